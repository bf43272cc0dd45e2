"""The embedded ``tiny`` model: a Llama architecture with GQA and seeded random weights.

Its config is a transformers ``LlamaConfig`` built in code (the ``tiny`` ModelShape
preset's numbers); its weights are drawn per tensor, in name order, from a
``torch.Generator`` seeded with ``seed``, so they depend on the seed only (not on
transformers' initialisation code). Scales keep activations O(1): embeddings N(0, 1),
linear weights N(0, 1/fan_in), norms 1 + N(0, 0.1²); logits then spread enough that
greedy decoding is not decided by rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from enginekit.models.arch import ModelArch
from enginekit.models.llama import LlamaWeights
from enginekit.models.shapes import model_preset
from enginekit.models.weights import weights_from_state_dict

TINY_EOS_TOKEN_ID = 2


def tiny_hf_config() -> Any:
    """The ``transformers.LlamaConfig`` of the tiny model."""
    from transformers import LlamaConfig

    shape = model_preset("tiny")
    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_model_len,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=TINY_EOS_TOKEN_ID,
        tie_word_embeddings=False,
    )


def random_state_dict(config: Any, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights, HF-named, for any Llama-family transformers ``config``
    (q/k/v biases when ``attention_bias`` is set or the model is Qwen2)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, meta in sorted(skeleton.state_dict().items()):
        if name in state:
            continue
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(meta.shape, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(meta.shape, generator=generator)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(meta.shape, generator=generator)
        else:
            t = torch.randn(meta.shape, generator=generator) * meta.shape[-1] ** -0.5
        state[name] = t
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def load_tiny(
    seed: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[ModelArch, LlamaWeights]:
    """Architecture and weights of the tiny model with weights from ``seed``."""
    config = tiny_hf_config()
    arch = ModelArch.from_hf_config(config.to_dict(), name="tiny")
    return arch, weights_from_state_dict(arch, random_state_dict(config, seed), dtype, device)

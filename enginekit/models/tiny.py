"""The embedded ``tiny`` model: a Llama architecture with GQA and seeded random weights.

Its config is a config.json-like dict built in code (``tiny_config``: the ``tiny``
ModelShape preset's numbers; ``tiny_hf_config`` is the same as a transformers
``LlamaConfig``, for oracles). Its weights are drawn per tensor, in name order, from a
``torch.Generator`` seeded with ``seed``, so they depend on the seed only (not on
transformers' initialisation code, which is not even imported: names and shapes come from
``llama_parameter_shapes``). Scales keep activations O(1): embeddings N(0, 1), linear
weights N(0, 1/fan_in), norms 1 + N(0, 0.1²); logits then spread enough that greedy
decoding is not decided by rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from enginekit.models.arch import ModelArch
from enginekit.models.llama import LlamaWeights
from enginekit.models.weights import weights_from_state_dict
from enginekit.spec.model import ModelShape, model_preset

TINY_EOS_TOKEN_ID = 2


def llama_config(shape: ModelShape, **settings: Any) -> dict[str, Any]:
    """A Llama config.json of ``shape``'s sizes (untied embeddings, SiLU, the shape's
    dtype), with ``settings`` (norm epsilon, rope theta, token ids, ...) added or
    overriding. The settings are copied: a config handed to transformers (which completes
    its ``rope_scaling`` in place) never changes a preset's (``PRESET_ROPE``)."""
    return {
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_model_len,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": shape.dtype,
        **copy.deepcopy(settings),
    }


def tiny_config() -> dict[str, Any]:
    """The tiny model's config.json, as transformers would write it for a LlamaConfig."""
    return llama_config(
        model_preset("tiny"),
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=TINY_EOS_TOKEN_ID,
    )


def tiny_hf_config() -> Any:
    """The ``transformers.LlamaConfig`` of the tiny model (imports transformers)."""
    from transformers import LlamaConfig

    settings = tiny_config()
    for key in ("model_type", "torch_dtype", "rope_theta"):
        settings.pop(key)
    return LlamaConfig(**settings)


def llama_parameter_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every parameter of a Llama, Mistral or Qwen2 model
    of ``config`` (a parsed config.json): what transformers' ``*ForCausalLM`` state dict
    holds, ``lm_head.weight`` included even when tied. q/k/v biases for Qwen2 and for
    ``attention_bias`` (which gives o_proj one too), MLP biases for ``mlp_bias``."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inner = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    qwen2 = config.get("model_type") == "qwen2"
    attention_bias = bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    shapes: dict[str, tuple[int, ...]] = {
        "lm_head.weight": (vocab, hidden),
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    outs = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
    for i in range(int(config["num_hidden_layers"])):
        prefix = f"model.layers.{i}."
        shapes[prefix + "input_layernorm.weight"] = (hidden,)
        shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)
        for name, out in outs.items():
            shapes[f"{prefix}self_attn.{name}_proj.weight"] = (out, hidden)
            if qwen2 or attention_bias:
                shapes[f"{prefix}self_attn.{name}_proj.bias"] = (out,)
        shapes[prefix + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if attention_bias:
            shapes[prefix + "self_attn.o_proj.bias"] = (hidden,)
        for name, shape in (("gate", (inner, hidden)), ("up", (inner, hidden)),
                            ("down", (hidden, inner))):  # fmt: skip
            shapes[f"{prefix}mlp.{name}_proj.weight"] = shape
            if mlp_bias:
                shapes[f"{prefix}mlp.{name}_proj.bias"] = shape[:1]
    return shapes


def random_state_dict(config: Any, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights, HF-named, for any Llama-family ``config`` (a parsed
    config.json or a transformers config), drawn in name order."""
    settings = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in sorted(llama_parameter_shapes(settings).items()):
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=generator)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=generator)
        else:
            t = torch.randn(shape, generator=generator) * shape[-1] ** -0.5
        state[name] = t
    if settings.get("tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def load_tiny(
    seed: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[ModelArch, LlamaWeights]:
    """Architecture and weights of the tiny model with weights from ``seed``."""
    config = tiny_config()
    arch = ModelArch.from_hf_config(config, name="tiny")
    return arch, weights_from_state_dict(arch, random_state_dict(config, seed), dtype, device)

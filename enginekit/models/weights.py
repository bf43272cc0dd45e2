"""Loading Llama-family weights: from a local Hugging Face folder or a state dict.

A folder holds ``config.json`` and one or more ``*.safetensors`` files (sharded or not);
nothing is downloaded. Tensors are found by their Hugging Face names
(``model.layers.{i}.self_attn.q_proj.weight`` ...; the ``model.`` prefix is optional) and
packed into ``LlamaWeights`` (q/k/v and gate/up fused) in the requested dtype and device.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from enginekit.errors import ConfigError
from enginekit.models.arch import ModelArch
from enginekit.models.llama import LayerWeights, LlamaWeights


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of the folder ``path``; ConfigError if absent, unreadable
    or not a JSON object."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={str(path)!r}: no config.json there")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model.path={str(path)!r}: config.json cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"model.path={str(path)!r}: config.json holds a {type(config).__name__}, "
            "not an object of model settings"
        )
    return config


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in the folder, on the CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model.path={str(path)!r}: no *.safetensors files there")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def weights_from_state_dict(
    arch: ModelArch,
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str,
) -> LlamaWeights:
    """Packs HF-named tensors into ``LlamaWeights``. Raises ConfigError naming a missing
    tensor; a missing ``lm_head.weight`` means tied embeddings only if the config ties."""
    tensors = {name.removeprefix("model."): t for name, t in state_dict.items()}

    def get(name: str) -> torch.Tensor:
        try:
            return tensors[name].to(device=device, dtype=dtype)
        except KeyError:
            raise ConfigError(f"weights lack {name!r}") from None

    def maybe(name: str) -> torch.Tensor | None:
        return get(name) if name in tensors else None

    layers = []
    for i in range(arch.shape.num_layers):
        prefix = f"layers.{i}."
        attn = prefix + "self_attn."
        biases = [maybe(f"{attn}{p}_proj.bias") for p in "qkv"]
        if any(b is not None for b in biases) and any(b is None for b in biases):
            raise ConfigError(f"layer {i} has biases on some of q/k/v only")
        if f"{prefix}mlp.gate_proj.bias" in tensors:
            raise ConfigError("MLP biases are not supported")
        layers.append(
            LayerWeights(
                input_norm=get(prefix + "input_layernorm.weight"),
                qkv=torch.cat([get(f"{attn}{p}_proj.weight") for p in "qkv"]),
                qkv_bias=None if biases[0] is None else torch.cat(biases),  # type: ignore[arg-type]
                o=get(attn + "o_proj.weight"),
                o_bias=maybe(attn + "o_proj.bias"),
                post_norm=get(prefix + "post_attention_layernorm.weight"),
                gate_up=torch.cat(
                    [get(prefix + "mlp.gate_proj.weight"), get(prefix + "mlp.up_proj.weight")]
                ),
                down=get(prefix + "mlp.down_proj.weight"),
            )
        )
    embed = get("embed_tokens.weight")
    if "lm_head.weight" in tensors and not arch.shape.tie_word_embeddings:
        lm_head = get("lm_head.weight")
    elif arch.shape.tie_word_embeddings:
        lm_head = embed
    else:
        raise ConfigError("weights lack 'lm_head.weight' and the config does not tie embeddings")
    return LlamaWeights(
        embed=embed,
        layers=layers,
        norm=get("norm.weight"),
        lm_head=lm_head,
        kv_scales=kv_cache_scales(tensors, arch.shape.num_layers, arch.shape.num_kv_heads),
    )


# Names fp8 checkpoints use for the KV-cache scales of layer i, K then V, after
# ``layers.{i}.self_attn.`` (newer exports, then the older output-scale naming).
_KV_SCALE_NAMES = (("k_scale", "v_scale"), ("k_proj.output_scale", "v_proj.output_scale"))


def kv_cache_scales(
    tensors: Mapping[str, torch.Tensor], num_layers: int, num_kv_heads: int
) -> torch.Tensor | None:
    """float32 [num_layers, 2, num_kv_heads] fp8 KV scales (``value ≈ stored × scale``)
    from ``layers.{i}.self_attn.k_scale`` / ``v_scale`` (or ``k_proj.output_scale`` /
    ``v_proj.output_scale``), each a scalar or one per kv head; None when the checkpoint
    has none. Raises ConfigError when only some layers have them or a shape is wrong."""
    for k_name, v_name in _KV_SCALE_NAMES:
        found = [
            [tensors.get(f"layers.{i}.self_attn.{name}") for name in (k_name, v_name)]
            for i in range(num_layers)
        ]
        present = [t is not None for pair in found for t in pair]
        if not any(present):
            continue
        if not all(present):
            raise ConfigError(f"the checkpoint has {k_name}/{v_name} for some layers only")
        scales = torch.empty(num_layers, 2, num_kv_heads, dtype=torch.float32)
        for i, pair in enumerate(found):
            for j, t in enumerate(pair):
                assert t is not None
                if t.numel() not in (1, num_kv_heads):
                    raise ConfigError(
                        f"layers.{i}.self_attn.{(k_name, v_name)[j]} has {t.numel()} values; "
                        f"expected 1 or {num_kv_heads} (one per kv head)"
                    )
                scales[i, j] = (
                    t.float().flatten().expand(num_kv_heads)
                    if t.numel() == 1
                    else t.float().flatten()
                )
        return scales
    return None


def load_hf_folder(
    path: str | Path, dtype: torch.dtype, device: torch.device | str
) -> tuple[ModelArch, LlamaWeights]:
    """Architecture and weights of the Hugging Face folder ``path`` (shape named after the
    folder). A config.json the forward cannot run (another activation, a rope type not
    implemented) is a ConfigError naming the folder, raised before any weight is read."""
    config = read_hf_config(path)
    try:
        arch = ModelArch.from_hf_config(config, name=Path(path).name)
    except ConfigError as exc:
        raise ConfigError(f"model.path={str(path)!r}: {exc}") from None
    return arch, weights_from_state_dict(arch, read_safetensors(path), dtype, device)

"""ModelArch: everything the forward needs to know beyond the shape, read from config.json.

Reads both spellings transformers has used for rotary settings: ``rope_theta`` +
``rope_scaling`` (transformers 4) and ``rope_parameters`` (transformers 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from enginekit.errors import ConfigError
from enginekit.spec.model import ModelShape

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings. ``llama3`` rescales low frequencies by ``factor`` and
    leaves high ones alone, blending in between (Llama 3.1); ``linear`` divides every
    frequency by ``factor``."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> RopeConfig:
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", 8192)
            ),
        )


@dataclass(frozen=True)
class ModelArch:
    """Shape plus the forward's settings. ``eos_token_id`` is the first EOS id of the
    config (a list in some configs) or None."""

    shape: ModelShape
    model_type: str
    rms_norm_eps: float
    rope: RopeConfig
    eos_token_id: int | None

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str | None = None) -> ModelArch:
        """Raises ConfigError for an unsupported architecture, activation or rope type."""
        shape = ModelShape.from_hf_config(config, name)
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act {act!r} is not supported (only silu)")
        eos = config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return cls(
            shape=shape,
            model_type=str(config["model_type"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf_config(config),
            eos_token_id=None if eos is None else int(eos),
        )

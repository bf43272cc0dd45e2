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
"""The rope types (config.json's ``rope_type``, or ``type``) ``enginekit.models.rope``
implements."""

_ROPE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
}
"""The parameters each rope type needs in the config (transformers' required keys)."""


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
        """The rotary settings of a parsed config.json: ``rope_parameters`` (transformers
        5) or ``rope_scaling`` with ``rope_theta`` beside it (transformers 4, and the
        published Llama 3.1 configs); neither means plain rope at ``rope_theta``.

        Raises ConfigError naming the key and the type for a rope type not in
        ROPE_TYPES (yarn, dynamic, longrope, ...: running one as plain rope would
        compute other logits than the model's), and for a ``linear`` or ``llama3``
        scaling that lacks one of its parameters (transformers refuses those too), and
        for a ``partial_rotary_factor`` other than 1."""
        key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
        raw = config.get(key) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config.json's {key} must be an object, got {raw!r}")
        params = dict(raw)
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"config.json's {key} has rope type {rope_type!r}, which enginekit does "
                f"not implement (it implements {', '.join(ROPE_TYPES)})"
            )
        missing = [name for name in _ROPE_PARAMETERS[rope_type] if params.get(name) is None]
        if missing:
            raise ConfigError(
                f"config.json's {key} of rope type {rope_type!r} lacks {', '.join(missing)}"
            )
        partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        if partial != 1.0:
            raise ConfigError(
                f"config.json's partial_rotary_factor {partial!r} is not implemented "
                "(enginekit rotates the whole head)"
            )
        try:
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
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"config.json's {key}: a rope setting is not a number: {exc}"
            ) from None


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

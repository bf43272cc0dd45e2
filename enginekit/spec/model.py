"""Model shapes: the numbers that size the KV cache and the cost of a step.

A shape is architecture only (no weights). Presets are the published configurations of
the models our users compare against; any other shape can be given field by field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from enginekit.errors import ConfigError

HF_ARCHITECTURES = ("llama", "mistral", "qwen2")
"""Hugging Face ``model_type`` values whose config.json ``from_hf_config`` reads."""

MODEL_DTYPES: dict[str, int] = {"bfloat16": 16, "float16": 16, "float32": 32}
"""The dtypes models run in (``model.dtype``), with their bits per element."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    # Attention sinks (StreamingLLM): keys at positions < attention_sinks stay visible to
    # every later query however far the window has moved. With a window w and s sinks, the
    # query at position p sees the key at k iff k <= p and (k > p - w or k < s). 0 without
    # a window; set by the engine from the eviction policy, never by a model's config.
    attention_sinks: int = 0
    # What the published weights are stored in (config.json's torch_dtype; may be one
    # MODEL_DTYPES lacks): the dtype model.dtype=auto runs (see enginekit.executor.factory).
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads ({self.num_heads}) must be a multiple of "
                f"model.num_kv_heads ({self.num_kv_heads})"
            )
        if self.attention_sinks < 0:
            raise ConfigError(f"attention_sinks must be >= 0, got {self.attention_sinks}")
        if self.attention_sinks and self.sliding_window is None:
            raise ConfigError("attention_sinks only apply to attention with a sliding window")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str | None = None) -> ModelShape:
        """The shape of a Llama-family Hugging Face ``config.json`` (already parsed).

        ``head_dim`` defaults to ``hidden_size // num_attention_heads`` and the KV heads to
        the attention heads (MHA); ``dtype`` is ``torch_dtype`` (or the newer ``dtype``),
        float32 when neither is given (what transformers then loads). ``sliding_window``
        is kept for Mistral, and for Qwen2 only when ``use_sliding_window`` is set (as
        transformers does). ``name`` defaults to the config's ``_name_or_path`` or its
        ``model_type``. Raises ConfigError for another architecture or a missing size."""
        model_type = config.get("model_type")
        if model_type not in HF_ARCHITECTURES:
            raise ConfigError(
                f"model_type {model_type!r} is not supported; supported: "
                f"{', '.join(HF_ARCHITECTURES)}"
            )
        try:
            num_heads = int(config["num_attention_heads"])
            hidden_size = int(config["hidden_size"])
            head_dim = config.get("head_dim") or hidden_size // num_heads
            window = config.get("sliding_window")
            if model_type == "qwen2" and not config.get("use_sliding_window", False):
                window = None
            return cls(
                name=name or str(config.get("_name_or_path") or model_type),
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=hidden_size,
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                head_dim=int(head_dim),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                max_model_len=int(config["max_position_embeddings"]),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                sliding_window=int(window) if window else None,
                dtype=_hf_dtype(config),
            )
        except ConfigError:
            raise
        except KeyError as exc:
            raise ConfigError(f"config.json of a {model_type} model lacks {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"config.json of a {model_type} model: a size is not a number: {exc}"
            ) from None

    @property
    def num_embedding_params(self) -> int:
        tables = 1 if self.tie_word_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    @property
    def num_layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q_and_o + k_and_v + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        return (
            self.num_embedding_params + self.num_layers * self.num_layer_params + self.hidden_size
        )

    @property
    def num_matmul_params_per_token(self) -> int:
        """Weights every token multiplies through: the layers and the LM head (the input
        embedding is a lookup, not a matmul)."""
        return self.num_layers * self.num_layer_params + self.vocab_size * self.hidden_size


def _hf_dtype(config: Mapping[str, Any]) -> str:
    """config.json's weight dtype by its torch name (``float32`` when it names none)."""
    dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
    return str(dtype).removeprefix("torch.")


LLAMA_3_1_ROPE_SCALING: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""Llama 3.1's ``rope_scaling`` as its config.json writes it: Llama 3's rotary
frequencies, trained at 8,192 positions, stretched to 131,072 (low frequencies divided by
``factor``, high ones kept, a blend between; ``enginekit.models.rope`` implements it)."""

_LLAMA_3_8B = ModelShape(
    name="llama-3-8b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_model_len=8192,
)
_LLAMA_3_70B = ModelShape(
    name="llama-3-70b",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=28672,
    vocab_size=128256,
    max_model_len=8192,
)

MODEL_PRESETS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        _LLAMA_3_8B,
        _LLAMA_3_70B,
        # Llama 3.1: Llama 3's shapes at a 128K context, reached by rope scaling
        # (PRESET_ROPE; a shape does not carry it).
        replace(_LLAMA_3_8B, name="llama-3.1-8b", max_model_len=131072),
        replace(_LLAMA_3_70B, name="llama-3.1-70b", max_model_len=131072),
        ModelShape(
            name="mistral-7b",  # v0.1: a 4,096-token sliding window
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=32000,
            max_model_len=32768,
            sliding_window=4096,
        ),
        ModelShape(
            name="llama-2-7b",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=32,
            head_dim=128,
            intermediate_size=11008,
            vocab_size=32000,
            max_model_len=4096,
            dtype="float16",  # Meta's checkpoint
        ),
        # The embedded random-weight model of the torch executor (enginekit.models.tiny).
        # Its vocabulary is Mistral-7B's SentencePiece one (enginekit.tokenizer), so that
        # the server has a tokenizer for it: ids and pieces match.
        ModelShape(
            name="tiny",
            num_layers=2,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=32000,
            max_model_len=2048,
            # Its seeded weights are drawn in float32, and CPUs (where it serves as the
            # default and the tests' model) compute float32 natively: bfloat16 would round
            # the weights and, measured on two cores, run its 32-request job 15% slower.
            dtype="float32",
        ),
    )
}


PRESET_ROPE: dict[str, dict[str, Any]] = {
    "llama-3-8b": {"rope_theta": 500000.0},
    "llama-3-70b": {"rope_theta": 500000.0},
    "llama-3.1-8b": {"rope_theta": 500000.0, "rope_scaling": LLAMA_3_1_ROPE_SCALING},
    "llama-3.1-70b": {"rope_theta": 500000.0, "rope_scaling": LLAMA_3_1_ROPE_SCALING},
    "mistral-7b": {"rope_theta": 10000.0},
    "llama-2-7b": {"rope_theta": 10000.0},
    "tiny": {"rope_theta": 10000.0},
}
"""The rotary settings of each preset's published config.json (``rope_theta``, and
``rope_scaling`` where the model has one), to be added to a config.json built from the
preset's shape. The simulator needs none of them (positions cost nothing); the torch
executor reads them from a model folder's own config.json."""


def model_preset(name: str) -> ModelShape:
    """The preset called ``name``; ConfigError listing the presets if there is none."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(MODEL_PRESETS))
        raise ConfigError(f"model.name={name!r} is not a known model; known: {known}") from None


def resolve_dtype(requested: str, shape: ModelShape) -> str:
    """The dtype a model runs in: ``requested`` (``model.dtype``), or for ``auto`` the
    model's own (``shape.dtype``: its config.json's, or the preset's, as ``vllm --dtype
    auto``). Raises ConfigError for a dtype not in MODEL_DTYPES."""
    dtype = shape.dtype if requested == "auto" else requested
    if dtype not in MODEL_DTYPES:
        what = f"{shape.name}'s own dtype {dtype!r}" if requested == "auto" else "it"
        raise ConfigError(
            f"model.dtype={requested}: {what} is not supported; choose auto, "
            f"{', '.join(MODEL_DTYPES)}"
        )
    return dtype

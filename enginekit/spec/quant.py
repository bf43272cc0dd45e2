"""KVQuant: how K and V are stored in the cache, and the bytes their scales take.

The quantizer plugin chooses a ``KVQuant``; ``KVSpec`` turns it into bytes per block, and
the torch executor turns it into tensors (``enginekit.kernels.layout``). Kinds:

- ``none``: K and V in the model's dtype.
- ``fp8``: e4m3 values, one float32 scale per (layer, K|V, kv head) for the whole pool
  (``value ≈ stored × scale``). Those scales are not per block: they cost
  ``num_layers × 2 × num_kv_heads × 4`` bytes once, outside the block pool.
- ``int4``: two 4-bit codes per byte (channel ``2i`` in the low nibble of byte ``i``,
  ``2i + 1`` in the high nibble), asymmetric: ``value ≈ zero + code × scale`` with float16
  ``scale`` and ``zero``. Keys are quantized per channel: one (scale, zero) per channel
  for each group of ``key_group_tokens`` consecutive tokens of a block. Values are
  quantized per token: one (scale, zero) per group of ``value_group_channels``
  consecutive channels of a token (the layout KIVI found best). A group never straddles
  a block (keys) or a head (values), so blocks stay independent for sharing,
  copy-on-write and swapping, which move a block's scales with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.errors import ConfigError

KINDS = ("none", "fp8", "int4")
FP8_SCALE_SOURCES = ("auto", "checkpoint", "calibrate")
FP16_BYTES = 2


@dataclass(frozen=True)
class KVQuant:
    """A storage format. Besides the layout, an fp8 format carries where its global scales
    come from (``fp8_scales``: ``checkpoint``, the model folder's ``k_scale`` / ``v_scale``,
    an error if absent; ``calibrate``, the max-abs of the first prefill times
    ``fp8_calibration_margin``; ``auto``, checkpoint when present, else calibrate)."""

    kind: str = "none"
    key_group_tokens: int = 0  # int4 only
    value_group_channels: int = 0  # int4 only
    fp8_scales: str = "auto"  # fp8 only
    fp8_calibration_margin: float = 2.0  # fp8 only

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown KV storage kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.fp8_scales not in FP8_SCALE_SOURCES:
            raise ConfigError(
                f"fp8_scales={self.fp8_scales!r}: choose {', '.join(FP8_SCALE_SOURCES)}"
            )
        if not self.fp8_calibration_margin >= 1.0:
            raise ConfigError(
                f"fp8_calibration_margin must be >= 1, got {self.fp8_calibration_margin}"
            )
        if self.kind == "int4" and min(self.key_group_tokens, self.value_group_channels) < 1:
            raise ConfigError("int4 needs key_group_tokens and value_group_channels >= 1")

    @classmethod
    def int4(cls, group_size: int, block_size: int, head_dim: int) -> KVQuant:
        """int4 with groups of ``group_size`` values, capped by the block (keys: tokens)
        and by the head (values: channels). Raises ConfigError naming
        ``quantizer.group_size`` when a capped group does not divide its block or head."""
        if group_size < 1:
            raise ConfigError(f"quantizer.group_size must be >= 1, got {group_size}")
        key_group = min(group_size, block_size)
        value_group = min(group_size, head_dim)
        if block_size % key_group or head_dim % value_group:
            raise ConfigError(
                f"quantizer.group_size={group_size} must divide cache.block_size="
                f"{block_size} (keys group tokens) and the head dim {head_dim} (values "
                "group channels), or exceed them"
            )
        return cls("int4", key_group_tokens=key_group, value_group_channels=value_group)

    def bits_per_element(self, model_bits: int) -> int:
        """Bits of one stored K or V element."""
        return {"none": model_bits, "fp8": 8, "int4": 4}[self.kind]

    def scale_bytes_per_block(self, num_layers: int, num_kv_heads: int, head_dim: int,
                              block_size: int) -> int:  # fmt: skip
        """Bytes of per-block scales and zero points over all layers and kv heads."""
        if self.kind != "int4":
            return 0
        key_groups = block_size // self.key_group_tokens * head_dim
        value_groups = block_size * (head_dim // self.value_group_channels)
        return num_layers * num_kv_heads * (key_groups + value_groups) * 2 * FP16_BYTES

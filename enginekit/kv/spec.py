"""KVSpec: the one place where the size of the KV cache is computed."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.errors import ConfigError
from enginekit.models.shapes import ModelShape


@dataclass(frozen=True)
class KVSpec:
    """Bytes of KV per token and per block.

    Per token: K and V (2) for every layer and KV head, head_dim elements of
    ``bits_per_element`` bits each, plus ``scale_bytes_per_token`` of quantization scales
    (0 without a quantizer). A block holds ``block_size`` tokens of every layer.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bits_per_element: int
    block_size: int
    scale_bytes_per_token: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"cache.block_size must be >= 1, got {self.block_size}")
        if self.bits_per_element not in (4, 8, 16, 32):
            raise ConfigError(
                f"KV bits per element must be 4, 8, 16 or 32: {self.bits_per_element}"
            )

    @classmethod
    def of(
        cls,
        shape: ModelShape,
        bits_per_element: int,
        block_size: int,
        scale_bytes_per_token: int = 0,
    ) -> KVSpec:
        return cls(
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            bits_per_element=bits_per_element,
            block_size=block_size,
            scale_bytes_per_token=scale_bytes_per_token,
        )

    @property
    def num_elements_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        return self.num_elements_per_token * self.bits_per_element // 8 + self.scale_bytes_per_token

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_in(self, num_bytes: int) -> int:
        """How many whole blocks fit in num_bytes."""
        return max(0, num_bytes // self.bytes_per_block)

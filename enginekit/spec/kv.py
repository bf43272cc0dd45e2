"""KVSpec: the one place where the size of the KV cache is computed."""

from __future__ import annotations

from dataclasses import dataclass, field

from enginekit.errors import ConfigError
from enginekit.spec.model import ModelShape
from enginekit.spec.quant import KVQuant


@dataclass(frozen=True)
class KVSpec:
    """Bytes of KV per block and per token.

    A block holds ``block_size`` tokens of every layer: K and V (2) for every layer and KV
    head, ``head_dim`` elements of ``bits_per_element`` bits each, plus the block's
    quantization scales and zero points (``quant.scale_bytes_per_block``, 0 unquantized).
    ``bytes_per_block`` is exact; ``bytes_per_token`` is its share per token (a fraction
    when a block's scales do not split evenly over its tokens).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bits_per_element: int
    block_size: int
    quant: KVQuant = field(default_factory=KVQuant)

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
        quant: KVQuant | None = None,
    ) -> KVSpec:
        """``bits_per_element`` is the model's when ``quant`` is None or ``none``."""
        quant = quant or KVQuant()
        return cls(
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            bits_per_element=quant.bits_per_element(bits_per_element),
            block_size=block_size,
            quant=quant,
        )

    @property
    def num_elements_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def scale_bytes_per_block(self) -> int:
        return self.quant.scale_bytes_per_block(
            self.num_layers, self.num_kv_heads, self.head_dim, self.block_size
        )

    @property
    def value_bytes_per_block(self) -> int:
        """Bytes of the stored K and V elements of one block, scales excluded."""
        return self.num_elements_per_token * self.block_size * self.bits_per_element // 8

    @property
    def bytes_per_block(self) -> int:
        return self.value_bytes_per_block + self.scale_bytes_per_block

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_in(self, num_bytes: int) -> int:
        """How many whole blocks fit in num_bytes."""
        return max(0, num_bytes // self.bytes_per_block)


_GIB = 1 << 30


def swap_space_num_blocks(
    swap_space_gib: float, bytes_per_block: int, num_device_blocks: int
) -> int:
    """Host blocks of a swap space of ``swap_space_gib`` GiB (``Preemption.swap_space_gib``),
    at most ``num_device_blocks``: one step never swaps out more than the device pool
    holds, and a victim that finds the swap space full is recomputed instead. The cache
    manager's bookkeeping and the torch executor's host tensors both follow this rule.
    Raises ConfigError for a negative size."""
    if swap_space_gib < 0:
        raise ConfigError(f"preemption.swap_space_gib must be >= 0, got {swap_space_gib}")
    return min(int(swap_space_gib * _GIB) // bytes_per_block, num_device_blocks)

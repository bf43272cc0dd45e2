"""``host``: KV blocks in host memory, least recently used evicted first.

In the torch executor a payload is a copy the executor made into pinned host memory
(where CUDA exists); the level keeps it as it is. In the simulator it keeps the keys only
and its loads take the hardware's host link time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.config import TierConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.tier import KVTier, LruIndex, Payload, TierContext

BYTES_PER_GIB = 1 << 30


@dataclass
class HostTierConfig(TierConfig):
    name: str = "host"


class HostTier(KVTier):
    """``tier.host_gib`` of host memory, refused up front if the host has less."""

    Config = HostTierConfig

    def __init__(self, config: TierConfig, context: TierContext) -> None:
        super().__init__(config, context)
        num_bytes = int(config.host_gib * BYTES_PER_GIB)
        if config.host_gib <= 0:
            raise ConfigError(f"tier.host_gib must be > 0, got {config.host_gib}")
        if num_bytes > context.host_memory_bytes:
            raise ConfigError(
                f"tier.host_gib={config.host_gib:g} is more than the host's memory "
                f"({context.host_memory_bytes / BYTES_PER_GIB:.1f} GiB available)"
            )
        capacity = num_bytes // context.block_bytes
        if capacity < 1:
            raise ConfigError(
                f"tier.host_gib={config.host_gib:g} holds no block of {context.block_bytes} bytes"
            )
        self._index = LruIndex(capacity)

    @property
    def capacity_blocks(self) -> int:
        return self._index.capacity

    @property
    def bytes_per_s(self) -> float:
        return self.context.link_bytes_per_s

    def num_blocks(self) -> int:
        return len(self._index)

    def num_present(self, keys: Sequence[int]) -> int:
        return self._index.num_leading(keys)

    def load(self, keys: Sequence[int]) -> list[Payload]:
        index = self._index
        payloads = []
        for key in keys:
            if key not in index:
                break
            payloads.append(index.get(key))
        return payloads

    def store(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        return self._index.put(key, payload)

    def touch(self, key: int) -> None:
        self._index.touch(key)

    def discard(self, keys: Sequence[int]) -> None:
        for key in keys:
            self._index.pop(key)

    def check_integrity(self) -> None:
        self._index.check_integrity()

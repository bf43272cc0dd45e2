"""``slru``: segmented LRU, a scan-resistant order: blocks reused since they were cached
outlive blocks used once."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.config import EvictionConfig
from enginekit.errors import ConfigError, KVCacheError
from enginekit.interfaces import Eviction, KVContext


@dataclass
class SLRUConfig(EvictionConfig):
    name: str = "slru"
    # The most blocks the protected segment keeps, as a fraction of the pool.
    protected_fraction: float = 0.5


class SLRUEviction(Eviction):
    """Segmented LRU (Karedla, Love and Wherry, 1994). The evictable blocks are in two LRU
    segments: *probation* holds those not hit since they were cached (used by one request
    only: a one-off prompt, a scan), *protected* those hit at least once since (a shared
    prefix, a conversation's history). A released block joins the most recent end of its
    segment. Protected holds at most ``protected_fraction`` of the pool; its least recently
    released blocks drop to the most recent end of probation when it overflows. Victims
    come from probation's least recently released end first, then protected's.

    With no reuse at all, every block is in probation: the order is ``lru``'s. Under
    ``radix`` (whose tree gives back only leaf tails) the victim is the first tail in the
    tree's order that was not hit since it was cached, else the tree's first.
    """

    Config = SLRUConfig

    def __init__(self, config: SLRUConfig, kv: KVContext) -> None:
        """Raises ConfigError for a ``protected_fraction`` outside (0, 1]."""
        super().__init__(config, kv)
        fraction = config.protected_fraction
        if not 0 < fraction <= 1:
            raise ConfigError(f"eviction.protected_fraction must be in (0, 1], got {fraction}")
        self.protected_capacity = max(1, int(fraction * kv.pool.num_blocks))
        self._probation: OrderedDict[int, None] = OrderedDict()  # least recent first
        self._protected: OrderedDict[int, None] = OrderedDict()
        self._reused: set[int] = set()  # cached blocks hit since they were cached

    def on_insert(self, block_id: int, content: int, parent: int | None) -> None:
        self._reused.discard(block_id)

    def on_hit(self, block_id: int) -> None:
        self._probation.pop(block_id, None)
        self._protected.pop(block_id, None)
        self._reused.add(block_id)

    def on_release(self, block_id: int) -> None:
        if block_id not in self._reused:
            self._probation[block_id] = None
            return
        protected = self._protected
        protected[block_id] = None
        while len(protected) > self.protected_capacity:
            demoted, _ = protected.popitem(last=False)
            self._probation[demoted] = None

    def on_evict(self, block_id: int) -> None:
        self._probation.pop(block_id, None)
        self._protected.pop(block_id, None)
        self._reused.discard(block_id)

    def evict(self, num_blocks: int) -> list[int]:
        victims: list[int] = []
        for segment in (self._probation, self._protected):
            while segment and len(victims) < num_blocks:
                block_id, _ = segment.popitem(last=False)
                self._reused.discard(block_id)
                victims.append(block_id)
        return self.evict_blocks(victims)

    def choose_victim(self, candidates: Sequence[int]) -> int:
        """Under radix: the first candidate (the tree's order) not hit since it was
        cached, else the first."""
        reused = self._reused
        return next((i for i, b in enumerate(candidates) if b not in reused), 0)

    def check_integrity(self) -> None:
        evictable = set(self.kv.pool.evictable_block_ids())
        held = self._probation.keys() | self._protected.keys()
        if len(held) != len(self._probation) + len(self._protected) or held != evictable:
            raise KVCacheError(
                f"slru: its segments hold {sorted(held)[:8]}..., the pool's evictable blocks "
                f"are {sorted(evictable)[:8]}..."
            )
        if len(self._protected) > self.protected_capacity:
            raise KVCacheError(
                f"slru: protected holds {len(self._protected)} blocks, more than "
                f"{self.protected_capacity}"
            )

"""``lfu``: least frequently used first, frequencies aging with a half-life, so that what
was popular long ago does not stay forever."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.config import EvictionConfig
from enginekit.errors import ConfigError, KVCacheError
from enginekit.interfaces import Eviction, KVContext


@dataclass
class LFUConfig(EvictionConfig):
    name: str = "lfu"
    # Accesses (insertions and hits, pool-wide) after which a block's count halves;
    # None: the pool's block count.
    half_life: int | None = None


class LFUEviction(Eviction):
    """Evicts the block with the lowest aged use count. A block's count is 1 when it is
    cached and grows by 1 at every hit; every count halves each ``half_life`` accesses
    (insertions and hits, counted over the whole pool): count(t) = sum over its uses u of
    2 ** (-(t - u) / half_life), LRFU's exponential aging (Lee et al., 2001).

    Counts all decay at the same rate, so their order never changes between uses: a block
    ranks by log2(count at its last use) + (its last use) / half_life, set at its last use,
    and a heap of the evictable blocks keyed by it gives the victims. Ties go to the block
    released first. A huge half-life is pure LFU; a small one approaches LRU by last use.
    Under ``radix`` (whose tree gives back only leaf tails) the victim is the tail of
    lowest rank.
    """

    Config = LFUConfig

    def __init__(self, config: LFUConfig, kv: KVContext) -> None:
        """Raises ConfigError for a ``half_life`` below 1."""
        super().__init__(config, kv)
        half_life = config.half_life if config.half_life is not None else kv.pool.num_blocks
        if half_life < 1:
            raise ConfigError(f"eviction.half_life must be >= 1 access, got {half_life}")
        self.half_life = half_life
        self._clock = 0  # accesses heard (insertions and hits)
        self._last_use: dict[int, int] = {}  # cached block -> clock at its last use
        self._count: dict[int, float] = {}  # cached block -> its count at its last use
        self._released: dict[int, int] = {}  # evictable block -> its release number
        self._num_released = 0
        self._heap: list[tuple[float, int, int]] = []  # (rank, release number, block)

    def _use(self, block_id: int, first: bool) -> None:
        clock = self._clock = self._clock + 1
        if first:
            count = 1.0
        else:
            age = clock - self._last_use.get(block_id, clock)
            count = self._count.get(block_id, 0.0) * 2.0 ** (-age / self.half_life) + 1.0
        self._count[block_id] = count
        self._last_use[block_id] = clock

    def rank(self, block_id: int) -> float:
        """The block's rank (lowest evicted first): log2 of its aged count, in units where
        the clock's half-lives are added, so it does not change until the block's next
        use. Pure."""
        return math.log2(self._count[block_id]) + self._last_use[block_id] / self.half_life

    def on_insert(self, block_id: int, content: int, parent: int | None) -> None:
        self._use(block_id, first=True)

    def on_hit(self, block_id: int) -> None:
        self._released.pop(block_id, None)
        self._use(block_id, first=False)

    def on_release(self, block_id: int) -> None:
        self._num_released += 1
        self._released[block_id] = self._num_released
        heapq.heappush(self._heap, (self.rank(block_id), self._num_released, block_id))
        if len(self._heap) > 4 * len(self._released) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        """The heap without its stale entries (blocks hit or evicted since their push),
        when those are most of it: its size stays within a constant of the evictable
        blocks'."""
        self._heap = [(self.rank(b), n, b) for b, n in self._released.items()]
        heapq.heapify(self._heap)

    def on_evict(self, block_id: int) -> None:
        self._released.pop(block_id, None)
        self._count.pop(block_id, None)
        self._last_use.pop(block_id, None)

    def evict(self, num_blocks: int) -> list[int]:
        victims: list[int] = []
        heap, released = self._heap, self._released
        while heap and len(victims) < num_blocks:
            _, number, block_id = heapq.heappop(heap)
            if released.get(block_id) != number:
                continue  # hit or evicted since this entry was pushed
            self.on_evict(block_id)
            victims.append(block_id)
        return self.evict_blocks(victims)

    def choose_victim(self, candidates: Sequence[int]) -> int:
        """Under radix: the candidate of lowest rank (the first in the tree's order among
        equals; one never heard of ranks lowest)."""
        count = self._count
        ranks = [self.rank(b) if b in count else -math.inf for b in candidates]
        return ranks.index(min(ranks))

    def check_integrity(self) -> None:
        evictable = set(self.kv.pool.evictable_block_ids())
        if set(self._released) != evictable:
            raise KVCacheError(
                f"lfu: it holds {len(self._released)} blocks evictable, the pool {len(evictable)}"
            )
        missing = [b for b in evictable if b not in self._count]
        if missing:
            raise KVCacheError(f"lfu: evictable blocks {missing[:8]} have no count")

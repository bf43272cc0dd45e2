"""``chain_aware``: least recently released first, but never a block whose successor in
a prefix chain is still cached: a chain is evicted from its tail."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from enginekit.config import EvictionConfig
from enginekit.errors import KVCacheError
from enginekit.interfaces import Eviction, KVContext


@dataclass
class ChainAwareConfig(EvictionConfig):
    name: str = "chain_aware"


class ChainAwareEviction(Eviction):
    """A cached block whose content is the parent of another cached block's is the head
    of that chain: a prompt can hit the successor only through it, so evicting it first
    would strand the successor (cached, and never hit again until the head is computed
    anew). This policy evicts only *leaves*: evictable blocks no cached block names as its
    parent, least recently released first. When the request for room exceeds the
    evictable leaves (every evictable block's successors are in use: a running request
    holds them but not this copy of their parent), it takes the least recently released
    evictable blocks, as ``lru`` would.

    Parents are contents (the hash chain), not block ids, so the rule holds across
    duplicate copies of a prefix. Under ``radix`` the tree's own order is this rule
    already: it gives back only the tails of leaves.
    """

    Config = ChainAwareConfig

    def __init__(self, config: ChainAwareConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self._content: dict[int, int] = {}  # cached block -> its content
        self._block: dict[int, int] = {}  # cached content -> its block
        self._parent: dict[int, int | None] = {}  # cached content -> its parent content
        self._num_children: dict[int, int] = {}  # content -> cached contents naming it
        self._released: OrderedDict[int, int] = OrderedDict()  # evictable -> release number
        self._num_released = 0
        self._leaves: list[tuple[int, int]] = []  # (release number, block): evictable leaves

    def is_leaf(self, block_id: int) -> bool:
        """Whether no cached block names this cached block's content as its parent. Pure."""
        return not self._num_children.get(self._content[block_id], 0)

    def on_insert(self, block_id: int, content: int, parent: int | None) -> None:
        self._content[block_id] = content
        self._block[content] = block_id
        self._parent[content] = parent
        if parent is not None:
            self._num_children[parent] = self._num_children.get(parent, 0) + 1

    def on_hit(self, block_id: int) -> None:
        self._released.pop(block_id, None)

    def on_release(self, block_id: int) -> None:
        self._num_released += 1
        self._released[block_id] = self._num_released
        if self.is_leaf(block_id):
            heapq.heappush(self._leaves, (self._num_released, block_id))
            if len(self._leaves) > 4 * len(self._released) + 64:
                self._rebuild()

    def _rebuild(self) -> None:
        """The leaves' heap without its stale entries (blocks hit, evicted or given a
        successor since their push), when those are most of it: its size stays within a
        constant of the evictable blocks'."""
        self._leaves = [(n, b) for b, n in self._released.items() if self.is_leaf(b)]
        heapq.heapify(self._leaves)

    def on_evict(self, block_id: int) -> None:
        content = self._content.pop(block_id, None)
        if content is None:
            return  # this policy evicted it, and forgot it then
        self._released.pop(block_id, None)
        del self._block[content]
        parent = self._parent.pop(content)
        if parent is None:
            return
        left = self._num_children[parent] - 1
        if left:
            self._num_children[parent] = left
            return
        del self._num_children[parent]
        parent_block = self._block.get(parent)
        if parent_block is not None and parent_block in self._released:
            # the parent is evictable and now a leaf
            heapq.heappush(self._leaves, (self._released[parent_block], parent_block))

    def evict(self, num_blocks: int) -> list[int]:
        victims: list[int] = []
        leaves, released = self._leaves, self._released
        while leaves and len(victims) < num_blocks:
            number, block_id = heapq.heappop(leaves)
            if released.get(block_id) != number or not self.is_leaf(block_id):
                continue  # hit, evicted or given a successor since this entry was pushed
            self.on_evict(block_id)  # may make its parent a leaf for this same call
            victims.append(block_id)
        while len(victims) < num_blocks and released:
            block_id = next(iter(released))  # successors in use: the oldest evictable
            self.on_evict(block_id)
            victims.append(block_id)
        return self.evict_blocks(victims)

    def check_integrity(self) -> None:
        evictable = set(self.kv.pool.evictable_block_ids())
        if set(self._released) != evictable:
            raise KVCacheError(
                f"chain_aware: it holds {len(self._released)} blocks evictable, the pool "
                f"{len(evictable)}"
            )
        unknown = [b for b in evictable if b not in self._content]
        if unknown:
            raise KVCacheError(f"chain_aware: evictable blocks {unknown[:8]} have no content")
        live = {b for n, b in self._leaves if self._released.get(b) == n}
        stranded = [b for b in evictable if self.is_leaf(b) and b not in live]
        if stranded:
            raise KVCacheError(f"chain_aware: evictable leaves {stranded[:8]} are not listed")

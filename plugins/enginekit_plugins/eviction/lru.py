"""``lru``: reclaim the cached blocks released longest ago."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import EvictionConfig
from enginekit.interfaces import Eviction


@dataclass
class LRUConfig(EvictionConfig):
    name: str = "lru"


class LRUEviction(Eviction):
    """Evicts in the pool's LRU order (``Eviction``'s default ``evict``): a block's
    recency is the moment its last reference was dropped (a hit takes it out of the order;
    its next release puts it at the end). A sequence releases its blocks tail first, so a
    shared prefix outlives the tails that extend it."""

    Config = LRUConfig

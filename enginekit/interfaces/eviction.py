"""Eviction: which cached, unreferenced blocks to reclaim when the free list is short, and
(for a windowed policy) which blocks of running sequences attention no longer reaches."""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from enginekit.config import EvictionConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.context import KVContext
from enginekit.request import Request


class AttentionSpan(NamedTuple):
    """The keys a query attends to under a policy: those within ``window`` tokens of it
    (None: every earlier key) and the first ``sinks`` tokens of the sequence."""

    window: int | None
    sinks: int = 0


class BlockRange(NamedTuple):
    """The blocks ``first .. end - 1`` of sequence ``seq_id``'s table."""

    seq_id: int
    first: int
    end: int


class Eviction(Plugin, ABC):
    Config: ClassVar[type[EvictionConfig]] = EvictionConfig

    def __init__(self, config: EvictionConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @classmethod
    def attention(cls, config: EvictionConfig, model_window: int | None) -> AttentionSpan:
        """What attention must be limited to for this policy to be exact, given the model's
        own sliding window (None: unlimited). The engine runs the model with it and hands
        it to every plugin as ``KVContext.attention_window`` / ``attention_sinks``.
        Default: the model's window, no sinks. Raises ConfigError for a setting the policy
        refuses. Pure."""
        return AttentionSpan(model_window, 0)

    def ranges_out_of_window(self, running: Sequence[Request]) -> list[BlockRange]:
        """Called after every step and at admission: the blocks of ``running`` sequences
        that no future query can attend to and that the sequence still holds (the cache
        manager gives them back, leaving holes; it needs an allocator that can:
        ``HoleAllocator``). Default: none. Pure."""
        return []

    def evict(self, num_blocks: int) -> list[int]:
        """Turns ``num_blocks`` evictable blocks into free ones and returns their ids.

        The caller ensures ``num_blocks <= pool.num_evictable_blocks``. Mutates the pool
        (drops the blocks' hashes); the manager then tells the prefix cache. Default: the
        pool's LRU order (``pool.evict_lru``: the blocks released longest ago first). With a
        policy that keeps the default, and a prefix cache that neither hears evictions nor
        holds blocks of its own, the cache manager makes room for growing sequences inside
        the structures (``BlockPool.make_room_lru``), without a call to this method."""
        return self.kv.pool.evict_lru(num_blocks)

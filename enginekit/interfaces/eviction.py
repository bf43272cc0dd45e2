"""Eviction: which cached, unreferenced blocks to reclaim when the free list is short, and
(for a windowed policy) which blocks of running sequences attention no longer reaches.

A policy that ranks blocks by more than their release order hears the accesses that decide
it (``hears_accesses``): which blocks were cached, hit, released and evicted, in the order
they happened."""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from enginekit.config import EvictionConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.structures import Access, AccessKind
from enginekit.request import Request

ACCESS_HOOKS = ("on_insert", "on_hit", "on_release", "on_evict", "hear", "choose_victim")
"""The methods of ``Eviction`` that hear accesses or choose by them: a policy that
overrides any of them hears every access (``hears_accesses``)."""


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
    """Chooses the cached blocks to evict.

    **Accesses.** A policy that overrides an access hook (``on_insert``, ``on_hit``,
    ``on_release``, ``on_evict``, ``hear`` for all four at once, or ``choose_victim``)
    hears every access to the cached blocks, in the order they happened, once per access:

    - ``on_insert(block, content, parent)``: a used block was cached under ``content`` (its
      hash: the same content has the same hash in every process), chained to the content
      ``parent`` (None: the sequence's first block, and under ``radix`` always);
    - ``on_hit(block)``: a cached block gained a reference (a prefix hit, a fork sharing
      it); it is in use until its release;
    - ``on_release(block)``: a cached block lost its last reference: it is evictable now;
    - ``on_evict(block)``: the block is no longer cached (whoever evicted it, this policy
      included); its id may be cached again later with other content.

    So the evictable blocks are exactly those released and neither hit nor evicted since.
    Accesses are delivered in batches, all of them before every ``evict`` call, after every
    step and before ``check_integrity``: a policy may count on having heard everything that
    happened before it is asked to choose. A policy that hears nothing pays nothing: the
    pool does not log for it.

    **Two prefix caches.** Under ``block_hash`` the pool's hash map holds the cached
    blocks: a policy hears all four kinds and ``evict`` picks victims among every block it
    heard released. Under ``radix`` the tree holds its blocks itself and can give back only
    the last block of an unlocked leaf: the policy hears the tree's insertions, hits and
    evictions (a block's id is its content; no parent: the tree keeps the chain, and
    evicts it from the tail by construction), and ``choose_victim`` picks each block among
    the tree's candidates.
    """

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

    @classmethod
    def hears_accesses(cls) -> bool:
        """Whether this policy overrides an access hook (see the class docstring). Pure."""
        return any(getattr(cls, hook) is not getattr(Eviction, hook) for hook in ACCESS_HOOKS)

    def hear(self, accesses: Sequence[Access]) -> None:
        """Hears ``accesses`` (``(kind, block, content, parent)``, oldest first) by calling
        the hook of each in order. A policy may override it to take a batch at once."""
        for kind, block_id, content, parent in accesses:
            if kind == AccessKind.RELEASE:
                self.on_release(block_id)
            elif kind == AccessKind.HIT:
                self.on_hit(block_id)
            elif kind == AccessKind.INSERT:
                self.on_insert(block_id, content, parent)
            else:
                self.on_evict(block_id)

    def on_insert(self, block_id: int, content: int, parent: int | None) -> None:  # noqa: B027
        """Block ``block_id`` (in use) was cached under ``content``, chained to ``parent``."""

    def on_hit(self, block_id: int) -> None:  # noqa: B027 - optional hook
        """Cached block ``block_id`` gained a reference: it is in use, not evictable."""

    def on_release(self, block_id: int) -> None:  # noqa: B027 - optional hook
        """Cached block ``block_id`` lost its last reference: it is evictable."""

    def on_evict(self, block_id: int) -> None:  # noqa: B027 - optional hook
        """Block ``block_id`` is no longer cached (the policy may have evicted it itself)."""

    def choose_victim(self, candidates: Sequence[int]) -> int:
        """For a prefix cache that holds its blocks itself (``radix``, whose tree can give
        back only the last block of an unlocked leaf): the index in ``candidates`` (the
        blocks the cache could evict next, in its own order: partly filled blocks first,
        then least recently used) of the one to evict. Called once per block evicted,
        after every access was heard. Default: 0, the cache's own order. Pure."""
        return 0

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises KVCacheError if the policy's own state disagrees with the pool (called
        after every access was heard)."""

    def evict(self, num_blocks: int) -> list[int]:
        """Turns ``num_blocks`` evictable blocks into free ones and returns their ids.

        The caller ensures ``num_blocks <= pool.num_evictable_blocks``. Mutates the pool
        (drops the blocks' hashes); the manager then tells the prefix cache. Default: the
        pool's LRU order (``pool.evict_lru``: the blocks released longest ago first). With a
        policy that keeps the default, and a prefix cache that neither hears evictions nor
        holds blocks of its own, the cache manager makes room for growing sequences inside
        the structures (``BlockPool.make_room_lru``), without a call to this method.

        A policy that ranks blocks itself returns blocks it heard released (never one in
        use) and evicts each with ``pool.evict`` (or ``evict_blocks``)."""
        return self.kv.pool.evict_lru(num_blocks)

    def evict_blocks(self, block_ids: Sequence[int]) -> list[int]:
        """Evicts each of ``block_ids`` (evictable, distinct) from the pool; returns them.
        Raises KVCacheError, having evicted those before it, at one that is not evictable:
        a policy bug."""
        evict = self.kv.pool.evict
        for block_id in block_ids:
            evict(block_id)
        return list(block_ids)

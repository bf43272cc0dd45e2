"""Allocator: which physical blocks a sequence gets, and when."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from enginekit.config import AllocatorConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.structures import IntBatch, IntList
from enginekit.request import Request


class Allocator(Plugin, ABC):
    """Owns the block tables' contents: admits, grows and releases sequences.

    The cache manager makes room (eviction) before calling ``admit`` or ``grow``, so
    these only take blocks from the pool's free list; they raise OutOfBlocksError (changing
    nothing) if the free list is still short. References: a table holds one reference to
    each of its blocks; ``release`` gives them back.
    """

    Config: ClassVar[type[AllocatorConfig]] = AllocatorConfig

    def __init__(self, config: AllocatorConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @abstractmethod
    def num_blocks_to_admit(self, request: Request, num_cached_blocks: int) -> int:
        """Free blocks that ``admit`` would take for ``request`` when its first
        ``num_cached_blocks`` blocks come from the prefix cache; never more for more
        cached blocks (the manager relies on it to keep refusing a request whose match
        cannot have grown). Pure."""

    @abstractmethod
    def admit(self, request: Request, cached_block_ids: IntList) -> None:
        """Creates the request's block table with the cached blocks, and whatever fresh
        blocks this allocator takes at admission: none for ``paged`` (the manager grows
        the table chunk by chunk, out of the ``num_blocks_to_admit`` blocks it promised
        the request), the whole slab for a reserving allocator. The manager has already
        taken one reference to each cached block for this request; the table takes those
        over. Mutates pool and tables."""

    @abstractmethod
    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Free blocks that ``grow`` would take. Pure."""

    @abstractmethod
    def grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> None:
        """Extends each sequence's table so that num_tokens[i] tokens fit (each argument a
        list, a tuple or a 1-D int64 array: the scheduler hands its decode batch as arrays).
        All or nothing. Mutates pool and tables."""

    def try_grow(
        self, seq_ids: IntBatch, num_tokens: IntBatch, make_room: Callable[[int], bool]
    ) -> bool:
        """``grow`` if ``make_room(n)`` makes room for the ``n = num_blocks_to_grow(...)``
        blocks it takes (not called when ``n`` is 0); returns False, changing nothing but
        what ``make_room`` did, if it does not. The manager's decode growth, once per step:
        an allocator over the backend's tables may do it in one call
        (``BlockTables.grow_with``). Mutates pool and tables."""
        num_needed = self.num_blocks_to_grow(seq_ids, num_tokens)
        if num_needed == 0:
            return True
        if not make_room(num_needed):
            return False
        self.grow(seq_ids, num_tokens)
        return True

    @abstractmethod
    def release(self, seq_id: int) -> None:
        """Drops the sequence's table and its references (last block first, so a
        sequence's tail becomes evictable before its shared head). Mutates pool and tables."""

    def num_blocks_for_longest(self, num_tokens: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens holds at most (admission rejects a
        request whose longest form needs more than the pool). Pure."""
        return self.kv.spec.num_blocks_for(num_tokens)

    def num_unusable_free_blocks(self) -> int | None:
        """Free blocks this allocator can never hand out as things stand (external
        fragmentation), or None where every free block is usable. May be slow."""
        return None

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Gives the child a table sharing every block of the parent's (one more reference
        each). Mutates pool and tables. Default: refused (see ``supports_fork``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot share blocks between sequences")

    supports_fork: ClassVar[bool] = False

    def num_hole_blocks(self) -> int:
        """Holes in running sequences' tables (blocks given back while the sequence runs,
        see ``enginekit.interfaces.capabilities.HoleAllocator``). Pure."""
        return 0

    def num_reserved_blocks(self) -> int:
        """Blocks held by all tables together, a shared block once per table. Pure.

        The default walks every table; an allocator may keep a running count instead.
        """
        tables = self.kv.tables
        return sum(tables.num_blocks(s) for s in tables.seq_ids())

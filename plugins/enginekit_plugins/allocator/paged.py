"""``paged``: blocks on demand, one every block_size tokens (vLLM's PagedAttention)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from enginekit.config import AllocatorConfig
from enginekit.interfaces import Allocator, IntBatch, IntList, KVContext
from enginekit.request import Request


@dataclass
class PagedConfig(AllocatorConfig):
    name: str = "paged"


class PagedAllocator(Allocator):
    """A sequence holds exactly ceil(tokens / block_size) blocks, so it wastes less than one
    block. Blocks need not be contiguous: the block table maps logical to physical. Tables
    may hold holes anywhere (``release_range``, ``append_holes``: see
    ``enginekit.interfaces.capabilities.HoleAllocator``)."""

    Config = PagedConfig

    def __init__(self, config: PagedConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self._num_reserved_blocks = 0  # blocks in tables, holes excluded
        self._num_hole_blocks = 0

    def num_blocks_to_admit(self, request: Request, num_cached_blocks: int) -> int:
        return self.kv.spec.num_blocks_for(request.num_tokens) - num_cached_blocks

    def admit(self, request: Request, cached_block_ids: IntList) -> None:
        """Creates the table with the cached blocks only: the rest of the prompt's blocks
        come with each prefill chunk (the cache manager grows the table per chunk out of
        the ``num_blocks_to_admit`` blocks it promised the request at admission)."""
        self.kv.tables.add_sequence(request.seq_id, cached_block_ids)
        self._num_reserved_blocks += len(cached_block_ids)

    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        return self.kv.tables.num_blocks_to_grow(seq_ids, num_tokens)

    def grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> None:
        self._num_reserved_blocks += self.kv.tables.grow(self.kv.pool, seq_ids, num_tokens)

    def try_grow(
        self, seq_ids: IntBatch, num_tokens: IntBatch, make_room: Callable[[int], bool]
    ) -> bool:
        num_grown = self.kv.tables.grow_with(self.kv.pool, seq_ids, num_tokens, make_room)
        if num_grown is None:
            return False
        self._num_reserved_blocks += num_grown
        return True

    def release(self, seq_id: int) -> None:
        """Frees the table's blocks last first, so that its prefix stays cached longest."""
        tables = self.kv.tables
        self._num_hole_blocks -= tables.num_holes(seq_id)
        self._num_reserved_blocks -= tables.free_sequence(self.kv.pool, seq_id)

    def release_range(self, seq_id: int, first: int, end: int) -> int:
        """Gives back the sequence's blocks ``first .. end - 1``, leaving holes in its table;
        returns how many were still held. Mutates pool and tables."""
        block_ids = self.kv.tables.release_range(seq_id, first, end)
        self._num_hole_blocks += len(block_ids)
        self._num_reserved_blocks -= len(block_ids)
        self.kv.pool.free(block_ids)
        return len(block_ids)

    def append_holes(self, seq_id: int, num_holes: int) -> None:
        """Appends ``num_holes`` holes to the sequence's table. Mutates tables."""
        self.kv.tables.append_holes(seq_id, num_holes)
        self._num_hole_blocks += num_holes

    supports_fork = True

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        tables, pool = self.kv.tables, self.kv.pool
        block_ids = tables.fork(parent_seq_id, child_seq_id)
        pool.incref_all(block_ids)
        self._num_reserved_blocks += len(block_ids)
        self._num_hole_blocks += tables.num_holes(child_seq_id)

    def num_hole_blocks(self) -> int:
        return self._num_hole_blocks

    def num_reserved_blocks(self) -> int:
        return self._num_reserved_blocks

"""Forked sequences (parallel samples, beams): shared blocks and copy-on-write of the
partly filled block that more than one of them writes into."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit._native import BlockPool, BlockTables
    from enginekit.interfaces import Allocator


class ForkMixin:
    """The KVCacheManager's forking half; it uses the manager's pool, tables and room."""

    pool: BlockPool
    tables: BlockTables
    allocator: Allocator
    _shared_tails: dict[int, set[int]]
    _unpin_after_copy: list[int]
    num_reclaimable_blocks: Callable[[], int]
    make_room: Callable[[int], bool]
    add_block_copy: Callable[[int, int], None]

    def fork(self, parent: Request, child: Request) -> None:
        """Gives ``child`` the parent's blocks, shared. If the parent's last block is only
        partly filled, both will write into it: each but the last writer gets a copy
        (``copy_on_write``) before its write."""
        self.allocator.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        num_computed = parent.num_computed_tokens
        if num_computed % self.tables.block_size:
            tail = self.tables.block_id_at(parent.seq_id, num_computed // self.tables.block_size)
            self._shared_tails.setdefault(tail, {parent.seq_id}).add(child.seq_id)

    def _tail_writers(self, decodes: Sequence[Request]) -> list[tuple[Request, int, int]]:
        """(request, logical index, block) of each decode about to write into a block that
        another sequence will write into too."""
        shared = self._shared_tails
        if not shared:
            return []
        found = []
        for request in decodes:
            index, slot = divmod(request.num_computed_tokens, self.tables.block_size)
            if slot == 0:
                continue  # writes at the start of a fresh block
            block_id = self.tables.block_id_at(request.seq_id, index)
            writers = shared.get(block_id)
            if writers is not None and request.seq_id in writers:
                found.append((request, index, block_id))
        return found

    def try_copy_on_write(self, decodes: Sequence[Request]) -> bool:
        """Before ``decodes`` write their next token: each that would write into a block
        another sequence still writes into gets a copy of it (queued for the executor).
        Returns False, copying nothing, if the blocks for the copies are not there
        (cached blocks it evicted trying stay evicted)."""
        writers = self._tail_writers(decodes)
        num_copies = len(writers)  # an upper bound: the last writer of a block copies nothing
        if num_copies and (
            num_copies > self.num_reclaimable_blocks() or not self.make_room(num_copies)
        ):
            return False
        for request, index, block_id in writers:
            holders = self._shared_tails.get(block_id)
            if holders is None:
                continue  # the others copied it away in this same call: it owns the block
            holders.discard(request.seq_id)
            if len(holders) <= 1:
                del self._shared_tails[block_id]  # at most one writer left: it owns the block
            if not holders:
                continue  # this was the last writer: it writes in place
            (copy,) = self.pool.allocate(1)
            self.add_block_copy(block_id, copy)
            self.tables.set_block(request.seq_id, index, copy)
            # The table's reference to the source becomes the copy's pin, dropped once the
            # executor has copied it.
            self._unpin_after_copy.append(block_id)
        return True

    def _leave_shared_tails(self, seq_id: int) -> None:
        for block_id in [b for b, holders in self._shared_tails.items() if seq_id in holders]:
            holders = self._shared_tails[block_id]
            holders.discard(seq_id)
            if len(holders) <= 1:
                del self._shared_tails[block_id]

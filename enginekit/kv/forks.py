"""Forked sequences (parallel samples, beams): shared blocks, and copy-on-write of the
partly filled block that more than one of them writes into."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from enginekit.kv.block_ops import BlockOps
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit.interfaces import Allocator
    from enginekit.interfaces.structures import BlockPool, BlockTables


class TailWrite(NamedTuple):
    """A decode about to write into a block another sequence writes into too."""

    request: Request
    block_index: int  # the block's logical index in the request's table
    block_id: int


class SharedTails:
    """Owns which partly filled blocks forked sequences share: block -> the sequences that
    will write into it. Each writer but the last gets a copy before its first write (the
    copy is queued in ``block_ops``); the last writes in place."""

    def __init__(
        self, pool: BlockPool, tables: BlockTables, allocator: Allocator, block_ops: BlockOps
    ) -> None:
        self._pool = pool
        self._tables = tables
        self._allocator = allocator
        self._block_ops = block_ops
        self._writers: dict[int, set[int]] = {}

    def fork(self, parent: Request, child: Request) -> None:
        """Gives ``child`` the parent's blocks, shared (through the allocator), and its
        computed tokens. Both will write into every block past the parent's full ones: a
        partly filled last block, and any block already held for tokens to come (a
        sequence swapped in mid-decode holds one for its next token)."""
        self._allocator.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        tables = self._tables
        first = parent.num_computed_tokens // tables.block_size
        for index in range(first, tables.num_blocks(parent.seq_id)):
            block_id = tables.block_id_at(parent.seq_id, index)
            if block_id >= 0:
                self._writers.setdefault(block_id, {parent.seq_id}).add(child.seq_id)

    def tail_writes(self, decodes: Sequence[Request]) -> list[TailWrite]:
        """The decodes about to write into a block another sequence writes into too. Pure."""
        if not self._writers:
            return []
        found = []
        block_size = self._tables.block_size
        for request in decodes:
            # The table has grown to hold the token: its block is a fresh one unless it
            # was shared by a fork.
            index = request.num_computed_tokens // block_size
            if index >= self._tables.num_blocks(request.seq_id):
                continue  # not grown yet: its block will be a fresh one
            block_id = self._tables.block_id_at(request.seq_id, index)
            writers = self._writers.get(block_id)
            if writers is not None and request.seq_id in writers:
                found.append(TailWrite(request, index, block_id))
        return found

    def copy_on_write(self, writes: Sequence[TailWrite]) -> None:
        """Gives each of ``writes`` that another sequence still writes into a fresh copy of
        the block (one free block each: the caller made the room). The table's reference to
        the source becomes the copy's pin, dropped once the executor has copied it."""
        for request, block_index, block_id in writes:
            writers = self._writers.get(block_id)
            if writers is None:
                continue  # the others copied it away in this same call: it owns the block
            writers.discard(request.seq_id)
            if len(writers) <= 1:
                del self._writers[block_id]  # at most one writer left: it owns the block
            if not writers:
                continue  # this was the last writer: it writes in place
            (copy,) = self._pool.allocate(1)
            self._block_ops.copy(block_id, copy)
            self._tables.set_block(request.seq_id, block_index, copy)

    def forget(self, seq_id: int) -> None:
        """The sequence released its blocks: it writes into none of them."""
        if not self._writers:
            return
        for block_id in [b for b, w in self._writers.items() if seq_id in w]:
            writers = self._writers[block_id]
            writers.discard(seq_id)
            if len(writers) <= 1:
                del self._writers[block_id]

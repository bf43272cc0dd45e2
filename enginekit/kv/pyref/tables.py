"""Pure-Python twin of ``enginekit._native.BlockTables`` (rust/block_table/).

Written for reading rather than speed: the executable specification the Rust class is tested
against, operation by operation (see ``enginekit.kv.pyref`` for the conventions).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from enginekit.errors import KVCacheError, OutOfBlocksError
from enginekit.interfaces.structures import IntBatch
from enginekit.kv.pyref.args import instance_arg, int_batch, int_list, known_seq_id, new_seq_id
from enginekit.kv.pyref.buffer import HOLE, int32_view, write_rows
from enginekit.kv.pyref.pool import (
    _INT32_MAX,
    _INT32_MIN,
    _MAX_HASH,
    PyBlockPool,
    _check_count,
    _check_hash,
)

__all__ = ["HOLE", "MAX_TABLE_LEN", "PyBlockTables"]

MAX_TABLE_LEN = 1 << 26
"""Most entries append_holes lets a table reach (rust/error.rs): a context of 2**26 tokens at
block size 1. Larger counts are refused up front."""


class PyBlockTables:
    """Per-sequence lists of physical block ids (logical block i -> physical block).

    Holds no references itself: callers incref and free in the BlockPool. ``grow`` and
    ``cache_blocks`` take the pool to do a whole batch in one call.

    Ids and validation, where the stub leaves them open (the Rust core does the same):

    - seq ids are ints in [0, 2**64). Naming a sequence that does not exist (a negative id
      included) raises KVCacheError; creating one (add_sequence, fork's child) with an id
      outside that range raises ValueError.
    - table entries are block ids in [0, 2**31), so that any table exports to int32; another
      value raises ValueError. Whether they lie inside a pool is check_integrity's business.
    - arguments are checked in order, left to right, before the state is looked at; a bad
      count (negative num_tokens, width, first or end; a num_tokens of 2**64 or more) raises
      ValueError; a pool that is no PyBlockPool raises TypeError.

    Holes: release_range turns entries into holes
    (HOLE, i.e. -1), for a sliding window that drops blocks a sequence can no longer attend
    to, possibly keeping attention-sink blocks in front of them; append_holes recreates them
    for a sequence brought back from a swap. A hole keeps its logical slot (num_blocks counts
    it, grow does not refill it) but references no block, so the lists handed back for the
    caller to free or incref (remove_sequence, fork) skip holes. Holes may sit
    anywhere in a table; each table's count of them is kept, so num_holes is O(1).
    """

    def __init__(self, block_size: int) -> None:
        """Raises ValueError if block_size is not in [1, 2**64)."""
        block_size = operator.index(block_size)
        if not 1 <= block_size <= _MAX_HASH:
            raise ValueError(f"block_size must be in [1, 2**64), got {block_size}")
        self._block_size = block_size
        self._tables: dict[int, list[int]] = {}
        self._num_holes: dict[int, int] = {}  # seq_id -> HOLE entries in its table

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_sequences(self) -> int:
        return len(self._tables)

    # ---- argument checks ------------------------------------------------------------------

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables.get(operator.index(seq_id))
        if table is None:
            raise KVCacheError(f"unknown sequence {seq_id}")
        return table

    @staticmethod
    def _entries(block_ids: Sequence[int]) -> list[int]:
        def check(block_id: int) -> int:
            if not 0 <= block_id <= _INT32_MAX:
                raise ValueError(f"block id {block_id} is not in [0, 2**31)")
            return block_id

        return int_list(block_ids, "block_ids", check)

    @staticmethod
    def _index(seq_id: int, table: list[int], index: int) -> int:
        index = operator.index(index)
        if not 0 <= index < len(table):
            raise KVCacheError(
                f"index {index} out of range for sequence {seq_id} of {len(table)} blocks"
            )
        return index

    @staticmethod
    def _seq_ids(seq_ids: Any, arg: Callable[..., list[int]] = int_list) -> list[int]:
        """A batch's seq ids (read by ``arg``); KVCacheError for one that is not a u64
        (unknown before anything else is checked)."""
        return arg(seq_ids, "seq_ids", known_seq_id)

    def _batch(self, seq_ids: IntBatch, num_tokens: IntBatch) -> list[tuple[int, int]]:
        """(seq_id, blocks wanted) pairs (each argument a list, a tuple or an int64 array);
        ValueError for a num_tokens outside [0, 2**64) or lengths that differ, then
        KVCacheError for an unknown seq_id."""

        def check_tokens(n: int) -> int:
            n = _check_count("num_tokens", n)
            if n > _MAX_HASH:
                raise ValueError(f"num_tokens {n} is not in [0, 2**64)")
            return n

        seqs = self._seq_ids(seq_ids, int_batch)
        tokens = int_batch(num_tokens, "num_tokens", check_tokens)
        if len(seqs) != len(tokens):
            raise ValueError(f"{len(seqs)} seq_ids but {len(tokens)} num_tokens in one batch")
        for s in seqs:
            self._table(s)
        return [(s, -(-n // self._block_size)) for s, n in zip(seqs, tokens, strict=True)]

    # ---- one sequence ---------------------------------------------------------------------

    def add_sequence(self, seq_id: int, block_ids: Sequence[int] = ()) -> None:
        """Raises KVCacheError if seq_id already exists."""
        seq_id = new_seq_id(seq_id)
        entries = self._entries(block_ids)
        if seq_id in self._tables:
            raise KVCacheError(f"sequence {seq_id} already exists")
        self._tables[seq_id] = entries
        self._num_holes[seq_id] = 0

    def remove_sequence(self, seq_id: int) -> list[int]:
        """Forgets the sequence; returns its blocks in logical order, holes skipped (the caller
        frees them).

        Raises KVCacheError for an unknown seq_id (as do all methods below).
        """
        table = self._table(seq_id)
        del self._tables[operator.index(seq_id)]
        del self._num_holes[operator.index(seq_id)]
        return _held(table)

    def free_sequence(self, pool: PyBlockPool, seq_id: int) -> int:
        """Forgets the sequence and frees its blocks into ``pool``, last logical block first
        (evictable ones leave the LRU order tail first, prefix last), holes skipped;
        returns how many: ``remove_sequence`` and ``pool.free`` of its blocks reversed. All
        or nothing: raises KVCacheError for an unknown seq_id or a block the pool holds no
        reference on, changing neither."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        block_ids = _held(self._table(seq_id))
        block_ids.reverse()
        pool.free(block_ids)
        self.remove_sequence(seq_id)
        return len(block_ids)

    def append_blocks(self, seq_id: int, block_ids: Sequence[int]) -> None:
        """Appends existing blocks, in order; each id stands for a reference the caller holds
        and hands over (no ref_count changes). Raises ValueError for a block id not in
        [0, 2**31), changing nothing."""
        table = self._table(seq_id)
        table.extend(self._entries(block_ids))

    def append_holes(self, seq_id: int, num_holes: int) -> None:
        """Appends num_holes holes: logical slots that hold no block (a sequence restored with
        the blocks it had released still released).

        Raises ValueError if num_holes is negative or the table would pass MAX_TABLE_LEN
        (2**26) entries, MemoryError if the host cannot hold them.
        """
        table = self._table(seq_id)
        num_holes = _check_count("num_holes", num_holes)
        if num_holes > MAX_TABLE_LEN - len(table):
            raise ValueError(
                f"cannot append {num_holes} holes to sequence {seq_id} of {len(table)} blocks: "
                "a table holds at most 2**26 entries"
            )
        table.extend([HOLE] * num_holes)
        self._num_holes[operator.index(seq_id)] += num_holes

    def release_range(self, seq_id: int, first: int, end: int) -> list[int]:
        """Makes entries first .. end - 1 holes; returns the blocks that were there and not
        holes yet, in logical order (the caller frees them). Entries already holes are
        skipped, so releasing a range again returns [].

        Raises ValueError if first or end is negative, then KVCacheError unless
        first <= end <= the table's length.
        """
        table = self._table(seq_id)
        first = _check_count("first", first)
        end = _check_count("end", end)
        if not first <= end <= len(table):
            raise KVCacheError(
                f"cannot release blocks [{first}, {end}) of sequence {seq_id}: it has {len(table)}"
            )
        released = _held(table[first:end])
        table[first:end] = [HOLE] * (end - first)
        self._num_holes[operator.index(seq_id)] += len(released)
        return released

    def num_holes(self, seq_id: int) -> int:
        """Holes in the table, wherever they are."""
        self._table(seq_id)
        return self._num_holes[operator.index(seq_id)]

    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """The child gets a copy of the parent's table, holes included; returns its blocks,
        holes skipped (the caller increfs them).

        Raises KVCacheError if the parent is unknown or the child exists.
        """
        parent = self._table(parent_id)
        child_id = new_seq_id(child_id)
        if child_id in self._tables:
            raise KVCacheError(f"fork into existing sequence {child_id}")
        self._tables[child_id] = list(parent)
        self._num_holes[child_id] = self._num_holes[operator.index(parent_id)]
        return _held(parent)

    def set_block(self, seq_id: int, index: int, block_id: int) -> int:
        """Replaces logical block ``index`` (copy-on-write); returns the old block id.

        Raises KVCacheError if index is out of range (negative indices are out of range) or
        a hole (checked before the new block id).
        """
        table = self._table(seq_id)
        index = self._index(seq_id, table, index)
        if table[index] == HOLE:
            raise KVCacheError(f"block {index} of sequence {seq_id} is a hole")
        (block_id,) = self._entries([block_id])
        old = table[index]
        table[index] = block_id
        return old

    def block_ids(self, seq_id: int) -> list[int]:
        """The table, holes as -1."""
        return list(self._table(seq_id))

    def block_id_at(self, seq_id: int, index: int) -> int:
        """The entry at index, -1 for a hole. Raises KVCacheError if index is out of range
        (negative indices are out of range)."""
        table = self._table(seq_id)
        return table[self._index(seq_id, table, index)]

    def num_blocks(self, seq_id: int) -> int:
        """Logical length: holes count."""
        return len(self._table(seq_id))

    # ---- batches --------------------------------------------------------------------------

    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)).

        A sequence listed twice counts twice (so this is an upper bound on what grow
        allocates); the sum is exact, past 2**64 too. Raises ValueError if the two
        sequences differ in length.
        """
        return self._num_to_grow(self._batch(seq_ids, num_tokens))

    def _num_to_grow(self, batch: list[tuple[int, int]]) -> int:
        return sum(max(0, want - len(self._tables[s])) for s, want in batch)

    def grow(self, pool: PyBlockPool, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Allocates from ``pool`` and appends so that each sequence holds at least
        ceil(num_tokens / block_size) blocks; returns the number of blocks allocated.

        Sequences are served in batch order, each taking the next blocks the pool hands out;
        a sequence listed twice grows to the larger of its two targets. All or nothing: raises
        OutOfBlocksError if the batch needs more than pool.num_free_blocks, and KVCacheError
        for an unknown seq_id, changing nothing.
        """
        pool = instance_arg(pool, "pool", PyBlockPool)
        return self._grow(pool, self._batch(seq_ids, num_tokens))

    def _grow(self, pool: PyBlockPool, batch: list[tuple[int, int]]) -> int:
        """``grow`` of a checked batch of (seq_id, blocks wanted)."""
        target: dict[int, int] = {}
        for s, want in batch:
            target[s] = max(target.get(s, 0), want)
        needed = sum(max(0, want - len(self._tables[s])) for s, want in target.items())
        if needed > pool.num_free_blocks:
            raise OutOfBlocksError(
                f"cannot allocate {needed} blocks: only {pool.num_free_blocks} free"
            )
        for s, want in batch:
            table = self._tables[s]
            table.extend(pool.allocate(max(0, want - len(table))))
        return needed

    def grow_with(
        self,
        pool: PyBlockPool,
        seq_ids: IntBatch,
        num_tokens: IntBatch,
        make_room: Callable[[int], bool],
    ) -> int | None:
        """``grow``, first asking ``make_room(n)`` for the ``n`` blocks the batch needs (as
        ``num_blocks_to_grow`` counts them) when ``n > 0``: returns the blocks allocated, or
        None, changing nothing, if ``make_room`` returns false. The batch is read once,
        before the call back (which may use the tables and the pool); after it, only the
        sequences that needed blocks are read again and grown (``grow`` of that part of
        the batch: one that ``make_room`` removed raises KVCacheError, nothing grown)."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        tables = self._tables
        batch = self._batch(seq_ids, num_tokens)
        growing = [(s, want) for s, want in batch if want > len(tables[s])]
        needed = self._num_to_grow(growing)
        if needed == 0:
            return 0
        if not make_room(needed):
            return None
        for s, _ in growing:
            self._table(s)
        return self._grow(pool, growing)

    def cache_blocks(
        self, pool: PyBlockPool, seq_id: int, first_index: int, block_hashes: Sequence[int]
    ) -> int:
        """Publishes blocks in the pool's hash map: for each i, block
        block_id_at(seq_id, first_index + i) is recorded as holding the content named by
        block_hashes[i], unless it already carries that hash or the hash names another block;
        returns how many were recorded. Checked first: raises KVCacheError if the range
        passes the table's end (or first_index is negative), and ValueError if a hash is not
        in [0, 2**64), changing nothing; then KVCacheError if the range holds a hole. If a
        recording raises midway (KVCacheError: a block with ref_count 0, outside the pool, or
        carrying another hash), the recordings this call made are undone before the exception
        propagates, so the call changes nothing."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        table = self._table(seq_id)
        first_index = operator.index(first_index)
        if not 0 <= first_index <= _MAX_HASH:
            raise KVCacheError(f"first_index {first_index} out of range for sequence {seq_id}")
        hashes = int_list(block_hashes, "block_hashes", _check_hash)
        if first_index + len(hashes) > len(table):
            raise KVCacheError(
                f"cache_blocks range [{first_index}, {first_index + len(hashes)}) passes the "
                f"end of sequence {seq_id} of {len(table)} blocks"
            )
        for offset in range(len(hashes)):
            if table[first_index + offset] == HOLE:
                raise KVCacheError(f"block {first_index + offset} of sequence {seq_id} is a hole")
        parents: list[int | None] = []
        if pool.is_recording_accesses and hashes:
            # Each block's parent is the one before it: the batch's previous hash, or for
            # the first, the hash the table's block before it carries (if any).
            parents = [_hash_of(pool, table[first_index - 1]) if first_index else None]
            parents += hashes[:-1]
        return _record_hashes(pool, table[first_index : first_index + len(hashes)], hashes, parents)

    def cache_blocks_at(
        self,
        pool: PyBlockPool,
        seq_ids: Sequence[int],
        block_indices: Sequence[int],
        block_hashes: Sequence[int],
    ) -> int:
        """``cache_blocks`` of one block for each i: block ``block_indices[i]`` of sequence
        ``seq_ids[i]`` under ``block_hashes[i]`` (a step's decodes that filled a block, in
        one call); returns how many were recorded. Checked first, in order: the arguments'
        types and values (KVCacheError for a seq id that is not a u64, ValueError for a
        negative index or a hash not in [0, 2**64)), ValueError if the three lengths differ,
        then per entry KVCacheError for an unknown sequence, an index past its table or a
        hole. A recording that raises midway undoes this call's recordings."""
        return self._cache_blocks_after(pool, seq_ids, block_indices, block_hashes, ())

    def _cache_blocks_after(
        self,
        pool: PyBlockPool,
        seq_ids: Sequence[int],
        block_indices: Sequence[int],
        block_hashes: Sequence[int],
        parents: Sequence[int | None],
    ) -> int:
        """``cache_blocks_at``, with each block's parent hash for the pool's access log
        (``parents[i]``; empty: the hash the table's block before it carries, if any)."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        seqs = self._seq_ids(seq_ids)
        indices = [
            min(v, _MAX_HASH)  # past u64 reads as u64's largest, as in the Rust binding
            for v in int_list(
                block_indices, "block_indices", lambda n: _check_count("block_indices", n)
            )
        ]
        hashes = int_list(block_hashes, "block_hashes", _check_hash)
        if not len(seqs) == len(indices) == len(hashes):
            raise ValueError(
                "seq_ids, block_indices and block_hashes differ in length "
                f"({len(seqs)}, {len(indices)}, {len(hashes)})"
            )
        block_ids = []
        for seq_id, index in zip(seqs, indices, strict=True):
            table = self._table(seq_id)
            if index >= len(table):
                raise KVCacheError(
                    f"index {index} out of range for sequence {seq_id} with {len(table)} blocks"
                )
            if table[index] == HOLE:
                raise KVCacheError(f"block {index} of sequence {seq_id} is a hole")
            block_ids.append(table[index])
        if not parents and pool.is_recording_accesses:
            parents = [
                _hash_of(pool, self._table(s)[i - 1]) if i else None
                for s, i in zip(seqs, indices, strict=True)
            ]
        return _record_hashes(pool, block_ids, hashes, parents)

    def max_num_blocks(self, seq_ids: Sequence[int]) -> int:
        """The longest table among seq_ids (0 for an empty batch)."""
        return max((len(self._table(s)) for s in self._seq_ids(seq_ids)), default=0)

    def export_into(self, seq_ids: Sequence[int], out: Any, width: int, pad: int = -1) -> None:
        """Writes the batch's tables row by row into ``out``, a writable C-contiguous buffer of
        int32 (e.g. a numpy array of shape (len(seq_ids), width)); rows shorter than width are
        padded with ``pad``, and holes are written as ``pad`` too. Only the first
        len(seq_ids) * width elements are written.

        Checks everything before writing anything, in this order: width >= 0 and pad in the
        int32 range (ValueError); ``out`` writable, C-contiguous and int32 (ValueError) and
        large enough (ValueError); then each seq_id in batch order: unknown (KVCacheError) or
        longer than width (ValueError).
        """
        seqs = self._seq_ids(seq_ids)
        width = _check_count("width", width)
        pad = operator.index(pad)
        if not _INT32_MIN <= pad <= _INT32_MAX:
            raise ValueError(f"pad {pad} is not in [-2**31, 2**31)")
        flat = int32_view(out)
        if len(flat) < len(seqs) * width:
            raise ValueError(
                f"out holds {len(flat)} int32 values, the batch needs {len(seqs) * width}"
            )
        tables = []
        for s in seqs:
            table = self._table(s)
            if len(table) > width:
                raise ValueError(f"sequence {s} has {len(table)} blocks, width is {width}")
            tables.append(table)
        write_rows(flat, tables, width, pad)

    def seq_ids(self) -> list[int]:
        """Every sequence id, ascending."""
        return sorted(self._tables)

    def check_integrity(self, pool: PyBlockPool | None = None) -> None:
        """Raises KVCacheError if a table holds an id outside the pool or a block with
        ref_count 0; without a pool, checks only that ids are valid entries (in [0, 2**31)).
        Holes may sit anywhere, but each table's hole count must equal its holes."""
        if pool is not None:
            instance_arg(pool, "pool", PyBlockPool)
        for seq_id in sorted(self._tables):
            table = self._tables[seq_id]
            for index, block_id in enumerate(table):
                where = f"BlockTables integrity: sequence {seq_id} block {index}"
                if block_id == HOLE:
                    continue
                if not 0 <= block_id <= _INT32_MAX:
                    raise KVCacheError(f"{where} holds invalid id {block_id}")
                if pool is None:
                    continue
                if block_id >= pool.num_blocks:
                    raise KVCacheError(
                        f"{where} holds {block_id}, outside a pool of {pool.num_blocks}"
                    )
                if pool.ref_count(block_id) == 0:
                    raise KVCacheError(f"{where} holds {block_id}, whose ref_count is 0")
            num_holes = table.count(HOLE)
            if num_holes != self._num_holes[seq_id]:
                raise KVCacheError(
                    f"BlockTables integrity: sequence {seq_id} counts "
                    f"{self._num_holes[seq_id]} holes but has {num_holes}"
                )


def _held(entries: list[int]) -> list[int]:
    """The entries that are blocks, holes skipped."""
    return [b for b in entries if b != HOLE]


def _hash_of(pool: PyBlockPool, block_id: int) -> int | None:
    """The hash block ``block_id`` carries (None: a hole, or not cached)."""
    return None if block_id == HOLE else pool._hashes[block_id]


def _record_hashes(
    pool: PyBlockPool,
    block_ids: list[int],
    hashes: list[int],
    parents: Sequence[int | None] = (),
) -> int:
    """``pool._cache_block(block_ids[i], hashes[i], parents[i])`` for each i (a missing
    parent is None); returns how many were recorded. If one raises, the ones this call
    recorded are undone first (and logged as evicted again)."""
    recorded: list[int] = []
    try:
        for i, (block_id, block_hash) in enumerate(zip(block_ids, hashes, strict=True)):
            parent = parents[i] if i < len(parents) else None
            if pool._cache_block(block_id, block_hash, parent):
                recorded.append(block_id)
    except Exception:
        for block_id in reversed(recorded):
            pool._uncache(block_id)
        raise
    return len(recorded)

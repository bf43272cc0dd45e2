"""Pure-Python twins of ``enginekit._native.BlockPool`` and ``BlockTables``.

Same methods, properties, orderings and exception classes as the Rust core (see
``enginekit/_native.pyi``), written for reading rather than speed: this module is the executable
specification the Rust classes are tested against, operation by operation.

Conventions shared by both classes:

- Every id is a plain int. An id outside the structure (negative, or >= num_blocks) is
  "unknown" and raises KVCacheError, never IndexError.
- A call that raises changes nothing: every method validates its whole input before mutating.
- ``check_integrity()`` re-derives every invariant from scratch and raises KVCacheError naming
  the first one that is broken.
"""

from __future__ import annotations

import operator
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from enginekit.errors import KVCacheError, OutOfBlocksError

__all__ = ["PyBlockPool", "PyBlockTables"]

_MAX_HASH = (1 << 64) - 1
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


def _check_hash(block_hash: int) -> int:
    block_hash = operator.index(block_hash)
    if not 0 <= block_hash <= _MAX_HASH:
        raise ValueError(f"block_hash {block_hash} is not in [0, 2**64)")
    return block_hash


def _check_count(name: str, n: int) -> int:
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


class PyBlockPool:
    """A fixed set of KV blocks with reference counts, a free list and a prefix-hash map.

    Every block is in exactly one state:

    - used: ref_count > 0 (it may also carry a hash, i.e. be cached);
    - evictable: ref_count == 0 and cached; kept in LRU order (least recently released first);
    - free: ref_count == 0 and not cached; kept in a LIFO stack (the last freed is the next
      allocated; a new pool hands out 0, 1, 2, ... in that order).

    State (all private): ``_ref_counts[b]``, ``_hashes[b]`` (the hash block b carries, or None),
    ``_hash_to_block`` (the inverse of ``_hashes`` over cached blocks), ``_free_stack`` (top =
    last element = next allocated) and ``_lru`` (an OrderedDict used as an ordered set, oldest
    first).
    """

    def __init__(self, num_blocks: int) -> None:
        """Raises ValueError if num_blocks < 1 (or > 2**31 - 1: block ids are int32)."""
        num_blocks = operator.index(num_blocks)
        if not 1 <= num_blocks <= _INT32_MAX:
            raise ValueError(f"num_blocks must be in [1, 2**31 - 1], got {num_blocks}")
        self._num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free_stack = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()

    # ---- counters -------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable without eviction."""
        return len(self._free_stack)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._lru)

    @property
    def num_used_blocks(self) -> int:
        return self._num_blocks - len(self._free_stack) - len(self._lru)

    # ---- helpers --------------------------------------------------------------------------

    def _known(self, block_id: int) -> int:
        block_id = operator.index(block_id)
        if not 0 <= block_id < self._num_blocks:
            raise KVCacheError(f"unknown block id {block_id} (pool has {self._num_blocks})")
        return block_id

    def _is_evictable(self, block_id: int) -> bool:
        return block_id in self._lru

    def _release(self, block_id: int) -> None:
        """A block whose ref_count just reached 0 joins the LRU list or the free stack."""
        if self._hashes[block_id] is not None:
            self._lru[block_id] = None
        else:
            self._free_stack.append(block_id)

    def _uncache(self, block_id: int) -> None:
        """Drops the hash of a used block (undo of a successful cache_block)."""
        block_hash = self._hashes[block_id]
        assert block_hash is not None and self._ref_counts[block_id] > 0
        del self._hash_to_block[block_hash]
        self._hashes[block_id] = None

    # ---- allocation and references --------------------------------------------------------

    def allocate(self, num_blocks: int) -> list[int]:
        """Pops num_blocks blocks off the free stack (never evicts); each gets ref_count 1.

        Raises OutOfBlocksError if num_blocks > num_free_blocks, ValueError if negative.
        """
        num_blocks = _check_count("num_blocks", num_blocks)
        if num_blocks > len(self._free_stack):
            raise OutOfBlocksError(f"asked for {num_blocks} blocks, {len(self._free_stack)} free")
        block_ids = [self._free_stack.pop() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._ref_counts[block_id] = 1
        return block_ids

    def incref(self, block_id: int) -> None:
        """Adds a reference. An evictable block leaves the LRU list (a prefix-cache hit).

        Raises KVCacheError for an unknown id or a free block.
        """
        block_id = self._known(block_id)
        if self._ref_counts[block_id] == 0:
            if not self._is_evictable(block_id):
                raise KVCacheError(f"incref of free block {block_id}")
            del self._lru[block_id]
        self._ref_counts[block_id] += 1

    def decref(self, block_id: int) -> None:
        """Drops a reference. At zero a cached block becomes evictable (most recent end of the
        LRU list) and an uncached block is pushed on the free stack.

        Raises KVCacheError for an unknown id or a block whose ref_count is already 0.
        """
        block_id = self._known(block_id)
        if self._ref_counts[block_id] == 0:
            raise KVCacheError(f"decref of block {block_id} whose ref_count is 0")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._release(block_id)

    def free(self, block_ids: Sequence[int]) -> None:
        """decref of every id, in order. Checked as a whole first (duplicates counted), so on
        error (double free, unknown id) nothing changes."""
        ids = [self._known(b) for b in block_ids]
        for block_id, times in Counter(ids).items():
            if times > self._ref_counts[block_id]:
                raise KVCacheError(
                    f"free drops {times} references of block {block_id}, "
                    f"which has {self._ref_counts[block_id]}"
                )
        for block_id in ids:
            self.decref(block_id)

    # ---- LRU list -------------------------------------------------------------------------

    def touch(self, block_id: int) -> None:
        """Moves an evictable block to the most recent end of the LRU list.

        Raises KVCacheError if the block is not evictable (including an unknown id).
        """
        block_id = self._known(block_id)
        if not self._is_evictable(block_id):
            raise KVCacheError(f"touch of block {block_id}, which is not evictable")
        self._lru.move_to_end(block_id)

    def evict(self, block_id: int) -> int:
        """Evictable -> free: drops the block's hash and returns it (the hash). The block is
        pushed on the free stack, so it is the next one allocated.

        Raises KVCacheError if the block is not evictable (including an unknown id).
        """
        block_id = self._known(block_id)
        if not self._is_evictable(block_id):
            raise KVCacheError(f"evict of block {block_id}, which is not evictable")
        del self._lru[block_id]
        block_hash = self._hashes[block_id]
        assert block_hash is not None
        del self._hash_to_block[block_hash]
        self._hashes[block_id] = None
        self._free_stack.append(block_id)
        return block_hash

    def evict_lru(self, num_blocks: int) -> list[int]:
        """Evicts the num_blocks least recently released evictable blocks; returns their ids,
        oldest first (each pushed on the free stack in that order, so the newest of them is
        allocated first). Raises OutOfBlocksError if num_blocks > num_evictable_blocks,
        ValueError if negative."""
        num_blocks = _check_count("num_blocks", num_blocks)
        if num_blocks > len(self._lru):
            raise OutOfBlocksError(
                f"asked to evict {num_blocks} blocks, {len(self._lru)} evictable"
            )
        victims = list(self._lru)[:num_blocks]
        for block_id in victims:
            self.evict(block_id)
        return victims

    # ---- prefix-hash map ------------------------------------------------------------------

    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Records that a used block holds the content named by block_hash.

        Returns True if recorded; False, changing nothing, if the hash already names another
        block (duplicate content) or this block already carries this hash.
        Raises KVCacheError for an unknown id, a block with ref_count 0, or a block that
        already carries a different hash; ValueError if block_hash is not in [0, 2**64).
        Checked in this order: unknown id, hash range, the block's own state, and only then the
        hash map (so a block carrying another hash raises even if block_hash is taken).
        """
        block_id = self._known(block_id)
        block_hash = _check_hash(block_hash)
        if self._ref_counts[block_id] == 0:
            raise KVCacheError(f"cache_block of block {block_id}, whose ref_count is 0")
        current = self._hashes[block_id]
        if current is not None:
            if current == block_hash:
                return False
            raise KVCacheError(
                f"block {block_id} already carries hash {current:#x}, not {block_hash:#x}"
            )
        if block_hash in self._hash_to_block:
            return False
        self._hashes[block_id] = block_hash
        self._hash_to_block[block_hash] = block_id
        return True

    def lookup(self, block_hash: int) -> int | None:
        """The block cached under block_hash, or None (also for a value that is not a valid
        hash). Changes nothing."""
        return self._hash_to_block.get(operator.index(block_hash))

    def lookup_prefix(self, block_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of leading hashes that are all cached. Changes nothing."""
        block_ids = []
        for block_hash in block_hashes:
            block_id = self.lookup(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    # ---- per-block queries ----------------------------------------------------------------

    def block_hash(self, block_id: int) -> int | None:
        """The hash a block carries, or None. Raises KVCacheError for an unknown id."""
        return self._hashes[self._known(block_id)]

    def ref_count(self, block_id: int) -> int:
        """Raises KVCacheError for an unknown id."""
        return self._ref_counts[self._known(block_id)]

    # ---- whole-state views ----------------------------------------------------------------

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order allocate would hand them out."""
        return self._free_stack[::-1]

    def evictable_block_ids(self) -> list[int]:
        """Evictable blocks, least recently released first."""
        return list(self._lru)

    def ref_counts(self) -> list[int]:
        """ref_count of every block, indexed by block id."""
        return list(self._ref_counts)

    def cached_blocks(self) -> dict[int, int]:
        """hash -> block id for every cached block (used or evictable)."""
        return dict(self._hash_to_block)

    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: every block in exactly one
        state; list lengths match the counters; LRU links consistent; the hash map and the
        per-block hashes mirror each other; evictable blocks are exactly the cached blocks
        with ref_count 0."""
        n = self._num_blocks

        def broken(what: str) -> KVCacheError:
            return KVCacheError(f"BlockPool integrity: {what}")

        if len(self._ref_counts) != n or len(self._hashes) != n:
            raise broken("per-block arrays do not have num_blocks entries")
        for block_id, rc in enumerate(self._ref_counts):
            if rc < 0:
                raise broken(f"block {block_id} has negative ref_count {rc}")
        in_free = Counter(self._free_stack)
        for block_id, times in in_free.items():
            if not 0 <= block_id < n:
                raise broken(f"free stack holds unknown id {block_id}")
            if times > 1:
                raise broken(f"block {block_id} is {times} times on the free stack")
        for block_id in self._lru:
            if not 0 <= block_id < n:
                raise broken(f"LRU list holds unknown id {block_id}")
        for block_id in range(n):
            states = [
                name
                for name, holds in (
                    ("used", self._ref_counts[block_id] > 0),
                    ("evictable", block_id in self._lru),
                    ("free", block_id in in_free),
                )
                if holds
            ]
            if len(states) != 1:
                raise broken(f"block {block_id} is in states {states or 'none'}")
            cached = self._hashes[block_id] is not None
            if states == ["free"] and cached:
                raise broken(f"free block {block_id} carries a hash")
            if states == ["evictable"] and not cached:
                raise broken(f"evictable block {block_id} carries no hash")
        if self.num_used_blocks + len(self._free_stack) + len(self._lru) != n:
            raise broken("counters do not add up to num_blocks")
        for block_hash, block_id in self._hash_to_block.items():
            if not 0 <= block_id < n or self._hashes[block_id] != block_hash:
                raise broken(f"hash map entry {block_hash:#x} -> {block_id} is not mirrored")
        num_cached = sum(h is not None for h in self._hashes)
        if num_cached != len(self._hash_to_block):
            raise broken("per-block hashes and the hash map differ in size")


class PyBlockTables:
    """Per-sequence lists of physical block ids (logical block i -> physical block).

    Holds no references itself: callers incref/decref in the BlockPool. ``grow`` and
    ``cache_blocks`` take the pool to do a whole batch in one call.

    Ids and validation, where the stub leaves them open (the Rust core does the same):

    - seq ids are ints in [0, 2**64). Naming a sequence that does not exist (a negative id
      included) raises KVCacheError; creating one (add_sequence, fork's child) with an id
      outside that range raises ValueError.
    - table entries are block ids in [0, 2**31), so that any table exports to int32; another
      value raises ValueError. Whether they lie inside a pool is check_integrity's business.
    - arguments are checked in order, left to right, before the state is looked at; a bad
      count (negative num_blocks, num_tokens or width) raises ValueError.
    """

    def __init__(self, block_size: int) -> None:
        """Raises ValueError if block_size < 1."""
        block_size = operator.index(block_size)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._block_size = block_size
        self._tables: dict[int, list[int]] = {}

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
    def _new_seq_id(seq_id: int) -> int:
        seq_id = operator.index(seq_id)
        if not 0 <= seq_id <= _MAX_HASH:
            raise ValueError(f"sequence id {seq_id} is not in [0, 2**64)")
        return seq_id

    @staticmethod
    def _entries(block_ids: Sequence[int]) -> list[int]:
        entries = [operator.index(b) for b in block_ids]
        for block_id in entries:
            if not 0 <= block_id <= _INT32_MAX:
                raise ValueError(f"block id {block_id} is not in [0, 2**31)")
        return entries

    @staticmethod
    def _index(seq_id: int, table: list[int], index: int) -> int:
        index = operator.index(index)
        if not 0 <= index < len(table):
            raise KVCacheError(
                f"index {index} out of range for sequence {seq_id} of {len(table)} blocks"
            )
        return index

    def _batch(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[tuple[int, int]]:
        """(seq_id, blocks wanted) pairs; ValueError for a negative num_tokens or lengths that
        differ, then KVCacheError for an unknown seq_id."""
        seqs = [operator.index(s) for s in seq_ids]
        for s in seqs:
            if s < 0:
                raise KVCacheError(f"unknown sequence {s}")
        tokens = [_check_count("num_tokens", n) for n in num_tokens]
        if len(seqs) != len(tokens):
            raise ValueError(f"{len(seqs)} seq_ids but {len(tokens)} num_tokens in one batch")
        for s in seqs:
            self._table(s)
        return [(s, -(-n // self._block_size)) for s, n in zip(seqs, tokens, strict=True)]

    # ---- one sequence ---------------------------------------------------------------------

    def has_sequence(self, seq_id: int) -> bool:
        return operator.index(seq_id) in self._tables

    def add_sequence(self, seq_id: int, block_ids: Sequence[int] = ()) -> None:
        """Raises KVCacheError if seq_id already exists."""
        seq_id = self._new_seq_id(seq_id)
        entries = self._entries(block_ids)
        if seq_id in self._tables:
            raise KVCacheError(f"sequence {seq_id} already exists")
        self._tables[seq_id] = entries

    def remove_sequence(self, seq_id: int) -> list[int]:
        """Forgets the sequence; returns its blocks in logical order (the caller frees them).

        Raises KVCacheError for an unknown seq_id (as do all methods below).
        """
        table = self._table(seq_id)
        del self._tables[operator.index(seq_id)]
        return table

    def append_blocks(self, seq_id: int, block_ids: Sequence[int]) -> None:
        table = self._table(seq_id)
        table.extend(self._entries(block_ids))

    def truncate(self, seq_id: int, num_blocks: int) -> list[int]:
        """Keeps the first num_blocks blocks; returns the removed ones in logical order.

        Raises KVCacheError if num_blocks exceeds the table's length, ValueError if negative.
        """
        table = self._table(seq_id)
        num_blocks = _check_count("num_blocks", num_blocks)
        if num_blocks > len(table):
            raise KVCacheError(
                f"truncate of sequence {seq_id} to {num_blocks} blocks, it has {len(table)}"
            )
        removed = table[num_blocks:]
        del table[num_blocks:]
        return removed

    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """The child gets a copy of the parent's table; returns it (the caller increfs).

        Raises KVCacheError if the parent is unknown or the child exists.
        """
        parent = self._table(parent_id)
        child_id = self._new_seq_id(child_id)
        if child_id in self._tables:
            raise KVCacheError(f"fork into existing sequence {child_id}")
        self._tables[child_id] = list(parent)
        return list(parent)

    def set_block(self, seq_id: int, index: int, block_id: int) -> int:
        """Replaces logical block ``index`` (copy-on-write); returns the old block id.

        Raises KVCacheError if index is out of range (negative indices are out of range).
        """
        table = self._table(seq_id)
        index = self._index(seq_id, table, index)
        (block_id,) = self._entries([block_id])
        old = table[index]
        table[index] = block_id
        return old

    def block_ids(self, seq_id: int) -> list[int]:
        return list(self._table(seq_id))

    def block_id_at(self, seq_id: int, index: int) -> int:
        """Raises KVCacheError if index is out of range (negative indices are out of range)."""
        table = self._table(seq_id)
        return table[self._index(seq_id, table, index)]

    def num_blocks(self, seq_id: int) -> int:
        return len(self._table(seq_id))

    # ---- batches --------------------------------------------------------------------------

    def num_blocks_to_grow(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> int:
        """Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)).

        A sequence listed twice counts twice (so this is an upper bound on what grow
        allocates). Raises ValueError if the two sequences differ in length.
        """
        return sum(
            max(0, want - len(self._tables[s])) for s, want in self._batch(seq_ids, num_tokens)
        )

    def grow(self, pool: PyBlockPool, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> int:
        """Allocates from ``pool`` and appends so that each sequence holds at least
        ceil(num_tokens / block_size) blocks; returns the number of blocks allocated.

        Sequences are served in batch order, each taking the next blocks the pool hands out;
        a sequence listed twice grows to the larger of its two targets. All or nothing: raises
        OutOfBlocksError if the batch needs more than pool.num_free_blocks, and KVCacheError
        for an unknown seq_id, changing nothing.
        """
        batch = self._batch(seq_ids, num_tokens)
        target: dict[int, int] = {}
        for s, want in batch:
            target[s] = max(target.get(s, 0), want)
        needed = sum(max(0, want - len(self._tables[s])) for s, want in target.items())
        if needed > pool.num_free_blocks:
            raise OutOfBlocksError(
                f"batch needs {needed} new blocks, pool has {pool.num_free_blocks} free"
            )
        for s, want in batch:
            table = self._tables[s]
            table.extend(pool.allocate(max(0, want - len(table))))
        return needed

    def cache_blocks(
        self, pool: PyBlockPool, seq_id: int, first_index: int, block_hashes: Sequence[int]
    ) -> int:
        """pool.cache_block(block_id_at(seq_id, first_index + i), block_hashes[i]) for each i;
        returns how many returned True. Checked first: raises KVCacheError if the range
        passes the table's end (or first_index is negative), and ValueError if a hash is not
        in [0, 2**64), changing nothing. If a cache_block raises midway, the recordings this
        call made are undone before the exception propagates, so the call changes nothing."""
        table = self._table(seq_id)
        first_index = operator.index(first_index)
        if first_index < 0:
            raise KVCacheError(f"first_index {first_index} out of range for sequence {seq_id}")
        hashes = [_check_hash(h) for h in block_hashes]
        if first_index + len(hashes) > len(table):
            raise KVCacheError(
                f"cache_blocks range [{first_index}, {first_index + len(hashes)}) passes the "
                f"end of sequence {seq_id} of {len(table)} blocks"
            )
        recorded: list[int] = []
        try:
            for offset, block_hash in enumerate(hashes):
                block_id = table[first_index + offset]
                if pool.cache_block(block_id, block_hash):
                    recorded.append(block_id)
        except Exception:
            for block_id in reversed(recorded):
                pool._uncache(block_id)
            raise
        return len(recorded)

    def max_num_blocks(self, seq_ids: Sequence[int]) -> int:
        """The longest table among seq_ids (0 for an empty batch)."""
        return max((len(self._table(s)) for s in seq_ids), default=0)

    def export_into(self, seq_ids: Sequence[int], out: Any, width: int, pad: int = -1) -> None:
        """Writes the batch's tables row by row into ``out``, a writable C-contiguous buffer of
        int32 (e.g. a numpy array of shape (len(seq_ids), width)); rows shorter than width are
        padded with ``pad``. Only the first len(seq_ids) * width elements are written.

        Checks everything before writing anything, in this order: width >= 0 and pad in the
        int32 range (ValueError); ``out`` writable, C-contiguous and int32 (ValueError) and
        large enough (ValueError); then each seq_id in batch order: unknown (KVCacheError) or
        longer than width (ValueError).
        """
        seqs = [operator.index(s) for s in seq_ids]
        for s in seqs:
            if s < 0:
                raise KVCacheError(f"unknown sequence {s}")
        width = _check_count("width", width)
        pad = operator.index(pad)
        if not _INT32_MIN <= pad <= _INT32_MAX:
            raise ValueError(f"pad {pad} is not in [-2**31, 2**31)")
        flat = _int32_view(out)
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
        for row, table in enumerate(tables):
            padded = table + [pad] * (width - len(table))
            for col, value in enumerate(padded):
                flat[row * width + col] = value

    def seq_ids(self) -> list[int]:
        """Every sequence id, ascending."""
        return sorted(self._tables)

    def check_integrity(self, pool: PyBlockPool | None = None) -> None:
        """Raises KVCacheError if a table holds an id outside the pool or a block with
        ref_count 0; without a pool, checks only that ids are valid entries (in [0, 2**31))."""
        for seq_id in sorted(self._tables):
            for index, block_id in enumerate(self._tables[seq_id]):
                where = f"BlockTables integrity: sequence {seq_id} block {index}"
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


def _int32_view(out: Any) -> memoryview:
    """A flat, writable int32 memoryview over ``out``; ValueError if it is not one."""
    try:
        view = memoryview(out)
    except TypeError as exc:
        raise ValueError(f"out does not support the buffer protocol: {exc}") from exc
    if view.readonly:
        raise ValueError("out is read-only")
    if not view.c_contiguous:
        raise ValueError("out is not C-contiguous")
    if view.itemsize != 4 or view.format.lstrip("@=<") not in ("i", "l"):
        raise ValueError(f"out is not int32 (format {view.format!r})")
    if view.nbytes == 0:  # memoryview cannot cast a view with a zero in its shape
        return memoryview(bytearray()).cast("i")
    return view.cast("B").cast("i")

"""Pure-Python twin of ``enginekit._native.BlockPool`` (rust/block_pool/).

Written for reading rather than speed: the executable specification the Rust class is tested
against, operation by operation (see ``enginekit.kv.pyref`` for the conventions).
"""

from __future__ import annotations

import operator
from collections import Counter, OrderedDict
from collections.abc import Sequence

from enginekit.errors import KVCacheError, OutOfBlocksError
from enginekit.interfaces.structures import Access, AccessKind, FreeBlockReserve
from enginekit.kv.pyref.args import instance_arg, int_list, u64_buffer

__all__ = ["MAX_BLOCKS", "PyBlockPool", "PyLruRoom"]

_MAX_HASH = (1 << 64) - 1
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1

MAX_BLOCKS = 1 << 26
"""Largest pool (rust/error.rs): 32 bytes of bookkeeping a block in the Rust core, 2 GiB at
the limit; a 141 GB GPU split into this many blocks would give each about 2.1 KB. Larger
sizes are refused up front."""


def _check_hash(block_hash: int) -> int:
    block_hash = operator.index(block_hash)
    if not 0 <= block_hash <= _MAX_HASH:
        raise ValueError(f"block_hash {block_hash} is not in [0, 2**64)")
    return block_hash


def _check_count(name: str, n: int) -> int:
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"{name} must be non-negative, got {n}")
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
        """Raises ValueError if num_blocks is not in [1, MAX_BLOCKS = 2**26], MemoryError if
        the host cannot hold the pool."""
        num_blocks = operator.index(num_blocks)
        if not 1 <= num_blocks <= MAX_BLOCKS:
            raise ValueError(f"num_blocks must be in [1, 2**26], got {num_blocks}")
        self._num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free_stack = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        # The accesses logged since the last take_accesses; None while not recording.
        self._accesses: list[Access] | None = None

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
        block_hash = self._hashes[block_id]
        if block_hash is not None:
            self._lru[block_id] = None
            if self._accesses is not None:
                self._accesses.append((AccessKind.RELEASE, block_id, block_hash, None))
        else:
            self._free_stack.append(block_id)

    def _uncache(self, block_id: int) -> None:
        """Drops the hash of a used block (undo of a successful _cache_block)."""
        block_hash = self._hashes[block_id]
        assert block_hash is not None and self._ref_counts[block_id] > 0
        del self._hash_to_block[block_hash]
        self._hashes[block_id] = None
        if self._accesses is not None:
            self._accesses.append((AccessKind.EVICT, block_id, block_hash, None))

    # ---- access log -----------------------------------------------------------------------

    def record_accesses(self, on: bool) -> None:
        """Starts (``on``) or stops logging accesses (``Access``); stopping drops what was
        logged. Raises TypeError unless ``on`` is a bool."""
        if not isinstance(on, bool):
            raise TypeError(f"on must be a bool, got {type(on).__name__}")
        if on and self._accesses is None:
            self._accesses = []
        elif not on:
            self._accesses = None

    @property
    def is_recording_accesses(self) -> bool:
        return self._accesses is not None

    def take_accesses(self) -> list[Access]:
        """The accesses logged since the last call, oldest first (empty while not
        recording)."""
        if not self._accesses:
            return []
        taken, self._accesses = self._accesses, []
        return taken

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

    def _is_free(self, block_id: int) -> bool:
        return self._ref_counts[block_id] == 0 and self._hashes[block_id] is None

    def longest_free_run(self) -> int:
        """Length of the longest run of consecutive free block ids."""
        best = current = 0
        for block_id in range(self._num_blocks):
            current = current + 1 if self._is_free(block_id) else 0
            best = max(best, current)
        return best

    def allocate_run(self, num_blocks: int) -> list[int]:
        """First fit: the lowest b such that blocks b .. b + num_blocks - 1 are all free (not
        evictable: never evicts). Takes them off the free stack, keeping the order of the
        rest; each gets ref_count 1; returns [b, b + 1, ...].

        Raises ValueError if negative; OutOfBlocksError "cannot allocate N blocks: only K
        free" if num_blocks > num_free_blocks, else "no run of N consecutive free blocks
        (longest: K)" when fragmentation prevents it.
        """
        num_blocks = _check_count("num_blocks", num_blocks)
        if num_blocks > len(self._free_stack):
            raise OutOfBlocksError(
                f"cannot allocate {num_blocks} blocks: only {len(self._free_stack)} free"
            )
        if num_blocks == 0:
            return []
        for start in range(self._num_blocks - num_blocks + 1):
            run = range(start, start + num_blocks)
            if all(self._is_free(b) for b in run):
                break
        else:
            raise OutOfBlocksError(
                f"no run of {num_blocks} consecutive free blocks "
                f"(longest: {self.longest_free_run()})"
            )
        taken = set(run)
        self._free_stack = [b for b in self._free_stack if b not in taken]
        for block_id in run:
            self._ref_counts[block_id] = 1
        return list(run)

    def incref(self, block_id: int) -> None:
        """Adds a reference. An evictable block leaves the LRU list (a prefix-cache hit).

        Raises KVCacheError for an unknown id or a free block.
        """
        block_id = self._known(block_id)
        self._check_not_free(block_id)
        self._add_ref(block_id)

    def incref_all(self, block_ids: Sequence[int]) -> None:
        """``incref`` of each id, in order (an id listed twice gains two references).
        Checked as a whole first, so on error (unknown id, free block) nothing changes."""
        ids = int_list(block_ids, "block_ids", self._known)
        for block_id in ids:
            self._check_not_free(block_id)
        for block_id in ids:
            self._add_ref(block_id)

    def _check_not_free(self, block_id: int) -> None:
        """KVCacheError for a free block (one neither referenced nor evictable)."""
        if self._ref_counts[block_id] == 0 and not self._is_evictable(block_id):
            raise KVCacheError(f"incref of free block {block_id}")

    def _add_ref(self, block_id: int) -> None:
        """Adds a reference to a block ``_check_not_free`` let through; an evictable one
        leaves the LRU order."""
        if self._ref_counts[block_id] == 0:
            del self._lru[block_id]
        self._ref_counts[block_id] += 1
        block_hash = self._hashes[block_id]
        if self._accesses is not None and block_hash is not None:
            self._accesses.append((AccessKind.HIT, block_id, block_hash, None))

    def _decref(self, block_id: int) -> None:
        """Drops a reference of a block whose ref_count is > 0 (free checked it). At zero a
        cached block becomes evictable (most recent end of the LRU list) and an uncached
        block is pushed on the free stack."""
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._release(block_id)

    def free(self, block_ids: Sequence[int]) -> None:
        """Drops one reference per id, in order (an id listed twice drops two). At zero a
        cached block becomes evictable (most recent end of the LRU list) and an uncached block
        is pushed on the free stack. Checked as a whole first (duplicates counted), so on error
        (double free, unknown id) nothing changes."""
        ids = int_list(block_ids, "block_ids", self._known)
        for block_id, times in Counter(ids).items():
            if times > self._ref_counts[block_id]:
                raise KVCacheError(
                    f"free drops {times} references of block {block_id}, "
                    f"which has {self._ref_counts[block_id]}"
                )
        for block_id in ids:
            self._decref(block_id)

    # ---- eviction -------------------------------------------------------------------------

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
        if self._accesses is not None:
            self._accesses.append((AccessKind.EVICT, block_id, block_hash, None))
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

    def make_room_lru(self, num_blocks: int, num_kept_free: int) -> bool:
        """Makes num_blocks blocks free beyond num_kept_free, evicting the least recently
        released evictable blocks (as ``evict_lru``) for what the free ones lack. Returns
        True if that many are free then; False, evicting nothing, if the free and evictable
        blocks together fall short. Raises ValueError if either count is negative."""
        num_blocks = _check_count("num_blocks", num_blocks)
        num_kept_free = _check_count("num_kept_free", num_kept_free)
        shortfall = num_blocks + num_kept_free - len(self._free_stack)
        if shortfall <= 0:
            return True
        if shortfall > len(self._lru):
            return False
        self.evict_lru(shortfall)
        return True

    # ---- prefix-hash map ------------------------------------------------------------------

    def _cache_block(self, block_id: int, block_hash: int, parent: int | None = None) -> bool:
        """Records that a used block holds the content named by block_hash, chained to the
        content ``parent`` (logged only) (``PyBlockTables.cache_blocks`` publishes blocks
        through it).

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
                f"block {block_id} already carries hash {current:#018x}: cannot cache it as "
                f"{block_hash:#018x}"
            )
        if block_hash in self._hash_to_block:
            return False
        self._hashes[block_id] = block_hash
        self._hash_to_block[block_hash] = block_id
        if self._accesses is not None:
            self._accesses.append((AccessKind.INSERT, block_id, block_hash, parent))
        return True

    def lookup_prefix(self, block_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of leading hashes that are all cached. Changes nothing.
        Every hash is checked first: ValueError if one is not in [0, 2**64). The hashes may
        also come as a 1-D C-contiguous buffer of u64 (``array.array("Q")``)."""
        hashes = u64_buffer(block_hashes)
        if hashes is None:
            hashes = int_list(block_hashes, "block_hashes", _check_hash)
        block_ids = []
        for block_hash in hashes:
            block_id = self._hash_to_block.get(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    # ---- per-block queries ----------------------------------------------------------------

    def ref_count(self, block_id: int) -> int:
        """Raises KVCacheError for an unknown id (``_known``)."""
        return self._ref_counts[self._known(block_id)]

    def num_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` (each counted as often as listed) have ref_count 0;
        KVCacheError for an unknown id (all checked first)."""
        ids = int_list(block_ids, "block_ids", self._known)
        return sum(1 for b in ids if self._ref_counts[b] == 0)

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


class PyLruRoom:
    """Twin of ``enginekit._native.LruRoom``: the make-room call back of a pool whose room
    is made by evicting in its own LRU order. ``room(num_blocks)`` is
    ``pool.make_room_lru(num_blocks, reserve.total)``, ``reserve.total`` read at each call
    (the free blocks its owner keeps, such as prefill promises). A pool that is no
    PyBlockPool is a TypeError."""

    def __init__(self, pool: PyBlockPool, reserve: FreeBlockReserve) -> None:
        self._pool = instance_arg(pool, "pool", PyBlockPool)
        self._reserve = reserve

    def __call__(self, num_blocks: int) -> bool:
        return self._pool.make_room_lru(num_blocks, self._reserve.total)

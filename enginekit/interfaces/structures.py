"""The cache structures as the engine and the plugins use them: the block pool, its LRU
make-room call back, the block tables and the radix tree, and the values the radix tree
returns.

Two implementations satisfy these Protocols: the Rust classes of ``enginekit._native`` and
their pure-Python twins in ``enginekit.kv.pyref`` (the executable specification); mypy
checks both against them (``enginekit/kv/pyref/__init__.py``). The result types below are
the one definition both return. A plugin gets its structures from its ``KVContext`` and
never asks which implementation it has.

Conventions shared by every method:

- Ids are plain ints. Naming an id the structure does not know (negative or huge ones
  included) raises ``KVCacheError``; a bad value (a negative count, a token or block id out
  of range) raises ``ValueError``.
- A list argument (``IntList``) is a ``list`` or a ``tuple`` of ints; anything else (bytes,
  str, dict, set, a generator, a numpy array, None) raises ``TypeError``. The block tables'
  batch calls (``num_blocks_to_grow``, ``grow``: once per step for every decode) also take
  a 1-D C-contiguous int64 numpy array (``IntBatch``), read without a Python call per item.
- Sizes past the limits (2**26 blocks in a pool, 2**26 entries in a table) raise
  ``ValueError`` before anything is allocated; a host allocation that fails raises
  ``MemoryError``.
- A call that raises changes nothing. Errors are the classes of ``enginekit.errors``.
- ``check_integrity()`` re-derives every invariant and raises ``KVCacheError`` naming the
  first one that is broken.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from array import array

__all__ = [
    "Access",
    "AccessKind",
    "BlockPool",
    "BlockTables",
    "InsertResult",
    "HashBatch",
    "IntBatch",
    "IntList",
    "LruRoom",
    "RadixMatch",
    "RadixNode",
    "RadixTree",
    "TokenBatch",
]

IntList: TypeAlias = list[int] | tuple[int, ...]
"""A list of ids, counts, hashes or tokens: a list or a tuple of ints, nothing else."""

IntBatch: TypeAlias = list[int] | tuple[int, ...] | npt.NDArray[np.int64]
"""The ids or counts of a batch call: an ``IntList``, or a 1-D C-contiguous int64 array."""

TokenBatch: TypeAlias = "list[int] | tuple[int, ...] | array[int]"
"""Token ids to match: an ``IntList``, or an ``array.array("I")`` of them (any 1-D
C-contiguous buffer of u32)."""

HashBatch: TypeAlias = "list[int] | tuple[int, ...] | array[int]"
"""Block hashes to look up: an ``IntList``, or an ``array.array("Q")`` of them (any 1-D
C-contiguous buffer of u64)."""


class AccessKind(IntEnum):
    """What happened to a cached block, as a pool logs it (``BlockPool.take_accesses``)."""

    INSERT = 0
    """A used block was cached: it now carries its content hash (a prefix cache published it)."""
    HIT = 1
    """A cached block gained a reference: a prefix hit, or a fork sharing it."""
    RELEASE = 2
    """A cached block lost its last reference: it became evictable."""
    EVICT = 3
    """The block is no longer cached: evicted (it is free now), or a just-cached block
    uncached again by a batch that rolled back."""


Access: TypeAlias = tuple[int, int, int, "int | None"]
"""One logged access: ``(kind, block_id, content, parent)``. ``kind`` is an ``AccessKind``
value; ``content`` the block's hash; ``parent``, for an insertion only, the hash of the
block before it in its sequence (None: the sequence's first block, the block after a hole,
or a parent that carried no hash of its own when the block was published; None for the
other kinds)."""


class FreeBlockReserve(Protocol):
    """Free blocks an owner keeps for itself (the cache manager's prefill promises): what
    a pool's ``LruRoom`` keeps free beyond the blocks it makes room for."""

    total: int


class BlockPool(Protocol):
    """A fixed set of KV blocks with reference counts, a free list and a prefix-hash map.

    Every block is in exactly one state:

    - used: ref_count > 0 (it may also carry a hash, i.e. be cached; blocks get their hashes
      through ``BlockTables.cache_blocks``);
    - evictable: ref_count == 0 and cached; kept in LRU order (least recently released
      first);
    - free: ref_count == 0 and not cached; kept in a LIFO stack (the last freed is the next
      allocated; a new pool hands out 0, 1, 2, ... in that order).
    """

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, whatever their state."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable without eviction."""
        ...

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks with ref_count 0."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref_count > 0."""
        ...

    def allocate(self, num_blocks: int) -> list[int]:
        """Pops num_blocks blocks off the free stack (never evicts); each gets ref_count 1.

        Raises OutOfBlocksError if num_blocks > num_free_blocks, ValueError if negative.
        """
        ...

    def allocate_run(self, num_blocks: int) -> list[int]:
        """First fit: the lowest b such that blocks b .. b + num_blocks - 1 are all free (free
        means on the free stack; evictable blocks are not free, and this never evicts). Takes
        them off the free stack, keeping the order of the rest of the stack; each gets
        ref_count 1; returns [b, b + 1, ..., b + num_blocks - 1] ([] for 0).

        Raises ValueError if negative; OutOfBlocksError "cannot allocate N blocks: only K
        free" if num_blocks > num_free_blocks, else "no run of N consecutive free blocks
        (longest: K)" when fragmentation prevents it.
        """
        ...

    def longest_free_run(self) -> int:
        """Length of the longest run of consecutive free block ids (0 if none is free): the
        largest allocate_run that succeeds. Pure."""
        ...

    def incref(self, block_id: int) -> None:
        """Adds a reference. An evictable block leaves the LRU list (a prefix-cache hit).

        Raises KVCacheError for an unknown id or a free block.
        """
        ...

    def incref_all(self, block_ids: IntList) -> None:
        """``incref`` of each id, in order (an id listed twice gains two references): a
        match's blocks pinned in one call. Checked as a whole first, so on error (unknown
        id, free block) nothing changes."""
        ...

    def free(self, block_ids: IntList) -> None:
        """Drops one reference per id, in order (an id listed twice drops two). At zero a
        cached block becomes evictable (most recent end of the LRU list) and an uncached
        block is pushed on the free stack.

        Checked as a whole first (duplicates counted), so on error (a double free, a block
        whose ref_count is already 0, an unknown id: KVCacheError) nothing changes.
        """
        ...

    def lookup_prefix(self, block_hashes: HashBatch) -> list[int]:
        """Block ids of the longest run of leading hashes that are all cached (used or
        evictable). Changes nothing. Every hash is checked first: ValueError if one is not
        in [0, 2**64). The hashes may come as an ``array.array("Q")`` (``HashBatch``), read
        without a Python call per hash."""
        ...

    def ref_count(self, block_id: int) -> int:
        """The block's reference count. Raises KVCacheError for an unknown id."""
        ...

    def num_unreferenced(self, block_ids: IntList) -> int:
        """How many of ``block_ids`` (each counted as often as listed) have reference count
        0 (free or evictable), in one call. Raises KVCacheError for an unknown id. Pure."""
        ...

    def evict(self, block_id: int) -> int:
        """Evictable -> free: drops the block's hash and returns that hash (not the block id);
        the block is pushed on the free stack, so it is the next one allocated.

        Raises KVCacheError if the block is not evictable (an unknown id included).
        """
        ...

    def evict_lru(self, num_blocks: int) -> list[int]:
        """Evicts the num_blocks least recently released evictable blocks; returns their ids,
        oldest first (each pushed on the free stack in that order, so the newest of them is
        allocated first). Raises OutOfBlocksError if num_blocks > num_evictable_blocks,
        ValueError if negative."""
        ...

    def make_room_lru(self, num_blocks: int, num_kept_free: int) -> bool:
        """Makes num_blocks blocks free beyond num_kept_free, evicting the least recently
        released evictable blocks (as ``evict_lru``) for what the free ones lack. Returns
        True if that many are free then; False, evicting nothing, if the free and evictable
        blocks together fall short. Raises ValueError if either count is negative."""
        ...

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order allocate would hand them out."""
        ...

    def evictable_block_ids(self) -> list[int]:
        """Evictable blocks, least recently released first."""
        ...

    def ref_counts(self) -> list[int]:
        """ref_count of every block, indexed by block id."""
        ...

    def record_accesses(self, on: bool) -> None:
        """Starts (``on``) or stops logging the accesses an eviction policy may hear
        (``Access``), in the order they happen; stopping drops what was logged. Off by
        default: a pool that does not record pays one untaken branch per access."""
        ...

    @property
    def is_recording_accesses(self) -> bool: ...

    def take_accesses(self) -> list[Access]:
        """The accesses logged since the last call, oldest first (empty while not
        recording)."""
        ...

    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: every block in exactly one
        state; list lengths match the counters; LRU links consistent; the hash map and the
        per-block hashes mirror each other; evictable blocks are exactly the cached blocks
        with ref_count 0."""
        ...


class LruRoom(Protocol):
    """The make-room call back of a pool whose room is made by evicting in its own LRU
    order (``Backend.new_lru_room(pool, reserve)``), for ``BlockTables.grow_with``:
    ``room(num_blocks)`` is ``pool.make_room_lru(num_blocks, reserve.total)``, with
    ``reserve.total`` read at each call. The Rust tables run the Rust room without calling
    into Python."""

    def __call__(self, num_blocks: int) -> bool:
        """Whether num_blocks blocks are free beyond the reserve's total, after evicting
        what the free ones lack (nothing evicted when that falls short): as
        ``BlockPool.make_room_lru``."""
        ...


PoolT = TypeVar("PoolT", bound=BlockPool, contravariant=True)
"""The pool a BlockTables works with: one of its own implementation (the Rust tables take
the Rust pool, the twin tables the twin pool)."""


class BlockTables(Protocol[PoolT]):
    """Per-sequence lists of physical block ids (logical block i -> physical block).

    Holds no references itself: callers incref and free in the BlockPool. ``grow``,
    ``cache_blocks`` and ``free_sequence`` take the pool (of the same implementation) to do
    a whole batch, or a table's blocks, in one call.

    Ids and counts: a table entry is a block id in [0, 2**31) (so every table exports to
    int32); any other value raises ValueError. A new sequence id (add_sequence, fork's
    child) must be in [0, 2**64), else ValueError; naming a sequence that does not exist (a
    negative or huge id included) raises KVCacheError. A negative count (num_tokens, width,
    first, end) raises ValueError. Arguments are checked left to right before the state is
    looked at.

    Holes: release_range turns entries into holes, for a sliding-window policy that
    releases the blocks a sequence can no longer attend to while keeping attention-sink
    blocks in front of them; append_holes recreates holes for a sequence brought back from a
    swap. A hole keeps its logical slot: num_blocks, max_num_blocks, grow and
    num_blocks_to_grow count it (grow never refills it). block_ids and block_id_at show a
    hole as -1; export_into writes it as ``pad``; fork copies holes; set_block and
    cache_blocks refuse a hole index with KVCacheError. remove_sequence and fork return the
    block ids the caller must free or incref, so they skip holes. Holes may sit anywhere in
    a table; each table counts its own (num_holes is O(1), and check_integrity verifies the
    count).
    """

    @property
    def block_size(self) -> int:
        """Tokens per block: logical block i of a sequence holds its tokens
        [i * block_size, (i + 1) * block_size)."""
        ...

    @property
    def num_sequences(self) -> int:
        """Sequences that have a table."""
        ...

    def add_sequence(self, seq_id: int, block_ids: IntList = ()) -> None:
        """Creates the sequence's table with these blocks. Raises KVCacheError if seq_id
        already exists; ValueError for a seq_id not in [0, 2**64) or a block id not in
        [0, 2**31)."""
        ...

    def remove_sequence(self, seq_id: int) -> list[int]:
        """Forgets the sequence; returns its blocks in logical order, holes skipped (the caller
        frees them).

        Raises KVCacheError for an unknown seq_id (as do all methods below that name one).
        """
        ...

    def free_sequence(self, pool: PoolT, seq_id: int) -> int:
        """Forgets the sequence and frees its blocks into ``pool``, last logical block first
        (evictable ones leave the pool's LRU order tail first, prefix last), holes skipped;
        returns how many: ``remove_sequence`` and ``pool.free`` of its blocks reversed, in
        one call. All or nothing: raises KVCacheError for an unknown seq_id or a block the
        pool holds no reference on, changing neither."""
        ...

    def append_blocks(self, seq_id: int, block_ids: IntList) -> None:
        """Appends these blocks to the end of the sequence's table, in order (after any
        holes, which keep their slots): the way to put blocks of the caller's choosing
        (``pool.allocate_run``'s, for instance) into a table, where ``grow`` takes the
        pool's next free ones. Mutates the table only: no ref_count changes. The caller
        must hold one reference on each id (a block listed twice needs two) and hands it
        over to the table: from then on it is handed back by remove_sequence and
        release_range for the caller to free, like the references of the table's other
        blocks (or listed by fork for the caller to incref). Nothing is checked against a
        pool here: check_integrity(pool) reports a block outside it or at ref_count 0.

        Raises KVCacheError for an unknown seq_id, then ValueError for a block id not in
        [0, 2**31) (TypeError if block_ids is not a list or tuple of ints); on error the
        table is unchanged and the references stay the caller's.
        """
        ...

    def append_holes(self, seq_id: int, num_holes: int) -> None:
        """Appends num_holes holes: logical slots that hold no block.

        Raises ValueError if num_holes is negative or the table would pass 2**26 entries
        (before allocating anything), MemoryError if the host cannot hold them.
        """
        ...

    def release_range(self, seq_id: int, first: int, end: int) -> list[int]:
        """Makes entries first .. end - 1 holes; returns the block ids that were there and not
        holes yet, in logical order (the caller frees them). Entries already holes are
        skipped, so releasing a range again returns [].

        Raises ValueError if first or end is negative, then KVCacheError unless
        first <= end <= the table's length.
        """
        ...

    def num_holes(self, seq_id: int) -> int:
        """Holes in the table, wherever they are (O(1))."""
        ...

    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """The child gets a copy of the parent's table, holes included; returns its block ids,
        holes skipped (the caller increfs them).

        Raises KVCacheError if the parent is unknown or the child exists; ValueError if
        child_id is not in [0, 2**64).
        """
        ...

    def set_block(self, seq_id: int, index: int, block_id: int) -> int:
        """Replaces logical block ``index`` (copy-on-write); returns the old block id.

        Raises KVCacheError if index is out of range or a hole (checked first), ValueError
        for a block id not in [0, 2**31).
        """
        ...

    def block_ids(self, seq_id: int) -> list[int]:
        """The table in logical order, holes as -1."""
        ...

    def block_id_at(self, seq_id: int, index: int) -> int:
        """The entry at index, -1 for a hole. Raises KVCacheError if index is out of range
        (a negative one included)."""
        ...

    def num_blocks(self, seq_id: int) -> int:
        """Logical length of the table: holes count."""
        ...

    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)).

        A sequence listed twice counts twice, so this is an upper bound on what grow
        allocates. Raises ValueError if the two lists differ in length or a num_tokens is
        negative.
        """
        ...

    def grow(self, pool: PoolT, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Allocates from ``pool`` and appends so that each sequence holds at least
        ceil(num_tokens / block_size) blocks; returns the number of blocks allocated.

        Sequences are served in batch order, each taking the next blocks the pool hands out.
        A sequence listed twice grows once, to the largest of its targets (num_blocks_to_grow
        counts it twice). All or nothing: raises OutOfBlocksError if the batch needs more than
        pool.num_free_blocks, and KVCacheError for an unknown seq_id, changing nothing.
        """
        ...

    def grow_with(
        self,
        pool: PoolT,
        seq_ids: IntBatch,
        num_tokens: IntBatch,
        make_room: Callable[[int], bool],
    ) -> int | None:
        """``grow``, first asking ``make_room(n)`` for the ``n`` blocks the batch needs (as
        ``num_blocks_to_grow`` counts them) when ``n > 0``: returns the blocks allocated, or
        None, changing nothing, if ``make_room`` returns false (one conversion of the batch
        where a count and a growth would take two). The batch is read once, before the call
        back, which may use the tables and the pool; after it, only the sequences that
        needed blocks are read again and grown, as ``grow`` of that part of the batch, whose
        errors are raised then (one of them removed: KVCacheError; a pool still short:
        OutOfBlocksError)."""
        ...

    def cache_blocks(
        self, pool: PoolT, seq_id: int, first_index: int, block_hashes: IntList
    ) -> int:
        """Publishes blocks in the pool's hash map: for each i, block
        b = block_id_at(seq_id, first_index + i) is recorded as holding the content named by
        block_hashes[i], unless b already carries that hash or the hash already names another
        block (duplicate content), which changes nothing. Returns how many were recorded. A
        recorded block is cached: at ref_count 0 it becomes evictable instead of free.

        Checked first, changing nothing: KVCacheError if the range passes the table's end or
        holds a hole; ValueError for a hash not in [0, 2**64). Then KVCacheError for a block
        with ref_count 0, one outside the pool, or one that already carries a different hash;
        an error midway undoes this call's recordings.
        """
        ...

    def cache_blocks_at(
        self, pool: PoolT, seq_ids: IntList, block_indices: IntList, block_hashes: IntList
    ) -> int:
        """``cache_blocks`` of one block of each of many sequences: block
        ``block_indices[i]`` of ``seq_ids[i]`` under ``block_hashes[i]`` (a step's decodes
        that filled one), in one call; returns how many were recorded. Checked first
        (ValueError for lengths that differ or a bad value, KVCacheError for an unknown
        sequence, an index past its table or a hole); changes nothing on error."""
        ...

    def max_num_blocks(self, seq_ids: IntList) -> int:
        """The longest table among seq_ids (0 for an empty batch)."""
        ...

    def export_into(self, seq_ids: IntList, out: Any, width: int, pad: int = -1) -> None:
        """Writes the batch's tables row by row into ``out``, a writable C-contiguous buffer of
        int32 (e.g. a numpy array of shape (len(seq_ids), width)); rows shorter than width are
        padded with ``pad``, and holes are written as ``pad``. Raises ValueError if out is too
        small, not int32, or a table is longer than width; KVCacheError for an unknown
        seq_id. Nothing is written when it raises."""
        ...

    def seq_ids(self) -> list[int]:
        """Every sequence id, ascending."""
        ...

    def check_integrity(self, pool: PoolT | None = None) -> None:
        """Raises KVCacheError if a table holds an id outside the pool or a block with
        ref_count 0; without a pool, checks only that ids are valid entries. Holes may sit
        anywhere, but each table's hole count must equal its holes."""
        ...


class RadixMatch(NamedTuple):
    """Result of RadixTree.match_prefix."""

    num_tokens: int
    """Length of the longest stored prefix of the query, in tokens."""
    block_ids: list[int]
    """The ceil(num_tokens / block_size) blocks covering positions [0, num_tokens) along the
    path; the last may be partially matched. Where a block straddles a node boundary, the
    deeper node's block is given (it holds the sequence's positions of both nodes)."""
    node_id: int
    """The node holding the last matched token; 0 (the root) if none matched."""


class InsertResult(NamedTuple):
    """Result of RadixTree.insert."""

    num_new_tokens: int
    """Tokens of the sequence that were not stored before (0 if it was a stored prefix)."""
    new_block_refs: list[int]
    """Every tree reference this call created, in creation order, duplicates included: the
    caller increfs each once in the pool."""
    node_id: int
    """The node holding the last token of the inserted sequence (0 for an empty one)."""
    released_block_refs: list[int]
    """Every tree reference this call released, in release order (a new leaf starting inside
    a block lends that block to the ancestors that held another copy of it): the caller
    frees each once in the pool, after the increfs."""


class RadixNode(NamedTuple):
    """One node as RadixTree.nodes() reports it."""

    node_id: int
    parent_id: int | None
    """None for the root."""
    token_ids: list[int]
    """The node's edge: positions [start, start + len) where start is the parent's end."""
    block_ids: list[int]
    """Blocks floor(start / block_size) ..= floor((end - 1) / block_size)."""
    lock_count: int
    """Locks taken on this node or on any of its descendants."""
    stamp: int
    """Logical time of the last insert, lock or unlock whose path went through the node."""


class RadixTree(Protocol):
    """A token-granular prefix tree whose nodes reference paged KV blocks (one tree per extra
    key, such as a tenant salt; the caller keeps them apart).

    Node 0 is the root and holds no tokens. Every other node holds a non-empty edge of tokens
    at the absolute positions [start, end) of every sequence through it and references the
    blocks floor(start / bs) ..= floor((end - 1) / bs) (block i holds positions
    [i * bs, (i + 1) * bs)). A block straddling a node boundary is referenced by both nodes.
    Each node reference is one tree reference; the caller mirrors tree references as pool
    references: incref every id of InsertResult.new_block_refs, then free every id of its
    released_block_refs; free every id evict returns.

    Locks: lock(n) adds a lock on n; lock_count of a node counts the locks on it and on its
    descendants; a node with lock_count > 0 is never evicted, not even in part. Recency: a logical
    clock ticks once per insert, lock and unlock, which stamp every node on the path from the root
    to the node concerned; match_prefix changes nothing. Node ids come from a counter and are never
    reused. Token ids are in [0, 2**32), block ids in [0, 2**31) (ValueError otherwise); a node id
    that does not exist raises KVCacheError.
    """

    @property
    def block_size(self) -> int:
        """Tokens per block, as given to the constructor."""
        ...

    def num_evictable_blocks(self) -> int:
        """Distinct blocks that nodes with lock_count 0 reference and no locked node does: the
        blocks evicting every unlocked node would take all the tree's references off. A block
        several nodes reference (straddling a split, or a chunk inserted after one that ended
        inside it) counts once, so this is at most the number of pool blocks the tree holds
        references on. O(1) in the Rust tree."""
        ...

    def num_evictable_among(self, block_ids: IntList) -> int:
        """How many distinct ids of block_ids num_evictable_blocks counts (a sequence that
        shares them takes them out of what evict can free). Pure. Raises ValueError for a
        block id not in [0, 2**31)."""
        ...

    def match_prefix(self, token_ids: TokenBatch, max_tokens: int | None = None) -> RadixMatch:
        """The longest prefix of token_ids[:max_tokens] (all of token_ids if None) stored in
        the tree, at token granularity (a match may end inside a node's edge); the ids after
        the first max_tokens are not read, so a caller matching a prefix of its list passes
        the whole list and a length instead of a copy. The ids may come as an
        ``array.array("I")`` (``TokenBatch``), read without a Python call per token. Pure:
        changes no stamp. Raises ValueError for a token id not in [0, 2**32) among those
        read, or a negative max_tokens."""
        ...

    def insert(self, token_ids: IntList, block_ids: IntList) -> InsertResult:
        """Stores token_ids; the token at position p lives in block_ids[p // block_size].

        Nodes already on the path keep their own blocks (the caller's ids for that range are
        ignored). Where the sequence leaves a node's edge midway, that node is split: the upper
        part (the prefix) becomes a NEW node, with the original's lock count and stamp; the
        original id keeps the lower part and its own locks; if the split point is inside a
        block, that block gains a reference (it is in new_block_refs). A new leaf references
        the caller's blocks for its range. A sequence that ends inside an edge splits nothing.
        A new leaf that starts inside a block lends that block (the caller's copy, which holds
        the path's positions before the leaf too) to its parent, and on up through the
        ancestors that start inside that block and hold the same other copy, unless a lock
        needs their copy (one on the ancestor itself, or below a child starting with that
        copy): each takes a reference to the new block (in new_block_refs) and releases its
        own (in released_block_refs). A reference released to one the same call created is in
        neither list. Stamps the whole path. Raises ValueError for a bad token or block id, or
        if block_ids holds fewer than ceil(len(token_ids) / block_size) ids (extra ones are
        ignored).
        """
        ...

    def lock(self, node_id: int) -> None:
        """+1 lock on the node (+1 lock_count on it and every ancestor); stamps the path.
        Locking the root is allowed and protects nothing. Raises KVCacheError for an unknown
        node."""
        ...

    def unlock(self, node_id: int) -> None:
        """Undoes one lock(node_id) of that same node (a split keeps the locks on the original
        id); stamps the path. Raises KVCacheError for an unknown node or one without locks of
        its own."""
        ...

    def evict(self, num_blocks: int) -> list[int]:
        """Releases references at block granularity until num_blocks distinct blocks have
        lost their last tree reference, or nothing unlocked is left (never raises for too
        large a count): num_evictable_blocks() falls by exactly min(num_blocks,
        num_evictable_blocks()). Each round takes the first unlocked leaf in eviction order
        and trims the last block off its edge. The order: leaves whose edge ends inside a
        block first (a partly filled last block, which a block-granular cache would not hold
        at all, goes before any full block), then least recent stamp, ties to the lower node
        id. Trimming cuts the edge back to that block's first position (or to the node's
        start) and releases the block's reference; a block another node references too (the
        parent's, where the block straddles the node boundary) drops a reference and frees
        nothing. A node left without tokens is removed; its parent may become an unlocked
        leaf, at its own stamp. A trimmed leaf keeps its stamp, so it stays in its place in
        the order until it is gone: a released sequence loses its tail before its prefix, as
        a block LRU list gives blocks back. Returns every released reference in release
        order: the caller frees each once. Raises ValueError if num_blocks is negative."""
        ...

    def nodes(self) -> list[RadixNode]:
        """Every node, sorted by id."""
        ...

    def evictable_tails(self) -> list[tuple[int, int]]:
        """Every eviction candidate (an unlocked leaf) as (node id, the block ``evict``
        would trim off it next: its last), in ``evict``'s order: what an eviction policy
        choosing its own victims chooses among."""
        ...

    def evict_tail(self, node_id: int) -> int:
        """One round of ``evict`` on the candidate a caller chose: trims the last block off
        the unlocked leaf ``node_id`` and returns the released reference (the caller frees
        it once). Raises KVCacheError, changing nothing, for an unknown node or one that is
        not a candidate (the root, a locked node, a node with children)."""
        ...

    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: parent and child links agree;
        children are keyed by their first token, hence distinct; every node is reachable from
        the root; every non-root node holds tokens, starts at its parent's end and holds
        exactly the blocks its positions span; lock_count = own locks + the children's
        lock_counts; no stamp is newer than its parent's."""
        ...

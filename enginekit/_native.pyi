"""Typed stub of ``enginekit._native``, the Rust core of the host-side KV bookkeeping.

Every class here has a pure-Python twin in ``enginekit.kv.pyref`` with the same API and
behaviour; tests drive both with the same operation sequences and compare whole states.
Errors are the classes of ``enginekit.errors``; a call that raises changes nothing.

The classes implement the Protocols of ``enginekit.interfaces.structures``, whose docstrings
state the contract of each method the engine and the plugins call (mypy checks the classes
against them); the radix tree returns the NamedTuples defined there. This stub documents the
rest: constructors, limits, functions, and the methods only tests and benchmarks call.

Argument types, the same in both: a list of ids, counts, hashes or tokens (``IntList``) is a
``list`` or ``tuple`` of ints; anything else (bytes, str, dict, set, a generator, a numpy
array, None) raises TypeError, as does an ``extra_key`` that is not ``bytes`` or None and None
where an int is due. A host allocation that fails raises MemoryError.

Limits (rust/error.rs, and the twins): a pool holds at most ``MAX_BLOCKS`` = 2**26 blocks
(the Rust pool's bookkeeping is 32 bytes a block, 2 GiB at the limit; a 141 GB GPU in this
many blocks gives each about 2.1 KB, less than one token's KV in any production model);
``append_holes`` lets a table reach at most ``MAX_TABLE_LEN`` = 2**26 entries (a context of
2**26 tokens at block size 1). Larger sizes raise ValueError before anything is allocated.
"""

from typing import Any

from enginekit.interfaces.structures import InsertResult, IntList, RadixMatch, RadixNode

ROOT_HASH: int
"""Parent hash of a sequence's first block."""

MAX_BLOCKS: int
"""Largest pool, in blocks: 2**26 (see the module docstring)."""

MAX_TABLE_LEN: int
"""Most entries append_holes lets a table reach: 2**26 (see the module docstring)."""

def hash_block(parent_hash: int, token_ids: IntList, extra_key: bytes | None = None) -> int:
    """Chained 64-bit hash of one block (spec in rust/hash.rs).

    Raises ValueError if parent_hash is not in [0, 2**64) or a token id is not in [0, 2**32),
    ValueError if extra_key is 2**32 bytes or longer; TypeError for a wrong type. Arguments
    are checked left to right.
    """

def hash_blocks(
    token_ids: IntList,
    block_size: int,
    extra_key: bytes | None = None,
    parent_hash: int = ...,
) -> list[int]:
    """Chained hashes of every full block of ``token_ids``; a trailing partial block is ignored.

    ``parent_hash`` defaults to ROOT_HASH (None is refused, TypeError). Raises as hash_block,
    or ValueError if block_size < 1; arguments are checked left to right.
    """

def _panic_for_test() -> None:
    """Test hook: panics inside Rust; always raises KVCacheError("internal error: ...")."""

class BlockPool:
    """A fixed set of KV blocks with reference counts, a free list and a prefix-hash map.

    Every block is in exactly one state:
    - used: ref_count > 0 (it may also carry a hash, i.e. be cached);
    - evictable: ref_count == 0 and cached; kept in LRU order (least recently released first);
    - free: ref_count == 0 and not cached; kept in a LIFO stack (the last freed is the next
      allocated; a new pool hands out 0, 1, 2, ... in that order).
    """

    def __init__(self, num_blocks: int) -> None:
        """Raises ValueError if num_blocks is not in [1, MAX_BLOCKS = 2**26] (see the module
        docstring), MemoryError if the host cannot hold the pool's bookkeeping."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable without eviction."""
    @property
    def num_evictable_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def allocate(self, num_blocks: int) -> list[int]:
        """Pops num_blocks blocks off the free stack (never evicts); each gets ref_count 1.

        Raises OutOfBlocksError if num_blocks > num_free_blocks, ValueError if negative.
        """
    def allocate_run(self, num_blocks: int) -> list[int]:
        """First fit: the lowest b such that blocks b .. b + num_blocks - 1 are all free (free
        means on the free stack; evictable blocks are not free, and this never evicts). Takes
        them off the free stack, keeping the order of the rest of the stack; each gets
        ref_count 1; returns [b, b + 1, ..., b + num_blocks - 1] ([] for 0).

        Raises ValueError if negative; OutOfBlocksError "cannot allocate N blocks: only K
        free" if num_blocks > num_free_blocks, else "no run of N consecutive free blocks
        (longest: K)" when fragmentation prevents it.
        """
    def longest_free_run(self) -> int:
        """Length of the longest run of consecutive free block ids (0 if none is free)."""
    def incref(self, block_id: int) -> None:
        """Adds a reference. An evictable block leaves the LRU list (a prefix-cache hit).

        Raises KVCacheError for an unknown id or a free block.
        """
    def decref(self, block_id: int) -> None:
        """Drops a reference. At zero a cached block becomes evictable (most recent end of the
        LRU list) and an uncached block is pushed on the free stack.

        Raises KVCacheError for an unknown id or a block whose ref_count is already 0.
        """
    def free(self, block_ids: IntList) -> None:
        """decref of every id, in order. Checked as a whole first (duplicates counted), so on
        error (double free, unknown id) nothing changes."""
    def touch(self, block_id: int) -> None:
        """Moves an evictable block to the most recent end of the LRU list.

        Raises KVCacheError if the block is not evictable.
        """
    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Records that a used block holds the content named by block_hash.

        Returns True if recorded; False, changing nothing, if the hash already names another
        block (duplicate content) or this block already carries this hash.
        Raises KVCacheError for an unknown id, a block with ref_count 0, or a block that
        already carries a different hash; ValueError if block_hash is not in [0, 2**64).
        """
    def lookup(self, block_hash: int) -> int | None:
        """The block cached under block_hash, or None. Changes nothing. Raises ValueError if
        block_hash is not in [0, 2**64), as cache_block does."""
    def lookup_prefix(self, block_hashes: IntList) -> list[int]:
        """Block ids of the longest run of leading hashes that are all cached. Changes nothing.
        Every hash is checked first: ValueError if one is not in [0, 2**64)."""
    def block_hash(self, block_id: int) -> int | None:
        """The hash a block carries, or None. Raises KVCacheError for an unknown id."""
    def ref_count(self, block_id: int) -> int:
        """Raises KVCacheError for an unknown id."""
    def evict(self, block_id: int) -> int:
        """Evictable -> free: drops the block's hash and returns that hash (not the block id);
        the block is pushed on the free stack, so it is the next one allocated.

        Raises KVCacheError if the block is not evictable.
        """
    def evict_lru(self, num_blocks: int) -> list[int]:
        """Evicts the num_blocks least recently released evictable blocks; returns their ids,
        oldest first. Raises OutOfBlocksError if num_blocks > num_evictable_blocks."""
    def free_block_ids(self) -> list[int]:
        """Free blocks in the order allocate would hand them out."""
    def evictable_block_ids(self) -> list[int]:
        """Evictable blocks, least recently released first."""
    def ref_counts(self) -> list[int]:
        """ref_count of every block, indexed by block id."""
    def cached_blocks(self) -> dict[int, int]:
        """hash -> block id for every cached block (used or evictable)."""
    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: every block in exactly one
        state; list lengths match the counters; LRU links consistent; the hash map and the
        per-block hashes mirror each other; evictable blocks are exactly the cached blocks
        with ref_count 0."""

class BlockTables:
    """Per-sequence lists of physical block ids (logical block i -> physical block).

    Holds no references itself: callers incref/decref in the BlockPool. ``grow`` and
    ``cache_blocks`` take the pool to do a whole batch in one call.

    Ids and counts: a table entry is a block id in [0, 2**31) (so every table exports to
    int32); any other value raises ValueError. A new sequence id (add_sequence, fork's child)
    must be in [0, 2**64), else ValueError; naming a sequence that does not exist (a negative
    or huge id included) raises KVCacheError. A negative count (num_blocks, num_tokens, width)
    raises ValueError. Arguments are checked left to right before the state is looked at.

    Holes: release_range turns entries into holes, for a
    sliding-window policy that releases the blocks a sequence can no longer attend to while
    keeping attention-sink blocks in front of them; append_holes recreates holes for a
    sequence brought back from a swap. A hole keeps its logical slot: num_blocks,
    max_num_blocks, grow and num_blocks_to_grow count it (grow never refills it). block_ids
    and block_id_at show a hole as -1; export_into writes it as ``pad``; fork copies holes;
    set_block and cache_blocks refuse a hole index with KVCacheError. remove_sequence,
    truncate and fork return the block ids the caller must free or incref, so they skip
    holes. Holes may sit anywhere in a table; each table counts its own (num_holes is O(1),
    and check_integrity verifies the count).
    """

    def __init__(self, block_size: int) -> None:
        """Raises ValueError if block_size is not in [1, 2**64)."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_sequences(self) -> int: ...
    def has_sequence(self, seq_id: int) -> bool: ...
    def add_sequence(self, seq_id: int, block_ids: IntList = ()) -> None:
        """Raises KVCacheError if seq_id already exists; ValueError for a seq_id not in
        [0, 2**64) or a block id not in [0, 2**31)."""
    def remove_sequence(self, seq_id: int) -> list[int]:
        """Forgets the sequence; returns its blocks in logical order, holes skipped (the caller
        frees them).

        Raises KVCacheError for an unknown seq_id (as do all methods below).
        """
    def append_blocks(self, seq_id: int, block_ids: IntList) -> None: ...
    def append_holes(self, seq_id: int, num_holes: int) -> None:
        """Appends num_holes holes: logical slots that hold no block.

        Raises ValueError if num_holes is negative or the table would pass MAX_TABLE_LEN =
        2**26 entries (before allocating anything), MemoryError if the host cannot hold them.
        """
    def truncate(self, seq_id: int, num_blocks: int) -> list[int]:
        """Keeps the first num_blocks entries; returns the removed blocks in logical order,
        holes skipped.

        Raises KVCacheError if num_blocks exceeds the table's length, ValueError if negative.
        """
    def release_range(self, seq_id: int, first: int, end: int) -> list[int]:
        """Makes entries first .. end - 1 holes; returns the block ids that were there and not
        holes yet, in logical order (the caller frees them). Entries already holes are
        skipped, so releasing a range again returns [].

        Raises ValueError if first or end is negative, then KVCacheError unless
        first <= end <= the table's length; changes nothing then.
        """
    def num_holes(self, seq_id: int) -> int:
        """Holes in the table, wherever they are (O(1))."""
    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """The child gets a copy of the parent's table, holes included; returns its block ids,
        holes skipped (the caller increfs them).

        Raises KVCacheError if the parent is unknown or the child exists; ValueError if
        child_id is not in [0, 2**64).
        """
    def set_block(self, seq_id: int, index: int, block_id: int) -> int:
        """Replaces logical block ``index`` (copy-on-write); returns the old block id.

        Raises KVCacheError if index is out of range or a hole (checked first), ValueError
        for a block id not in [0, 2**31).
        """
    def block_ids(self, seq_id: int) -> list[int]:
        """The table in logical order, holes as -1."""
    def block_id_at(self, seq_id: int, index: int) -> int:
        """The entry at index, -1 for a hole. Raises KVCacheError if index is out of range."""
    def num_blocks(self, seq_id: int) -> int:
        """Logical length of the table: holes count."""
    def num_blocks_to_grow(self, seq_ids: IntList, num_tokens: IntList) -> int:
        """Sum over the batch of max(0, ceil(num_tokens / block_size) - num_blocks(seq)).

        A sequence listed twice counts twice, so this is an upper bound on what grow allocates.
        Raises ValueError if the two sequences differ in length or a num_tokens is negative.
        """
    def grow(self, pool: BlockPool, seq_ids: IntList, num_tokens: IntList) -> int:
        """Allocates from ``pool`` and appends so that each sequence holds at least
        ceil(num_tokens / block_size) blocks; returns the number of blocks allocated.

        Sequences are served in batch order, each taking the next blocks the pool hands out. A
        sequence listed twice grows once, to the largest of its targets (num_blocks_to_grow
        counts it twice). All or nothing: raises OutOfBlocksError if the batch needs more than
        pool.num_free_blocks, and KVCacheError for an unknown seq_id, changing nothing.
        """
    def cache_blocks(
        self, pool: BlockPool, seq_id: int, first_index: int, block_hashes: IntList
    ) -> int:
        """pool.cache_block(block_id_at(seq_id, first_index + i), block_hashes[i]) for each i;
        returns how many returned True. Checked first: raises KVCacheError if the range
        passes the table's end or holds a hole, ValueError for a hash not in [0, 2**64),
        changing nothing; a cache_block error midway undoes this call's recordings."""
    def max_num_blocks(self, seq_ids: IntList) -> int:
        """The longest table among seq_ids (0 for an empty batch)."""
    def export_into(self, seq_ids: IntList, out: Any, width: int, pad: int = -1) -> None:
        """Writes the batch's tables row by row into ``out``, a writable C-contiguous buffer of
        int32 (e.g. a numpy array of shape (len(seq_ids), width)); rows shorter than width are
        padded with ``pad``, and holes are written as ``pad``. Raises ValueError if out is too
        small, not int32, or a table is longer than width; KVCacheError for an unknown
        seq_id."""
    def seq_ids(self) -> list[int]:
        """Every sequence id, ascending."""
    def check_integrity(self, pool: BlockPool | None = None) -> None:
        """Raises KVCacheError if a table holds an id outside the pool or a block with
        ref_count 0; without a pool, checks only that ids are valid entries. Holes may sit
        anywhere, but each table's hole count must equal its holes."""

class RadixTree:
    """A token-granular prefix tree whose nodes reference paged KV blocks (one tree per extra
    key, such as a tenant salt; the caller keeps them apart).

    Node 0 is the root and holds no tokens. Every other node holds a non-empty edge of tokens
    at the absolute positions [start, end) of every sequence through it and references the
    blocks floor(start / bs) ..= floor((end - 1) / bs) (block i holds positions
    [i * bs, (i + 1) * bs)). A block straddling a node boundary is referenced by both nodes.
    Each node reference is one tree reference; the caller mirrors tree references as pool
    references: incref every id of InsertResult.new_block_refs, decref every id evict returns.

    Locks: lock(n) adds a lock on n; lock_count of a node counts the locks on it and on its
    descendants; a node with lock_count > 0 is never evicted. Recency: a logical clock ticks
    once per insert, lock and unlock, which stamp every node on the path from the root to the
    node concerned; match_prefix changes nothing. Node ids come from a counter and are never
    reused. A call that raises changes nothing. Token ids are in [0, 2**32), block ids in
    [0, 2**31) (ValueError otherwise); a node id that does not exist raises KVCacheError.
    """

    def __init__(self, block_size: int) -> None:
        """Raises ValueError if block_size is not in [1, 2**64)."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_nodes(self) -> int:
        """Nodes, the root included (1 for an empty tree)."""
    @property
    def num_tokens(self) -> int:
        """Tokens stored over all edges."""
    @property
    def num_block_refs(self) -> int:
        """Tree references held by all nodes."""
    def evictable_block_refs(self) -> int:
        """References held by non-root nodes with lock_count 0: what evict could release."""
    def num_evictable_blocks(self) -> int:
        """Distinct blocks that nodes with lock_count 0 reference and no locked node does: the
        blocks evicting every unlocked node would take all the tree's references off. A block
        several nodes reference (straddling a split, or a chunk inserted after one that ended
        inside it) counts once, so this is at most the number of pool blocks the tree holds
        references on. O(1)."""
    def has_node(self, node_id: int) -> bool: ...
    def match_prefix(self, token_ids: IntList) -> RadixMatch:
        """The longest prefix of token_ids stored in the tree, at token granularity (a match
        may end inside a node's edge). Pure: changes no stamp."""
    def insert(self, token_ids: IntList, block_ids: IntList) -> InsertResult:
        """Stores token_ids; the token at position p lives in block_ids[p // block_size].

        Nodes already on the path keep their own blocks (the caller's ids for that range are
        ignored). Where the sequence leaves a node's edge midway, that node is split: the upper
        part (the prefix) becomes a NEW node, with the original's lock count and stamp; the
        original id keeps the lower part and its own locks; if the split point is inside a
        block, that block gains a reference (it is in new_block_refs). A new leaf references
        the caller's blocks for its range. A sequence that ends inside an edge splits nothing.
        Stamps the whole path. Raises ValueError for a bad token or block id, or if block_ids
        holds fewer than ceil(len(token_ids) / block_size) ids (extra ones are ignored).
        """
    def lock(self, node_id: int) -> None:
        """+1 lock on the node (+1 lock_count on it and every ancestor); stamps the path.
        Locking the root is allowed and protects nothing. Raises KVCacheError for an unknown
        node."""
    def unlock(self, node_id: int) -> None:
        """Undoes one lock(node_id) of that same node (a split keeps the locks on the original
        id); stamps the path. Raises KVCacheError for an unknown node or one without locks of
        its own."""
    def evict(self, num_blocks: int) -> list[int]:
        """Removes unlocked leaves, least recent stamp first (ties: lower node id), a parent
        that becomes an unlocked leaf included, until at least num_blocks references were
        released or nothing evictable is left (never raises for too large a count); returns
        every released reference, node by node, each node's blocks in order: the caller
        decrefs each once. Raises ValueError if num_blocks is negative."""
    def nodes(self) -> list[RadixNode]:
        """Every node, sorted by id."""
    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: parent and child links agree;
        children are keyed by their first token, hence distinct; every node is reachable from
        the root; every non-root node holds tokens, starts at its parent's end and holds
        exactly the blocks its positions span; lock_count = own locks + the children's
        lock_counts; no stamp is newer than its parent's; the counters match the nodes."""

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
array, None) raises TypeError (the block tables' batch calls also take a 1-D int64 array:
``IntBatch``), as does an ``extra_key`` that is not ``bytes`` or None and None
where an int is due; a pool or block tables argument that is not of this module is refused
with TypeError too. Token ids may also come as a 1-D buffer of u32, an ``array("I")``
(``TokenBatch``).

Memory: every allocation a call's arguments or a structure's size set (the copy of a list
argument, the result list, a new table or node) is made fallibly: a host that cannot hold it
raises MemoryError instead of aborting the process. The results of the calls that change a
structure are made before the change, so that MemoryError leaves it as it was (the radix
tree's ``evict`` reserves its result before it evicts and makes the Python list after).
A panic inside a call (a bug) raises KVCacheError("internal error: ...").

Limits (rust/error.rs, and the twins): a pool holds at most ``MAX_BLOCKS`` = 2**26 blocks
(the Rust pool's bookkeeping is 32 bytes a block, 2 GiB at the limit; a 141 GB GPU in this
many blocks gives each about 2.1 KB, less than one token's KV in any production model);
``append_holes`` lets a table reach at most ``MAX_TABLE_LEN`` = 2**26 entries (a context of
2**26 tokens at block size 1). Larger sizes raise ValueError before anything is allocated.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from enginekit.interfaces.structures import (
    Access,
    FreeBlockReserve,
    HashBatch,
    InsertResult,
    IntBatch,
    IntList,
    RadixMatch,
    RadixNode,
    TokenBatch,
)

ROOT_HASH: int
"""Parent hash of a sequence's first block."""

MAX_BLOCKS: int
"""Largest pool, in blocks: 2**26 (see the module docstring)."""

MAX_TABLE_LEN: int
"""Most entries append_holes lets a table reach: 2**26 (see the module docstring)."""

def hash_block(parent_hash: int, token_ids: TokenBatch, extra_key: bytes | None = None) -> int:
    """Chained 64-bit hash of one block (spec in rust/hash.rs).

    Raises ValueError if parent_hash is not in [0, 2**64) or a token id is not in [0, 2**32),
    ValueError if extra_key is 2**32 bytes or longer; TypeError for a wrong type. Arguments
    are checked left to right.
    """

def hash_blocks(
    token_ids: TokenBatch,
    block_size: int,
    extra_key: bytes | None = None,
    parent_hash: int = ...,
) -> list[int]:
    """Chained hashes of every full block of ``token_ids``; a trailing partial block is ignored.

    ``parent_hash`` defaults to ROOT_HASH (None is refused, TypeError). Raises as hash_block,
    or ValueError if block_size is not in [1, 2**64); arguments are checked left to right.
    """

def decode_context_lens(
    num_tokens: npt.NDArray[np.int64], block_size: int, ints: list[int]
) -> tuple[list[int], list[int]]:
    """The decode batch's pass when a step is scheduled; contract and twin:
    ``enginekit.scheduler.decode_ops.decode_context_lens``."""

def append_decode_tokens(
    token_lists: list[list[int]],
    token_ids: list[int],
    num_tokens: npt.NDArray[np.int64],
    max_num_tokens: npt.NDArray[np.int64],
    stops_at_eos: npt.NDArray[np.uint8],
    eos: int | None,
) -> tuple[list[int], list[int]]:
    """The decode batch's pass when a step's tokens come back; contract and twin:
    ``enginekit.scheduler.decode_ops.append_decode_tokens``."""

def _panic_for_test() -> None:
    """Test hook: panics inside Rust; always raises KVCacheError("internal error: ...")."""

class BlockPool:
    """The Rust block pool: ``enginekit.interfaces.structures.BlockPool``, whose docstrings
    state the contracts of the methods below that carry none here."""

    def __init__(self, num_blocks: int) -> None:
        """An empty pool: every block free, handed out 0, 1, 2, ... Raises ValueError if
        num_blocks is not in [1, MAX_BLOCKS = 2**26] (see the module docstring), MemoryError
        if the host cannot hold the pool's bookkeeping."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_evictable_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def allocate(self, num_blocks: int) -> list[int]: ...
    def allocate_run(self, num_blocks: int) -> list[int]: ...
    def longest_free_run(self) -> int: ...
    def incref(self, block_id: int) -> None: ...
    def incref_all(self, block_ids: IntList) -> None: ...
    def free(self, block_ids: IntList) -> None: ...
    def lookup_prefix(self, block_hashes: HashBatch) -> list[int]: ...
    def ref_count(self, block_id: int) -> int: ...
    def num_unreferenced(self, block_ids: IntList) -> int: ...
    def evict(self, block_id: int) -> int: ...
    def evict_lru(self, num_blocks: int) -> list[int]: ...
    def make_room_lru(self, num_blocks: int, num_kept_free: int) -> bool: ...
    def free_block_ids(self) -> list[int]: ...
    def evictable_block_ids(self) -> list[int]: ...
    def ref_counts(self) -> list[int]: ...
    def cached_blocks(self) -> dict[int, int]:
        """hash -> block id for every cached block (used or evictable)."""
    def record_accesses(self, on: bool) -> None: ...
    @property
    def is_recording_accesses(self) -> bool: ...
    def take_accesses(self) -> list[Access]: ...
    def check_integrity(self) -> None: ...

class LruRoom:
    """The Rust make-room call back of a Rust pool:
    ``enginekit.interfaces.structures.LruRoom``. ``BlockTables.grow_with`` runs it without
    calling into Python."""

    def __init__(self, pool: BlockPool, reserve: FreeBlockReserve) -> None:
        """The room of ``pool`` beyond ``reserve.total`` free blocks (a pool of the twins is
        refused with TypeError)."""
    def __call__(self, num_blocks: int) -> bool: ...

class BlockTables:
    """The Rust block tables: ``enginekit.interfaces.structures.BlockTables`` over a Rust
    BlockPool (a pool of the twins is refused with TypeError); its docstrings state the
    contracts of the methods below that carry none here."""

    def __init__(self, block_size: int) -> None:
        """No sequences yet. Raises ValueError if block_size is not in [1, 2**64)."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_sequences(self) -> int: ...
    def add_sequence(self, seq_id: int, block_ids: IntList = ()) -> None: ...
    def remove_sequence(self, seq_id: int) -> list[int]: ...
    def free_sequence(self, pool: BlockPool, seq_id: int) -> int: ...
    def append_blocks(self, seq_id: int, block_ids: IntList) -> None: ...
    def append_holes(self, seq_id: int, num_holes: int) -> None: ...
    def release_range(self, seq_id: int, first: int, end: int) -> list[int]: ...
    def num_holes(self, seq_id: int) -> int: ...
    def fork(self, parent_id: int, child_id: int) -> list[int]: ...
    def set_block(self, seq_id: int, index: int, block_id: int) -> int: ...
    def block_ids(self, seq_id: int) -> list[int]: ...
    def block_id_at(self, seq_id: int, index: int) -> int: ...
    def num_blocks(self, seq_id: int) -> int: ...
    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        """Exact, past 2**64 too. A num_tokens outside [0, 2**64) is a ValueError here and in
        ``grow`` and ``grow_with``."""
    def grow(self, pool: BlockPool, seq_ids: IntBatch, num_tokens: IntBatch) -> int: ...
    def grow_with(
        self,
        pool: BlockPool,
        seq_ids: IntBatch,
        num_tokens: IntBatch,
        make_room: Callable[[int], bool],
    ) -> int | None: ...
    def cache_blocks(
        self, pool: BlockPool, seq_id: int, first_index: int, block_hashes: IntList
    ) -> int: ...
    def cache_blocks_at(
        self, pool: BlockPool, seq_ids: IntList, block_indices: IntList, block_hashes: IntList
    ) -> int: ...
    def max_num_blocks(self, seq_ids: IntList) -> int: ...
    def export_into(self, seq_ids: IntList, out: Any, width: int, pad: int = -1) -> None: ...
    def seq_ids(self) -> list[int]: ...
    def check_integrity(self, pool: BlockPool | None = None) -> None: ...

class HashChains:
    """The Rust hash chains: ``enginekit.interfaces.hash_chains.HashChains``, whose
    docstrings state the contracts of the methods below. A sequence id to look up
    (``num_names``, ``num_published``, ``names``, ``lookup``, ``is_cached``, ``remove``)
    outside [0, 2**64) is a ValueError: no sequence has one. A token batch (``token_ids``,
    each of ``token_lists``) that is no list, tuple or ``array("I")`` is a TypeError, read
    or not."""

    def __init__(self, block_size: int, root_hash: int | None = None) -> None:
        """No chains. Raises ValueError if block_size is not in [1, 2**64) or root_hash
        (``ROOT_HASH`` if None) not in [0, 2**64)."""
    @property
    def block_size(self) -> int: ...
    def num_names(self, seq_id: int) -> int: ...
    def num_published(self, seq_id: int) -> int: ...
    def names(self, seq_id: int) -> list[int]: ...
    def extend(
        self, seq_id: int, token_ids: TokenBatch, num_blocks: int, extra_key: bytes | None = None
    ) -> int: ...
    def lookup(self, pool: BlockPool, seq_id: int, num_blocks: int) -> list[int]: ...
    def is_cached(self, pool: BlockPool, seq_id: int, index: int) -> bool: ...
    def publish(self, tables: BlockTables, pool: BlockPool, seq_id: int, end: int) -> int: ...
    def publish_filled(
        self,
        tables: BlockTables,
        pool: BlockPool,
        seq_ids: Sequence[int],
        token_lists: Sequence[TokenBatch],
        num_tokens: Sequence[int],
        extra_keys: Sequence[bytes | None],
    ) -> list[int]: ...
    def remove(self, seq_id: int) -> None: ...
    def seq_ids(self) -> list[int]: ...

class RadixTree:
    """The Rust radix tree: ``enginekit.interfaces.structures.RadixTree``, whose docstrings
    state the contracts of the methods below that carry none here; results are the
    NamedTuples defined there."""

    def __init__(self, block_size: int) -> None:
        """A tree holding only the root. Raises ValueError if block_size is not in
        [1, 2**64)."""
    @property
    def block_size(self) -> int: ...
    def num_evictable_blocks(self) -> int: ...
    def num_evictable_among(self, block_ids: IntList) -> int: ...
    def match_prefix(self, token_ids: TokenBatch, max_tokens: int | None = None) -> RadixMatch: ...
    def insert(self, token_ids: IntList, block_ids: IntList) -> InsertResult: ...
    def lock(self, node_id: int) -> None: ...
    def unlock(self, node_id: int) -> None: ...
    def evict(self, num_blocks: int) -> list[int]: ...
    def nodes(self) -> list[RadixNode]: ...
    def evictable_tails(self) -> list[tuple[int, int]]: ...
    def evict_tail(self, node_id: int) -> int: ...
    def check_integrity(self) -> None: ...

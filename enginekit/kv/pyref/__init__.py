"""Pure-Python twins of ``enginekit._native.BlockPool``, ``BlockTables``, ``RadixTree`` and
``HashChains``.

Same methods, properties, orderings and exception classes as the Rust core (see
``enginekit/_native.pyi``), written for reading rather than speed: these modules are the
executable specification the Rust classes are tested against, operation by operation. The
classes live in ``pool``, ``tables``, ``radix`` and ``hash_chains``; import them from here.
Both they and the Rust classes satisfy the Protocols of ``enginekit.interfaces.structures``
and ``enginekit.interfaces.hash_chains`` (checked below), and the radix tree's results are
the NamedTuples defined there.

Conventions shared by all classes:

- Every id is a plain int. An id outside the structure (negative, or >= num_blocks) is
  "unknown" and raises KVCacheError, never IndexError.
- A list argument is a list or tuple of ints; any other type (bytes, str, dict, set, a
  generator, None) raises TypeError (``args``), as the Rust bindings do. An extra key
  is bytes or None.
- Sizes past the limits of rust/error.rs (``MAX_BLOCKS``, ``MAX_TABLE_LEN``: 2**26 each) raise
  ValueError before anything is allocated; a failed allocation is a MemoryError.
- A call that raises changes nothing: every method validates its whole input before mutating.
- ``check_integrity()`` re-derives every invariant from scratch and raises KVCacheError naming
  the first one that is broken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginekit.kv.pyref.hash_chains import PyHashChains
from enginekit.kv.pyref.pool import MAX_BLOCKS, PyBlockPool, PyLruRoom
from enginekit.kv.pyref.radix import PyRadixTree
from enginekit.kv.pyref.tables import MAX_TABLE_LEN, PyBlockTables

__all__ = [
    "MAX_BLOCKS",
    "MAX_TABLE_LEN",
    "PyBlockPool",
    "PyBlockTables",
    "PyHashChains",
    "PyLruRoom",
    "PyRadixTree",
]

if TYPE_CHECKING:
    # Both implementations against the structure Protocols the engine and the plugins use:
    # a signature that drifts from its Protocol fails `mypy enginekit` here. Each
    # constructor takes one int (num_blocks or block_size) and builds a conforming object,
    # but a room's, which takes its pool and the pool owner's reserve.
    from collections.abc import Callable

    from enginekit._native import BlockPool, BlockTables, HashChains, LruRoom, RadixTree
    from enginekit.interfaces import hash_chains, structures

    _pool: Callable[[int], structures.BlockPool] = PyBlockPool
    _room: Callable[[PyBlockPool, structures.FreeBlockReserve], structures.LruRoom] = PyLruRoom
    _native_room: Callable[[BlockPool, structures.FreeBlockReserve], structures.LruRoom] = LruRoom
    _tables: Callable[[int], structures.BlockTables[PyBlockPool]] = PyBlockTables
    _tree: Callable[[int], structures.RadixTree] = PyRadixTree
    _native_pool: Callable[[int], structures.BlockPool] = BlockPool
    _native_tables: Callable[[int], structures.BlockTables[BlockPool]] = BlockTables
    _native_tree: Callable[[int], structures.RadixTree] = RadixTree
    _chains: Callable[[int], hash_chains.HashChains[PyBlockPool, PyBlockTables]] = PyHashChains
    _native_chains: Callable[[int], hash_chains.HashChains[BlockPool, BlockTables]] = HashChains

"""Pure-Python twins of ``enginekit._native.BlockPool``, ``BlockTables`` and ``RadixTree``.

Same methods, properties, orderings and exception classes as the Rust core (see
``enginekit/_native.pyi``), written for reading rather than speed: these modules are the
executable specification the Rust classes are tested against, operation by operation. The
classes live in ``pool``, ``tables`` and ``radix``; import them from here.

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

from enginekit.kv.pyref.pool import MAX_BLOCKS, PyBlockPool
from enginekit.kv.pyref.radix import InsertResult, PyRadixTree, RadixMatch, RadixNode
from enginekit.kv.pyref.tables import MAX_TABLE_LEN, PyBlockTables

__all__ = [
    "MAX_BLOCKS",
    "MAX_TABLE_LEN",
    "InsertResult",
    "PyBlockPool",
    "PyBlockTables",
    "PyRadixTree",
    "RadixMatch",
    "RadixNode",
]

"""The backend of the cache structures, chosen once per engine: Rust or Python twins."""

from __future__ import annotations

from enginekit.interfaces.backend import Backend


def make_backend(native: bool) -> Backend:
    """The Rust extension's structures (``native``) or the pure-Python twins
    (``enginekit.kv.pyref``, the executable spec), which behave the same."""
    if native:
        from enginekit._native import (
            ROOT_HASH,
            BlockPool,
            BlockTables,
            RadixTree,
            hash_block,
            hash_blocks,
        )

        return Backend(
            "native", BlockPool, BlockTables, RadixTree, ROOT_HASH, hash_block, hash_blocks
        )
    from enginekit.kv import pyref
    from enginekit.kv.pyref import hashing

    return Backend(
        "pyref",
        pyref.PyBlockPool,
        pyref.PyBlockTables,
        pyref.PyRadixTree,
        hashing.ROOT_HASH,
        hashing.hash_block,
        hashing.hash_blocks,
    )

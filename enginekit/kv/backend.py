"""The backend of the cache structures: the Rust ones an engine runs on, or their
pure-Python twins (``enginekit.kv.pyref``), the reference the tests, the fuzzer and the
benchmarks compare them with."""

from __future__ import annotations

from enginekit.interfaces.backend import Backend
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.eviction import AttentionSpan
from enginekit.spec.kv import KVSpec


def make_backend(native: bool) -> Backend:
    """The Rust extension's structures (``native``) or the pure-Python twins
    (``enginekit.kv.pyref``, the executable spec, for tests and benchmarks), which behave
    the same."""
    if native:
        from enginekit._native import (
            ROOT_HASH,
            BlockPool,
            BlockTables,
            HashChains,
            LruRoom,
            RadixTree,
            hash_block,
            hash_blocks,
        )

        return Backend(
            "native",
            BlockPool,
            BlockTables,
            RadixTree,
            HashChains,
            ROOT_HASH,
            hash_block,
            hash_blocks,
            LruRoom,
        )
    from enginekit.kv import pyref
    from enginekit.kv.pyref import hashing

    return Backend(
        "pyref",
        pyref.PyBlockPool,
        pyref.PyBlockTables,
        pyref.PyRadixTree,
        pyref.PyHashChains,
        hashing.ROOT_HASH,
        hashing.hash_block,
        hashing.hash_blocks,
        pyref.PyLruRoom,
    )


def make_context(
    backend: Backend,
    num_blocks: int,
    spec: KVSpec,
    max_model_len: int,
    attention: AttentionSpan,
) -> KVContext:
    """The structures the plugins share: an empty pool of ``num_blocks`` blocks and empty
    block tables of ``backend``'s kind, with the attention the eviction policy resolved."""
    return KVContext(
        backend.new_block_pool(num_blocks),
        backend.new_block_tables(spec.block_size),
        spec,
        max_model_len,
        backend,
        attention.window,
        attention.sinks,
    )

"""Smoke test of the compiled core: it imports, each class answers, errors have the right class."""

import numpy as np
import pytest

from enginekit import _native as n
from enginekit.errors import KVCacheError, OutOfBlocksError


def test_hash_known_answer() -> None:
    assert n.ROOT_HASH == 0x656E67696E656B69
    assert n.hash_block(n.ROOT_HASH, [1, 2, 3, 4]) == 0xDFBA54631C0CAE29
    assert n.hash_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [0xDFBA54631C0CAE29, 0xE4B2D1B2343A51F5]
    with pytest.raises(ValueError):
        n.hash_block(-1, [1])


def test_block_pool_smoke() -> None:
    pool = n.BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    with pytest.raises(OutOfBlocksError, match="cannot allocate 5 blocks: only 2 free"):
        pool.allocate(5)
    pool.free([0])
    with pytest.raises(KVCacheError, match="double free of block 0"):
        pool.free([1, 0])
    with pytest.raises(KVCacheError, match="unknown block -1"):
        pool.incref(-1)
    assert pool.ref_counts() == [0, 1, 0, 0]
    pool.check_integrity()


def test_block_tables_smoke() -> None:
    pool = n.BlockPool(8)
    tables = n.BlockTables(4)
    tables.add_sequence(7)
    assert tables.grow(pool, [7], [9]) == 3
    out = np.zeros((1, 4), dtype=np.int32)
    tables.export_into([7], out, 4)
    assert out.tolist() == [[0, 1, 2, -1]]
    with pytest.raises(ValueError):
        tables.export_into([7], np.zeros((1, 4), dtype=np.int64), 4)
    with pytest.raises(KVCacheError, match="unknown sequence 42"):
        tables.block_ids(42)
    tables.check_integrity(pool)


def test_panic_becomes_kvcache_error() -> None:
    with pytest.raises(KVCacheError, match="internal error: forced panic for test"):
        n._panic_for_test()

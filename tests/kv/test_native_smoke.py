"""Smoke test of the compiled core: it imports, each class answers, errors have the right class
(a failed host allocation included)."""

import subprocess
import sys

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


# Runs in a child under an address-space limit 64 MiB above what it has mapped, so the
# largest pool (2 GiB of bookkeeping) or table (256 MiB of entries; 512 MiB in the twin)
# that the limits allow cannot be allocated. The interpreter must survive with MemoryError.
OUT_OF_MEMORY = """
import resource, sys
from enginekit import _native
from enginekit.kv import pyref
native = sys.argv[1] == "native"
Pool = _native.BlockPool if native else pyref.PyBlockPool
Tables = _native.BlockTables if native else pyref.PyBlockTables
tables = Tables(1)
tables.add_sequence(0, [5])
with open("/proc/self/status") as status:
    mapped = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped * 1024 + (64 << 20), hard))
for what, call in [
    ("pool", lambda: Pool(_native.MAX_BLOCKS)),
    ("holes", lambda: tables.append_holes(0, _native.MAX_TABLE_LEN - 1)),
]:
    try:
        call()
        print(what, "allocated")
    except MemoryError:
        print(what, "MemoryError")
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
print(tables.block_ids(0), tables.num_holes(0), Pool(4).allocate(2))
"""


@pytest.mark.parametrize("impl", ["native", "python"])
def test_a_failed_allocation_is_a_memory_error(impl: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY, impl],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Nothing changed by the failed call: the table still holds its one block, no holes.
    assert proc.stdout.splitlines() == ["pool MemoryError", "holes MemoryError", "[5] 0 [0, 1]"]

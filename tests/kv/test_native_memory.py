"""A native call whose arguments or result the host cannot hold raises MemoryError: the
process goes on, and the structure called is as it was.

The calls run in a child process, each under an address-space limit (``RLIMIT_AS``) a few
tens of MiB above what the child has mapped once the call's arguments are built: enough for
the interpreter to go on, too little for the copy of a list argument of 2**24 ints or a
result list of 2**23 ints. A call that aborts the process (a failed infallible allocation)
or hangs it (a panic while Python is out of memory) fails the test through the child's exit
status or its timeout.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import resource

import numpy as np

from enginekit import _native

HEADROOM = 32 << 20
SOFT, HARD = resource.getrlimit(resource.RLIMIT_AS)


def mapped() -> int:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    return kib * 1024


def under_limit(name, call, unchanged=lambda: True):
    resource.setrlimit(resource.RLIMIT_AS, (mapped() + HEADROOM, HARD))
    try:
        call()
        outcome = "returned"
    except MemoryError:
        outcome = "MemoryError"
    except Exception as exc:
        outcome = type(exc).__name__
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (SOFT, HARD))
    print(name, outcome, "unchanged" if unchanged() else "CHANGED", flush=True)


BIG = 1 << 24  # ints in a list argument: its copy is 64 MiB of u32 or 128 MiB of u64
zeros = [0] * BIG
pool = _native.BlockPool(1 << 23)  # its id lists are 64 MiB of pointers, and the ints
num_free = pool.num_free_blocks
under_limit("allocate", lambda: pool.allocate(1 << 23), lambda: pool.num_free_blocks == num_free)
under_limit(
    "allocate_run", lambda: pool.allocate_run(1 << 23), lambda: pool.num_free_blocks == num_free
)
under_limit("free_block_ids", pool.free_block_ids)
under_limit("ref_counts", pool.ref_counts)
under_limit("lookup_prefix", lambda: pool.lookup_prefix(zeros))
under_limit("free", lambda: pool.free(zeros), lambda: pool.num_free_blocks == num_free)
under_limit("incref_all", lambda: pool.incref_all(zeros), lambda: pool.ref_count(0) == 0)
del pool

tables = _native.BlockTables(1)
under_limit("add_sequence", lambda: tables.add_sequence(1, zeros), lambda: tables.seq_ids() == [])
tables.add_sequence(1, [5])
under_limit(
    "append_blocks", lambda: tables.append_blocks(1, zeros), lambda: tables.block_ids(1) == [5]
)
under_limit("num_blocks_to_grow", lambda: tables.num_blocks_to_grow(zeros, zeros))

tree = _native.RadixTree(1 << 20)
under_limit(
    "radix insert", lambda: tree.insert(zeros, [0] * 16), lambda: len(tree.nodes()) == 1
)
under_limit("match_prefix", lambda: tree.match_prefix(zeros))

chains = _native.HashChains(1)
under_limit(
    "extend", lambda: chains.extend(1, zeros, BIG), lambda: chains.seq_ids() == []
)
under_limit("hash_blocks", lambda: _native.hash_blocks(zeros, 1))
counts = np.zeros(BIG, dtype=np.int64)
under_limit("decode_context_lens", lambda: _native.decode_context_lens(counts, 1, [0]))
print("done", flush=True)
"""

CALLS = [
    "allocate",
    "allocate_run",
    "free_block_ids",
    "ref_counts",
    "lookup_prefix",
    "free",
    "incref_all",
    "add_sequence",
    "append_blocks",
    "num_blocks_to_grow",
    "radix insert",
    "match_prefix",
    "extend",
    "hash_blocks",
    "decode_context_lens",
]


def test_calls_the_host_cannot_hold_raise_memory_error_and_change_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, (
        f"the child ended with status {proc.returncode} after {lines[-1:]}:\n" + proc.stderr[-3000:]
    )
    assert lines == [f"{name} MemoryError unchanged" for name in CALLS] + ["done"]

#!/usr/bin/env python3
"""Differential fuzzer: the native KV bookkeeping against its pure-Python twins.

Decodes the fuzzer's bytes into a sequence of operations over a BlockPool, BlockTables, a
RadixTree and HashChains, valid and invalid alike, and runs each on the native classes and
on the twins of ``enginekit.kv.pyref``. It fails on any difference in results or exception
classes (and, for the radix tree, the hash chains and the newer methods, exception
messages), on any exception other than the documented ones (KVCacheError,
OutOfBlocksError, ValueError), on a failing call that changed the twin's state, on any
check_integrity failure, and on a pool reference count that differs from the references held
by the tables and the tree: the driver owns references the way the cache manager does
(what a table or the tree holds, it holds one pool reference for).

By hand (atheris, coverage-guided over the Python twin; libFuzzer flags pass through)::

    python tests/fuzz/fuzz_native.py -max_total_time=600 [corpus_dir]
    python tests/fuzz/fuzz_native.py tests/fuzz/artifacts/crash-<hash>   # replays one input

Findings (``crash-*``, ``oom-*``, ``timeout-*`` ...) go to ``tests/fuzz/artifacts/``, which git
ignores, unless ``-artifact_prefix=`` says otherwise. Every size the harness passes is one the
structures accept at a few blocks, or one they refuse before allocating (past MAX_BLOCKS or
MAX_TABLE_LEN), so a run stays within libFuzzer's default memory limit.

Without atheris, ``run_one(data)`` is the entry point (tests/project/test_fuzz.py drives it with
hypothesis).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from enginekit import _native
from enginekit.errors import KVCacheError, OutOfBlocksError

if __name__ == "__main__":
    # Coverage guidance comes from the twins' Python code (the native module cannot be
    # instrumented from here): instrument them as they are imported.
    import atheris

    with atheris.instrument_imports(include=["enginekit.kv"]):
        from enginekit.kv import pyref
        from enginekit.kv.pyref import hashing as pyhash
else:
    from enginekit.kv import pyref
    from enginekit.kv.pyref import hashing as pyhash

DOCUMENTED = (KVCacheError, OutOfBlocksError, ValueError, TypeError)
MAX_STEPS = 200
HASHES = [0, 1, 2, 3, 2**64 - 1]
# append_holes counts: a few holes, or counts refused before anything is allocated.
HOLE_COUNTS = [-1, 0, 1, 2, 3, _native.MAX_TABLE_LEN + 1, 2**64]
# Where findings go unless -artifact_prefix= is given (ignored by git).
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def not_a_list(kind: str, items: list[int]) -> Any:
    """``items`` in a container the bindings refuse (a fresh one per call: a generator can
    be consumed once)."""

    def gen() -> Iterator[int]:
        yield from items

    return {
        "bytes": lambda: bytes(x % 256 for x in items),
        "str": lambda: "".join(str(x % 10) for x in items),
        "dict": lambda: dict.fromkeys(items, 0),
        "set": lambda: set(items),
        "generator": gen,
        "none": lambda: None,
        # int32: the block tables' batch calls take int64 arrays (and nothing else does)
        "array": lambda: np.array(items, dtype=np.int32),
    }[kind]()


NOT_A_LIST = ["bytes", "str", "dict", "set", "generator", "none", "array"]


class Bytes:
    """Reads small ints off the input; an exhausted input reads as zeros."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def more(self) -> bool:
        return self.pos < len(self.data)

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def int(self, lo: int, hi: int) -> int:
        """An int in [lo, hi] (hi - lo < 65536)."""
        span = hi - lo + 1
        v = self.u8() if span <= 256 else self.u8() | self.u8() << 8
        return lo + v % span

    def pick(self, items: Sequence[Any]) -> Any:
        return items[self.int(0, len(items) - 1)]

    def one_in(self, n: int) -> bool:
        return self.int(0, n - 1) == 0

    def ints(self, lo: int, hi: int, max_len: int) -> list[int]:
        return [self.int(lo, hi) for _ in range(self.int(0, max_len))]


class World:
    """One pool, one set of block tables, one radix tree and one set of hash chains of one
    implementation."""

    def __init__(self, native: bool, num_blocks: int, block_size: int) -> None:
        mod: Any = _native if native else pyref
        prefix = "" if native else "Py"
        self.pool = getattr(mod, prefix + "BlockPool")(num_blocks)
        self.tables = getattr(mod, prefix + "BlockTables")(block_size)
        self.tree = getattr(mod, prefix + "RadixTree")(block_size)
        self.chains = getattr(mod, prefix + "HashChains")(block_size)

    def snapshot(self) -> tuple[Any, ...]:
        pool, tables, tree = self.pool, self.tables, self.tree
        seqs = tables.seq_ids()
        return (
            pool.free_block_ids(),
            pool.evictable_block_ids(),
            pool.ref_counts(),
            pool.cached_blocks(),
            pool.longest_free_run(),
            (pool.num_free_blocks, pool.num_evictable_blocks, pool.num_used_blocks),
            seqs,
            [(tables.block_ids(s), tables.num_holes(s)) for s in seqs],
            [tuple(n) for n in tree.nodes()],
            tree.num_evictable_blocks(),
            [
                (s, self.chains.names(s), self.chains.num_published(s))
                for s in self.chains.seq_ids()
            ],
        )

    def check(self) -> None:
        self.pool.check_integrity()
        self.tables.check_integrity(self.pool)
        self.tables.check_integrity()
        self.tree.check_integrity()
        held = Counter(b for s in self.tables.seq_ids() for b in self.tables.block_ids(s))
        del held[-1]
        held.update(b for n in self.tree.nodes() for b in n.block_ids)
        counts = {b: rc for b, rc in enumerate(self.pool.ref_counts()) if rc}
        assert counts == dict(held), f"pool ref counts {counts}, owners hold {dict(held)}"


def outcome(fn: Callable[[World], Any], world: World, messages: bool) -> tuple[str, Any]:
    try:
        result = fn(world)
    except DOCUMENTED as exc:
        return ("raised", (type(exc).__name__, str(exc) if messages else ""))
    if isinstance(result, tuple):  # named tuples compare as tuples
        result = tuple(result)
    return ("returned", result)


class Fuzz:
    def __init__(self, data: bytes) -> None:
        self.b = Bytes(data)
        self.num_blocks = self.b.int(1, 16)
        self.bs = self.b.int(1, 4)
        self.native = World(True, self.num_blocks, self.bs)
        self.python = World(False, self.num_blocks, self.bs)
        # Token sequences are cut from two shared bases over a tiny alphabet, so that the
        # tree shares prefixes, splits edges inside and on block boundaries, and grows deep.
        self.bases = [[self.b.int(0, 3) for _ in range(self.b.int(1, 24))] for _ in range(2)]
        self.node_ids = [0]

    # ---- plumbing -------------------------------------------------------------------------

    def call(
        self, what: str, fn: Callable[[World], Any], messages: bool = False
    ) -> tuple[bool, Any]:
        """fn on both worlds, which must agree; returns (returned?, the result)."""
        before = self.python.snapshot()
        expected = outcome(fn, self.python, messages)
        if expected[0] == "raised":
            assert self.python.snapshot() == before, f"python {what} raised but changed state"
        got = outcome(fn, self.native, messages)
        assert got == expected, f"{what}: native {got}, python {expected}"
        return expected[0] == "returned", expected[1]

    def must(self, what: str, fn: Callable[[World], Any]) -> Any:
        """A call the driver's bookkeeping relies on: it must succeed on both."""
        ok, value = self.call(what, fn)
        assert ok, f"{what} raised {value}"
        return value

    def seq_id(self) -> int:
        existing = self.python.tables.seq_ids()
        if existing and not self.b.one_in(4):
            return int(self.b.pick(existing))
        return int(self.b.pick([0, 1, 2, 3, 4, 5, -1, 2**64, 2**64 - 1]))

    def table(self, seq_id: int) -> list[int]:
        t = self.python.tables
        return list(t.block_ids(seq_id)) if seq_id in t.seq_ids() else []

    def block_id(self) -> int:
        return self.b.int(-1, self.num_blocks + 1)

    def allocate(self, k: int) -> list[int] | None:
        method = self.b.pick(["allocate", "allocate_run"])
        exact = method == "allocate_run"  # allocate's messages differ between the twins
        ok, ids = self.call(f"{method}({k})", lambda w: getattr(w.pool, method)(k), exact)
        return ids if ok else None

    def free(self, ids: list[int]) -> None:
        self.must(f"free({ids})", lambda w: w.pool.free(ids))

    def tokens(self) -> list[int]:
        base = self.b.pick(self.bases)
        return base[: self.b.int(0, len(base))] + self.b.ints(0, 3, 6)

    # ---- tables ---------------------------------------------------------------------------

    def op_add(self) -> None:
        seq, ids = self.seq_id(), self.allocate(self.b.int(0, 4))
        if ids is None:
            return
        if self.b.one_in(10):
            ids = ids + [self.b.pick([-1, 2**31])]  # a bad entry: refused as a whole
        ok, _ = self.call(f"add_sequence({seq})", lambda w: w.tables.add_sequence(seq, ids))
        if not ok:
            self.free([b for b in ids if 0 <= b < self.num_blocks])

    def op_remove(self) -> None:
        seq = self.seq_id()
        ok, ids = self.call(f"remove({seq})", lambda w: w.tables.remove_sequence(seq))
        if ok:
            self.free(ids)

    def op_append(self) -> None:
        seq, ids = self.seq_id(), self.allocate(self.b.int(0, 3))
        if ids is None:
            return
        ok, _ = self.call(f"append({seq})", lambda w: w.tables.append_blocks(seq, ids))
        if not ok:
            self.free(ids)

    def op_release_range(self) -> None:
        seq = self.seq_id()
        length = len(self.table(seq))
        first, end = self.b.int(-1, length + 1), self.b.int(-1, length + 1)
        ok, ids = self.call(
            f"release_range({seq}, {first}, {end})",
            lambda w: w.tables.release_range(seq, first, end),
            True,
        )
        if ok:
            self.free(ids)

    def op_append_holes(self) -> None:
        seq = self.seq_id()
        n = self.b.pick(HOLE_COUNTS)
        self.call(f"append_holes({seq}, {n})", lambda w: w.tables.append_holes(seq, n), True)

    def op_fork(self) -> None:
        parent, child = self.seq_id(), self.seq_id()
        ok, ids = self.call(f"fork({parent}, {child})", lambda w: w.tables.fork(parent, child))
        for b in ids if ok else []:
            self.must(f"incref({b})", lambda w, b=b: w.pool.incref(b))

    def op_copy_on_write(self) -> None:
        seq = self.seq_id()
        index = self.b.int(-1, len(self.table(seq)))
        new = self.allocate(1)
        if new is None:
            return
        block = self.b.pick([-1, 2**31]) if self.b.one_in(8) else new[0]
        ok, old = self.call(
            f"set_block({seq}, {index}, {block})", lambda w: w.tables.set_block(seq, index, block)
        )
        self.free([old] if ok else new)

    def op_grow(self) -> None:
        seqs = [self.seq_id() for _ in range(self.b.int(0, 3))]
        tokens = [self.b.int(-1, 5 * self.bs) for _ in seqs]
        if self.b.one_in(6):
            tokens = tokens[:-1] if tokens else [1]
        self.call("num_blocks_to_grow", lambda w: w.tables.num_blocks_to_grow(seqs, tokens))
        if self.b.one_in(2):
            self.call(f"grow({seqs}, {tokens})", lambda w: w.tables.grow(w.pool, seqs, tokens))
            return
        room = self.b.one_in(2)  # what make_room answers; the calls it gets must agree

        def grow_with(w: World) -> tuple[Any, list[int]]:
            asked: list[int] = []
            grown = w.tables.grow_with(w.pool, seqs, tokens, lambda n: asked.append(n) or room)
            return grown, asked

        self.call(f"grow_with({seqs}, {tokens}, room {room})", grow_with)

    def op_cache_blocks(self) -> None:
        seq = self.seq_id()
        first = self.b.int(-1, len(self.table(seq)) + 1)
        hashes = [self.b.pick(HASHES) for _ in range(self.b.int(0, 3))]
        if self.b.one_in(8):
            hashes.append(self.b.pick([-1, 2**64]))
        self.call("cache_blocks", lambda w: w.tables.cache_blocks(w.pool, seq, first, hashes))

    def op_export(self) -> None:
        seqs = [self.seq_id() for _ in range(self.b.int(0, 3))]
        width = self.b.int(-1, 6)
        size = max(0, len(seqs) * max(width, 0) - self.b.int(0, 1))
        pad = self.b.pick([-1, 0, 2**31 - 1, 2**31])

        def export(w: World) -> list[int]:
            out = np.full(size, 1234, np.int32)
            try:
                w.tables.export_into(seqs, out, width, pad)
            finally:
                snapshot = out.tolist()
            return snapshot

        self.call("export_into", export)

    def op_table_queries(self) -> None:
        seq = self.seq_id()
        index = self.b.int(-1, len(self.table(seq)))
        self.call("block_ids", lambda w: w.tables.block_ids(seq))
        self.call("block_id_at", lambda w: w.tables.block_id_at(seq, index))
        self.call("num_blocks", lambda w: w.tables.num_blocks(seq))
        self.call("num_holes", lambda w: w.tables.num_holes(seq), True)
        self.call("max_num_blocks", lambda w: w.tables.max_num_blocks([seq, seq]))

    # ---- pool -----------------------------------------------------------------------------

    def op_pool_probe(self) -> None:
        """Ownership-neutral pool calls: an incref undone at once (which moves an evictable
        block to the recent end of the LRU list), a free of an unowned id (which must fail),
        queries, bad counts, an allocation given back."""
        b = self.block_id()
        ok, _ = self.call(f"incref({b})", lambda w: w.pool.incref(b))
        if ok:
            self.must(f"free([{b}])", lambda w: w.pool.free([b]))
        pins = [self.block_id() for _ in range(self.b.int(0, 3))]
        ok, _ = self.call(f"incref_all({pins})", lambda w: w.pool.incref_all(pins))
        if ok:
            self.must(f"free({pins})", lambda w: w.pool.free(pins))
        b = self.block_id()
        if not 0 <= b < self.num_blocks or self.python.pool.ref_count(b) == 0:
            self.call(f"free([{b}])", lambda w: w.pool.free([b]))
        self.call("ref_count", lambda w: w.pool.ref_count(b))
        k = self.b.int(-1, self.num_blocks + 1)
        ids = self.allocate(k)
        if ids:
            self.free(ids)

    def op_pool_evict(self) -> None:
        b = self.block_id()
        self.call(f"evict({b})", lambda w: w.pool.evict(b))
        k = self.b.int(-1, self.python.pool.num_evictable_blocks + 1)
        self.call(f"evict_lru({k})", lambda w: w.pool.evict_lru(k))

    def op_pool_lookup(self) -> None:
        hashes = [self.b.pick(HASHES) for _ in range(self.b.int(0, 3))]
        self.call("lookup_prefix", lambda w: w.pool.lookup_prefix(hashes))

    # ---- radix tree -----------------------------------------------------------------------

    def op_radix_insert(self) -> None:
        seq = self.seq_id()
        blocks = self.table(seq)
        tokens = self.tokens()[: len(blocks) * self.bs + (1 if self.b.one_in(8) else 0)]
        if self.b.one_in(10):
            tokens.append(self.b.pick([-1, 2**32]))
        if self.b.one_in(10):
            blocks.append(self.b.pick([-1, 2**31]))
        ok, result = self.call(
            f"insert({tokens}, {blocks})", lambda w: w.tree.insert(tokens, blocks), True
        )
        if ok:
            _, refs, node_id, released = result
            self.node_ids.append(node_id)
            for b in refs:
                self.must(f"incref({b})", lambda w, b=b: w.pool.incref(b))
            if released:
                self.free(released)

    def op_radix_match(self) -> None:
        tokens = self.tokens()
        if self.b.one_in(10):
            tokens.append(-1)
        limit = self.b.pick([None, None, -1, *range(len(tokens) + 2)])
        ok, result = self.call(
            f"match_prefix(.., {limit})", lambda w: w.tree.match_prefix(tokens, limit), True
        )
        if ok:
            self.node_ids.append(result[2])

    def node_id(self) -> int:
        if self.b.one_in(6):
            return int(self.b.pick([-1, 2**64, 10_000]))
        return int(self.b.pick(self.node_ids))

    def op_radix_lock(self) -> None:
        node = self.node_id()
        method = self.b.pick(["lock", "unlock"])
        self.call(f"{method}({node})", lambda w: getattr(w.tree, method)(node), True)

    def op_radix_evict(self) -> None:
        k = self.b.int(-1, 6)
        ok, released = self.call(f"tree.evict({k})", lambda w: w.tree.evict(k), True)
        if ok:
            self.free(released)

    # ---- hash chains ----------------------------------------------------------------------

    def op_chains_extend(self) -> None:
        seq = self.seq_id()
        tokens = self.tokens()
        if self.b.one_in(10):
            tokens.append(self.b.pick([-1, 2**32]))
        num_blocks = self.b.int(-1, len(tokens) // self.bs + 1)
        key = self.b.pick([None, None, b"k"])
        self.call(
            f"chains.extend({seq}, {tokens}, {num_blocks}, {key!r})",
            lambda w: w.chains.extend(seq, tokens, num_blocks, key),
            True,
        )

    def op_chains_publish(self) -> None:
        seq = self.seq_id()
        num_names = self.python.chains.num_names(seq) if 0 <= seq < 2**64 else 0
        end = self.b.int(-1, num_names + 1)
        self.call(
            f"chains.publish({seq}, {end})",
            lambda w: w.chains.publish(w.tables, w.pool, seq, end),
            True,
        )

    def op_chains_publish_filled(self) -> None:
        seqs = [self.seq_id() for _ in range(self.b.int(0, 3))]
        lists = [self.tokens() for _ in seqs]
        counts = [max(0, len(t) + self.b.int(-1, 1)) for t in lists]
        keys = [self.b.pick([None, None, b"k"]) for _ in seqs]
        self.call(
            f"chains.publish_filled({seqs}, {counts})",
            lambda w: w.chains.publish_filled(w.tables, w.pool, seqs, lists, counts, keys),
            True,
        )

    def op_chains_queries(self) -> None:
        seq = self.seq_id()
        k = self.b.int(0, 6)
        self.call(f"chains.lookup({seq}, {k})", lambda w: w.chains.lookup(w.pool, seq, k), True)
        self.call(
            f"chains.is_cached({seq}, {k})", lambda w: w.chains.is_cached(w.pool, seq, k), True
        )
        if self.b.one_in(4):
            self.call(f"chains.remove({seq})", lambda w: w.chains.remove(seq), True)

    # ---- argument types -------------------------------------------------------------------

    def op_bad_types(self) -> None:
        """A list argument of a refused type (TypeError on both, nothing changed); or a
        tuple, which both accept where a list is."""
        kind = self.b.pick([*NOT_A_LIST, "tuple"])
        items = self.b.ints(0, self.num_blocks, 3)
        seq = self.seq_id()

        def arg() -> Any:
            return tuple(items) if kind == "tuple" else not_a_list(kind, items)

        calls: list[tuple[str, Callable[[World], Any]]] = [
            ("lookup_prefix", lambda w: w.pool.lookup_prefix(arg())),
            ("num_blocks_to_grow", lambda w: w.tables.num_blocks_to_grow(arg(), [1] * 3)),
            ("max_num_blocks", lambda w: w.tables.max_num_blocks(arg())),
            ("match_prefix", lambda w: w.tree.match_prefix(arg())),
            ("hash_blocks", lambda w: _hash_module(w).hash_blocks(arg(), self.bs)),
        ]
        if kind != "tuple":  # would change the state: only their refusal is checked
            calls += [
                ("free", lambda w: w.pool.free(arg())),
                ("add_sequence", lambda w: w.tables.add_sequence(seq, arg())),
                ("append_blocks", lambda w: w.tables.append_blocks(seq, arg())),
                ("grow", lambda w: w.tables.grow(w.pool, [seq], arg())),
                ("insert", lambda w: w.tree.insert(arg(), [0] * 8)),
            ]
        what, fn = self.b.pick(calls)
        ok, _ = self.call(f"{what}({kind} {items})", fn, kind != "tuple")
        assert not ok or kind == "tuple", f"{what} accepted a {kind}"

    # ---- driver ---------------------------------------------------------------------------

    OPS: list[Callable[[Fuzz], None]] = []

    def run(self) -> None:
        for _ in range(MAX_STEPS):
            if not self.b.more():
                break
            self.b.pick(self.OPS)(self)
            self.check()

    def check(self) -> None:
        assert self.native.snapshot() == self.python.snapshot(), "states differ"
        self.python.check()
        self.native.check()


Fuzz.OPS = [
    Fuzz.op_add,
    Fuzz.op_add,
    Fuzz.op_remove,
    Fuzz.op_append,
    Fuzz.op_release_range,
    Fuzz.op_release_range,
    Fuzz.op_append_holes,
    Fuzz.op_fork,
    Fuzz.op_copy_on_write,
    Fuzz.op_grow,
    Fuzz.op_cache_blocks,
    Fuzz.op_export,
    Fuzz.op_table_queries,
    Fuzz.op_pool_probe,
    Fuzz.op_pool_evict,
    Fuzz.op_pool_lookup,
    Fuzz.op_radix_insert,
    Fuzz.op_radix_insert,
    Fuzz.op_radix_match,
    Fuzz.op_radix_lock,
    Fuzz.op_radix_evict,
    Fuzz.op_chains_extend,
    Fuzz.op_chains_publish,
    Fuzz.op_chains_publish_filled,
    Fuzz.op_chains_queries,
    Fuzz.op_bad_types,
]


def _hash_module(world: World) -> Any:
    """The block hashing of the world's implementation."""
    return _native if type(world.pool).__module__ == _native.__name__ else pyhash


def run_one(data: bytes) -> None:
    """Decodes and runs one input; raises AssertionError on any finding."""
    Fuzz(data).run()


def libfuzzer_argv(argv: list[str]) -> list[str]:
    """``argv`` with ``-artifact_prefix=`` pointing into ``ARTIFACTS`` unless it names one."""
    if any(a.startswith("-artifact_prefix=") for a in argv[1:]):
        return list(argv)
    return [argv[0], f"-artifact_prefix={ARTIFACTS}/", *argv[1:]]


def main(argv: list[str]) -> None:
    import atheris

    ARTIFACTS.mkdir(exist_ok=True)
    atheris.Setup(libfuzzer_argv(argv), run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

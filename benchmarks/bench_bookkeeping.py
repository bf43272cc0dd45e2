"""Host bookkeeping: the Rust structures against their pure-Python twins, per operation and
per scheduler step.

Measured side by side in one run, interleaved round by round (noise hits both alike), on
the same operations and the same data:

1. operations, one call each: pool allocate + free; table growth and batch export; prefix
   match and insert for both prefix caches (``block_hash``: hash the prompt's blocks and
   look the chain up in the pool, publish a sequence's blocks under their hashes;
   ``radix``: match a prompt in the tree, insert a sequence);
2. steps with 256 running sequences: one decode step at the KV-structure level (how many
   blocks the batch needs, grow every table by one token, export the batch's block
   tables), with a block boundary crossed by 1 in 16 sequences; the scheduler's
   ``schedule()`` + ``update()`` alone (the executor's tokens given, no cost model, no
   metrics); then one whole engine step (schedule, simulated execute, update, metrics),
   each with 256 running decodes, native structures against the reference ones, for both
   prefix caches.

Times are CPU time of this process (``time.process_time``: these machines are shared, so
wall time counts other work). Goals: structures <= 100 us per step with Rust, schedule +
update <= 50 us, and Rust >= 20x faster than Python on the structures. Absolute times are
this machine's only; the ratios are what carries over. About a minute with the defaults.

    python benchmarks/bench_bookkeeping.py [--steps 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from enginekit import Engine, SamplingParams, _native
from enginekit.kv.backend import make_backend
from enginekit.kv.pyref import PyBlockPool, PyBlockTables, PyRadixTree
from enginekit.kv.pyref import hashing as pyhash
from enginekit.step import ModelOutput

NUM_SEQS = 256
BLOCK_SIZE = 16
CONTEXT = 1000  # tokens each sequence holds when a step measurement starts
PROMPT = 1024  # tokens of a prompt matched or inserted (64 blocks)
SHARED = 512  # tokens the radix tree's sequences share
VOCAB = 128_000
MAX_TOKENS = 4000  # each decoding request's output bound: the steps a decode step case lasts


class Impl(NamedTuple):
    """One implementation of the structures: Rust or the Python twins."""

    name: str
    pool: type
    tables: type
    radix: type
    hash_blocks: Callable[..., list[int]]


RUST = Impl("Rust", _native.BlockPool, _native.BlockTables, _native.RadixTree, _native.hash_blocks)
PYTHON = Impl("Python", PyBlockPool, PyBlockTables, PyRadixTree, pyhash.hash_blocks)

# A case builds, for one implementation and a number of calls to come, the closure to
# time; anything a call consumes (fresh blocks, fresh sequences) is prepared here.
Case = Callable[[Impl, int], Callable[[], None]]


class Row(NamedTuple):
    """One measurement: median seconds per call of each implementation."""

    section: str
    name: str
    rust_s: float
    python_s: float

    @property
    def ratio(self) -> float:
        return self.python_s / self.rust_s


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


def pool_allocate_free(impl: Impl, num_calls: int) -> Callable[[], None]:
    pool = impl.pool(4096)

    def call() -> None:
        pool.free(pool.allocate(64))

    return call


def table_grow(impl: Impl, num_calls: int) -> Callable[[], None]:
    """One sequence of a 256-sequence batch grows into one more block, taken from the pool
    (the decode step's growth, one sequence at a time)."""
    per_seq = -(-(num_calls + 1) // NUM_SEQS)  # blocks each sequence gains over the run
    pool = impl.pool(NUM_SEQS * (64 + per_seq))
    tables = impl.tables(BLOCK_SIZE)
    for seq_id in range(NUM_SEQS):
        tables.add_sequence(seq_id, pool.allocate(64))
    counter = iter(range(num_calls + 1))

    def call() -> None:
        i = next(counter)
        seq_id = i % NUM_SEQS
        assert tables.grow(pool, [seq_id], [(65 + i // NUM_SEQS) * BLOCK_SIZE]) == 1

    return call


def table_export(impl: Impl, num_calls: int) -> Callable[[], None]:
    tables = impl.tables(BLOCK_SIZE)
    for seq_id in range(NUM_SEQS):
        tables.add_sequence(seq_id, list(range(seq_id * 64, seq_id * 64 + 64)))
    seq_ids = list(range(NUM_SEQS))
    out = np.empty((NUM_SEQS, 128), dtype=np.int32)
    return lambda: tables.export_into(seq_ids, out, 128)


def block_hash_match(impl: Impl, num_calls: int) -> Callable[[], None]:
    """A 1,024-token prompt whose 64 blocks are all cached: hash them, look them up."""
    prompt = _tokens(0, PROMPT)
    pool, tables = impl.pool(128), impl.tables(BLOCK_SIZE)
    tables.add_sequence(0, pool.allocate(PROMPT // BLOCK_SIZE))
    tables.cache_blocks(pool, 0, 0, impl.hash_blocks(prompt, BLOCK_SIZE))

    def call() -> None:
        hit = pool.lookup_prefix(impl.hash_blocks(prompt, BLOCK_SIZE))
        assert len(hit) == PROMPT // BLOCK_SIZE

    return call


def block_hash_insert(impl: Impl, num_calls: int) -> Callable[[], None]:
    """Publishing a sequence's 64 computed blocks under their (precomputed) hashes."""
    num_blocks = PROMPT // BLOCK_SIZE
    pool, tables = impl.pool(num_blocks * (num_calls + 1)), impl.tables(BLOCK_SIZE)
    rng = np.random.default_rng(1)
    hashes = []
    for seq_id in range(num_calls + 1):
        tables.add_sequence(seq_id, pool.allocate(num_blocks))
        hashes.append(rng.integers(0, 2**63, num_blocks).tolist())
    counter = iter(range(num_calls + 1))

    def call() -> None:
        seq_id = next(counter)
        tables.cache_blocks(pool, seq_id, 0, hashes[seq_id])

    return call


def _radix_tree(impl: Impl) -> tuple[object, list[list[int]]]:
    """A tree of NUM_SEQS 1,024-token sequences sharing a 512-token prefix."""
    tree = impl.radix(BLOCK_SIZE)
    shared = _tokens(2, SHARED)
    sequences = [shared + _tokens(100 + i, PROMPT - SHARED) for i in range(NUM_SEQS)]
    block_ids = list(range(PROMPT // BLOCK_SIZE))
    for sequence in sequences:
        tree.insert(sequence, block_ids)
    return tree, sequences


def radix_match(impl: Impl, num_calls: int) -> Callable[[], None]:
    tree, sequences = _radix_tree(impl)
    query = sequences[NUM_SEQS // 2]

    def call() -> None:
        assert tree.match_prefix(query).num_tokens == PROMPT  # type: ignore[attr-defined]

    return call


def radix_insert(impl: Impl, num_calls: int) -> Callable[[], None]:
    """A new 1,024-token sequence sharing the tree's 512-token prefix: one new leaf."""
    tree, sequences = _radix_tree(impl)
    shared = sequences[0][:SHARED]
    fresh = [shared + _tokens(10_000 + i, PROMPT - SHARED) for i in range(num_calls + 1)]
    block_ids = list(range(PROMPT // BLOCK_SIZE))
    counter = iter(fresh)

    def call() -> None:
        tree.insert(next(counter), block_ids)  # type: ignore[attr-defined]

    return call


OPERATIONS: tuple[tuple[str, Case], ...] = (
    ("pool: allocate 64 blocks + free them", pool_allocate_free),
    ("tables: grow a table by one block", table_grow),
    ("tables: export 256 tables of 64 blocks", table_export),
    ("block_hash match: hash + look up 64 blocks", block_hash_match),
    ("block_hash insert: publish 64 blocks", block_hash_insert),
    ("radix match: 1,024 tokens, 256 in tree", radix_match),
    ("radix insert: 1,024 tokens, 512 shared", radix_insert),
)


def structure_step(impl: Impl, num_calls: int) -> Callable[[], None]:
    """One decode step's bookkeeping of NUM_SEQS sequences: count, grow, export."""
    pool = impl.pool(NUM_SEQS * (CONTEXT + 4096) // BLOCK_SIZE + NUM_SEQS)
    tables = impl.tables(BLOCK_SIZE)
    seq_ids = list(range(NUM_SEQS))
    # stagger lengths so that each step 1 in 16 sequences crosses into a new block
    lengths = [CONTEXT + i % BLOCK_SIZE for i in seq_ids]
    for seq_id, length in zip(seq_ids, lengths, strict=True):
        tables.add_sequence(seq_id, pool.allocate(-(-length // BLOCK_SIZE)))
    width = 512
    out = np.empty((NUM_SEQS, width), dtype=np.int32)

    def step() -> None:
        for i in range(NUM_SEQS):
            lengths[i] += 1
        if tables.num_blocks_to_grow(seq_ids, lengths) <= pool.num_free_blocks:
            tables.grow(pool, seq_ids, lengths)
        tables.export_into(seq_ids, out, width)

    return step


def _decoding_engine(prefix: str, impl: Impl, num_seqs: int = NUM_SEQS) -> Engine:
    """An engine whose ``num_seqs`` requests have all been prefilled and decode from now on."""
    overrides = [
        "progress=false",
        f"+prefix={prefix}",
        f"scheduler.max_num_seqs={num_seqs}",
        "cache.num_blocks=200000",
    ]
    # The twins' engine takes them as its backend. The Rust one is built without the
    # argument: tools/compare_checkouts.py runs this harness on older checkouts' engines,
    # which do not take it.
    if impl is RUST:
        engine = Engine.from_overrides(overrides)
    else:
        engine = Engine.from_overrides(overrides, make_backend(native=False))
    for i in range(num_seqs):
        prompt = [(i * 7919 + j) % 32000 + 1 for j in range(CONTEXT + i % BLOCK_SIZE)]
        engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    while len(engine.scheduler.running) < num_seqs or any(
        r.num_output_tokens == 0 for r in engine.scheduler.running
    ):
        engine.step()
    return engine


def scheduler_step(prefix: str, num_seqs: int = NUM_SEQS) -> Case:
    """``schedule()`` + ``update()`` with ``num_seqs`` running decodes, the tokens given."""

    def make(impl: Impl, num_calls: int) -> Callable[[], None]:
        scheduler = _decoding_engine(prefix, impl, num_seqs).scheduler
        tokens = [(7 * i) % 31000 + 1 for i in range(num_seqs)]

        def call() -> None:
            scheduled = scheduler.schedule()
            scheduler.update(scheduled, ModelOutput(tokens[: len(scheduled.sample_seq_ids)], 0.0))

        return call

    return make


def engine_step(prefix: str) -> Case:
    """One engine step with NUM_SEQS running decodes, on native or reference structures."""

    def make(impl: Impl, num_calls: int) -> Callable[[], None]:
        engine = _decoding_engine(prefix, impl)

        def call() -> None:
            engine.step()

        return call

    return make


STEPS: tuple[tuple[str, Case], ...] = (
    ("structures: count + grow + export", structure_step),
    ("schedule + update, block_hash", scheduler_step("block_hash")),
    ("schedule + update, radix", scheduler_step("radix")),
    ("engine step, block_hash (schedule+sim+update)", engine_step("block_hash")),
    ("engine step, radix (schedule+sim+update)", engine_step("radix")),
)


def time_per_call(call: Callable[[], None], num_calls: int) -> float:
    start = time.process_time()
    for _ in range(num_calls):
        call()
    return (time.process_time() - start) / num_calls


def side_by_side(case: Case, rust_calls: int, rounds: int) -> tuple[float, float]:
    """Median seconds per call of Rust and Python over interleaved rounds; Python makes a
    tenth of Rust's calls per round (at least one)."""
    python_calls = max(1, rust_calls // 10)
    rust = case(RUST, rust_calls * rounds)
    python = case(PYTHON, python_calls * rounds)
    rust_times, python_times = [], []
    for _ in range(rounds):
        rust_times.append(time_per_call(rust, rust_calls))
        python_times.append(time_per_call(python, python_calls))
    return statistics.median(rust_times), statistics.median(python_times)


def run(steps: int = 2000, rounds: int = 5, echo: bool = True) -> list[Row]:
    """Every operation (``steps`` Rust calls per round) and every step (a tenth of that),
    side by side; prints each row as it comes when ``echo``."""
    rows = []
    plan = [("operation", OPERATIONS, steps), (f"step, {NUM_SEQS} running", STEPS, steps // 10)]
    for section, cases, num_calls in plan:
        if echo:
            print(f"\n{'per ' + section:<48} {'Rust us':>10} {'Python us':>12} {'ratio':>9}")
        for name, case in cases:
            rust_s, python_s = side_by_side(case, max(1, num_calls), rounds)
            row = Row(section, name, rust_s, python_s)
            rows.append(row)
            if echo:
                print(
                    f"{name:<48} {rust_s * 1e6:>10.1f} {python_s * 1e6:>12.1f} {row.ratio:>8.1f}x"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="Rust calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{NUM_SEQS} sequences, block size {BLOCK_SIZE}, {CONTEXT} tokens each in steps; "
        f"prompts of {PROMPT} tokens"
    )
    run(args.steps, args.rounds)


if __name__ == "__main__":
    main()

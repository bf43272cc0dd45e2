"""Host bookkeeping per scheduler step: the Rust structures against their pure-Python twins.

Measured side by side in one run, interleaved, on the same operations:

1. structures: one decode step of 256 running sequences at the KV-structure level
   (how many blocks the batch needs, grow every table by one token, export the batch's
   block tables as one int32 array), with a block boundary crossed by 1 in 16 sequences;
2. engine: one whole engine step (schedule, simulated execute, update, metrics) with 256
   running decodes, native structures against the reference ones, for both prefix caches.

Goals: structures <= 100 us per step with Rust, and Rust >= 20x faster than Python.
Absolute times are this machine's only; the ratios are what carries over.

    python benchmarks/bench_bookkeeping.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from enginekit import Engine, SamplingParams
from enginekit._native import BlockPool, BlockTables
from enginekit.kv.pyref import PyBlockPool, PyBlockTables

NUM_SEQS = 256
BLOCK_SIZE = 16
CONTEXT = 1000  # tokens each sequence holds when the measurement starts


def structure_step_factory(pool_cls: type, tables_cls: type) -> Callable[[], None]:
    """A closure doing one decode step's bookkeeping on fresh structures each call."""
    pool = pool_cls(NUM_SEQS * (CONTEXT + 4096) // BLOCK_SIZE + NUM_SEQS)
    tables = tables_cls(BLOCK_SIZE)
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


def engine_step_factory(native: bool, prefix: str = "block_hash") -> Callable[[], None]:
    """A closure doing one engine step with NUM_SEQS running decodes."""
    engine = Engine.from_overrides(
        ["progress=false", f"+prefix={prefix}", f"cache.native={native}",
         f"scheduler.max_num_seqs={NUM_SEQS}", "cache.num_blocks=200000"]
    )  # fmt: skip
    for i in range(NUM_SEQS):
        prompt = [(i * 7919 + j) % 32000 + 1 for j in range(CONTEXT)]
        engine.add_request(prompt, SamplingParams(max_tokens=4000, ignore_eos=True))
    while len(engine.scheduler.running) < NUM_SEQS or any(
        r.num_output_tokens == 0 for r in engine.scheduler.running
    ):
        engine.step()
    return lambda: engine.step()


def time_per_call(step: Callable[[], None], num_calls: int) -> float:
    start = time.perf_counter()
    for _ in range(num_calls):
        step()
    return (time.perf_counter() - start) / num_calls


def side_by_side(
    name: str, rust: Callable[[], None], python: Callable[[], None], steps: int, rounds: int
) -> tuple[float, float]:
    """Median per-call time of each over interleaved rounds (noise hits both alike)."""
    rust_times, python_times = [], []
    for _ in range(rounds):
        rust_times.append(time_per_call(rust, steps))
        python_times.append(time_per_call(python, max(1, steps // 10)))
    r, p = statistics.median(rust_times), statistics.median(python_times)
    print(f"{name:<46} {r * 1e6:>10.1f} {p * 1e6:>12.1f} {p / r:>8.1f}x")
    return r, p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="calls per round (Rust)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{NUM_SEQS} running decode sequences, block size {BLOCK_SIZE}, ~{CONTEXT} tokens each")
    print(f"{'per step':<46} {'Rust us':>10} {'Python us':>12} {'ratio':>9}")
    side_by_side(
        "structures: grow + export block tables",
        structure_step_factory(BlockPool, BlockTables),
        structure_step_factory(PyBlockPool, PyBlockTables),
        args.steps,
        args.rounds,
    )
    for prefix in ("block_hash", "radix"):
        side_by_side(
            f"engine step, {prefix} (schedule+sim+update)",
            engine_step_factory(native=True, prefix=prefix),
            engine_step_factory(native=False, prefix=prefix),
            max(1, args.steps // 10),
            args.rounds,
        )


if __name__ == "__main__":
    main()

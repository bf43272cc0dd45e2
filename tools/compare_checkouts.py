"""Two checkouts of the project side by side, one process at a time, alternating.

Measures the cache manager's CPU time per generated token in ``bench_cache_manager.py``'s
replay, or the scheduler's ``schedule()`` + ``update()`` at 256 decodes, for each checkout in
a fresh process of its own, one at a time, the two alternating (new then base, base then
new, ...) so that a change in the machine's load falls on both alike.

On a shared machine a run is slowed by what else the machine does, never sped up, and the
two sides of a pair are not always slowed alike; so besides each pair's ratio (base ÷ new:
how many times less time the new checkout takes) this prints the ratios' median, geometric
mean and range, and the ratio of each side's fastest run.

    python3 tools/compare_checkouts.py BASE [--checkout DIR] [--pairs 12] \\
        [--workload multiturn] [--pool 4096] [--prefix block_hash] [--requests 2000]
    python3 tools/compare_checkouts.py BASE --step block_hash [--pairs 12]

BASE and DIR (default: this checkout) are checkouts of the project (another commit: ``git
worktree add DIR COMMIT``), each with its native module built in place as it ships: ``cargo
build --release`` there with the features its ``pyproject.toml`` gives maturin, then
``target/release/lib_native.so`` copied to ``enginekit/_native.abi3.so``. Each side imports
its own package and plugins. The replay is each checkout's own
(``bench_cache_manager.replay``, Rust structures): its manager time is what that checkout
reports. The step is this checkout's ``bench_bookkeeping.py`` harness on each checkout's
engine (256 requests of about 1,000 tokens decoding, the executor's tokens given), timed
in CPU time as the best of 7 rounds of 300 steps after 100 of warm-up, the rounds 0.3 s
apart (the machine slows for stretches of a fraction of a second).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 100
ROUNDS = 7
# The machine slows for stretches of a fraction of a second: rounds that all fall in one
# stretch have no fast one, so each round waits this long first (idle: no CPU time).
ROUND_GAP_S = 0.3


def _import_from(root: Path) -> None:
    """Puts ``root``'s package, plugins and benchmarks first on the path and imports the
    package and the plugins; SystemExit if either comes from elsewhere (the run would
    measure the wrong code)."""
    sys.path[:0] = [str(root / "benchmarks"), str(root), str(root / "plugins")]
    import enginekit_plugins

    import enginekit

    for module in (enginekit, enginekit_plugins):
        origin = Path(module.__file__ or "").resolve()
        if root not in origin.parents:
            raise SystemExit(f"{module.__name__} was imported from {origin}, not from {root}")


def replay_us_per_token(root: Path, workload: str, requests: int, pool: int, prefix: str) -> float:
    """The checkout's replay of ``workload`` through its Rust manager: µs per token."""
    _import_from(root)
    import bench_cache_manager

    from enginekit.config import WorkloadConfig

    trace = bench_cache_manager.workload_trace(WorkloadConfig(name=workload, num_requests=requests))
    result = bench_cache_manager.replay(trace, pool, prefix, True)
    return float(result.us_per_token)


def step_us(root: Path, prefix: str, num_seqs: int, num_steps: int) -> float:
    """The checkout's ``schedule()`` + ``update()`` with ``num_seqs`` decodes, driven by this
    checkout's ``bench_bookkeeping.scheduler_step`` (the same harness for both sides): µs of
    CPU time per step, the best of ROUNDS rounds of ``num_steps`` after WARMUP_STEPS, each
    after ROUND_GAP_S idle."""
    _import_from(root)
    spec = importlib.util.spec_from_file_location(
        "bench_bookkeeping", HERE / "benchmarks" / "bench_bookkeeping.py"
    )
    assert spec is not None and spec.loader is not None
    bench_bookkeeping = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_bookkeeping)  # its imports: ``root``'s package
    # Each request has its first output token when the steps start, and must not finish.
    if 1 + WARMUP_STEPS + ROUNDS * num_steps >= bench_bookkeeping.MAX_TOKENS:
        raise SystemExit(f"{num_steps} steps a round would finish the requests mid-measurement")
    step = bench_bookkeeping.scheduler_step(prefix, num_seqs)(bench_bookkeeping.RUST, 0)
    bench_bookkeeping.time_per_call(step, WARMUP_STEPS)
    rounds = []
    for _ in range(ROUNDS):
        time.sleep(ROUND_GAP_S)
        rounds.append(bench_bookkeeping.time_per_call(step, num_steps))
    return min(rounds) * 1e6


def _measure_in_child(root: Path, args: argparse.Namespace) -> float:
    """One measurement of ``root`` in a fresh interpreter; SystemExit with its error if it
    fails."""
    # The child measures ``--child`` alone (its positional base is only the parser's due).
    command = [sys.executable, __file__, str(root), "--child", str(root)]
    command += ["--workload", args.workload, "--requests", str(args.requests)]
    command += ["--pool", str(args.pool), "--prefix", args.prefix]
    command += ["--num-seqs", str(args.num_seqs), "--steps", str(args.steps)]
    if args.step is not None:
        command += ["--step", args.step]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measuring {root} failed:\n{done.stderr.strip()}")
    return float(done.stdout.split()[-1])


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _checkout(text: str) -> Path:
    root = Path(text).resolve()
    if not (root / "enginekit" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{root} is not a checkout of the project")
    return root


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=_checkout, help="the checkout to compare against")
    parser.add_argument("--checkout", type=_checkout, default=HERE, help="the new side")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--step", metavar="PREFIX", help="compare schedule + update instead")
    parser.add_argument("--workload", default="multiturn")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4096)
    parser.add_argument("--prefix", default="block_hash")
    parser.add_argument("--num-seqs", type=int, default=256, help="decodes in a step")
    parser.add_argument("--steps", type=int, default=300, help="steps in a round")
    parser.add_argument("--child", type=_checkout, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")

    if args.child is not None:
        if args.step is not None:
            value = step_us(args.child, args.step, args.num_seqs, args.steps)
        else:
            value = replay_us_per_token(
                args.child, args.workload, args.requests, args.pool, args.prefix
            )
        print(f"{value:.6f}")
        return

    if args.step is not None:
        what = f"schedule + update at {args.num_seqs} decodes, {args.step}, µs per step"
    else:
        what = (
            f"manager time in the replay of {args.workload} ({args.requests:,} requests) at "
            f"{args.pool:,} blocks, {args.prefix}, µs per generated token"
        )
    print(f"{what}\nnew: {args.checkout}\nbase: {args.base}\n")
    print("| pair | new | base | base ÷ new |\n| ---: | ---: | ---: | ---: |")
    new_values: list[float] = []
    base_values: list[float] = []
    for pair in range(args.pairs):
        if pair % 2 == 0:
            new = _measure_in_child(args.checkout, args)
            base = _measure_in_child(args.base, args)
        else:
            base = _measure_in_child(args.base, args)
            new = _measure_in_child(args.checkout, args)
        new_values.append(new)
        base_values.append(base)
        print(f"| {pair + 1} | {new:.3f} | {base:.3f} | {base / new:.2f}× |", flush=True)
    ratios = [b / n for n, b in zip(new_values, base_values, strict=True)]
    pairs = f"{len(ratios)} pair{'s' if len(ratios) > 1 else ''}"
    print(
        f"\nbase ÷ new over {pairs}: median {statistics.median(ratios):.2f}×, "
        f"geometric mean {_geometric_mean(ratios):.2f}×, {min(ratios):.2f}× to "
        f"{max(ratios):.2f}×; fastest runs {min(base_values):.3f} ÷ {min(new_values):.3f} = "
        f"{min(base_values) / min(new_values):.2f}×"
    )


if __name__ == "__main__":
    main()

"""Instructions the KV cache manager executes per generated token in
``bench_cache_manager.py``'s replay, counted by callgrind: a measure that does not depend
on what else the machine runs, where CPU time on a shared machine varies by tens of
percent from run to run.

The replay reads its clock (``time.process_time_ns``) at the start and the end of each
batch of manager calls; here each reading toggles callgrind's collection instead, so only
the batches are counted, plus a constant per batch (the toggle's own call, measured by
``--empty`` and subtracted by hand: the number of batches is printed). ``--checkout DIR``
measures another checkout of the project (another commit, with its native module built):
its package, its plugins and its own replay are imported instead of this one's.

    cc -O2 -shared -fPIC -o toggle.so tools/callgrind_toggle.c
    valgrind --tool=callgrind --collect-atstart=no python3 \\
        tools/count_manager_instructions.py toggle.so [--workload multiturn] \\
        [--pool 4096] [--prefix block_hash] [--checkout DIR]
    valgrind --tool=callgrind --collect-atstart=no python3 \\
        tools/count_manager_instructions.py toggle.so --empty 100000
    valgrind --tool=callgrind --collect-atstart=no python3 \\
        tools/count_manager_instructions.py toggle.so --scheduler-step block_hash

``--scheduler-step PREFIX`` counts ``bench_bookkeeping.py``'s ``schedule()`` + ``update()``
at 256 decodes instead, ``--engine-step PREFIX`` its whole engine step there (schedule, the
simulator, update, the metrics' record): 300 steps after 50 of warm-up, one toggle at each
end.

callgrind prints the total ("Collected"); divide by the generated tokens printed here.
About four minutes for multiturn at 4,096 blocks (Rust backend). With ``PYTHONHASHSEED=0``
in the environment a count repeats exactly; without it, string hashes are seeded per
process and counts of the same code differ by about 0.5%. Compare two versions with both
run through ``--checkout``: the import path alone moves a replay's count by up to about 2%.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("toggle_lib", help="callgrind_toggle.c built as a shared library")
    parser.add_argument("--workload", default="multiturn")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4096)
    parser.add_argument("--prefix", default="block_hash")
    parser.add_argument("--python", action="store_true", help="the twins, not Rust")
    parser.add_argument("--checkout", type=Path, help="measure this checkout's code instead")
    parser.add_argument(
        "--empty", type=int, metavar="N", help="only N empty batches (the per-batch constant)"
    )
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--scheduler-step", metavar="PREFIX", help="count 300 scheduler steps")
    steps.add_argument("--engine-step", metavar="PREFIX", help="count 300 engine steps")
    args = parser.parse_args(argv)
    toggle = ctypes.CDLL(args.toggle_lib).toggle
    num_toggles = 0

    def clock() -> int:
        nonlocal num_toggles
        toggle()
        num_toggles += 1
        return 0

    if args.empty is not None:
        for _ in range(args.empty):
            start = clock()
            clock() - start
        print(f"{args.empty} empty batches", file=sys.stderr)
        return

    if args.checkout is not None:
        root = args.checkout.resolve()
        sys.path[:0] = [str(root / "benchmarks"), str(root), str(root / "plugins")]
    else:  # this checkout's benchmarks: the replay and the step harness
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

    if args.scheduler_step is not None or args.engine_step is not None:
        import bench_bookkeeping

        if args.scheduler_step is not None:
            prefix, what = args.scheduler_step, "schedule + update"
            case = bench_bookkeeping.scheduler_step(prefix)
        else:
            prefix, what = args.engine_step, "engine step"
            case = bench_bookkeeping.engine_step(prefix)
        step = case(bench_bookkeeping.RUST, 350)
        for _ in range(50):
            step()
        toggle()
        for _ in range(300):
            step()
        toggle()
        print(f"300 steps of {what}, {prefix}", file=sys.stderr)
        return

    import bench_cache_manager as bench

    from enginekit.config import WorkloadConfig

    trace = bench.workload_trace(WorkloadConfig(name=args.workload, num_requests=args.requests))
    bench.clock_cost_ns = lambda *a, **k: 0  # its readings would be counted
    real_clock = time.process_time_ns
    time.process_time_ns = clock  # the replay reads it when it starts
    try:
        result = bench.replay(trace, args.pool, args.prefix, not args.python)
    finally:
        time.process_time_ns = real_clock
    if num_toggles != 2 * result.num_timed_batches:
        raise SystemExit(
            f"the replay read its clock {num_toggles} times for {result.num_timed_batches} "
            "batches: not once at each end of each, so the counts are not the batches'"
        )
    print(
        f"{args.workload} at {args.pool:,} blocks, {args.prefix}: "
        f"{result.num_generated_tokens:,} generated tokens, {result.num_steps:,} steps, "
        f"{result.num_timed_batches:,} batches",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

"""Wall time of the simulated executor's whole run: the default job (Llama-3-8B on an H200,
``shared_prefix``) at growing request counts, to show it grows linearly.

Goal: <= 2 s of wall time per 1,000 requests on the default configuration.

    python benchmarks/bench_simulator.py [--counts 1000,2000,4000]
"""

from __future__ import annotations

import argparse
import time

from enginekit import Engine


def wall_time(num_requests: int, *overrides: str) -> tuple[float, dict]:
    engine = Engine.from_overrides(
        ["progress=false", f"workload.num_requests={num_requests}", *overrides]
    )
    engine.add_workload()
    start = time.perf_counter()
    result = engine.run()
    return time.perf_counter() - start, result.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,2000,4000")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    print(f"{'requests':>9} {'wall s':>8} {'s / 1k req':>11} {'sim s':>9} {'steps/s':>9}")
    base = None
    for count in counts:
        seconds, summary = wall_time(count)
        per_1k = seconds / count * 1000
        base = base or per_1k
        steps = summary.get("num_steps", 0)
        print(
            f"{count:>9} {seconds:>8.2f} {per_1k:>11.2f} {summary['duration_s']:>9.1f} "
            f"{steps / seconds if steps else float('nan'):>9.0f}   x{per_1k / base:.2f} of first"
        )


if __name__ == "__main__":
    main()

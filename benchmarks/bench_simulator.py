"""Wall time of the simulated executor's whole run: the default job (Llama-3-8B on an H200,
``shared_prefix``: a 1,200-token system prompt + ~600 unique tokens, 200-900 output
tokens, all arriving at once) at growing request counts, to show it grows linearly.

Per count: the setup (generating the workload and queueing it) and the run (every step
until the last request finishes), as wall seconds and per 1,000 requests, and the per-1k
time as a multiple of the first count's (1.00 everywhere = linear); the same for this
process's CPU time, which other processes on a shared machine disturb less. Counts run one after
another in this process; the peak resident memory is the process's so far (prompt token
lists dominate it: ~2,000 Python ints per request).

Goal: <= 2 s of wall time per 1,000 requests on the default configuration. Absolute times
are this machine's only.

    python benchmarks/bench_simulator.py [--counts 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from typing import NamedTuple

from enginekit import Engine
from enginekit.driver import WorkloadDriver

DEFAULT_COUNTS = "1000,10000,100000"


class Row(NamedTuple):
    num_requests: int
    setup_s: float
    run_s: float
    cpu_s: float  # this process's CPU time over setup and run
    simulated_s: float
    num_steps: int
    peak_rss_gib: float

    @property
    def wall_s(self) -> float:
        return self.setup_s + self.run_s

    @property
    def per_1k_s(self) -> float:
        return self.wall_s / self.num_requests * 1000

    @property
    def cpu_per_1k_s(self) -> float:
        return self.cpu_s / self.num_requests * 1000


def _peak_rss_gib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)


def measure(num_requests: int, *overrides: str) -> Row:
    """One run of ``num_requests`` requests of the default job (plus ``overrides``)."""
    engine = Engine.from_overrides(
        ["progress=false", f"workload.num_requests={num_requests}", *overrides]
    )
    cpu_start = time.process_time()
    start = time.perf_counter()
    driver = WorkloadDriver(engine)
    driver.add_workload()
    setup = time.perf_counter() - start
    start = time.perf_counter()
    summary = driver.run().summary
    run_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    del engine
    gc.collect()
    return Row(
        num_requests,
        setup,
        run_s,
        cpu_s,
        summary["duration_s"],
        summary["num_steps"],
        _peak_rss_gib(),
    )


def run(counts: list[int], echo: bool = True) -> list[Row]:
    """Measures every count in order; prints each row as it comes when ``echo``."""
    if echo:
        print(
            f"{'requests':>9} {'setup s':>8} {'run s':>8} {'wall s':>8} {'s / 1k req':>11} "
            f"{'x first':>8} {'cpu s / 1k':>11} {'x first':>8} {'sim s':>9} {'steps':>8} "
            f"{'peak GiB':>9}"
        )
    rows: list[Row] = []
    for count in counts:
        row = measure(count)
        rows.append(row)
        if echo:
            print(
                f"{count:>9,} {row.setup_s:>8.2f} {row.run_s:>8.2f} {row.wall_s:>8.2f} "
                f"{row.per_1k_s:>11.3f} {row.per_1k_s / rows[0].per_1k_s:>8.2f} "
                f"{row.cpu_per_1k_s:>11.3f} {row.cpu_per_1k_s / rows[0].cpu_per_1k_s:>8.2f} "
                f"{row.simulated_s:>9.1f} {row.num_steps:>8,} {row.peak_rss_gib:>9.2f}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default=DEFAULT_COUNTS, help="comma-separated")
    args = parser.parse_args()
    run([int(c) for c in args.counts.split(",")])


if __name__ == "__main__":
    main()

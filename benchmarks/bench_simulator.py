"""Wall time and peak memory of the simulated executor's whole run at growing request
counts: Llama-3-8B on an H200 serving ``--workload`` (default ``sharegpt``: ShareGPT V3
single-turn requests sampled as vLLM's benchmark samples them, all arriving at once;
``shared_prefix``, the default job: a 1,200-token system prompt + ~600 unique tokens,
200-900 output tokens), to show that time and memory grow linearly.

Per count: the setup (opening the workload and queueing the first requests) and the run
(every step until the last request finishes, the reuse analysis at its end included), as
wall seconds and per 1,000 requests, and the per-1k time as a multiple of the first
count's (1.00 everywhere = linear); the same for the CPU time, which other processes on
a shared machine disturb less; and the peak resident memory. With ``--isolate`` (the
default from the command line) each count runs in a fresh process, so its peak memory is
its own; otherwise counts run one after another in this process and the peak is the
process's so far. Workloads of more than 10,000 requests stream (``WorkloadDriver``):
requests are drawn as the run needs them and released when they finish.

Goal: 1,000,000 ShareGPT requests in under 20 minutes and under 4 GiB peak memory on 2
cores. Absolute times are this machine's only; the load average printed before and after
says how busy the machine was.

    python benchmarks/bench_simulator.py [--counts 1000,10000,100000,1000000]
        [--workload sharegpt|shared_prefix|...] [--no-isolate]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from enginekit import Engine
from enginekit.driver import WorkloadDriver
from enginekit.extras import exit_if_missing

DEFAULT_COUNTS = "1000,10000,100000,1000000"
DEFAULT_WORKLOAD = "sharegpt"


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
    """One run of ``num_requests`` requests of the default job (plus ``overrides``, e.g.
    ``workload=sharegpt``)."""
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


def measure_isolated(num_requests: int, *overrides: str) -> Row:
    """``measure`` in a fresh Python process: the peak memory is this count's alone."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(num_requests)]
    out = subprocess.run([*command, *overrides], capture_output=True, text=True, check=True)
    return Row(*json.loads(out.stdout.strip().splitlines()[-1]))


def run(
    counts: list[int], echo: bool = True, workload: str | None = None, isolate: bool = False
) -> list[Row]:
    """Measures every count in order (of ``workload``; None: the default job's); prints
    each row as it comes when ``echo``. ``isolate``: each in a fresh process."""
    overrides = () if workload is None else (f"workload={workload}",)
    measure_one = measure_isolated if isolate else measure
    if echo:
        print(
            f"{'requests':>9} {'setup s':>8} {'run s':>8} {'wall s':>8} {'s / 1k req':>11} "
            f"{'x first':>8} {'cpu s / 1k':>11} {'x first':>8} {'sim s':>9} {'steps':>8} "
            f"{'peak GiB':>9}"
        )
    rows: list[Row] = []
    for count in counts:
        row = measure_one(count, *overrides)
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
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD, help="workload.name")
    parser.add_argument("--no-isolate", action="store_true", help="all counts in this process")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child of --isolate
    args, overrides = parser.parse_known_args()
    if args.workload == "sharegpt":
        exit_if_missing("benchmarks/bench_simulator.py --workload sharegpt", extras=["data"])
    if args.one is not None:
        print(json.dumps(list(measure(args.one, *overrides))))
        return
    counts = [int(c) for c in args.counts.split(",")]
    print(_load_average("at the start"), flush=True)
    run(counts, workload=args.workload, isolate=not args.no_isolate)
    print(_load_average("at the end"), flush=True)


def _load_average(when: str) -> str:
    """The machine's load average (1, 5, 15 minutes) on a line: other processes on a
    shared machine slow the wall time and, less, the CPU time."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return f"load average {when}: unknown"
    return f"load average {when} (1, 5, 15 min): {one:.2f}, {five:.2f}, {fifteen:.2f}"


if __name__ == "__main__":
    main()

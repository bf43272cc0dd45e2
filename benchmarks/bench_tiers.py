"""KV tiers on Mooncake's published conversation trace, in the simulator.

Replays the trace (``benchmarks/data/mooncake/conversation_trace.jsonl``: 12,031 requests
of an hour of Kimi's traffic) at its own arrival times and stretched (``--time-scales``:
2 is half the rate), on one model and accelerator, three ways side by side:

- ``device``: the device pool alone (``+tier=none``);
- ``+host``: a host-memory tier under it (``+tier=host``, ``--host-gib``);
- ``+host+disk``: host then local disk (``tier.levels=[host,disk]``, ``--disk-gib``).

For each it prints the prompt tokens served from cache by where they were (device, host,
disk), the whole hit rate beside the unbounded cache's (every block ever computed kept:
the bound no capacity can pass), mean and p99 TTFT, and throughput, and the TTFT ratio to
the device-only run. The runs are independent processes (two at a time on two cores).

    python3 benchmarks/bench_tiers.py [--model llama-3.1-8b] [--hardware h200]
        [--host-gib 256] [--disk-gib 2048] [--time-scales 1,2] [--limit N] [--json FILE]

``--limit N`` replays the trace's first N lines (a quick look; the whole trace is the
figure the README gives).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from enginekit import Engine
from enginekit import metric_keys as mk
from enginekit.driver import WorkloadDriver

TRACE = Path(__file__).resolve().parent / "data" / "mooncake" / "conversation_trace.jsonl"
CONFIGS: dict[str, list[str]] = {
    "device": ["+tier=none"],
    "+host": ["+tier=host"],
    "+host+disk": ["+tier=host", "tier.levels=[host,disk]"],
}


def replay(name: str, trace: str, common: list[str], time_scale: float) -> dict[str, Any]:
    """One replay of ``trace`` (arrival times stretched by ``time_scale``) with
    configuration ``name``; its figures."""
    engine = Engine.from_overrides(
        ["progress=false", "workload=trace", f"workload.path={trace}", *common, *CONFIGS[name]]
    )
    start = time.perf_counter()
    driver = WorkloadDriver(engine)
    driver.add_workload()
    summary = driver.run().summary
    wall_s = time.perf_counter() - start
    queries = summary[mk.PREFIX_CACHE_QUERIES.key]
    hits = summary[mk.PREFIX_CACHE_HITS.key]
    ttft = summary[mk.TIME_TO_FIRST_TOKEN_SECONDS.key]
    return {
        "config": name,
        "time_scale": time_scale,
        "requests": summary[mk.NUM_REQUESTS.key],
        "rejected": summary[mk.NUM_REQUESTS_REJECTED.key],
        "query_tokens": queries,
        "hit_tokens": hits,
        # the tier keys are in the summary of a run with tiers only
        "hit_tokens_by_tier": summary.get(mk.KV_TIER_HITS_BY_SOURCE.key, {"device": hits}),
        "hit_rate": hits / queries if queries else 0.0,
        "hit_rate_unbounded": summary[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key],
        "ttft_mean_s": ttft["mean"] if ttft else None,
        "ttft_p99_s": ttft["p99"] if ttft else None,
        "total_tokens_per_s": summary[mk.TOTAL_TOKENS_PER_S.key],
        "output_tokens_per_s": summary[mk.OUTPUT_TOKENS_PER_S.key],
        "loads_avoided_blocks": summary.get(mk.KV_TIER_LOADS_AVOIDED_BLOCKS.key, 0),
        "wall_s": wall_s,
    }


def _stretched(lines: list[str], scale: float, folder: Path) -> str:
    """A copy of the trace's ``lines`` with every timestamp multiplied by ``scale``."""
    path = folder / f"trace-x{scale:g}.jsonl"
    with path.open("w") as out:
        for line in lines:
            record = json.loads(line)
            record["timestamp"] = record["timestamp"] * scale
            out.write(json.dumps(record) + "\n")
    return str(path)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as the table the benchmark prints."""
    levels = ["device", "host", "disk"]
    lines = [
        f"{'config':<11} {'x time':>6} {'requests':>9} {'rejected':>8} "
        + " ".join(f"{'hit ' + level:>10}" for level in levels)
        + f" {'hit rate':>9} {'unbounded':>9} {'TTFT mean':>10} {'TTFT p99':>9} "
        f"{'x device':>8} {'tok/s':>8} {'wall s':>7}"
    ]
    device_ttft = {r["time_scale"]: r["ttft_mean_s"] for r in rows if r["config"] == "device"}
    for row in rows:
        base_ttft = device_ttft.get(row["time_scale"])
        by_tier = row["hit_tokens_by_tier"]
        shares = " ".join(
            f"{by_tier.get(level, 0) / row['query_tokens']:>10.1%}" for level in levels
        )
        ratio = base_ttft / row["ttft_mean_s"] if base_ttft and row["ttft_mean_s"] else math.nan
        lines.append(
            f"{row['config']:<11} {row['time_scale']:>6g} {row['requests']:>9,} "
            f"{row['rejected']:>8,} {shares} "
            f"{row['hit_rate']:>9.1%} {row['hit_rate_unbounded']:>9.1%} "
            f"{row['ttft_mean_s']:>9.2f}s {row['ttft_p99_s']:>8.2f}s {ratio:>7.2f}x "
            f"{row['total_tokens_per_s']:>8,.0f} {row['wall_s']:>7.0f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--host-gib", type=float, default=256.0)
    parser.add_argument("--disk-gib", type=float, default=2048.0)
    parser.add_argument("--limit", type=int, default=None, help="replay the first N lines")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument(
        "--time-scales",
        default="1,2",
        help="comma-separated factors stretching the arrival times (2: half the rate)",
    )
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    lines = Path(args.trace).read_text().splitlines()[: args.limit]
    folder = tempfile.TemporaryDirectory()
    scales = [float(x) for x in args.time_scales.split(",")]
    traces = {scale: _stretched(lines, scale, Path(folder.name)) for scale in scales}
    common = [
        f"model={args.model}",
        f"hardware={args.hardware}",
        f"tier.host_gib={args.host_gib}",
        f"tier.disk_gib={args.disk_gib}",
    ]
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"unknown config {unknown[0]!r}; known: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    print(
        f"trace: {Path(args.trace).name}"
        + (f" (first {args.limit} lines)" if args.limit else f" ({len(lines):,} requests)")
    )
    print(f"model={args.model} hardware={args.hardware}, simulated; {' '.join(common[2:])}")
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(replay, name, traces[scale], common, scale)
            for scale in scales
            for name in names
        ]
        rows = [future.result() for future in futures]
    folder.cleanup()
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

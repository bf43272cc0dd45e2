"""Eviction policies against Belady's OPT on real conversations, in the simulator.

Replays Mooncake's conversation trace (``benchmarks/data/mooncake/conversation_trace.jsonl``:
12,031 requests of an hour of Kimi's traffic, arrival times stretched by ``--time-scale``)
on one model and accelerator, or (``--workload sharegpt``) ShareGPT V3 conversations turn
by turn (``+experiment=sharegpt_multiturn``: Llama-2-7B, 2,000 turns), under
``block_hash``, once per eviction policy (``--policies``) and device pool size
(``--pools``, in blocks). For each run it gives the first-admission hit rate, the
OPT hit rate at that pool on the same run's block accesses (``prefix_cache_hit_rate_opt``:
furthest-next-lookup eviction, per block, an upper bound on what any policy hits; see
``enginekit.reuse.opt``) and the share of it the policy got, beside the LRU curve's
prediction and the unbounded cache's hit rate. The runs are independent processes, two at
a time on two cores; ``--plot FILE`` draws hit rate against pool size per policy, OPT
dashed.

    python3 benchmarks/bench_eviction.py [--workload mooncake|sharegpt]
        [--model llama-3.1-8b] [--hardware h200] [--pools 15000,30000,55000]
        [--policies lru,slru,lfu,chain_aware] [--time-scale 8] [--limit N]
        [--json FILE] [--plot FILE]

``--limit N`` replays the trace's first N lines (a quick look; the whole trace is the
figure the README gives).
"""

from __future__ import annotations

import argparse
import json
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
POLICIES = ("lru", "slru", "lfu", "chain_aware")


def replay(policy: str, num_blocks: int, workload: list[str]) -> dict[str, Any]:
    """One run of ``workload`` (overrides) under eviction ``policy`` in a pool of
    ``num_blocks``."""
    engine = Engine.from_overrides(
        [
            "progress=false",
            "+prefix=block_hash",
            f"+eviction={policy}",
            f"cache.num_blocks={num_blocks}",
            *workload,
        ]
    )
    start = time.process_time()
    driver = WorkloadDriver(engine)
    driver.add_workload()
    summary = driver.run().summary
    return {
        "policy": policy,
        "num_blocks": num_blocks,
        "requests": summary[mk.NUM_REQUESTS.key],
        "hit_rate": summary[mk.PREFIX_CACHE_FIRST_HIT_RATE.key],
        "hit_rate_opt": summary[mk.PREFIX_CACHE_HIT_RATE_OPT.key],
        "share_of_opt": summary[mk.PREFIX_CACHE_HIT_RATE_OF_OPT.key],
        "hit_rate_lru_curve": summary[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key],
        "hit_rate_unbounded": summary[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key],
        "num_preemptions": summary[mk.NUM_PREEMPTIONS_TOTAL.key],
        "ttft_mean_s": (summary[mk.TIME_TO_FIRST_TOKEN_SECONDS.key] or {}).get("mean"),
        "cpu_s": time.process_time() - start,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, by pool size then policy, each policy's hit rate
    also given as its change from lru's at the same pool."""
    lru = {r["num_blocks"]: r["hit_rate"] for r in rows if r["policy"] == "lru"}
    lines = [
        "| pool (blocks) | policy | hit rate | vs lru | OPT | share of OPT | LRU curve "
        "| unbounded | preemptions | TTFT mean | CPU s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (r["num_blocks"], POLICIES.index(r["policy"]))):
        base = lru.get(r["num_blocks"])
        delta = "" if base is None else f"{100 * (r['hit_rate'] - base):+.2f} pt"
        ttft = "-" if r["ttft_mean_s"] is None else f"{r['ttft_mean_s']:.2f} s"
        lines.append(
            f"| {r['num_blocks']:,} | {r['policy']} | {_percent(r['hit_rate'])} | {delta} "
            f"| {_percent(r['hit_rate_opt'])} | {_percent(r['share_of_opt'])} "
            f"| {_percent(r['hit_rate_lru_curve'])} | {_percent(r['hit_rate_unbounded'])} "
            f"| {r['num_preemptions']:,} | {ttft} | {r['cpu_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """Hit rate against pool size, one line per policy, OPT dashed (the best over the
    runs at each size: each run's OPT is its own stream's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = sorted({r["num_blocks"] for r in rows})
    for policy in POLICIES:
        points = sorted((r["num_blocks"], r["hit_rate"]) for r in rows if r["policy"] == policy)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=policy)
    opt = [max(r["hit_rate_opt"] for r in rows if r["num_blocks"] == n) for n in sizes]
    ax.plot(sizes, opt, linestyle="--", color="black", label="OPT (Belady)")
    ax.set_xscale("log")
    ax.set_xlabel("device pool (blocks)")
    ax.set_ylabel("first-admission hit rate")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("mooncake", "sharegpt"), default="mooncake")
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument(
        "--pools",
        default=None,
        help="blocks, comma-separated (mooncake: 15000,30000,55000; sharegpt: 1024,2048,4096)",
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=8.0,
        help="stretch the trace's arrival times (8: an eighth of its rate, which one "
        "simulated accelerator serves without a queue)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay the first N lines")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--plot", default=None, help="draw the curves into this image")
    args = parser.parse_args()
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"unknown policy {unknown[0]!r}; known: {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    folder = tempfile.TemporaryDirectory()
    if args.workload == "mooncake":
        pools = [int(x) for x in (args.pools or "15000,30000,55000").split(",")]
        lines = Path(args.trace).read_text().splitlines()[: args.limit]
        trace = Path(args.trace)
        if args.limit:  # the first lines, in a file of their own
            trace = Path(folder.name) / "trace.jsonl"
            trace.write_text("\n".join(lines) + "\n")
        workload = [
            "workload=trace",
            f"workload.path={trace}",
            f"workload.arrival_time_scale={args.time_scale}",
            f"model={args.model}",
            f"hardware={args.hardware}",
        ]
        title = "Mooncake conversation trace"
        print(
            f"trace: {Path(args.trace).name}"
            + (f" (first {args.limit} lines)" if args.limit else f" ({len(lines):,} requests)")
            + f", arrivals x{args.time_scale:g}; model={args.model} "
            f"hardware={args.hardware}, simulated"
        )
    else:
        pools = [int(x) for x in (args.pools or "1024,2048,4096").split(",")]
        workload = ["+experiment=sharegpt_multiturn"]
        if args.limit:
            workload.append(f"workload.num_requests={args.limit}")
        title = "ShareGPT conversations, turn by turn"
        print("workload: +experiment=sharegpt_multiturn (Llama-2-7B, simulated)")
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(replay, policy, num_blocks, workload)
            for num_blocks in pools
            for policy in policies
        ]
        rows = [future.result() for future in futures]
    folder.cleanup()
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Queue plugins in the simulator: the order of the waiting queue at saturation.

Two experiments, each a pair of runs on the same requests (Llama-3-8B on a simulated
H200, a small KV pool, requests arriving faster than they are served):

(a) ``prefix``: ``--groups`` prompt groups, each sharing a ``--prefix-len``-token prefix,
    their requests interleaved at random, plus a share (``--cold-share``) of cold prompts
    that share nothing. The pool holds a few groups' prefixes at a time, so the order in
    which the queue admits decides how often a prefix is evicted and computed again.
    ``fcfs`` against ``lpm`` (longest cached prefix first, ``--max-overtakes`` its aging
    bound): throughput (prompt + output tokens per second), prefix hit rate, and p50/p99
    TTFT of cold requests (the summary's ``time_to_first_token_seconds_cold``: requests
    whose first admission hit no cached token).
(b) ``tenants``: two tenants of unique prompts, one arriving ``--flood`` times as often as
    the other, together well past what the engine serves. ``fcfs`` against ``fair``
    (virtual token counters): the tokens each tenant was served while both were sending
    (up to the last arrival; a prompt counts once its first token is out, outputs as
    they are produced) and their ratio.

    python3 benchmarks/bench_queue.py [--requests 1200] [--max-overtakes 8] [--json FILE]

The runs are independent processes (two at a time on two cores). Prints a markdown
table; ``--json`` records the figures (``benchmarks/results/queue.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from enginekit import Engine, SamplingParams
from enginekit import metric_keys as mk

VOCAB = 128_000
COMMON = ["progress=false", "model.name=llama-3-8b", "hardware.name=h200"]


def _sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def prefix_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The shared-prefix workload: group prompts (prefix + a unique tail) and cold ones."""
    rng = np.random.default_rng(args.seed)
    prefixes = [rng.integers(0, VOCAB, args.prefix_len).tolist() for _ in range(args.groups)]
    arrivals = np.cumsum(rng.exponential(1.0 / args.prefix_rate, args.requests)).tolist()
    requests = []
    for i, arrival in enumerate(arrivals):
        if rng.random() < args.cold_share:
            prompt = rng.integers(0, VOCAB, args.cold_len).tolist()
            kind = "cold"
        else:
            group = int(rng.integers(0, args.groups))
            prompt = prefixes[group] + rng.integers(0, VOCAB, args.tail_len).tolist()
            kind = f"group-{group}"
        requests.append(
            {"id": f"{kind}-{i}", "prompt": prompt, "arrival": arrival, "tokens": args.output_len}
        )
    return requests


def tenant_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Two tenants' unique prompts: ``flood`` arrives ``args.flood`` times as often."""
    rng = np.random.default_rng(args.seed + 1)
    requests = []
    for user, rate in (("light", args.tenant_rate), ("flood", args.tenant_rate * args.flood)):
        count = int(rate * args.tenant_window_s)
        arrivals = np.sort(rng.uniform(0.0, args.tenant_window_s, count)).tolist()
        for i, arrival in enumerate(arrivals):
            prompt = rng.integers(0, VOCAB, args.tenant_prompt_len).tolist()
            requests.append(
                {
                    "id": f"{user}-{i}",
                    "prompt": prompt,
                    "arrival": arrival,
                    "tokens": args.output_len,
                    "user": user,
                }
            )
    return sorted(requests, key=lambda r: r["arrival"])


def run_prefix(queue: str, args: argparse.Namespace) -> dict[str, Any]:
    overrides = [*COMMON, f"+queue={queue}", f"cache.num_blocks={args.num_blocks}"]
    overrides += [f"scheduler.max_num_seqs={args.max_num_seqs}"]
    if queue == "lpm":
        overrides.append(f"queue.max_overtakes={args.max_overtakes}")
    engine = Engine.from_overrides(overrides)
    for r in prefix_requests(args):
        engine.add_request(
            r["prompt"], _sampling(r["tokens"]), request_id=r["id"], arrival_time=r["arrival"]
        )
    start = time.perf_counter()
    summary = engine.run().summary
    cold = summary[mk.TIME_TO_FIRST_TOKEN_SECONDS_COLD.key]
    ttft = summary[mk.TIME_TO_FIRST_TOKEN_SECONDS.key]
    return {
        "experiment": "prefix",
        "queue": queue,
        "requests": summary[mk.NUM_REQUESTS.key],
        "total_tokens_per_s": summary[mk.TOTAL_TOKENS_PER_S.key],
        "prefix_hit_rate": summary[mk.PREFIX_CACHE_HIT_RATE.key],
        "num_waiting_peak": summary[mk.NUM_WAITING_PEAK.key],
        "ttft_p50_s": ttft["p50"],
        "ttft_p99_s": ttft["p99"],
        "cold_requests": cold["count"],
        "cold_ttft_p50_s": cold["p50"],
        "cold_ttft_p99_s": cold["p99"],
        "wall_s": time.perf_counter() - start,
    }


def run_tenants(queue: str, args: argparse.Namespace) -> dict[str, Any]:
    overrides = [*COMMON, f"+queue={queue}", f"cache.num_blocks={args.num_blocks}"]
    overrides += [f"scheduler.max_num_seqs={args.max_num_seqs}"]
    engine = Engine.from_overrides(overrides)
    requests = tenant_requests(args)
    for r in requests:
        engine.add_request(
            r["prompt"],
            _sampling(r["tokens"]),
            request_id=r["id"],
            arrival_time=r["arrival"],
            user=r["user"],
        )
    start = time.perf_counter()
    contended_until = max(r["arrival"] for r in requests if r["user"] == "light")
    while engine.has_unfinished_requests() and engine.clock < contended_until:
        engine.step()
    served = {"light": 0, "flood": 0}
    for r in requests:
        out = engine.output(r["id"])
        prompt = len(out.prompt_token_ids) if out.first_token_time is not None else 0
        served[r["user"]] += prompt + len(out.output_token_ids)
    return {
        "experiment": "tenants",
        "queue": queue,
        "contended_s": engine.clock,
        "requests": {u: sum(r["user"] == u for r in requests) for u in served},
        "served_tokens": served,
        "flood_to_light": served["flood"] / served["light"] if served["light"] else None,
        "wall_s": time.perf_counter() - start,
    }


def _job(job: tuple[str, str, argparse.Namespace]) -> dict[str, Any]:
    experiment, queue, args = job
    return (run_prefix if experiment == "prefix" else run_tenants)(queue, args)


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| (a) queue | tokens/s | prefix hit rate | cold requests | cold TTFT p50 (s) "
        "| cold TTFT p99 (s) | TTFT p99 (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["experiment"] == "prefix":
            lines.append(
                f"| {r['queue']} | {_f(r['total_tokens_per_s'], 0)} "
                f"| {100 * r['prefix_hit_rate']:.1f}% | {r['cold_requests']} "
                f"| {_f(r['cold_ttft_p50_s'])} | {_f(r['cold_ttft_p99_s'])} "
                f"| {_f(r['ttft_p99_s'])} |"
            )
    lines += [
        "",
        "| (b) queue | contended (s) | light tenant tokens | flooding tenant tokens "
        "| flood / light |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["experiment"] == "tenants":
            served = r["served_tokens"]
            lines.append(
                f"| {r['queue']} | {_f(r['contended_s'], 1)} | {served['light']:,} "
                f"| {served['flood']:,} | {_f(r['flood_to_light'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1200, help="(a) requests")
    parser.add_argument("--groups", type=int, default=12, help="(a) prompt groups")
    parser.add_argument("--prefix-len", type=int, default=2048, help="(a) shared prefix")
    parser.add_argument("--tail-len", type=int, default=64, help="(a) unique tail")
    parser.add_argument("--cold-share", type=float, default=0.2, help="(a) cold prompts")
    parser.add_argument("--cold-len", type=int, default=1024, help="(a) cold prompt length")
    parser.add_argument("--prefix-rate", type=float, default=40.0, help="(a) requests/s")
    parser.add_argument("--max-overtakes", type=int, default=8, help="(a) lpm's aging bound")
    parser.add_argument("--flood", type=float, default=10.0, help="(b) rate ratio")
    parser.add_argument("--tenant-rate", type=float, default=12.0, help="(b) light tenant/s")
    parser.add_argument("--tenant-window-s", type=float, default=30.0, help="(b) arrivals")
    parser.add_argument("--tenant-prompt-len", type=int, default=1024, help="(b) prompts")
    parser.add_argument("--output-len", type=int, default=64, help="output tokens each")
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV pool, 16-token blocks")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    jobs = [("prefix", q, args) for q in ("fcfs", "lpm")]
    jobs += [("tenants", q, args) for q in ("fcfs", "fair")]
    with ProcessPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(_job, jobs))
    print(table(rows))
    if args.json is not None:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        report = {"settings": settings, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Capacity of a quantized KV cache: tokens a fixed memory budget holds with each
quantizer, against the formula, and what that does to a memory-bound workload.

For each executor the same KV budget (``cache.memory_gib``) is given to ``none``, ``fp8``
and ``int4``; the table shows the pool's tokens, their ratio to the unquantized pool and
to the bytes formula (budget / bytes per token), and the run's concurrency, preemptions
and throughput, side by side in one run:

- ``sim``: Llama-3-8B on an H200 (simulated), ``unique`` chat traffic with long outputs,
  a 4 GiB pool, so that memory, not compute, limits the batch. Dequantization costs no
  simulated time: the model counts bytes and FLOPs, and a fused kernel's extra ALU work
  hides under the memory traffic it saves.
- ``torch``: the embedded tiny model on the CPU (real tensors), a pool small enough that
  the unquantized cache preempts. Its throughput is CPU wall time: compare ratios only.

    python benchmarks/bench_kv_quant_capacity.py [--executor sim|torch|both] [--block-size 64]
"""

from __future__ import annotations

import argparse
import time

from enginekit import Engine
from enginekit.driver import WorkloadDriver

QUANTIZERS = ("none", "fp8", "int4")
GIB = 1 << 30

SIM = {
    "budget_gib": 4.0,
    "overrides": ["workload=unique", "workload.num_requests=2000", "workload.seed=1"],
}
TORCH = {
    "budget_gib": 0.0005,
    "overrides": [
        "executor=torch",
        "model=tiny",
        "model.dtype=bfloat16",  # a 16-bit baseline, as the simulated Llama-3-8B's
        "threads=1",
        "workload=unique",
        "workload.num_requests=48",
        "workload.seed=1",
        "model.max_model_len=512",
    ],
}


def run(executor: str, quantizer: str, block_size: int) -> dict:
    setup = SIM if executor == "sim" else TORCH
    engine = Engine.from_overrides(
        [
            "progress=false",
            f"+quantizer={quantizer}",
            f"cache.block_size={block_size}",
            f"cache.memory_gib={setup['budget_gib']}",
            *setup["overrides"],
        ]
    )
    driver = WorkloadDriver(engine)
    driver.add_workload()
    start = time.perf_counter()
    summary = driver.run().summary
    wall = time.perf_counter() - start
    spec = engine.kv_spec
    tokens = summary["kv_cache_num_blocks"] * spec.block_size
    return {
        "bytes_per_token": spec.bytes_per_token,
        "pool_tokens": tokens,
        "formula_tokens": setup["budget_gib"] * GIB / spec.bytes_per_token,
        "running_mean": summary["num_running_mean"],
        "running_peak": summary["num_running_peak"],
        "preemptions": summary["num_preemptions_total"],
        "recomputed": summary["recomputed_tokens_total"],
        "output_tps": summary["output_tokens_per_s"] if executor == "sim" else None,
        "wall_tps": summary["generation_tokens_total"] / wall,
    }


def report(executor: str, block_size: int) -> None:
    rows = {q: run(executor, q, block_size) for q in QUANTIZERS}
    base = rows["none"]
    budget = (SIM if executor == "sim" else TORCH)["budget_gib"]
    print(f"\n== {executor}: KV budget {budget} GiB, blocks of {block_size} tokens ==")
    header = (
        f"{'quantizer':>9} {'B/token':>9} {'pool tokens':>12} {'x none':>7} {'of formula':>10} "
        f"{'running':>8} {'peak':>5} {'preempt':>8} {'recomputed':>10} {'throughput':>11}"
    )
    print(header)
    for name, r in rows.items():
        if executor == "sim":
            throughput = f"x{r['output_tps'] / base['output_tps']:.2f}"
        else:
            throughput = f"x{r['wall_tps'] / base['wall_tps']:.2f}"
        print(
            f"{name:>9} {r['bytes_per_token']:>9,.0f} {r['pool_tokens']:>12,} "
            f"{r['pool_tokens'] / base['pool_tokens']:>7.2f} "
            f"{r['pool_tokens'] / r['formula_tokens']:>10.4f} {r['running_mean']:>8.1f} "
            f"{r['running_peak']:>5} {r['preemptions']:>8} {r['recomputed']:>10,} "
            f"{throughput:>11}"
        )
    if executor == "sim":
        tps = ", ".join(f"{q} {r['output_tps']:,.0f}" for q, r in rows.items())
        print(f"simulated output tok/s: {tps}")
    print("throughput: output tokens per second relative to none, same run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", choices=["sim", "torch", "both"], default="both")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    for executor in ("sim", "torch"):
        if args.executor in (executor, "both"):
            report(executor, args.block_size)


if __name__ == "__main__":
    main()

"""Claim about time to first token: what a prefix-cache hit does to it (see
``enginekit.claims.job``). On the simulator: Llama-3-8B on an H200 (roofline cost model,
``enginekit.executor.sim.executor``).

One 1,800-token conversation whose first 1,200 tokens are a system prompt is served alone
on an idle engine (cold), then a second one sharing that system prompt
(``+prefix=block_hash``, blocks of 16). Then the same under load: the ``shared_prefix``
workload (the same 1,200 + ~600 tokens) arriving as a Poisson stream, with and without a
prefix cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from enginekit import metric_keys as mk
from enginekit.claims.scenario import ClaimRow, Section, Table, sim_engine, sim_summary
from enginekit.executor.sim.executor import STEP_OVERHEAD_S, SimExecutor

if TYPE_CHECKING:
    from enginekit.engine import Engine

SIM = ("model.name=llama-3-8b", "hardware.name=h200")
SYSTEM_LEN, CONVERSATION_LEN, BLOCK_SIZE = 1_200, 1_800, 16
CLAIMED_TTFT_MS = (450.0, 90.0)  # cold, with the hit
ABOUT = 0.25  # "about" a claimed time: within this share of it
LOAD_RATES, QUICK_LOAD_RATES = (10.0, 15.0, 20.0), (20.0,)


class _Served(NamedTuple):
    ttft_s: float
    num_prefilled: int
    num_hit_tokens: int
    flops: int


def _serve_alone(engine: Engine, prompt: list[int]) -> _Served:
    """Serves ``prompt`` (one output token) on ``engine``, a simulated one with nothing
    else running; its only step is the prompt's prefill."""
    from enginekit.request import SamplingParams

    assert isinstance(engine.executor, SimExecutor)
    metrics = engine.metrics
    prefilled, hits = metrics.num_prefill_tokens_computed, metrics.prefix_cache_hits
    request_id = engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    engine.run()
    out = engine.output(request_id)
    assert out.first_token_time is not None
    return _Served(
        out.first_token_time - out.arrival_time,
        metrics.num_prefill_tokens_computed - prefilled,
        metrics.prefix_cache_hits - hits,
        engine.executor.last_cost.flops,
    )


def _load_ttft(rate: float, prefix: str, num_requests: int) -> dict[str, float]:
    s = sim_summary(
        *SIM,
        f"prefix.name={prefix}",
        f"workload.num_requests={num_requests}",
        f"workload.arrival_rate={rate}",
    )
    ttft = s[mk.TIME_TO_FIRST_TOKEN_SECONDS.key]
    return {
        "p50_ms": ttft["p50"] * 1e3,
        "p90_ms": ttft["p90"] * 1e3,
        "output_tokens_per_s": s[mk.OUTPUT_TOKENS_PER_S.key],
    }


def prefix_section(quick: bool = False) -> Section:
    """The 1,800-token conversation, cold and with its system prompt hit, then under load."""
    engine = sim_engine(*SIM, "prefix.name=block_hash", f"cache.block_size={BLOCK_SIZE}")
    rng = np.random.default_rng(0)
    vocab = engine.shape.vocab_size
    unique_len = CONVERSATION_LEN - SYSTEM_LEN
    system = rng.integers(0, vocab, SYSTEM_LEN).tolist()
    cold = _serve_alone(engine, system + rng.integers(0, vocab, unique_len).tolist())
    hit = _serve_alone(engine, system + rng.integers(0, vocab, unique_len).tolist())
    blocks_hit = hit.num_hit_tokens // BLOCK_SIZE
    cold_ms, hit_ms = cold.ttft_s * 1e3, hit.ttft_s * 1e3
    speedup = cold_ms / hit_ms
    rates = QUICK_LOAD_RATES if quick else LOAD_RATES
    num_requests = 150 if quick else 400
    load = {
        rate: {p: _load_ttft(rate, p, num_requests) for p in ("none", "block_hash")}
        for rate in rates
    }
    # the load at which a cold server's median TTFT comes closest to the claimed 450 ms
    near = min(rates, key=lambda r: abs(load[r]["none"]["p50_ms"] - CLAIMED_TTFT_MS[0]))
    near_cold, near_hit = load[near]["none"]["p50_ms"], load[near]["block_hash"]["p50_ms"]
    claimed_cold, claimed_hit = CLAIMED_TTFT_MS
    close = abs(cold_ms / claimed_cold - 1) < ABOUT and abs(hit_ms / claimed_hit - 1) < ABOUT
    rows = (
        ClaimRow(
            "prefix_blocks_hit",
            "A 1,800-token conversation with a 1,200-token shared system prompt hits 75 "
            "blocks (block 16)",
            f"{blocks_hit} blocks hit ({hit.num_hit_tokens:,} tokens)",
            "yes" if blocks_hit == 75 else "no",
            {"blocks_hit": blocks_hit, "hit_tokens": hit.num_hit_tokens},
        ),
        ClaimRow(
            "prefix_prefilled",
            "… so only 600 tokens are prefilled",
            f"{hit.num_prefilled:,} tokens prefilled (cold: {cold.num_prefilled:,})",
            "yes" if hit.num_prefilled == 600 else "no",
            {"prefilled_hit": hit.num_prefilled, "prefilled_cold": cold.num_prefilled},
        ),
        ClaimRow(
            "prefix_ttft",
            "Time to first token: about 450 ms cold against 90 ms with the hit",
            f"one request on an idle simulated H200: {cold_ms:.1f} ms cold, {hit_ms:.1f} ms "
            f"with the hit ({speedup:.1f}×); under load ({near:g} req/s, median): "
            f"{near_cold:,.0f} ms without a prefix cache, {near_hit:,.0f} ms with it; "
            f"yes within {ABOUT:.0%} of both claimed times, partly for a speedup of 2× or more",
            "yes" if close else ("partly" if speedup >= 2 else "no"),
            {
                "ttft_cold_ms": cold_ms,
                "ttft_hit_ms": hit_ms,
                "speedup": speedup,
                "flops_cold": cold.flops,
                "flops_hit": hit.flops,
                "load": {str(r): v for r, v in load.items()},
            },
        ),
    )
    header = (
        "arrivals (req/s)",
        "TTFT p50 / p90 no prefix cache (ms)",
        "TTFT p50 / p90 block_hash (ms)",
        "output tok/s none / block_hash",
    )
    table_rows = tuple(
        (
            f"{rate:g}",
            f"{v['none']['p50_ms']:,.0f} / {v['none']['p90_ms']:,.0f}",
            f"{v['block_hash']['p50_ms']:,.0f} / {v['block_hash']['p90_ms']:,.0f}",
            f"{v['none']['output_tokens_per_s']:,.0f} / "
            f"{v['block_hash']['output_tokens_per_s']:,.0f}",
        )
        for rate, v in load.items()
    )
    flops_ratio = cold.flops / hit.flops
    notes = (
        f"Idle H200: the prefill is compute-bound. The hit skips the matmuls of 1,200 of "
        f"1,800 tokens but the 600 new tokens still attend to the 1,200 cached ones, so "
        f"FLOPs fall {flops_ratio:.2f}× (not 3×) and TTFT {speedup:.2f}× (a fixed "
        f"{STEP_OVERHEAD_S * 1e6:.0f} µs step overhead included). The claim's 5× is more "
        f"than the prefilled tokens alone (3×) explain.",
        f"450 ms is about {claimed_cold / cold_ms:.0f}× the idle H200's cold prefill: a "
        f"loaded server's figure, where a prefill waits behind and shares steps with other "
        f"requests' work (or a slower GPU or a larger model). In the load table the median "
        f"cold TTFT nears it at {near:g} req/s, where the server without a prefix cache is "
        f"saturating (p90 {load[near]['none']['p90_ms']:,.0f} ms) and the one with it is "
        f"not: every request prefills a third of the tokens, so the hit counts for more "
        f"than its FLOPs.",
        f"Load runs: `python -m enginekit +prefix=none|block_hash workload.num_requests="
        f"{num_requests} workload.arrival_rate=<rate>` (the default shared_prefix workload: "
        f"1,200 shared + ~600 unique prompt tokens, 200-900 output tokens).",
    )
    return Section(
        "Prefix-cache hit and time to first token",
        rows,
        (Table("Time to first token under load (simulated)", header, table_rows),),
        notes,
    )

"""RunMetrics on a hand-made run: every counter and percentile checked by hand."""

from __future__ import annotations

import json

import pytest

from enginekit.errors import EngineKitError
from enginekit.metrics import LATENCY_KEYS, RunMetrics, latency_stats
from enginekit.step import KVUsage

BLOCK_BYTES = 1 << 23  # 8 MiB: 100 blocks = 800 MiB = exactly 0.78125 GiB


def step_usage(used: int, total: int, unused: int) -> KVUsage:
    """The cache's usage after a step, as the engine reports it (no table blocks)."""
    return KVUsage(total, used, 0, total - used, 0, 0, unused)


def hand_made_run() -> RunMetrics:
    m = RunMetrics()
    m.on_request_added("r1", 0.0, 10)
    m.on_request_added("r2", 1.0, 20)
    m.on_request_added("r3", 1.0, 30)
    m.on_request_added("r4", 2.0, 40)  # never finishes
    m.on_prefix_query(100, 40)
    m.on_prefix_query(50, 0)
    m.on_step(0.5, 0.5, 10, 0, 1, 3, step_usage(used=10, total=100, unused=6))  # ran 0.0 .. 0.5
    m.on_first_token("r1", 0.5)
    m.on_step(2.0, 1.5, 50, 2, 3, 1, step_usage(used=30, total=100, unused=2))  # ran 0.5 .. 2.0
    m.on_first_token("r2", 1.25)
    m.on_first_token("r3", 2.0)
    m.on_preemption("recompute", 30)
    m.on_first_token("r3", 3.5)  # after a preemption: ignored
    m.on_preemption("swap", 0)
    m.on_preemption("recompute", 12)
    m.on_request_finished("r2", 2.25, 1)
    m.on_request_finished("r1", 2.5, 5)
    m.on_first_token("r4", 3.0)
    m.on_request_finished("r3", 4.0, 3)
    return m


def test_counters():
    s = hand_made_run().summary(BLOCK_BYTES, ideal_hit_tokens=50)
    assert s["num_requests"] == 4
    assert s["num_requests_finished"] == 3
    assert s["prompt_tokens_total"] == 100
    assert s["generation_tokens_total"] == 9
    assert s["num_steps"] == 2
    assert s["prefill_tokens_computed"] == 60
    assert s["decode_tokens_computed"] == 2
    assert s["prefix_cache_queries"] == 150
    assert s["prefix_cache_hits"] == 40
    assert s["prefix_cache_hit_rate"] == 40 / 150
    assert s["prefix_cache_hits_ideal"] == 50
    assert s["prefix_cache_hit_rate_ideal"] == 0.5
    assert s["num_preemptions_total"] == 3
    assert s["num_preemptions_by_kind"] == {"recompute": 2, "swap": 1}
    assert s["recomputed_tokens_total"] == 42


def test_kv_cache_and_occupancy():
    s = hand_made_run().summary(BLOCK_BYTES)
    assert s["kv_cache_num_blocks"] == 100
    assert s["kv_cache_pool_gib"] == 0.78125
    # Time-weighted: (0.1 × 0.5 + 0.3 × 1.5) / 2.0 = 0.25.
    assert s["kv_cache_usage_perc_mean"] == pytest.approx(0.25, rel=1e-12)
    assert s["kv_cache_usage_perc_peak"] == 0.3
    assert s["kv_cache_unused_slots_mean"] == 4.0
    assert s["kv_cache_unused_slots_peak"] == 6
    assert s["num_running_mean"] == 2.0
    assert s["num_running_peak"] == 3
    assert s["num_waiting_peak"] == 3
    assert s["busy_time_s"] == 2.0


def test_latency_percentiles():
    s = hand_made_run().summary(BLOCK_BYTES)
    # TTFT: r1 0.5, r2 0.25, r3 1.0, r4 1.0 (first token counts even unfinished).
    assert s["time_to_first_token_seconds"] == {
        "count": 4,
        "mean": 0.6875,
        "p50": 0.75,
        "p90": 1.0,
        "p99": 1.0,
    }
    # e2e: r1 2.5, r2 1.25, r3 3.0; p90 interpolates 2.5 + 0.8 × 0.5.
    e2e = s["e2e_request_latency_seconds"]
    assert (e2e["count"], e2e["p50"]) == (3, 2.5)
    assert e2e["mean"] == pytest.approx(6.75 / 3, rel=1e-12)
    assert e2e["p90"] == pytest.approx(2.9, rel=1e-12)
    assert e2e["p99"] == pytest.approx(2.5 + 0.98 * 0.5, rel=1e-12)
    # TPOT: r1 (2.5 - 0.5) / 4 = 0.5, r3 (4.0 - 2.0) / 2 = 1.0; r2 has one output: left out.
    assert s["time_per_output_token_seconds"] == {
        "count": 2,
        "mean": 0.75,
        "p50": 0.75,
        "p90": pytest.approx(0.95),
        "p99": pytest.approx(0.995),
    }


def test_duration_and_throughput():
    s = hand_made_run().summary(BLOCK_BYTES)
    assert s["duration_s"] == 4.0  # first arrival 0.0 .. last finish 4.0
    assert s["output_tokens_per_s"] == 9 / 4
    assert s["total_tokens_per_s"] == 109 / 4
    assert s["output_tokens_per_s_per_kv_gib"] == pytest.approx(9 / 4 / 0.78125)


def test_empty_run_is_strict_json():
    s = RunMetrics().summary(BLOCK_BYTES)
    assert s["num_requests"] == 0
    assert s["duration_s"] == 0.0
    assert s["output_tokens_per_s"] is None
    assert s["prefix_cache_hit_rate"] is None
    assert s["kv_cache_usage_perc_mean"] is None
    for key in LATENCY_KEYS:
        assert s[key] == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    json.dumps(s, allow_nan=False)


def test_duplicate_request_and_unknown_request():
    m = RunMetrics()
    m.on_request_added("a", 0.0, 1)
    with pytest.raises(EngineKitError, match="already added"):
        m.on_request_added("a", 0.0, 1)
    with pytest.raises(KeyError):
        m.on_first_token("b", 1.0)


def test_latency_stats_single_sample():
    assert latency_stats([2.0]) == {"count": 1, "mean": 2.0, "p50": 2.0, "p90": 2.0, "p99": 2.0}


def test_step_times_bound_the_duration_when_no_request_finished():
    m = RunMetrics()
    m.on_request_added("a", 1.0, 8)
    m.on_step(1.5, 0.25, 8, 0, 1, 0, step_usage(used=1, total=10, unused=8))  # ran 1.25 .. 1.5
    m.on_step(2.0, 0.5, 0, 1, 1, 0, step_usage(used=2, total=10, unused=15))  # ran 1.5 .. 2.0
    s = m.summary(BLOCK_BYTES)
    assert s["duration_s"] == 1.0  # arrival 1.0 .. last step end 2.0
    assert s["busy_time_s"] == 0.75
    assert s["kv_cache_usage_perc_mean"] == pytest.approx((0.1 * 0.25 + 0.2 * 0.5) / 0.75)
    assert s["generation_tokens_total"] == 0
    assert s["output_tokens_per_s"] == 0.0


def test_every_admission_queries_the_prefix_cache_and_readmissions_are_also_counted_apart():
    m = RunMetrics()
    m.on_prefix_query(100, 64)  # first admissions
    m.on_prefix_query(50, 0)
    m.on_prefix_query(120, 96, is_readmission=True)  # preempted, admitted again
    s = m.summary(BLOCK_BYTES)
    assert (s["prefix_cache_queries"], s["prefix_cache_hits"]) == (270, 160)
    assert s["prefix_cache_hit_rate"] == 160 / 270
    assert (s["prefix_cache_first_queries"], s["prefix_cache_first_hits"]) == (150, 64)
    assert s["prefix_cache_first_hit_rate"] == 64 / 150
    assert (s["prefix_cache_readmission_queries"], s["prefix_cache_readmission_hits"]) == (120, 96)
    assert s["prefix_cache_readmission_hit_rate"] == 0.8


def test_a_recomputed_request_queries_again_when_it_is_readmitted():
    from enginekit import Engine, SamplingParams

    engine = Engine.from_overrides(
        ["executor=sim", "model=tiny", "progress=false", "cache.watermark=0"]
        + ["+prefix=block_hash", "cache.block_size=4", "cache.num_blocks=6"]
    )
    for base in (100, 200):
        engine.add_request(
            list(range(base, base + 8)), SamplingParams(max_tokens=8, ignore_eos=True)
        )
    s = engine.run().summary
    assert s["num_preemptions_total"] > 0
    assert s["prefix_cache_first_queries"] == 16
    assert s["prefix_cache_readmission_queries"] > 0
    # a recomputed request's published blocks are still cached when it comes back
    assert s["prefix_cache_readmission_hits"] > 0
    assert s["prefix_cache_queries"] == 16 + s["prefix_cache_readmission_queries"]

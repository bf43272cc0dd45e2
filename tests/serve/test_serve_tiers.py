"""The KV tiers in ``/metrics``: a simulated server over a host level counts, per level
(``tier`` label), the blocks hit, the bytes loaded and written, the evictions, failures
and link time, and holds the level's blocks and capacity as gauges, equal to the engine's
summary; a server without tiers has no level's series."""

from __future__ import annotations

import httpx
import openai
from test_serve import wait_until_idle
from test_serve_sim import serve

from enginekit import metric_keys as mk

BLOCK_BYTES = 8192  # tiny: one block of 16 tokens


def test_a_host_level_counts_in_metrics_as_in_the_summary() -> None:
    """A, B, A, B one after the other on 6 blocks over a host level of 2 (the run of
    tests/engine/test_tier_metrics.py, block by block there): A and B again each load
    one block from the host (which then leaves it); 6 blocks are written, 2 evicted."""
    host_gib = 2 * BLOCK_BYTES / mk.BYTES_PER_GIB
    with serve(
        "cache.num_blocks=6",
        "cache.watermark=0",
        "+prefix=block_hash",
        "+tier=host",
        f"tier.host_gib={host_gib!r}",
        "tier.load_or_recompute=false",
        "serve.time_scale=1000",
    ) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        for first in (100, 200, 100, 200):
            done = client.completions.create(
                model="tiny", prompt=list(range(first, first + 64)), max_tokens=1
            )
            assert done.usage.completion_tokens == 1
        metrics = wait_until_idle(running.url)
        summary = httpx.get(f"{running.url}/summary").json()["summary"]
    expected = {
        "kv_tier_hit_blocks_total": 2,
        "kv_tier_loaded_bytes_total": 2 * BLOCK_BYTES,
        "kv_tier_written_bytes_total": 6 * BLOCK_BYTES,
        "kv_tier_evicted_blocks_total": 2,
        "kv_tier_failures_total": 0,
        "kv_tier_blocks": 2,
        "kv_tier_capacity_blocks": 2,
    }
    for name, value in expected.items():
        assert metrics[f'enginekit:{name}{{tier="host"}}'] == value, name
    assert metrics["enginekit:kv_tier_loads_avoided_blocks_total"] == 0
    load_s = metrics['enginekit:kv_tier_load_seconds_total{tier="host"}']
    assert load_s == summary[mk.KV_TIER_LOAD_TIME_S.key]["host"] > 0
    # the same counts as the summary's
    assert summary[mk.KV_TIER_HITS_BY_SOURCE.key] == {"device": 64, "host": 2 * 16}
    assert summary[mk.KV_TIER_LOADED_BYTES.key] == {"host": 2 * BLOCK_BYTES}
    assert summary[mk.KV_TIER_WRITTEN_BYTES.key] == {"host": 6 * BLOCK_BYTES}
    assert summary[mk.KV_TIER_EVICTED_BLOCKS.key] == {"host": 2}
    assert metrics["vllm:prefix_cache_hits_total"] == summary[mk.PREFIX_CACHE_HITS.key] == 96


def test_a_server_without_tiers_has_no_level_series() -> None:
    with serve() as running:
        metrics = wait_until_idle(running.url)
    assert not [name for name in metrics if name.startswith("enginekit:kv_tier_") and "{" in name]
    assert metrics["enginekit:kv_tier_loads_avoided_blocks_total"] == 0

"""Two levels under a simulated pool: what the device evicts goes to host memory, what the
host evicts to disk, and a prompt's blocks come back from whichever holds them, with every
invariant checked after every step."""

from __future__ import annotations

import pytest

from enginekit import Engine, SamplingParams
from enginekit import metric_keys as mk

BLOCK_MIB = 2  # Llama-3-8B's 16-token block of bf16 KV


@pytest.mark.parametrize("policy", ["on_evict", "write_through", "second_hit"])
def test_blocks_come_back_from_host_and_from_disk(policy):
    engine = Engine.from_overrides(
        [
            "model=llama-3-8b",
            "progress=false",
            "cache.num_blocks=200",
            "+tier=host",
            "tier.levels=[host,disk]",
            f"tier.host_gib={40 * BLOCK_MIB / 1024}",  # 40 blocks
            f"tier.disk_gib={2000 * BLOCK_MIB / 1024}",
            f"tier.write_policy={policy}",
            "tier.load_or_recompute=false",
        ]
    )
    prompts = [[p * 1000 + t for t in range(16 * 30 + 5)] for p in range(8)]
    # each prompt three times, the second time in reverse order: the pool holds 6 of the
    # 8, the host one more, the disk the rest
    for turn, order in enumerate([range(8), range(7, -1, -1), range(8)]):
        for p in order:
            prompt = prompts[p]
            engine.add_request(prompt, SamplingParams(max_tokens=2), request_id=f"{turn}-{p}")
            while engine.has_unfinished_requests():
                engine.step()
                engine.check_integrity()
    summary = engine.summary()
    hits = summary[mk.KV_TIER_HITS_BY_SOURCE.key]
    assert sum(hits.values()) == summary[mk.PREFIX_CACHE_HITS.key]
    assert hits["host"] + hits["disk"] > 0
    if policy == "on_evict":  # write_through churns the small host: its hits are on disk
        assert hits["host"] > 0 and hits["disk"] > 0
    written = summary[mk.KV_TIER_WRITTEN_BYTES.key]
    assert written["host"] > 0 and written["disk"] > 0  # the host's evictions went down
    held = summary[mk.KV_TIER_BLOCKS.key]
    assert held["host"] <= 40 and held["disk"] <= 2000

"""Two simulated replicas on one Redis: the blocks one computed are hits for the other
(the simulator moves no bytes; the keys the replicas share are real Redis keys)."""

from __future__ import annotations

from enginekit import Engine, SamplingParams
from enginekit import metric_keys as mk


def _replica(redis_url: str) -> Engine:
    return Engine.from_overrides(
        [
            "model=llama-3-8b",
            "progress=false",
            "+tier=redis",
            f"tier.redis_url={redis_url}",
            "tier.write_policy=write_through",  # written as each request finishes
            # Llama-3-8B computes a 16-token block early in a prompt about as fast as 5 GB/s
            # moves its 2 MiB: always load, to see the sharing itself
            "tier.load_or_recompute=false",
        ]
    )


def test_a_second_replica_hits_the_blocks_the_first_wrote_to_redis(redis_url):
    prompt = list(range(1000, 1000 + 16 * 40 + 3))  # 40 full blocks and 3 tokens
    first = _replica(redis_url)
    first.add_request(prompt, SamplingParams(max_tokens=4), request_id="a")
    first.run()
    assert first.cache.tier_stats()[0].num_written_blocks == 40
    second = _replica(redis_url)
    second.add_request(prompt, SamplingParams(max_tokens=4), request_id="b")
    summary = second.run().summary
    assert summary[mk.KV_TIER_HITS_BY_SOURCE.key] == {"device": 0, "redis": 40 * 16}
    assert second.output("b").num_cached_tokens == 40 * 16

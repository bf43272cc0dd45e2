"""KV tiers on the torch executor: blocks written down to host memory, to disk or to Redis
and loaded back give the tokens transformers' own forward gives, with every later prefix
hit coming from a tier (a flood of other prompts evicts the device pool first)."""

from __future__ import annotations

import random

import pytest
from torch_helpers import hf_config, hf_generate, hf_model, prompts, saved_engine

from enginekit import Engine, SamplingParams
from enginekit.models.tiny import random_state_dict
from enginekit.request import Request

NEW_TOKENS = 8
NUM_BLOCKS = 48  # blocks of 4 tokens: the flood evicts every block of the first wave


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    return folder, model


def hf_greedy(model, prompt: list[int]) -> list[int]:
    return hf_generate(model, prompt, NEW_TOKENS)


def run_waves(
    eng: Engine, vocab: int, device_hits: list[int] | None = None
) -> list[tuple[list[int], list[int]]]:
    """Three waves, one after the other: prompts sharing a prefix, a flood of unrelated
    prompts that fills the pool, and the first wave again. Returns (prompt, output tokens)
    of the first and third waves; ``device_hits`` gets, before the third wave, the tokens
    of each of its prompts that the device's prefix cache still holds."""
    first = prompts(vocab, shared=21, seed=1, n=4)
    rng = random.Random(7)
    flood = [[rng.randrange(3, vocab) for _ in range(60)] for _ in range(4)]
    results = []
    for wave, batch in enumerate([first, flood, first]):
        if wave == 2 and device_hits is not None:
            for i, prompt in enumerate(batch):  # a probe, never admitted
                probe = Request(f"probe-{i}", 10**9 + i, prompt, SamplingParams(), 0.0)
                device_hits.append(eng.cache.prefix.match(probe).num_tokens)
                eng.cache.prefix.on_released(probe)
        ids = [
            eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS), request_id=f"{wave}-{i}")
            for i, p in enumerate(batch)
        ]
        while eng.has_unfinished_requests():
            eng.step()
            eng.check_integrity()
        if wave != 1:
            results += [
                (p, eng.output(r).output_token_ids) for r, p in zip(ids, batch, strict=True)
            ]
    return results


def tier_overrides(tier: str, tmp_path, redis_url: str | None) -> list[str]:
    # Always load: by the restore-cost model a model this small computes a block faster
    # than any link moves it, and would never load.
    always = "tier.load_or_recompute=false"
    if tier == "host":
        return ["+tier=host", "tier.host_gib=0.01", always]
    if tier == "disk":
        path = tmp_path / "blocks"
        return ["+tier=disk", f"tier.disk_path={path}", "tier.disk_gib=0.01", always]
    return ["+tier=redis", f"tier.redis_url={redis_url}", always]


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
@pytest.mark.parametrize("tier", ["host", "disk", "redis"])
def test_greedy_tokens_with_a_tier_equal_transformers_and_a_run_without(
    saved_model, tmp_path, request, prefix, tier
):
    folder, model = saved_model
    redis_url = request.getfixturevalue("redis_url") if tier == "redis" else None
    common = [f"+prefix={prefix}", f"cache.num_blocks={NUM_BLOCKS}", "cache.watermark=0"]
    with_tier = saved_engine(folder, *common, *tier_overrides(tier, tmp_path, redis_url))
    device_hits: list[int] = []
    results = run_waves(with_tier, model.config.vocab_size, device_hits)
    assert device_hits == [0, 0, 0, 0]  # the flood left the device nothing to hit
    stats = with_tier.cache.tier_stats()
    assert len(stats) == 1 and stats[0].num_failures == 0
    # the shared prefix (5 full blocks) and more came back from the tier
    assert stats[0].num_hit_blocks >= 5
    without = saved_engine(folder, *common)
    assert run_waves(without, model.config.vocab_size) == results
    for prompt, output in results:
        assert output == hf_greedy(model, prompt)
    with_tier.cache.tiers.close()  # type: ignore[union-attr]


TWO_PROCESS_SCRIPT = """
import sys
from torch_helpers import prompts, saved_engine
from enginekit import SamplingParams

folder, url = sys.argv[1], sys.argv[2]
eng = saved_engine(folder, "+tier=redis", f"tier.redis_url={url}",
                   "tier.write_policy=write_through", "tier.load_or_recompute=false")
for i, prompt in enumerate(prompts(256, shared=21, seed=5, n=3)):
    eng.add_request(prompt, SamplingParams(max_tokens=4), request_id=str(i))
eng.run()
print(eng.cache.tier_stats()[0].num_written_blocks)
"""


def test_a_second_engine_in_another_process_loads_the_first_s_blocks_from_redis(
    saved_model, redis_url
):
    import subprocess
    import sys
    from pathlib import Path

    folder, model = saved_model
    tests_dir = Path(__file__).resolve().parents[1]
    written = subprocess.run(
        [sys.executable, "-c", TWO_PROCESS_SCRIPT, str(folder), redis_url],
        capture_output=True,
        text=True,
        check=True,
        cwd=tests_dir,
        env={**__import__("os").environ, "PYTHONPATH": str(tests_dir)},
    )
    assert int(written.stdout.split()[-1]) > 0
    eng = saved_engine(
        folder, "+tier=redis", f"tier.redis_url={redis_url}", "tier.load_or_recompute=false"
    )
    batch = prompts(256, shared=21, seed=5, n=3)
    for i, prompt in enumerate(batch):
        eng.add_request(prompt, SamplingParams(max_tokens=NEW_TOKENS), request_id=str(i))
    eng.run()
    stats = eng.cache.tier_stats()[0]
    # every full block of the first prompt, and of the others beyond the shared prefix the
    # first one's load put on the device, came from the other process
    assert stats.num_hit_blocks >= (len(batch[0]) - 1) // 4
    for i, prompt in enumerate(batch):
        assert eng.output(str(i)).output_token_ids == hf_greedy(model, prompt)


def test_a_redis_that_dies_mid_run_costs_recomputation_not_tokens(
    saved_model, tmp_path, redis_server
):
    folder, model = saved_model
    common = ["+prefix=block_hash", f"cache.num_blocks={NUM_BLOCKS}", "cache.watermark=0"]
    eng = saved_engine(folder, *common, *tier_overrides("redis", tmp_path, redis_server.url))
    vocab = model.config.vocab_size
    first = prompts(vocab, shared=21, seed=1, n=4)
    for i, prompt in enumerate(first):
        eng.add_request(prompt, SamplingParams(max_tokens=NEW_TOKENS), request_id=f"a{i}")
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    redis_server.kill()  # every later write and load fails
    rng = random.Random(7)
    flood = [[rng.randrange(3, vocab) for _ in range(60)] for _ in range(4)]
    for i, prompt in enumerate(flood + first):
        eng.add_request(prompt, SamplingParams(max_tokens=NEW_TOKENS), request_id=f"b{i}")
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    assert eng.cache.tier_stats()[0].num_failures > 0
    for i, prompt in enumerate(flood + first):
        assert eng.output(f"b{i}").output_token_ids == hf_greedy(model, prompt)

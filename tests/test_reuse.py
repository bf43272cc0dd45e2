"""The reuse analysis (enginekit.reuse) and the driver that feeds it: the streamed ideal
against enginekit.workloads.ideal, stack distances against a brute-force LRU stack, the
hit-rate curve against an LRU cache simulated block by block, the miss causes, and
streaming against adding every request up front."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest

from enginekit import Engine
from enginekit import metric_keys as mk
from enginekit.app import compose_config
from enginekit.driver import WorkloadDriver
from enginekit.report import CURVE_PNG, render_report, write_json
from enginekit.reuse import ReuseTracker, stack_distances
from enginekit.workloads.ideal import ideal_prefix_hit_tokens
from enginekit.workloads.request import WorkloadRequest


def _random_requests(rng: random.Random, vocab: int = 3) -> list[WorkloadRequest]:
    """Prompts that share prefixes of random lengths (of earlier prompts and outputs)."""
    base = [rng.randrange(vocab) for _ in range(40)]
    requests = []
    for i in range(rng.randrange(1, 14)):
        cut = rng.randrange(0, 40)
        prompt = base[:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 10))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
        requests.append(WorkloadRequest(f"r{i}", tuple(prompt), tuple(output), 0.0, len(output)))
        if rng.random() < 0.3:
            base = prompt + output
    return requests


@pytest.mark.parametrize("seed", range(6))
def test_the_streamed_ideal_is_the_yardstick_at_both_granularities(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        block_size = rng.choice([1, 2, 3, 4, 16])
        requests = _random_requests(rng)
        tracker = ReuseTracker(block_size)
        for r in requests:
            tracker.add(r.request_id, r.prompt_token_ids, r.output_token_ids)
        assert tracker.ideal_hit_tokens(False) == ideal_prefix_hit_tokens(
            requests, block_size, include_outputs=True
        )
        assert tracker.ideal_hit_tokens(True) == ideal_prefix_hit_tokens(
            requests, 1, include_outputs=True
        )


def _brute_distances(ids: list[int]) -> list[int]:
    stack: list[int] = []
    out = []
    for x in ids:
        if x in stack:
            out.append(len(stack) - 1 - stack.index(x))
            stack.remove(x)
        else:
            out.append(-1)
        stack.append(x)
    return out


def test_stack_distances_are_those_of_an_lru_stack() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ids = [rng.randrange(rng.choice([2, 8, 30])) for _ in range(rng.randrange(0, 80))]
        assert stack_distances(np.asarray(ids, dtype=np.int32)).tolist() == _brute_distances(ids)
    ids = np.asarray([1, 2, 1, 3, 2, 1], dtype=np.int32)
    query = np.asarray([True, True, False, True, True, True])
    assert stack_distances(ids, query).tolist() == [-1, -1, -1, -1, 2, 2]


def _lru_hits(requests: list[WorkloadRequest], block_size: int, capacity: int) -> int:
    """Prompt tokens an LRU cache of ``capacity`` whole blocks hits, simulated: each
    request in turn looks up its leading blocks, then touches every block of its prompt
    and output (but the last token), deepest first."""
    cache: OrderedDict[tuple[int, ...], None] = OrderedDict()
    hits = 0
    for r in requests:
        tokens = list(r.prompt_token_ids) + list(r.output_token_ids)[:-1]
        keys = [tuple(tokens[: (b + 1) * block_size]) for b in range(len(tokens) // block_size)]
        cap = (len(r.prompt_token_ids) - 1) // block_size
        for key in keys[:cap]:
            if key not in cache:
                break
            hits += block_size
        for key in reversed(keys):
            cache[key] = None
            cache.move_to_end(key)
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


@pytest.mark.parametrize("seed", range(4))
def test_the_curve_is_an_lru_cache_at_every_size(seed: int) -> None:
    rng = random.Random(100 + seed)
    block_size = rng.choice([1, 2, 4])
    requests = [r for _ in range(3) for r in _random_requests(rng)]
    requests = [r._replace(request_id=f"q{i}") for i, r in enumerate(requests)]
    tracker = ReuseTracker(block_size)
    for i, r in enumerate(requests):  # one at a time: admitted at i, finished at i
        tracker.add(r.request_id, r.prompt_token_ids, r.output_token_ids)
        tracker.finish(r.request_id, 0, False, admitted_at=float(i), finished_at=float(i))
    num_prompt = sum(len(r.prompt_token_ids) for r in requests)
    curve = tracker.hit_rate_curve(num_prompt)
    assert curve.num_blocks == tuple(sorted(curve.num_blocks))
    for size, rate in zip(curve.num_blocks, curve.hit_rate, strict=True):
        assert rate * num_prompt == pytest.approx(_lru_hits(requests, block_size, size))
    assert curve.ideal_hit_rate * num_prompt == pytest.approx(tracker.ideal_hit_tokens(False))
    assert curve.hit_rate[-1] == pytest.approx(curve.ideal_hit_rate)


def test_misses_are_split_by_cause_and_add_up() -> None:
    tracker = ReuseTracker(4)
    first = list(range(10))  # 2 whole blocks + 2 tokens
    tracker.add("a", first, [50, 51])
    tracker.add("b", first[:10] + [99])  # shares 10 tokens: 2 blocks, 2 more to the token
    tracker.add("c", first, (), extra_key="tenant")  # same tokens under another salt
    tracker.finish("a", 0, token_granular=False)
    tracker.finish("b", 4, token_granular=False)  # the cache kept one of the two blocks
    tracker.finish("c", 0, token_granular=False)
    misses = tracker.miss_counts()
    assert misses.num_prompt_tokens == 10 + 11 + 10
    assert misses.num_hit == 4
    assert misses.num_capacity == 4  # b's second block
    assert misses.num_granularity == 2  # b's tokens 8 and 9
    assert misses.num_other_key == 9  # c: all but its last token, under the other salt
    assert misses.num_compulsory == 10 + 1 + 1  # a entirely, b's and c's last tokens
    assert sum(misses[1:]) == misses.num_prompt_tokens


def _summary(*overrides: str, stream: bool | None = None) -> dict:
    engine = Engine(compose_config(["progress=false", *overrides]))
    driver = WorkloadDriver(engine, stream=stream)
    driver.add_workload()
    return driver.run().summary


def test_streaming_schedules_exactly_what_adding_everything_up_front_does() -> None:
    common = (
        "workload=multiturn",
        "workload.num_requests=120",
        "cache.num_blocks=1500",
        "scheduler.max_num_seqs=16",
        "workload.arrival_rate=4",
    )
    upfront, streamed = _summary(*common, stream=False), _summary(*common, stream=True)
    assert streamed[mk.NUM_WAITING_PEAK.key] <= upfront[mk.NUM_WAITING_PEAK.key]
    for key in (mk.NUM_WAITING_PEAK.key, mk.WORKLOAD_SOURCE.key):
        upfront.pop(key), streamed.pop(key)
    assert streamed == upfront


def test_a_run_classifies_its_misses_and_predicts_its_own_hit_rate(tmp_path) -> None:
    s = _summary("workload=odd_lengths", "workload.num_requests=200", "cache.num_blocks=400")
    shares = [s[m.key] for m in mk.ADDED_BY_DRIVER[:4]]
    assert s[mk.PREFIX_CACHE_FIRST_HIT_RATE.key] + sum(shares) == pytest.approx(1.0)
    # documents off the block grid: block_hash misses their last partial blocks
    assert s[mk.PREFIX_CACHE_MISS_GRANULARITY.key] > 0.01
    assert s[mk.PREFIX_CACHE_MISS_OTHER_KEY.key] == 0
    curve = s[mk.PREFIX_CACHE_HIT_RATE_CURVE.key]
    assert [400, s[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key]] in curve
    assert curve[-1][1] <= s[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key] + 1e-12
    text = render_report(s, {})
    assert "== hit rate by cache size" in text and "<- this pool" in text
    assert "missed: capacity" in text
    write_json(s, {}, tmp_path / "report.json")
    assert (tmp_path / CURVE_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_curve_predicts_the_hit_rate_of_a_pool_that_evicts() -> None:
    """Conversations whose contexts outgrow a 3,000-block pool (no preemption): the
    prediction at the pool is within 5 points of the measured first-admission rate."""
    s = _summary(
        "workload=multiturn",
        "workload.num_requests=200",
        "cache.num_blocks=3000",
        "scheduler.max_num_seqs=16",
        "workload.arrival_rate=2",
    )
    assert s[mk.NUM_PREEMPTIONS_TOTAL.key] == 0
    measured = s[mk.PREFIX_CACHE_FIRST_HIT_RATE.key]
    assert 0.3 < measured < s[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key] - 0.1  # it does evict
    assert abs(s[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key] - measured) < 0.05

"""The reuse analysis (enginekit.reuse) and the driver that feeds it: the streamed ideal
against enginekit.workloads.ideal, stack distances against a brute-force LRU stack, the
pinned-pool rule on hand-built access streams (exact values, a brute-force evaluation of
the rule, and a pool simulated block by block, which the rule bounds from above), the
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
from enginekit.report import CURVE_PNG, NOT_PREDICTED, render_report, write_json
from enginekit.reuse import AccessStream, ReuseTracker, min_pool_sizes, stack_distances
from enginekit.reuse.curve import (
    LOOKUP,
    NO_HIT,
    RELEASE_HELD,
    RELEASE_WRITTEN,
    _count_below,
    hit_rate_curve,
)
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


def test_a_repeated_request_takes_the_nodes_of_its_first_time(monkeypatch) -> None:
    """Requests repeated within a trace skip the walk (the recent ones are remembered):
    the same ideals, block accesses and curve as walking every one."""
    rng = random.Random(21)
    for _ in range(20):
        block_size = rng.choice([1, 2, 4])
        base = _random_requests(rng)
        requests = [rng.choice(base) for _ in range(3 * len(base))]
        trackers = []
        for limit in (1 << 30, 0):  # remember all; remember only the latest
            monkeypatch.setattr("enginekit.reuse.tracker.RECENT_BYTES", limit)
            tracker = ReuseTracker(block_size)
            for i, r in enumerate(requests):
                tracker.add(f"q{i}", r.prompt_token_ids, r.output_token_ids)
                tracker.finish(f"q{i}", 0, False, admitted_at=float(i), finished_at=float(i))
            trackers.append(tracker)
        remembering, walking = trackers
        for key in ("ideal_block_tokens", "ideal_token_tokens", "num_prompt_tokens"):
            assert getattr(remembering, key) == getattr(walking, key)
        assert remembering._access_ids == walking._access_ids
        num_prompt = remembering.num_prompt_tokens
        assert remembering.hit_rate_curve(num_prompt) == walking.hit_rate_curve(num_prompt)


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


def test_count_below_matches_counting_each_prefix() -> None:
    rng = random.Random(3)
    for _ in range(300):
        values = np.asarray([rng.randrange(30) for _ in range(rng.randrange(0, 70))], np.int64)
        num = rng.randrange(0, 25)
        lens = np.asarray([rng.randrange(len(values) + 1) for _ in range(num)], np.int64)
        bounds = np.asarray([rng.randrange(32) for _ in range(num)], np.int64)
        expected = [int((values[:k] < b).sum()) for k, b in zip(lens, bounds, strict=True)]
        assert _count_below(values, lens, bounds).tolist() == expected


# An event: ("lookup", blocks deepest first, how many of its last blocks are queried,
# pinned) or ("release", blocks deepest first, how many of its last blocks it held).
Event = tuple


def access_stream_of(events: list[Event]) -> AccessStream:
    """The ``AccessStream`` of hand-written events (see ``Event``), in their order."""
    ids, event, kind, query, pinned = [], [], [], [], []
    for e, (what, blocks, count, *rest) in enumerate(events):
        for k, block in enumerate(blocks):
            from_end = len(blocks) - 1 - k
            ids.append(block)
            event.append(e)
            if what == "lookup":
                kind.append(LOOKUP)
                query.append(from_end < count)
                pinned.append(rest[0])
            else:
                kind.append(RELEASE_HELD if from_end < count else RELEASE_WRITTEN)
                query.append(False)
                pinned.append(0)
    return AccessStream(
        np.asarray(ids, np.int32),
        np.asarray(event, np.int64),
        np.asarray(kind, np.int8),
        np.asarray(query, bool),
        np.asarray(pinned, np.int64),
    )


def _rule_sizes(events: list[Event]) -> list[int]:
    """The rule, evaluated access by access: a queried block that some earlier lookup
    still references hits from ``pinned`` blocks on; an unreferenced one that entered the
    eviction order with d unreferenced blocks entering after it from d + pinned + 1; a
    lookup hits up to its first miss."""
    references: dict[int, int] = {}
    order: list[int] = []  # unreferenced blocks, the most recently released last
    out: list[int] = []
    for what, blocks, count, *rest in events:
        distances = []
        for k, block in enumerate(blocks):
            from_end = len(blocks) - 1 - k
            if what == "lookup":
                if from_end < count:
                    if references.get(block, 0):
                        distances.append(-1)
                    elif block in order:
                        distances.append(len(order) - 1 - order.index(block))
                    else:
                        distances.append(None)
                if block in order:
                    order.remove(block)
                references[block] = references.get(block, 0) + 1
                continue
            if from_end < count:
                references[block] -= 1
            if not references.get(block, 0):
                if block in order:
                    order.remove(block)
                order.append(block)
        if what != "lookup":
            out += [NO_HIT] * len(blocks)
            continue
        sizes, worst = [], -1
        for distance in reversed(distances):  # from the root-most block
            worst = None if distance is None or worst is None else max(worst, distance)
            sizes.append(NO_HIT if worst is None else worst + rest[0] + 1)
        out += [NO_HIT] * (len(blocks) - count) + sizes[::-1]
    return out


def test_the_pinned_rule_on_a_hand_built_stream() -> None:
    events: list[Event] = [
        ("lookup", [1, 0], 2, 0),  # a: nothing cached yet
        ("lookup", [7], 1, 2),  # c: holds block 7 from now to the end
        ("release", [2, 1, 0], 2),  # a ends: wrote 2, held 1 and 0 (0 most recent)
        ("release", [9, 8], 0),  # b wrote 9 and 8 and ends, after a
        ("lookup", [2, 1, 0], 3, 5),  # d: 5 blocks pinned as it is admitted
        ("lookup", [6, 7], 2, 5),  # e: 7 (its root) is held by c; 6 was never computed
        ("lookup", [8], 1, 5),  # f: 8 is still cached; d's lookup took 0, 1, 2 out
    ]
    sizes = min_pool_sizes(access_stream_of(events)).tolist()
    assert sizes == [NO_HIT] * 2 + [NO_HIT] + [NO_HIT] * 5 + [
        # d: 0 has 8 and 9 released after it (d = 2), 1 has 0, 8, 9 (3), 2 has 1, 0, 8, 9
        max(2, 3, 4) + 5 + 1,
        max(2, 3) + 5 + 1,
        2 + 5 + 1,
        NO_HIT,  # e: 6 misses at every size
        5,  # e: 7, referenced by c, hits any pool that holds the pinned blocks
        0 + 5 + 1,  # f: only 9 (older) is left in the order besides 8: d = 0
    ]
    assert sizes == _rule_sizes(events)


def _random_path(rng: random.Random, tree: dict[tuple[int, ...], int]) -> list[int]:
    """The blocks of a random root-first path in a binary tree of depth 3 (ids by
    prefix)."""
    choices = tuple(rng.randrange(2) for _ in range(rng.randrange(1, 4)))
    return [tree.setdefault(choices[: k + 1], len(tree)) for k in range(len(choices))]


def _random_events(rng: random.Random) -> list[Event]:
    """Requests over a small tree of blocks: each looks up a random path and releases it
    later with a few blocks of its own written past it, with random pinned counts."""
    events: list[Event] = []
    running: list[list[int]] = []
    tree: dict[tuple[int, ...], int] = {}
    num_writes = 100
    for _ in range(rng.randrange(1, 25)):
        if running and rng.random() < 0.5:
            path = running.pop(rng.randrange(len(running)))
            written = [num_writes + k for k in range(rng.randrange(3))]
            num_writes += 3
            events.append(("release", written[::-1] + path[::-1], len(path)))
            continue
        path = _random_path(rng, tree)
        events.append(("lookup", path[::-1], rng.randrange(len(path) + 1), rng.randrange(5)))
        running.append(path)
    for path in running:
        events.append(("release", path[::-1], len(path)))
    return events


def test_the_pinned_rule_matches_its_brute_force_evaluation() -> None:
    rng = random.Random(11)
    for _ in range(300):
        events = _random_events(rng)
        assert min_pool_sizes(access_stream_of(events)).tolist() == _rule_sizes(events)


def _pool_hits(events: list[Event], capacity: int) -> int:
    """Queried blocks a pool of ``capacity`` blocks hits, simulated: referenced blocks
    stay; the unreferenced cached ones are evicted oldest release first whenever the pool
    holds more than ``capacity``; a lookup hits its queried blocks up to the first that is
    not in the pool."""
    references: dict[int, int] = {}
    cached: OrderedDict[int, None] = OrderedDict()  # unreferenced, oldest first
    hits = 0

    def fit() -> None:
        while cached and sum(1 for v in references.values() if v) + len(cached) > capacity:
            cached.popitem(last=False)

    for what, blocks, count, *_ in events:
        if what == "lookup":
            queried = blocks[len(blocks) - count :][::-1]  # root-most first
            for block in queried:
                if not (references.get(block, 0) or block in cached):
                    break
                hits += 1
            for block in blocks:
                cached.pop(block, None)
                references[block] = references.get(block, 0) + 1
            fit()
            continue
        for k, block in enumerate(blocks):
            if len(blocks) - 1 - k < count:
                references[block] -= 1
            if not references.get(block, 0):
                cached.pop(block, None)
                cached[block] = None
        fit()
    return hits


def test_the_pinned_rule_bounds_a_simulated_pool_from_above() -> None:
    """With the stream's pinned counts those of the simulated pool, the rule hits every
    block the pool hits (it reads the pool at the lookup only); with no two requests
    running at once it is the pool exactly."""
    rng = random.Random(5)
    for _ in range(200):
        events = _random_events(rng)
        references: dict[int, int] = {}
        exact: list[Event] = []
        for event in events:  # each lookup's pinned: the blocks referenced before it
            what, blocks, count, *_ = event
            if what == "lookup":
                event = (what, blocks, count, sum(1 for v in references.values() if v))
                for block in blocks:
                    references[block] = references.get(block, 0) + 1
            else:
                for k, block in enumerate(blocks):
                    if len(blocks) - 1 - k < count:
                        references[block] -= 1
            exact.append(event)
        sizes = np.asarray(min_pool_sizes(access_stream_of(exact)))
        peak = max([e[3] for e in exact if e[0] == "lookup"] + [1]) + 3
        for capacity in range(peak, peak + 12):
            predicted = int(((sizes != NO_HIT) & (sizes <= capacity)).sum())
            assert predicted >= _pool_hits(exact, capacity)
    for _ in range(200):  # one request at a time: nothing is pinned at a lookup
        events, tree = [], {}
        for _ in range(rng.randrange(1, 10)):
            path = _random_path(rng, tree)
            events.append(("lookup", path[::-1], rng.randrange(len(path) + 1), 0))
            events.append(("release", [50 + len(events)] + path[::-1], len(path)))
        sizes = np.asarray(min_pool_sizes(access_stream_of(events)))
        for capacity in range(1, 12):
            predicted = int(((sizes != NO_HIT) & (sizes <= capacity)).sum())
            assert predicted == _pool_hits(events, capacity)


def test_a_lookup_reads_the_pinned_blocks_of_the_last_step_before_it() -> None:
    tracker = ReuseTracker(2)
    tracker.add("a", [1, 2, 3, 4, 5], [6, 7])
    tracker.add("b", [1, 2, 3, 4, 9], [8])
    tracker.record_pinned(1.0, 3)
    tracker.record_pinned(2.0, 7, num_released_blocks=4)
    tracker.record_pinned(3.0, 2)
    tracker.finish("a", 0, False, admitted_at=2.0, finished_at=3.0)
    tracker.finish("b", 0, False, admitted_at=4.0, finished_at=4.0)
    stream = tracker.access_stream()
    # a's lookup at 2.0 reads the record of 1.0 (3); b's at 4.0 the one of 3.0 (2)
    assert stream.pinned[stream.kind == LOOKUP].tolist() == [3, 3, 2, 2]
    assert stream.ids[stream.kind == LOOKUP].tolist() == [2, 1, 2, 1]  # deepest first
    assert stream.query.tolist() == [True, True] + [False] * 3 + [True, True] + [False] * 2
    held, written = RELEASE_HELD, RELEASE_WRITTEN
    assert stream.kind.tolist() == [LOOKUP] * 2 + [written, held, held] + [LOOKUP] * 2 + [held] * 2
    # b's lookup: block 1 (root) was released last by a (d = 0), block 2 just before it
    # (d = 1); 2 blocks pinned; a's lookup found nothing
    assert min_pool_sizes(stream).tolist() == [NO_HIT] * 5 + [1 + 2 + 1, 0 + 2 + 1] + [NO_HIT] * 2
    assert tracker.peak_pinned_blocks == 11  # 7 after the step, 4 released in it
    curve = tracker.hit_rate_curve(10, watermark=0.1)
    assert curve.min_num_blocks == 12  # 12 - int(1.2) = 11 blocks left beside the watermark
    assert curve.is_predicted(12) and not curve.is_predicted(11)
    assert curve.ideal_hit_rate == pytest.approx(4 / 10)  # b's two blocks of 2 tokens
    assert curve.at(3) == pytest.approx(2 / 10) and curve.at(4) == pytest.approx(4 / 10)


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
    # it preempted: its peak of referenced blocks leaves smaller pools unpredicted, and
    # larger ones too up to its peak with the watermark; its own pool ran this schedule
    assert s[mk.NUM_PREEMPTIONS_TOTAL.key] > 0
    smallest = s[mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key]
    assert smallest > 400
    assert all((rate is None) == (size < smallest and size != 400) for size, rate in curve)
    text = render_report(s, {})
    assert "== hit rate by cache size" in text and "<- this pool" in text
    assert "missed: capacity" in text
    write_json(s, {}, tmp_path / "report.json")
    assert (tmp_path / CURVE_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_curve_predicts_the_hit_rate_of_a_pool_that_evicts() -> None:
    """Conversations whose contexts outgrow a 3,000-block pool (no preemption): the
    prediction at the pool is within a point of the measured first-admission rate."""
    s = _summary(*_CONVERSATIONS, "cache.num_blocks=3000")
    assert s[mk.NUM_PREEMPTIONS_TOTAL.key] == 0
    measured = s[mk.PREFIX_CACHE_FIRST_HIT_RATE.key]
    assert 0.3 < measured < s[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key] - 0.1  # it does evict
    assert abs(s[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key] - measured) < 0.01


_CONVERSATIONS = (
    "workload=multiturn",
    "workload.num_requests=200",
    "scheduler.max_num_seqs=16",
    "workload.arrival_rate=2",
)


def test_a_roomy_pool_predicts_the_smaller_pools_that_run_its_schedule() -> None:
    """The curve of a 6,000-block run predicts the first-admission hit rate of reruns at
    3,000 and 4,000 blocks within 2 points; 2,000 blocks, below its peak of referenced
    blocks, preempts and is marked not predicted (in the summary's curve too)."""
    engine = Engine(compose_config(["progress=false", *_CONVERSATIONS, "cache.num_blocks=6000"]))
    driver = WorkloadDriver(engine)
    driver.add_workload()
    summary = driver.run().summary
    sizes = (2000, 3000, 4000)
    curve = driver.tracker.hit_rate_curve(driver.tracker.num_prompt_tokens, sizes, 0.01)
    assert curve.min_num_blocks == summary[mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key]
    assert 2000 < curve.min_num_blocks <= 3000
    for size, rate in summary[mk.PREFIX_CACHE_HIT_RATE_CURVE.key]:
        assert (rate is None) == (size < curve.min_num_blocks)
    for size in sizes:
        rerun = _summary(*_CONVERSATIONS, f"cache.num_blocks={size}")
        measured = rerun[mk.PREFIX_CACHE_FIRST_HIT_RATE.key]
        if size < curve.min_num_blocks:
            assert not curve.is_predicted(size)
            assert rerun[mk.NUM_PREEMPTIONS_TOTAL.key] > 0
        else:
            assert curve.is_predicted(size)
            assert abs(curve.at(size) - measured) < 0.02
    assert NOT_PREDICTED in render_report(summary, {})


def test_sizes_beyond_every_reuse_are_points_at_the_ideal() -> None:
    """Every reuse hits from 5 blocks on, but the run needed 10 to run its schedule: the
    curve still predicts from 10 blocks on (the ideal), at the pool and its multiples."""
    sizes = np.asarray([1, 3, 5, NO_HIT], dtype=np.int32)
    curve = hit_rate_curve(sizes, 2, 20, extra_sizes=(20, 5, 10, 40, 80), smallest_predicted=10)
    assert {10, 20, 40, 80} <= set(curve.num_blocks)
    assert curve.num_blocks == tuple(sorted(curve.num_blocks))
    rates = dict(zip(curve.num_blocks, curve.hit_rate, strict=True))
    assert curve.ideal_hit_rate == pytest.approx(3 * 2 / 20)
    for size in (10, 20, 40, 80):
        assert curve.is_predicted(size) and rates[size] == pytest.approx(curve.ideal_hit_rate)
    assert not curve.is_predicted(5) and rates[1] == pytest.approx(2 / 20)


def test_a_pool_larger_than_every_reuse_is_predicted_and_measured_in_the_report() -> None:
    """All requests at once in a roomy pool (the default job's shape): its referenced
    blocks peak above the size that holds every reuse, yet the curve predicts the pool,
    its multiples and the smallest pool that runs the schedule, and the report's row of
    the pool sets the measured rate beside the predicted one."""
    s = _summary("workload.num_requests=40")
    curve = s[mk.PREFIX_CACHE_HIT_RATE_CURVE.key]
    pool, smallest = s[mk.KV_CACHE_NUM_BLOCKS.key], s[mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key]
    predicted = {size: rate for size, rate in curve if rate is not None}
    expected = {smallest, pool, *(int(pool * m) for m in (0.5, 2, 4))}
    assert expected <= set(predicted)
    measured = s[mk.PREFIX_CACHE_FIRST_HIT_RATE.key]
    assert (
        predicted[pool]
        == pytest.approx(measured)
        == pytest.approx(s[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key])
    )
    text = render_report(s, {})
    row = next(line for line in text.splitlines() if "<- this pool" in line)
    assert row.split()[0] == f"{pool:,}"
    assert f"{100 * measured:.2f} %  <- this pool, measured {100 * measured:.2f} %" in row
    assert sum("<- " in line and NOT_PREDICTED not in line for line in text.splitlines()) >= 4
    header = next(line for line in text.splitlines() if line.split()[:1] == ["blocks"])
    assert header.split() == ["blocks", "GiB", "hit", "rate", "OPT"]

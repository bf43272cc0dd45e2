"""Belady's OPT on a run's access stream (enginekit.reuse.opt) and the pool simulated block
by block (enginekit.reuse.simulate): the sweep against every keep-or-evict choice of
small streams and against Belady simulated, OPT against LRU simulated and the hit-rate
curve on random streams, the classic example, and a run's summary and report."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reuse import Event, access_stream_of

from enginekit import Engine
from enginekit import metric_keys as mk
from enginekit.app import compose_config
from enginekit.driver import WorkloadDriver
from enginekit.report import render_report
from enginekit.reuse import AccessStream, min_pool_sizes
from enginekit.reuse.curve import NO_HIT
from enginekit.reuse.opt import opt_curve, opt_hit_rate, opt_hits, reuse_intervals
from enginekit.reuse.simulate import simulate_lru, simulate_opt, simulate_pool


@st.composite
def _events(draw: st.DrawFn, max_requests: int = 20) -> list[Event]:
    """Requests over a binary tree of blocks of depth 3: each looks up a random root-first
    path (some of its last blocks queried, a random pinned count) and releases it later
    with a few blocks of its own written past it."""
    tree: dict[tuple[int, ...], int] = {}
    events: list[Event] = []
    running: list[list[int]] = []
    num_writes = 100
    for _ in range(draw(st.integers(1, max_requests))):
        if running and draw(st.booleans()):
            path = running.pop(draw(st.integers(0, len(running) - 1)))
            written = list(range(num_writes, num_writes + draw(st.integers(0, 2))))
            num_writes += 3
            events.append(("release", written[::-1] + path[::-1], len(path)))
            continue
        choices = draw(st.lists(st.integers(0, 1), min_size=1, max_size=3))
        path = [tree.setdefault(tuple(choices[: k + 1]), len(tree)) for k in range(len(choices))]
        count = draw(st.integers(0, len(path)))
        events.append(("lookup", path[::-1], count, draw(st.integers(0, 4))))
        running.append(path)
    for path in running:
        events.append(("release", path[::-1], len(path)))
    return events


def _own_pinned(events: list[Event]) -> list[Event]:
    """The events with each lookup's pinned count the blocks referenced before it: the
    pool's own, as a real pool of this model has them."""
    references: dict[int, int] = {}
    out: list[Event] = []
    for what, blocks, count, *rest in events:
        if what == "lookup":
            out.append((what, blocks, count, sum(1 for v in references.values() if v)))
            for block in blocks:
                references[block] = references.get(block, 0) + 1
            continue
        for k, block in enumerate(blocks):
            if len(blocks) - 1 - k < count:
                references[block] -= 1
        out.append((what, blocks, count, *rest))
    return out


def _curve_hits(stream: AccessStream, size: int) -> int:
    """The curve's hits (queried blocks, prefix matches) at ``size`` blocks."""
    sizes = min_pool_sizes(stream)
    return int(((sizes != NO_HIT) & (sizes <= size)).sum())


SIZES = range(0, 14)


def _best_of_every_choice(stream: AccessStream, size: int) -> int:
    """The most queries that hit, trying every set of reuse intervals to keep."""
    intervals = reuse_intervals(stream)
    held = int(np.count_nonzero(intervals.held & (intervals.pinned <= size)))
    contains = [
        [
            bool(start < intervals.positions[k] and end >= k)
            for start, end in zip(intervals.start, intervals.end, strict=True)
        ]
        for k in range(len(intervals.positions))
    ]
    best = 0
    for mask in range(1 << len(intervals.start)):
        kept = [bool(mask >> i & 1) for i in range(len(intervals.start))]
        fits = all(
            sum(k and c for k, c in zip(kept, row, strict=True)) <= max(0, size - pinned)
            for row, pinned in zip(contains, intervals.pinned.tolist(), strict=True)
        )
        if fits:
            best = max(best, sum(kept))
    return held + best


@settings(max_examples=60, deadline=None)
@given(_events(max_requests=10))
def test_the_sweep_keeps_the_most_of_every_keep_or_evict_choice(events: list[Event]) -> None:
    stream = access_stream_of(events)
    if len(reuse_intervals(stream).start) > 9:
        return
    for size in range(0, 8):
        assert opt_hits(stream, size) == _best_of_every_choice(stream, size)


@settings(max_examples=150, deadline=None)
@given(_events())
def test_opt_is_belady_simulated_and_bounds_lru_at_every_size(events: list[Event]) -> None:
    """The sweep is Belady's furthest-next-query eviction simulated; it hits at least
    every block LRU hits, and LRU's prefix matches are at most its hits and at most the
    curve's (which reads the pool at the lookup only)."""
    stream = access_stream_of(events)
    opt = opt_curve(stream, list(SIZES))
    assert (np.diff(opt) >= 0).all()  # more blocks never hit less
    for size, best in zip(SIZES, opt.tolist(), strict=True):
        lru = simulate_lru(stream, size)
        assert best == simulate_opt(stream, size).per_block
        assert best >= lru.per_block >= lru.prefix
        assert _curve_hits(stream, size) >= lru.prefix


@settings(max_examples=150, deadline=None)
@given(_events())
def test_with_the_pools_own_pinned_blocks_the_curve_is_lru_and_opt_bounds_it(
    events: list[Event],
) -> None:
    stream = access_stream_of(_own_pinned(events))
    opt = opt_curve(stream, [*SIZES, 10**6])
    for size, best in zip(SIZES, opt[:-1].tolist(), strict=True):
        curve = _curve_hits(stream, size)
        assert simulate_lru(stream, size).prefix == curve
        assert best >= curve
    # a pool that holds everything: every reuse hits, per block as in prefix matches
    assert opt[-1] == _curve_hits(stream, 10**6) == int((min_pool_sizes(stream) != NO_HIT).sum())


def test_the_classic_example() -> None:
    """Belady's reference string over 3 blocks, each access a lookup then a release: LRU
    hits 8 (12 faults), MIN 12 (the textbook's MIN, which must load every page, faults 9
    times; here block 4, used once, need not be cached); 14 at most (6 distinct blocks)."""
    refs = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    events: list[Event] = []
    for block in refs:
        events += [("lookup", [block], 1, 0), ("release", [block], 1)]
    stream = access_stream_of(events)
    assert simulate_lru(stream, 3) == (8, 8)
    assert opt_hits(stream, 3) == simulate_opt(stream, 3).per_block == 12
    assert opt_curve(stream, [1, 2, 3, 4, 6]).tolist() == [5, 9, 12, 13, 14]
    assert _curve_hits(stream, 3) == 8
    assert opt_hit_rate(stream, 3) == pytest.approx(12 / 20)
    assert opt_hit_rate(stream, 3, tokens_per_hit=16, num_prompt_tokens=640) == 12 * 16 / 640
    with pytest.raises(ValueError, match="unknown policy"):
        simulate_pool(stream, 3, "fifo")  # type: ignore[arg-type]


def test_pinned_blocks_take_the_room_of_cached_ones() -> None:
    """Two blocks released, then a lookup of a new block while 2 are pinned in a pool of
    3: one cached block fits there, so OPT hits one of the two later lookups; the curve
    reads the pool at those lookups only (nothing pinned) and hits both."""
    events: list[Event] = [
        ("lookup", [1], 0, 0),
        ("release", [1], 1),
        ("lookup", [2], 0, 0),
        ("release", [2], 1),
        ("lookup", [9], 1, 2),
        ("lookup", [1], 1, 0),
        ("lookup", [2], 1, 0),
    ]
    stream = access_stream_of(events)
    assert opt_hits(stream, 3) == 1 and simulate_lru(stream, 3).prefix == 1
    assert _curve_hits(stream, 3) == 2
    assert opt_hits(stream, 4) == 2


def _run(*overrides: str) -> tuple[dict, WorkloadDriver]:
    engine = Engine(compose_config(["progress=false", *overrides]))
    driver = WorkloadDriver(engine)
    driver.add_workload()
    return driver.run().summary, driver


def test_a_run_reports_opt_above_its_measured_rate_and_its_curve() -> None:
    """Conversations whose contexts outgrow a 3,000-block pool: the measured first-admission
    rate is at most OPT at the pool (a share of it below 1); OPT is at least the curve at
    every size it predicts and reaches the curve's ideal where every reuse fits; the
    report shows OPT beside the curve and the share in its prefix-cache section."""
    s, driver = _run(
        "workload=multiturn",
        "workload.num_requests=200",
        "scheduler.max_num_seqs=16",
        "workload.arrival_rate=2",
        "cache.num_blocks=3000",
    )
    measured, opt = s[mk.PREFIX_CACHE_FIRST_HIT_RATE.key], s[mk.PREFIX_CACHE_HIT_RATE_OPT.key]
    assert 0.3 < measured <= opt <= s[mk.PREFIX_CACHE_HIT_RATE_IDEAL.key] + 1e-12
    assert s[mk.PREFIX_CACHE_HIT_RATE_OF_OPT.key] == pytest.approx(measured / opt)
    assert s[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key] <= opt
    opt_points = dict(s[mk.PREFIX_CACHE_HIT_RATE_CURVE_OPT.key])
    assert opt_points[3000] == opt and set(opt_points) <= {3000, 6000, 12000}
    curve = [(size, rate) for size, rate in s[mk.PREFIX_CACHE_HIT_RATE_CURVE.key] if rate]
    tracker = driver.tracker
    rates = tracker.opt_hit_rates(tracker.num_prompt_tokens, [size for size, _ in curve])
    for (size, rate), best in zip(curve, rates, strict=True):
        assert best >= rate - 1e-12, size
        if size in opt_points:
            assert opt_points[size] == pytest.approx(best)
    assert (np.diff(rates) >= -1e-12).all()
    assert rates[-1] == pytest.approx(curve[-1][1])  # every reuse fits: the curve's ideal
    text = render_report(s, {})
    header = next(line for line in text.splitlines() if line.split()[:1] == ["blocks"])
    assert header.split() == ["blocks", "GiB", "hit", "rate", "OPT"]
    row = next(line for line in text.splitlines() if "<- this pool" in line)
    assert f"{100 * opt:.2f} %  <- this pool" in row
    assert "measured hit rate, share of OPT" in text

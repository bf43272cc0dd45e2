"""Belady's optimal (MIN) hit count of one run's block accesses: the most that any
eviction policy could hit on the same stream in the same pool.

The model is the hit-rate curve's (``enginekit.reuse.curve``): the pool of C blocks holds
the blocks running requests reference (``pinned(t)`` of them at a lookup at t, as the run
recorded them: never evicted) and unreferenced cached blocks in the rest, C - pinned(t).
A block enters the unreferenced cache when its last reference is released
(``RELEASE_HELD``, ``RELEASE_WRITTEN``) and leaves it at its next lookup, which
references it again. At a query (a lookup access that may hit: a prompt's blocks up to
the cap, ``AccessStream.query``):

- a block some running request references hits at every size that holds the pinned
  blocks (C >= pinned(t), as in the curve);
- a block never released before misses at every size;
- an unreferenced block hits iff the policy kept it cached from its release to this
  lookup, and the unreferenced blocks a policy keeps at a query t, this one included (the
  ones its own lookup took earlier in the event no longer: they are referenced now), are
  at most C - pinned(t).

So each reuse of an unreferenced block is an interval (its release, its lookup], and a
policy chooses which intervals to keep, subject to: at each query t, the kept intervals
that contain t number at most K(t) = max(0, C - pinned(t)). Nothing is constrained between
queries, which only lets a policy keep more (the bound still holds).

**Definition.** ``opt_hits(stream, C)`` is the largest number of queries that hit in
this model: the blocks held by running requests, plus the most reuse intervals that fit.
Hits count per block: every queried block that is in the pool counts, whether or not the
blocks before it in its prompt hit. The queries are a prompt's blocks up to the cap the
curve uses (a prompt's last token is always computed), so the count is already capped
per request at the blocks the curve may count.

**Why it bounds every policy.** Any eviction policy (LRU, LFU, one that knows the
future, one that evicts a referenced block's neighbours first...) run on this stream in
a pool of C blocks keeps, at each query, a set of unreferenced blocks that fits in
C - pinned(t), and hits a queried block only if that block is in the pool: its kept
intervals are a feasible set, and its per-block hits at most OPT's. A pool hits a
prompt's leading blocks up to the first that misses (a prefix match), so its counted
hits are a subset of its per-block hits: at most OPT's too. (The converse would not hold:
Belady's per-block choice followed by the prefix rule is not an upper bound, since a
policy that keeps whole prefixes can beat it on chained hits.) The curve reads the pool
at the lookup only (a block evicted while more blocks were pinned counts as a hit once
its rank improves), which estimates a real LRU pool from above: where the pinned counts
are the stream's own referenced blocks at each lookup, the curve is exactly an LRU pool
of this model (``enginekit.reuse.simulate``) and OPT is at least it; where the run's
pinned blocks (promised ones included) fall between a release and its lookup, the curve
can exceed what any real pool hits, OPT included (by little next to OPT's per-block
margin on the runs checked).

**Why the greedy is optimal.** Sweeping the queries in time order, adding each interval
at its release and, wherever more than K(t) kept intervals contain t, dropping the one
whose lookup lies furthest in the future (possibly the block just released: MIN may
bypass) keeps the most intervals, for any K(t), shrinking or growing: let R be the
intervals the sweep has dropped so far and O an optimal set that avoids R. When the sweep
drops x at t, the intervals containing t outside R are more than K(t), while O keeps at
most K(t) of them, so some y among them is not in O, and y ends no later than x. O - x + y
is still feasible: it differs from O only at points y contains and x does not, which
come before t (y ends first), where every interval of O - x + y containing them lies
outside R and so among those the sweep kept there (at most K of them). It has O's size
and avoids R + x. So an optimal set avoids every interval the sweep drops, and the
sweep's own set, feasible, is optimal. Belady's rule is this exchange; a capacity that
shrinks only means dropping more at that query, still the furthest first.

Cost: the preparation is one sort of the stream by block id (as the curve's); then each
size is one sweep in Python over the queries where the pool can be full at that size and
the intervals that contain one (``_sweep``), O(n log n): a size that holds every reuse
costs nothing more, one that evicts about as much as the whole curve (which counts every
size at once), so a run's summary takes OPT at a few sizes only.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from enginekit.reuse.curve import (
    LOOKUP,
    AccessStream,
    IntArray,
    _flatnonzero32,
    _neighbour_at,
    _rank,
    _sorted_by_id,
    references_after,
)


class ReuseIntervals(NamedTuple):
    """A stream's queries and reuses, as OPT sees them. ``positions``: the queries' places
    in the stream, ascending; ``pinned``: each query's pinned blocks; ``held``: the
    queries whose block a running request references; ``start``: each reuse interval's
    release (a stream position), ascending; ``end``: its lookup, as an index into the
    queries; ``num_open``: at each query, the reuse intervals that contain it (released
    before it, looked up at it or later)."""

    positions: IntArray
    pinned: IntArray
    held: npt.NDArray[np.bool_]
    start: IntArray
    end: IntArray
    num_open: IntArray


def reuse_intervals(stream: AccessStream) -> ReuseIntervals:
    """The queries of ``stream`` (lookup accesses marked ``query``) and the interval of
    each reuse of an unreferenced block: from the access before the lookup (the release
    that left the block unreferenced) to the lookup. Pure; vectorised."""
    ids = np.asarray(stream.ids)
    n = len(ids)
    kind = np.asarray(stream.kind, dtype=np.int8)
    queries = _flatnonzero32(np.asarray(stream.query, dtype=bool) & (kind == LOOKUP))
    pinned = np.asarray(stream.pinned, dtype=np.int64)[queries]
    if not len(queries):
        empty = np.zeros(0, dtype=np.int64)
        return ReuseIntervals(empty, pinned, np.zeros(0, dtype=bool), empty, empty, empty)
    order, same = _sorted_by_id(ids)
    after = np.empty(n, dtype=np.int32)
    after[order] = references_after(kind, order, same)
    held = after[queries] > 1  # a lookup of a block referenced before it
    del after
    rank = _rank(order)
    previous = _neighbour_at(order, same, rank, queries, -1)
    del order, same, rank
    reuse = np.flatnonzero(~held & (previous >= 0))
    start = previous[reuse].astype(np.int64)
    by_start = np.argsort(start, kind="stable")
    start, end = start[by_start], reuse[by_start].astype(np.int64)
    positions = queries.astype(np.int64)
    num_open = np.searchsorted(start, positions, "left") - np.searchsorted(
        np.sort(end), np.arange(len(queries)), "left"
    )
    return ReuseIntervals(positions, pinned, held, start, end, num_open)


def opt_curve(stream: AccessStream, sizes: npt.ArrayLike) -> IntArray:
    """OPT's hits (queried blocks, per block: module docstring) in a pool of each of
    ``sizes`` blocks. Non-decreasing in the size; from the size that holds every reuse
    on, every query but the never-released ones hits."""
    return opt_curve_of(reuse_intervals(stream), sizes)


def opt_curve_of(intervals: ReuseIntervals, sizes: npt.ArrayLike) -> IntArray:
    """``opt_curve`` from a stream's ``reuse_intervals``."""
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    out = np.zeros(len(sizes), dtype=np.int64)
    held_pinned = np.sort(intervals.pinned[intervals.held])
    for k, size in enumerate(sizes.tolist()):
        held_hits = int(np.searchsorted(held_pinned, size, "right"))
        out[k] = held_hits + _sweep(intervals, size)
    return out


def opt_hits(stream: AccessStream, num_blocks: int) -> int:
    """OPT's hits (queried blocks, per block) in a pool of ``num_blocks`` blocks."""
    return int(opt_curve(stream, [num_blocks])[0])


def opt_hit_rate(
    stream: AccessStream, num_blocks: int, tokens_per_hit: int = 1, num_prompt_tokens: int = 0
) -> float:
    """OPT's hit rate in a pool of ``num_blocks`` blocks: its hits times
    ``tokens_per_hit`` (the block size) over ``num_prompt_tokens`` (the curve's unit),
    or over the stream's queries when that is 0 (a share of the queried blocks)."""
    hits = opt_hits(stream, num_blocks)
    if num_prompt_tokens:
        return hits * tokens_per_hit / num_prompt_tokens
    num_queries = int(np.count_nonzero(np.asarray(stream.query) & (stream.kind == LOOKUP)))
    return hits / num_queries if num_queries else 0.0


def _sweep(intervals: ReuseIntervals, size: int) -> int:
    """The reuse intervals the furthest-next-lookup sweep keeps in a pool of ``size``
    blocks (module docstring). Only the queries where the pool can be full count (all
    open intervals and the pinned blocks exceed the size) and the intervals that contain
    one: the others are kept whatever the sweep does."""
    capacity = np.maximum(size - intervals.pinned, 0)
    full = intervals.num_open > capacity
    num_intervals = len(intervals.start)
    positions = intervals.positions
    if not full.any():
        return num_intervals
    # an interval (start, end] contains a full query iff some full query lies after its
    # start and at or before its end
    num_full_before = np.zeros(len(full) + 1, dtype=np.int64)
    np.cumsum(full, out=num_full_before[1:])
    first_after = np.searchsorted(positions, intervals.start, "right")
    contested = num_full_before[intervals.end + 1] > num_full_before[first_after]
    num_free = num_intervals - int(np.count_nonzero(contested))
    start = intervals.start[contested]
    end = intervals.end[contested]
    ends_at = np.zeros(len(full), dtype=bool)
    ends_at[end] = True
    steps = np.flatnonzero(full | ends_at)
    released_by = np.searchsorted(start, positions[steps], "left").tolist()
    caps = capacity[steps].tolist()
    is_full = full[steps].tolist()
    is_end = ends_at[steps].tolist()
    keys = (-end).tolist()  # a max-heap of lookups: the furthest on top
    dropped = bytearray(len(full))
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    pushed = kept = live = 0
    for step, query in enumerate(steps.tolist()):
        released = released_by[step]
        while pushed < released:
            push(heap, keys[pushed])
            pushed += 1
            live += 1
        if is_full[step]:
            cap = caps[step]
            while live > cap:  # the heap's top is open: live > 0, ended ones end earlier
                dropped[-pop(heap)] = 1
                live -= 1
        if is_end[step] and not dropped[query]:
            kept += 1
            live -= 1
    return num_free + kept

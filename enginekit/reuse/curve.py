"""The hit rate a pool of every size would get on one run's block accesses.

The pool (``block_hash`` with ``lru`` eviction): a pool of C blocks holds the blocks that
running requests reference (their tables' blocks and the blocks promised to their
prefills: never evicted; ``pinned``) and, in the rest, unreferenced cached blocks,
evicted in the order they were released (the least recently released first). So at a
lookup at time t:

- a block some running request references is in the pool (a pool that holds the
  referenced blocks has it);
- an unreferenced block is still cached iff fewer than ``C - pinned(t)`` blocks were
  released after it and are still unreferenced: its stack distance among unreferenced
  blocks ``d`` is below ``C - pinned(t)``, i.e. ``C >= d + pinned(t) + 1``;
- a block never released before (never cached) misses at every size;

and a request hits its leading blocks up to the first that misses (a prefix match), so
its block j hits from the largest of those sizes over blocks 0..j on: ``min_pool_sizes``.
The rule reads the pool at the lookup only: a block evicted earlier while more blocks
were referenced, and whose rank has since improved, counts as a hit (an estimate from
above). And it takes the run's pinned blocks as they were: a smaller pool that misses
more also computes more prefill, so its requests run longer and pin more blocks at once,
which over-predicts it a little more.

Tiers below the pool (``tiered_pool_blocks``): a level that takes the blocks the pool
evicts holds the next most recently released ones after the pool's, so a pool of D blocks
over levels of H blocks in all behaves as one pool of D + H: the curve at D + H is its
hit rate.

An access stream (``AccessStream``) lists, in time order, every lookup and release as an
event of contiguous accesses, deepest block first. A lookup references its blocks from
then on (each lookup of a block is matched by one ``RELEASE_HELD`` of it later); a
release drops the references its request's lookup took (``RELEASE_HELD``) and releases
the blocks its request wrote itself (``RELEASE_WRITTEN``); a block enters the eviction
order when no reference to it is left. Stack distances are counted offline in numpy
(``_count_below``: log n levels, each one merge of the stream's entries and one search
per lookup).
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

NUM_CURVE_POINTS = 48
NUM_POINTS_BELOW = 3  # grid points under the smallest predicted size

LOOKUP = 0  # a lookup touches a block: a reference to it from now on
RELEASE_HELD = 1  # a release drops the reference its request's lookup took
RELEASE_WRITTEN = 2  # a release of a block its request wrote (it held no lookup's reference)

NO_HIT = -1  # ``min_pool_sizes`` of an access no pool size hits (or not a query)

IntArray = npt.NDArray[np.int64]


class AccessStream(NamedTuple):
    """Block accesses in time order, all arrays of one length. ``event``: the index of
    the lookup or release each access belongs to (non-decreasing; an event's accesses
    are contiguous, its deepest block first); ``kind``: ``LOOKUP``, ``RELEASE_HELD`` or
    ``RELEASE_WRITTEN``; ``query``: the lookup accesses that may hit (a lookup's
    root-most blocks); ``pinned``: the pool's referenced blocks at the access's time
    (read at queries)."""

    ids: npt.NDArray[np.integer]
    event: npt.NDArray[np.integer]
    kind: npt.NDArray[np.integer]
    query: npt.NDArray[np.bool_]
    pinned: npt.NDArray[np.integer]


class HitRateCurve(NamedTuple):
    """The hit rate a pool of ``num_blocks[i]`` blocks would get, ``hit_rate[i]`` (a share
    of prompt tokens), sizes ascending; from ``num_blocks[-1]`` on it is
    ``ideal_hit_rate``, every reuse the stream allows. Below ``min_num_blocks`` (this
    run's peak of referenced blocks with the admission watermark to spare) the run would
    have queued or preempted differently: those sizes are not predicted (``is_predicted``),
    their values are the rule's alone."""

    num_blocks: tuple[int, ...]
    hit_rate: tuple[float, ...]
    ideal_hit_rate: float
    min_num_blocks: int = 0
    peak_pinned_blocks: int = 0

    def is_predicted(self, num_blocks: int) -> bool:
        """Whether a pool of ``num_blocks`` would have run this run's schedule."""
        return num_blocks >= self.min_num_blocks

    def at(self, num_blocks: int) -> float:
        """The hit rate at ``num_blocks`` blocks (interpolated between points, linear in
        log size; the ideal beyond the last)."""
        sizes = self.num_blocks
        if not sizes or num_blocks >= sizes[-1]:
            return self.ideal_hit_rate
        if num_blocks <= sizes[0]:
            return self.hit_rate[0] * num_blocks / sizes[0] if sizes[0] else 0.0
        i = bisect.bisect_right(sizes, num_blocks)
        lo, hi = sizes[i - 1], sizes[i]
        t = (math.log(num_blocks) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return self.hit_rate[i - 1] + t * (self.hit_rate[i] - self.hit_rate[i - 1])


def tiered_pool_blocks(device_blocks: int, tier_blocks: int) -> int:
    """The pool size whose curve value is the hit rate of a pool of ``device_blocks`` over
    KV tiers of ``tier_blocks`` blocks in all (``enginekit.kv.tiers``): their sum.

    Assumes the levels take what the pool evicts (``tier.write_policy=on_evict``), each
    exclusive of the pool and evicting its least recently used blocks (LRU at every
    level, the pool's ``lru``), at block granularity (``block_hash``), every block found
    in a level loaded (``tier.load_or_recompute=false``, or loads cheaper than
    computing). Then the pool keeps the referenced blocks and the most recently released
    others, the levels the next ``tier_blocks`` of them in the order the pool evicted
    them: together the unreferenced blocks of a pool of D + H. The implementation keeps a
    loaded block in its level as well (not strictly exclusive: that copy takes a level's
    room until one of them is evicted), and a save reaches the level one step after the
    eviction, so the sum is an estimate from above. An inclusive level
    (``write_through``: every released block written down) holds the pool's blocks again:
    its hit rate lies between the curve at max(D, H) (the level duplicating the pool) and
    at D + H; ``second_hit`` writes fewer blocks, at most the curve at D + H."""
    return device_blocks + tier_blocks


def min_num_blocks(peak_pinned: int, watermark: float) -> int:
    """The smallest pool that admits every step of a run whose referenced blocks peaked
    at ``peak_pinned``: C - int(watermark * C) >= peak_pinned (as admission keeps
    ``int(watermark * C)`` blocks reclaimable)."""
    size = peak_pinned
    while size - int(watermark * size) < peak_pinned:
        size += 1
    return size


def _count_below(
    values: npt.NDArray[np.integer],
    prefix_lens: npt.NDArray[np.integer],
    bounds: npt.NDArray[np.integer],
) -> IntArray:
    """For each query q: #{k < prefix_lens[q] : values[k] < bounds[q]} (values and bounds
    >= 0). A merge-sort tree in numpy: level L holds the values sorted within aligned
    blocks of 2**L, as keys ``block * width + value`` (the level below's keys, re-keyed
    and merged), and [0, prefix_len) is the union of one such block per set bit of
    prefix_len, each counted by one search. O((m + q) log m) time, three arrays of m
    int64 besides the queries'."""
    num_values = len(values)
    out = np.zeros(len(prefix_lens), dtype=np.int64)
    if not num_values or not len(prefix_lens):
        return out
    width = max(int(values.max()), int(bounds.max())) + 1
    keys = values.astype(np.int64)  # level 0: blocks of one, keyed by their index
    _rekey(keys, width, None)
    num_levels = num_values.bit_length()  # a prefix length is at most num_values
    for level in range(num_levels):
        for start in range(0, len(out), _CHUNK):  # the queries a chunk at a time
            lens = prefix_lens[start : start + _CHUNK]
            has = np.flatnonzero((lens >> level) & 1)
            if len(has):
                block = (lens[has].astype(np.int64) >> level) - 1  # the block at this bit
                needles = block * width
                needles += bounds[start : start + _CHUNK][has]
                found = np.searchsorted(keys, needles, "left")
                found -= block << level
                out[start : start + _CHUNK][has] += found
        if level + 1 == num_levels:
            break
        # re-key: the block at position k goes from k >> level to k >> (level + 1), i.e.
        # down by ceil((k >> level) / 2) blocks; then merge the sorted halves
        _rekey(keys, width, level)
        keys.sort(kind="stable")
    return out


_CHUNK = 1 << 20  # elementwise passes over a stream go a chunk at a time


def _rekey(keys: IntArray, width: int, level: int | None) -> None:
    """Moves each key at position k from its block at ``level`` (k >> level) to its block
    at the next level (k >> (level + 1)): down by ceil((k >> level) / 2) blocks of
    ``width``; ``level`` None keys a level-0 value by its position (up by k blocks). A
    chunk at a time, so the scratch stays small."""
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        steps = np.arange(start, start + len(chunk), dtype=np.int64)
        if level is None:
            steps = -steps
        else:
            steps >>= level
            steps += 1
            steps >>= 1
        steps *= width
        chunk -= steps


def _sorted_by_id(ids: npt.NDArray[np.integer]) -> tuple[npt.NDArray[np.int32], np.ndarray]:
    """(order, same): the accesses' positions ordered by (id, position) as int32 (a
    stream holds fewer than 2**31 accesses; ids are >= 0), and whether each of them but
    the first has the same id as the one before it."""
    n = len(ids)
    keys = np.asarray(ids).astype(np.int64)
    keys <<= 32
    for start in range(0, n, _CHUNK):
        keys[start : start + _CHUNK] |= np.arange(start, min(n, start + _CHUNK))
    keys.sort()
    order = keys.astype(np.int32)  # the low half: the position
    keys >>= 32
    same = keys[1:] == keys[:-1]
    return order, same


def _neighbour_at(
    order: npt.NDArray[np.int32],
    same: np.ndarray,
    rank: npt.NDArray[np.int32],
    positions: npt.NDArray[np.integer],
    step: int,
) -> npt.NDArray[np.int32]:
    """For the accesses at ``positions``: the access of the same id ``step`` (-1: the
    previous, +1: the next) places away in ``order`` (``rank``: each access's place in
    it); -1 for no previous one, len(order) for no next one."""
    n = len(order)
    out = np.full(len(positions), -1 if step < 0 else n, dtype=np.int32)
    for start in range(0, len(positions), _CHUNK):  # bounded temporaries
        place = rank[positions[start : start + _CHUNK]].astype(np.int64)
        if step < 0:
            has = place > 0
            has[has] = same[place[has] - 1]
        else:
            has = place < n - 1
            has[has] = same[place[has]]
        out[start : start + _CHUNK][has] = order[place[has] + step]
    return out


def _rank(order: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Each access's place in ``order``."""
    n = len(order)
    rank = np.empty(n, dtype=np.int32)
    for start in range(0, n, _CHUNK):
        rank[order[start : start + _CHUNK]] = np.arange(start, min(n, start + _CHUNK))
    return rank


def _flatnonzero32(mask: np.ndarray) -> npt.NDArray[np.int32]:
    """``np.flatnonzero(mask)`` as int32, a chunk at a time."""
    out = np.empty(int(np.count_nonzero(mask)), dtype=np.int32)
    done = 0
    for start in range(0, len(mask), _CHUNK):
        found = np.flatnonzero(mask[start : start + _CHUNK]) + start
        out[done : done + len(found)] = found
        done += len(found)
    return out


def _live_since(
    is_entry: npt.NDArray[np.bool_],
    entry_next: npt.NDArray[np.integer],
    previous: npt.NDArray[np.integer],
    positions: npt.NDArray[np.integer],
) -> IntArray:
    """For each query (p = ``previous[q]``, i = ``positions[q]``, p < i): the entries j
    (the positions where ``is_entry``; ``entry_next``: the next access of each one's id)
    with p < j < i whose id is not accessed again before i: the blocks that entered the
    eviction order after position p and are still in it at i."""
    num_entries_before = np.zeros(len(is_entry) + 1, dtype=np.int32)
    np.cumsum(is_entry, dtype=np.int32, out=num_entries_before[1:])
    since = num_entries_before[np.asarray(previous, dtype=np.int64) + 1]
    entries_between = num_entries_before[positions].astype(np.int64) - since
    del num_entries_before
    # entries after p accessed again before i: those with next < i, less those up to p
    again = np.searchsorted(np.sort(entry_next), positions, "left").astype(np.int64)
    again -= _count_below(entry_next, since, positions)
    return entries_between - again  # type: ignore[no-any-return]


def stack_distances(ids: np.ndarray, query: np.ndarray | None = None) -> IntArray:
    """LRU stack distances of an access stream: for access i (where ``query`` is true,
    default every one), the number of distinct ids accessed since the previous access to
    ``ids[i]``; -1 for a first access (and where not queried). An LRU cache of C entries
    hits access i exactly when its distance is below C. Every access is an entry of the
    eviction order here (no references)."""
    n = len(ids)
    out = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return out
    order, same = _sorted_by_id(ids)
    rank = _rank(order)
    everyone = np.arange(n)
    prev = _neighbour_at(order, same, rank, everyone, -1)
    mask = prev >= 0
    if query is not None:
        mask &= query
    positions = np.flatnonzero(mask)
    if len(positions):
        is_entry = np.ones(n, dtype=bool)
        nxt = _neighbour_at(order, same, rank, everyone, 1)
        out[positions] = _live_since(is_entry, nxt, prev[positions], positions)
    return out


def min_pool_sizes(stream: AccessStream) -> npt.NDArray[np.int32]:
    """For each access: the smallest pool size at which it hits under the module's rule
    (``NO_HIT`` where no size does, and where it is not a query). Each access sees the
    ones before it, those of its own event included. Pure."""
    out = np.full(len(stream.ids), NO_HIT, dtype=np.int32)
    queries, sizes = query_pool_sizes(stream)
    out[queries] = sizes
    return out


def references_after(
    kind: npt.NDArray[np.int8], order: npt.NDArray[np.int32], same: np.ndarray
) -> npt.NDArray[np.int32]:
    """The references each block has right after each access, in ``order`` (the accesses
    sorted by block id, as ``_sorted_by_id`` gives them with ``same``): a running sum over
    the block's own accesses, +1 at a lookup, -1 at a release of a block it held. Pure."""
    delta = (kind == LOOKUP).astype(np.int8)
    delta -= kind == RELEASE_HELD
    delta = delta[order]
    running = np.cumsum(delta, dtype=np.int32)
    group_starts = np.concatenate([[0], np.flatnonzero(~same) + 1])
    before_group = running[group_starts] - delta[group_starts]
    if before_group.any():  # a block whose lookups its releases do not all drop
        running -= np.repeat(before_group, np.diff(group_starts, append=len(order)))
    return running


def query_pool_sizes(
    stream: AccessStream,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """``min_pool_sizes`` at the queries only: (their positions, their sizes). Memory:
    about 25 bytes per access besides the stream's."""
    ids = np.asarray(stream.ids)
    n = len(ids)
    kind = np.asarray(stream.kind, dtype=np.int8)
    queries = _flatnonzero32(np.asarray(stream.query, dtype=bool) & (kind == LOOKUP))
    if not len(queries):
        return queries, np.zeros(0, dtype=np.int32)
    order, same = _sorted_by_id(ids)
    running = references_after(kind, order, same)
    sorted_kind = kind[order]
    is_entry = np.empty(n, dtype=bool)  # the block enters the eviction order here
    is_entry[order] = (sorted_kind != LOOKUP) & (running == 0)
    is_held = np.empty(n, dtype=bool)  # a lookup of a block referenced before it
    is_held[order] = (sorted_kind == LOOKUP) & (running > 1)
    del running, sorted_kind
    held = is_held[queries]
    del is_held
    rank = _rank(order)
    previous = _neighbour_at(order, same, rank, queries, -1)
    entry_next = _neighbour_at(order, same, rank, _flatnonzero32(is_entry), 1)
    del order, same, rank
    never = n + 1  # beyond every distance: no size hits
    distance = np.full(len(queries), never, dtype=np.int64)
    distance[held] = -1  # referenced: in the pool with the pinned blocks
    cached = np.flatnonzero(~held & (previous >= 0))
    del held
    if len(cached):
        distance[cached] = _live_since(is_entry, entry_next, previous[cached], queries[cached])
    del is_entry, entry_next, previous, cached
    # a prefix match: the largest distance over the event's queries from its root-most
    # (last) access to each one, via one running maximum over the reversed stream
    event = np.asarray(stream.event, dtype=np.int64)[queries][::-1]
    offset = (event[0] - event) * (never + 2)
    del event
    distance = distance[::-1] + offset
    np.maximum.accumulate(distance, out=distance)
    distance -= offset
    del offset
    distance = distance[::-1]
    hits = distance < never
    distance += np.asarray(stream.pinned, dtype=np.int64)[queries]
    distance += 1
    sizes = np.where(hits, distance, NO_HIT).astype(np.int32)
    return queries, sizes


def hit_rate_curve(
    sizes: npt.NDArray[np.integer],
    num_blocks_per_hit: int,
    num_prompt_tokens: int,
    extra_sizes: tuple[int, ...] = (),
    smallest_predicted: int = 0,
    peak_pinned: int = 0,
) -> HitRateCurve:
    """The curve of the queries' ``min_pool_sizes`` values ``sizes`` (NO_HIT dropped):
    each hit is ``num_blocks_per_hit`` tokens (the block size) of ``num_prompt_tokens``.
    Sizes: a geometric grid from ``smallest_predicted`` (and a few points under it) to
    the size where every reuse hits, plus ``smallest_predicted`` and every positive
    ``extra_sizes``, those beyond that size included (where the rate is the ideal): a
    run whose every reuse fits in less than ``smallest_predicted`` blocks still gets
    points from ``smallest_predicted`` on, and its pool and their multiples are always
    points."""
    sizes = sizes[sizes != NO_HIT]
    extra = [s for s in (*extra_sizes, smallest_predicted) if s > 0]
    if not len(sizes) or not num_prompt_tokens:
        grid_empty = tuple(sorted({1, *extra}))
        rates_empty = (0.0,) * len(grid_empty)
        return HitRateCurve(grid_empty, rates_empty, 0.0, smallest_predicted, peak_pinned)
    counts = np.bincount(sizes)
    cumulative = np.cumsum(counts)  # cumulative[C]: hits at size C
    full = max(1, int(len(counts)) - 1)  # at this size every reuse hits
    low = max(1, min(smallest_predicted, full))
    below = np.geomspace(1, low, NUM_POINTS_BELOW + 1)[:-1] if low > 1 else np.zeros(0)
    grid = np.unique(
        np.concatenate(
            [
                np.rint(below).astype(np.int64),
                np.rint(np.geomspace(low, full, NUM_CURVE_POINTS)).astype(np.int64),
                np.asarray(extra, dtype=np.int64),
                [full],
            ]
        )
    )
    per_token = num_blocks_per_hit / num_prompt_tokens
    rates = cumulative[np.minimum(grid, len(counts) - 1)] * per_token
    ideal = float(len(sizes) * per_token)
    return HitRateCurve(
        tuple(grid.tolist()), tuple(rates.tolist()), ideal, smallest_predicted, peak_pinned
    )

"""What a run's traffic could reuse: the ideal prefix hits, why each missed prompt token
missed, and the hit rate the same traffic would get at every cache size.

``ReuseTracker`` takes a run's requests one by one in arrival order (``add``), each
seeing the prompts and outputs (all but the last, sampled, token) of every request added
before it, as if those had finished: the yardstick of ``prefix_cache_hit_rate_ideal``.
Blocks are keyed exactly, by (their parent block's node, their tokens), in one prefix
tree per prefix-cache salt (``extra_key``), so no hash can collide. For each request it
finds, capped at ``len(prompt) - 1`` tokens because an engine always computes the last
prompt token:

- the block-granular ideal: the leading whole blocks an earlier request of the same salt
  had (``ideal_prefix_hit_tokens`` of enginekit.workloads.ideal, one pass, streamed);
- the token-granular ideal: the longest prefix an earlier request of the same salt had,
  to the token (the ideal of a radix cache);
- the same under any salt.

``finish(request_id, num_hit_tokens)`` then classifies the prompt tokens the engine
missed at the request's first admission (``num_hit_tokens`` of ``len(prompt)`` hit), in
this order: **capacity** up to the ideal at the cache's own granularity (reusable by an
unbounded cache of the same granularity and salt: the cache had evicted it, or an
earlier request still running had not computed it yet), **granularity** from there up to
the token-granular ideal (reusable to the token, not in whole blocks), **other key** up
to the any-salt ideal (the same tokens under another salt), and **compulsory** for the
rest: misses an unbounded cache takes too (no earlier request computed them, and each
prompt's last token).

The block accesses, in the order of the run: a request touches its prompt's whole blocks
when it is admitted (its lookup, placed at its first token's time, before the blocks the
same step releases) and every whole block of its prompt and output when it finishes (its
release), deepest first both times (a cache releases a sequence's blocks tail first, so a
prefix is always more recent than the blocks that extend it). So blocks that running
requests hold stay near the top of the stack, as a pool pins them; the output blocks
running requests write are not in the stream until they finish, so each lookup's
distances also count the output blocks the requests running then had written (each
writes its output at an even pace from its lookup to its release). ``hit_rate_curve``
computes the LRU stack distance of every access in one offline pass (``stack_distances``)
and from them the hit rate at every cache size: a request hits the leading prompt blocks
(up to the cap) whose distance at its lookup is below the size. At the largest size the
curve is every reuse the run's timing allowed (an output is reusable once its request
has finished), at most the ideal. The stream is ``block_hash``'s (block-granular, whole
blocks only): for ``radix`` the curve leaves out its partial-block matches and its
node-level eviction; preempted requests' second admissions are not in it.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

NUM_CURVE_POINTS = 48


class _Ideal(NamedTuple):
    """A request's ideal hits (tokens): block-granular, token-granular, any salt; and
    its prompt's length."""

    block: int
    token: int
    any_key: int
    num_prompt_tokens: int


class MissCounts(NamedTuple):
    """Prompt tokens of the classified requests' first admissions: hit, and missed by
    cause (module docstring)."""

    num_prompt_tokens: int
    num_hit: int
    num_capacity: int
    num_granularity: int
    num_other_key: int
    num_compulsory: int


class HitRateCurve(NamedTuple):
    """The hit rate an LRU cache of ``num_blocks[i]`` blocks would get, ``hit_rate[i]``
    (a share of prompt tokens), sizes ascending; from ``num_blocks[-1]`` on it is
    ``ideal_hit_rate``, every reuse the stream allows."""

    num_blocks: tuple[int, ...]
    hit_rate: tuple[float, ...]
    ideal_hit_rate: float

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


def _common_tokens(a: bytes, b: bytes) -> int:
    """Leading int32 tokens two little-endian token byte strings share."""
    m = min(len(a), len(b))
    x = int.from_bytes(a[:m], "little") ^ int.from_bytes(b[:m], "little")
    return m // 4 if x == 0 else ((x & -x).bit_length() - 1) // 32


class ReuseTracker:
    """See the module docstring. Memory: one node per distinct (prefix, block) of the
    traffic, four ints per block access, a few per live request."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._nodes: dict[tuple[int, bytes], int] = {}
        # Each node's children (whole blocks and the partial tails sequences end with),
        # sorted, so that the longest partial match is a neighbour of the query.
        self._children: dict[int, list[bytes]] = {}
        self._roots: dict[str | None, int] = {None: 0}
        self._num_node_ids = 1
        self._ideals: dict[str, _Ideal] = {}
        self.ideal_block_tokens = 0
        self.ideal_token_tokens = 0
        self.num_prompt_tokens = 0
        self._misses = [0] * 6
        self._token_granular_misses: bool | None = None
        # per request added, until it finishes: its blocks' nodes (in order), how many
        # are the prompt's, how many may hit, and its place in the order of addition
        self._paths: dict[str, tuple[array, int, int, int]] = {}
        self._num_added = 0
        # the accesses, a lookup and a release per finished request (module docstring)
        self._access_ids = array("i")
        self._event_time = array("d")
        self._event_kind = array("b")  # 0: lookup, 1: release (after lookups at a time)
        self._event_order = array("q")  # the request's place in the order of addition
        self._event_length = array("i")  # blocks touched
        self._event_eligible = array("i")  # lookups: leading blocks that may hit

    # ---- the trees ------------------------------------------------------------------

    def _root(self, key: str | None) -> int:
        root = self._roots.get(key)
        if root is None:
            root = self._roots[key] = self._new_id()
        return root

    def _new_id(self) -> int:
        node = self._num_node_ids
        self._num_node_ids += 1
        return node

    def _partial(self, node: int, query: bytes) -> int:
        """Tokens of ``query`` (a segment after ``node``) some child of ``node`` starts
        with."""
        children = self._children.get(node)
        if not children or not query:
            return 0
        i = bisect.bisect_left(children, query)
        best = 0
        if i < len(children):
            best = _common_tokens(query, children[i])
        if i:
            best = max(best, _common_tokens(query, children[i - 1]))
        return best

    def _match(self, root: int, data: bytes, num_prompt: int) -> int:
        """Tokens of the prompt (``data``'s first ``num_prompt`` tokens) some sequence
        under ``root`` starts with. Reads only."""
        width = 4 * self.block_size
        parent, matched = root, 0
        for b in range(num_prompt // self.block_size):
            node = self._nodes.get((parent, data[b * width : (b + 1) * width]))
            if node is None:
                break
            parent, matched = node, b + 1
        start = matched * width
        end = min(num_prompt * 4, start + width)
        return matched * self.block_size + self._partial(parent, data[start:end])

    # ---- requests -------------------------------------------------------------------

    def add(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        output_token_ids: Sequence[int] | np.ndarray = (),
        extra_key: str | bytes | None = None,
    ) -> None:
        """The next request in arrival order. Its ideal hits count at once; its prompt
        and output (but the last token) join the trees; its block accesses are
        recorded."""
        bs, width = self.block_size, 4 * self.block_size
        prompt = np.asarray(prompt_token_ids, dtype="<i4")
        output = np.asarray(output_token_ids, dtype="<i4")
        data = (np.concatenate([prompt, output[:-1]]) if len(output) > 1 else prompt).tobytes()
        n = len(prompt)
        self.num_prompt_tokens += n
        num_prompt_blocks, num_blocks = n // bs, len(data) // width
        key = extra_key.decode("utf-8", "replace") if isinstance(extra_key, bytes) else extra_key
        parent = self._root(key)
        nodes, children = self._nodes, self._children
        matched, partial, matching = 0, 0, True
        path: list[int] = []
        for b in range(num_blocks):
            if matching and b == num_prompt_blocks:
                partial = self._partial(parent, data[b * width : n * 4])
                matching = False
            segment = data[b * width : (b + 1) * width]
            node = nodes.get((parent, segment))
            if node is None:
                if matching:
                    partial = self._partial(parent, data[b * width : min(n, b * bs + bs) * 4])
                    matching = False
                node = nodes[(parent, segment)] = self._new_id()
                bisect.insort(children.setdefault(parent, []), segment)
            elif matching:
                matched += 1
            path.append(node)
            parent = node
        if matching:
            partial = self._partial(parent, data[matched * width : n * 4])
        tail = data[num_blocks * width :]
        if tail:
            siblings = children.setdefault(parent, [])
            i = bisect.bisect_left(siblings, tail)
            if i == len(siblings) or siblings[i] != tail:
                siblings.insert(i, tail)
        cap = max(0, n - 1)
        max_hit_blocks = cap // bs
        block = min(matched, max_hit_blocks) * bs
        token = min(matched * bs + partial, cap)
        any_key = token
        if len(self._roots) > 1:
            for other, root in self._roots.items():
                if other != key:
                    any_key = max(any_key, min(self._match(root, data, n), cap))
        self._ideals[request_id] = _Ideal(block, token, any_key, n)
        self.ideal_block_tokens += block
        self.ideal_token_tokens += token
        self._paths[request_id] = (
            array("i", path),
            num_prompt_blocks,
            max_hit_blocks,
            self._num_added,
        )
        self._num_added += 1

    def ideal_hit_tokens(self, token_granular: bool) -> int:
        """The ideal hits of every request added: to the token, or in whole blocks."""
        return self.ideal_token_tokens if token_granular else self.ideal_block_tokens

    def finish(
        self,
        request_id: str,
        num_hit_tokens: int,
        token_granular: bool,
        admitted_at: float | None = None,
        finished_at: float = 0.0,
    ) -> None:
        """Classifies the prompt tokens ``request_id`` missed at its first admission, of
        a cache that hit ``num_hit_tokens`` of them and is ``token_granular`` or not, and
        records its lookup at ``admitted_at`` (its first token's time; None:
        ``finished_at``) and its release at ``finished_at`` (module docstring). A request
        never added is ignored."""
        ideal = self._ideals.pop(request_id, None)
        path = self._paths.pop(request_id, None)
        if ideal is None or path is None:
            return
        nodes, num_prompt_blocks, max_hit_blocks, order = path
        lookup = nodes[:num_prompt_blocks]
        lookup.reverse()
        nodes.reverse()
        for time, kind, touched, eligible in (
            (finished_at if admitted_at is None else admitted_at, 0, lookup, max_hit_blocks),
            (finished_at, 1, nodes, 0),
        ):
            self._access_ids.extend(touched)
            self._event_time.append(time)
            self._event_kind.append(kind)
            self._event_order.append(order)
            self._event_length.append(len(touched))
            self._event_eligible.append(eligible)
        hit = min(num_hit_tokens, ideal.num_prompt_tokens)
        own = ideal.token if token_granular else ideal.block
        capacity = max(hit, own)
        granularity = max(capacity, ideal.token)
        other = max(granularity, ideal.any_key)
        counts = self._misses
        counts[0] += ideal.num_prompt_tokens
        counts[1] += hit
        counts[2] += capacity - hit
        counts[3] += granularity - capacity
        counts[4] += other - granularity
        counts[5] += ideal.num_prompt_tokens - other

    def miss_counts(self) -> MissCounts:
        return MissCounts(*self._misses)

    # ---- the curve ------------------------------------------------------------------

    def _output_blocks_held(self) -> np.ndarray:
        """For each finished request's lookup (in finish order), the output blocks the
        requests running then had written: each request writes its output blocks at an
        even pace from its lookup to its release, and holds them until that release
        (counted at a lookup in the step of its release)."""
        times = np.frombuffer(self._event_time, dtype=np.float64)
        lengths = np.frombuffer(self._event_length, dtype=np.int32)
        admitted, finished = times[0::2], times[1::2]
        written = (lengths[1::2] - lengths[0::2]).astype(np.float64)
        span = finished - admitted
        slope = np.divide(written, span, out=np.zeros_like(written), where=span > 0)
        by_admission, by_finish = np.argsort(admitted), np.argsort(finished)

        def running_sums(order: np.ndarray, values: np.ndarray, count: np.ndarray) -> np.ndarray:
            sums = np.concatenate([[0.0], np.cumsum(values[order])])
            return sums[count]

        started = np.searchsorted(admitted[by_admission], admitted, "right")
        ended = np.searchsorted(finished[by_finish], admitted, "left")  # released before
        rate = running_sums(by_admission, slope, started) - running_sums(by_finish, slope, ended)
        offset = running_sums(by_admission, slope * admitted, started)
        offset -= running_sums(by_finish, slope * admitted, ended)
        return np.maximum(0.0, admitted * rate - offset)

    def hit_rate_curve(
        self, num_prompt_tokens: int, extra_sizes: Sequence[int] = ()
    ) -> HitRateCurve:
        """The hit rate (hit tokens / ``num_prompt_tokens``) at cache sizes on a
        geometric grid from 1 block to the size that holds every reuse, plus
        ``extra_sizes`` (e.g. the run's pool)."""
        if not len(self._access_ids) or not num_prompt_tokens:
            return HitRateCurve((), (), 0.0)
        lengths = np.frombuffer(self._event_length, dtype=np.int32).astype(np.int64)
        starts = np.cumsum(lengths) - lengths
        events = np.lexsort(
            (
                np.frombuffer(self._event_order, dtype=np.int64),
                np.frombuffer(self._event_kind, dtype=np.int8),
                np.frombuffer(self._event_time, dtype=np.float64),
            )
        )
        held = np.repeat(self._output_blocks_held(), 2)[events]  # lookups' (at releases: 0)
        lengths, starts = lengths[events], starts[events]
        eligible_blocks = np.frombuffer(self._event_eligible, dtype=np.int32)[events]
        del events
        # position of each access within its event's (deepest-first) touches
        within = np.arange(int(lengths.sum()), dtype=np.int64)
        within -= np.repeat(np.cumsum(lengths) - lengths, lengths)
        ids = np.frombuffer(self._access_ids, dtype=np.int32)[np.repeat(starts, lengths) + within]
        eligible = np.repeat(lengths, lengths) - 1 - within < np.repeat(eligible_blocks, lengths)
        del starts, eligible_blocks
        distances = stack_distances(ids, eligible)
        del ids
        finite = eligible & (distances >= 0)
        # a request's own deeper blocks, touched just before, are not in the distance;
        # the outputs running requests have written so far hold pool blocks besides it
        true = distances[finite] - within[finite]
        true += np.rint(np.repeat(held, lengths)[finite]).astype(np.int64)
        del within, eligible, distances
        bs = self.block_size
        ideal = float(len(true) * bs / num_prompt_tokens)
        if not len(true):
            return HitRateCurve((1,), (0.0,), 0.0)
        counts = np.bincount(true)
        cumulative = np.cumsum(counts)  # cumulative[d]: accesses at distance <= d
        full = int(len(counts))  # at this size every reuse hits
        grid = np.unique(
            np.concatenate(
                [
                    np.rint(np.geomspace(1, full, NUM_CURVE_POINTS)).astype(np.int64),
                    np.asarray([s for s in extra_sizes if 0 < s < full], dtype=np.int64),
                    [full],
                ]
            )
        )
        # hits at size C: accesses at distance < C, i.e. cumulative[C - 1]
        rates = cumulative[grid - 1] * bs / num_prompt_tokens
        return HitRateCurve(tuple(grid.tolist()), tuple(rates.tolist()), ideal)


def stack_distances(ids: np.ndarray, query: np.ndarray | None = None) -> np.ndarray:
    """LRU stack distances of an access stream: for access i (where ``query`` is true,
    default every one), the number of distinct ids accessed since the previous access to
    ``ids[i]``; -1 for a first access (and where not queried). An LRU cache of C entries
    hits access i exactly when its distance is below C.

    Offline, O(n log² n) in numpy: with p the previous access of ids[i], the distance is
    #{j < i : prev[j] <= p} - (p + 1), a dominance count done level by level over the
    binary decomposition of [0, i) (each level one sort and two searches)."""
    n = len(ids)
    out = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return out
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    same = ordered[1:] == ordered[:-1]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    del order, ordered, same
    mask = prev >= 0
    if query is not None:
        mask &= query
    positions = np.flatnonzero(mask)
    if not len(positions):
        return out
    previous = prev[positions]
    counts = np.zeros(len(positions), dtype=np.int64)
    width = n + 2
    values = (prev + 1).astype(np.int32)  # 0 for a first access
    del prev
    keys = np.empty(n, dtype=np.int64)
    for level in range((n - 1).bit_length()):
        has = ((positions >> level) & 1).astype(bool)
        if not has.any():
            continue
        keys[:] = np.arange(n, dtype=np.int64)
        keys >>= level
        keys *= width
        keys += values
        keys.sort()
        low = ((positions[has] >> level) - 1) * width
        high = low + previous[has] + 1
        counts[has] += np.searchsorted(keys, high, "right") - np.searchsorted(keys, low, "left")
    out[positions] = counts - previous - 1
    return out

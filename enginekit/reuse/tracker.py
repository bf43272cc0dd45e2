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

The block accesses, in the order of the run (``enginekit.reuse.curve``): a request looks
up its prompt's whole blocks when it is admitted (placed at its first token's time, before
the blocks the same step releases) and holds them until it finishes; then it releases
every whole block of its prompt and output (those it wrote become cached then), deepest
first both times (a cache releases a sequence's blocks tail first, so a prefix is always
more recent than the blocks that extend it). ``record_pinned`` takes, after every step,
the blocks the pool's running requests reference or are promised: what a pool of any
size cannot use to cache. ``hit_rate_curve`` computes from them the hit rate at every
cache size: at a lookup, a block that no running request holds hits a pool of C blocks
iff fewer than ``C - pinned`` unreferenced blocks were released after it (its stack
distance among unreferenced blocks), one that a running request holds always hits, and a
request hits its leading prompt blocks (up to the cap) up to the first that misses. At
the largest size the curve is every reuse the run's timing allowed (an output is reusable
once its request has finished), at most the ideal. Sizes below the run's peak of pinned
blocks (with the admission watermark to spare) would have queued or preempted
differently: the curve marks them not predicted. The stream is ``block_hash``'s
(block-granular, whole blocks only): for ``radix`` the curve leaves out its partial-block
matches and its node-level eviction; preempted requests' second admissions are not in
it.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from enginekit.reuse.curve import (
    LOOKUP,
    RELEASE_HELD,
    RELEASE_WRITTEN,
    AccessStream,
    HitRateCurve,
    hit_rate_curve,
    min_num_blocks,
    query_pool_sizes,
)
from enginekit.reuse.opt import opt_curve

RECENT_BYTES = 64 << 20  # the recent requests' tokens and nodes the tracker keeps


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


def _id(node: int) -> bytes:
    """A node id as the 4 bytes of an ``array("i")`` item."""
    return node.to_bytes(4, sys.byteorder)


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
        # Node ids are 4-byte ints in native order (``_id``), so that a node's key, its
        # parent's id followed by its tokens, is one bytes object: hashed and compared
        # as such, and not a container the garbage collector has to scan.
        self._nodes: dict[bytes, bytes] = {}
        # Each node's children (whole blocks and the partial tails sequences end with),
        # each as the node's id followed by its tokens (for a whole block, the very key
        # of its node in ``_nodes``: a block's tokens are held once): one bytes object,
        # or a sorted list of them once there are two or more, so that the longest
        # partial match is a neighbour of the query.
        self._children: dict[bytes, bytes | list[bytes]] = {}
        self._roots: dict[str | None, bytes] = {None: _id(0)}
        # Recent distinct requests (root and tokens -> their nodes): a request repeated
        # within a replayed trace skips the walk, since the tree never loses a node.
        self._recent: OrderedDict[bytes, bytes] = OrderedDict()
        self._recent_bytes = 0
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
        self._event_prompt = array("i")  # the request's whole prompt blocks
        # after each step: its end, and the blocks running requests referenced or were
        # promised (``record_pinned``)
        self._pinned_time = array("d")
        self._pinned_blocks = array("q")
        self.peak_pinned_blocks = 0

    # ---- the trees ------------------------------------------------------------------

    def _root(self, key: str | None) -> bytes:
        root = self._roots.get(key)
        if root is None:
            root = self._roots[key] = self._new_id()
        return root

    def _new_id(self) -> bytes:
        node = self._num_node_ids
        self._num_node_ids += 1
        return _id(node)

    def _add_child(self, node: bytes, child: bytes) -> None:
        """Records ``child`` (``node``'s id followed by a whole block or a tail) as a
        child of ``node``, once."""
        children = self._children.get(node)
        if children is None:
            self._children[node] = child
        elif isinstance(children, bytes):
            if children != child:
                self._children[node] = sorted((children, child))
        else:
            i = bisect.bisect_left(children, child)
            if i == len(children) or children[i] != child:
                children.insert(i, child)

    def _partial(self, node: bytes, query: bytes) -> int:
        """Tokens of ``query`` (a segment after ``node``) some child of ``node`` starts
        with."""
        children = self._children.get(node)
        if not children or not query:
            return 0
        query = node + query  # children start with their parent's id: one more "token"
        if isinstance(children, bytes):
            return _common_tokens(query, children) - 1
        i = bisect.bisect_left(children, query)
        best = 0
        if i < len(children):
            best = _common_tokens(query, children[i])
        if i:
            best = max(best, _common_tokens(query, children[i - 1]))
        return best - 1

    def _walk(self, root: bytes, segments: list[bytes]) -> list[bytes]:
        """The nodes of the leading ``segments`` that exist under ``root``. Reads only."""
        path: list[bytes] = []
        get, parent = self._nodes.get, root
        for segment in segments:
            node = get(parent + segment)
            if node is None:
                break
            path.append(node)
            parent = node
        return path

    def _match(self, root: bytes, data: bytes, num_prompt: int) -> int:
        """Tokens of the prompt (``data``'s first ``num_prompt`` tokens) some sequence
        under ``root`` starts with. Reads only."""
        width = 4 * self.block_size
        num_blocks = num_prompt // self.block_size
        path = self._walk(root, [data[i : i + width] for i in range(0, num_blocks * width, width)])
        matched = len(path)
        start = matched * width
        end = min(num_prompt * 4, start + width)
        parent = path[-1] if path else root
        return matched * self.block_size + self._partial(parent, data[start:end])

    def _insert(self, root: bytes, data: bytes, num_prompt: int) -> tuple[int, int, bytes]:
        """Adds the whole blocks of ``data`` (a prompt of ``num_prompt`` tokens and its
        output) and its tail under ``root``. Returns, as they were before: the prompt's
        whole blocks an earlier sequence had, its tokens past them some earlier sequence
        had too (of the block it diverges in, or of its tail past its whole blocks), and
        the ids of every whole block's node, joined."""
        width = 4 * self.block_size
        num_prompt_blocks, num_blocks = num_prompt // self.block_size, len(data) // width
        segments = [data[i : i + width] for i in range(0, num_blocks * width, width)]
        path = self._walk(root, segments)
        num_walked = len(path)
        matched = min(num_walked, num_prompt_blocks)
        parent = path[matched - 1] if matched else root
        start = matched * width
        if num_walked < num_prompt_blocks:
            partial = self._partial(parent, data[start : start + width])
        else:
            partial = self._partial(parent, data[start : num_prompt * 4])
        parent = path[-1] if path else root
        nodes, children = self._nodes, self._children
        new = segments[num_walked:]
        tail = data[num_blocks * width :]
        if new:
            # Past the walk every block is new, the only child of the new block before
            # it (the first one, a child of an existing node); ids are consecutive.
            first = self._num_node_ids
            self._num_node_ids = first + len(new)
            ids = array("I", range(first, first + len(new))).tobytes()
            key = parent + new[0]
            self._add_child(parent, key)
            node = nodes[key] = ids[:4]
            path.append(node)
            for i in range(1, len(new)):
                key = node + new[i]
                children[node] = key  # a new node's only child
                node = nodes[key] = ids[4 * i : 4 * i + 4]
                path.append(node)
            if tail:
                children[node] = node + tail
        elif tail:
            self._add_child(parent, parent + tail)
        return matched, partial, b"".join(path)

    def _remember(self, key: bytes, joined: bytes) -> None:
        """Keeps ``key`` (a root and a request's tokens) -> its nodes among the recent
        distinct requests, at most ``RECENT_BYTES`` of them, the least recent dropped."""
        recent = self._recent
        recent[key] = joined
        self._recent_bytes += len(key) + len(joined)
        while self._recent_bytes > RECENT_BYTES and len(recent) > 1:
            old_key, old_joined = recent.popitem(last=False)
            self._recent_bytes -= len(old_key) + len(old_joined)

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
        num_prompt_blocks = n // bs
        key = extra_key.decode("utf-8", "replace") if isinstance(extra_key, bytes) else extra_key
        root = self._root(key)
        recent_key = root + data
        joined = self._recent.get(recent_key)
        if joined is not None:  # a repeat: its blocks and its tail are in the tree
            self._recent.move_to_end(recent_key)
            matched = num_prompt_blocks
            parent = joined[4 * matched - 4 : 4 * matched] if matched else root
            partial = self._partial(parent, data[matched * width : n * 4])
        else:
            matched, partial, joined = self._insert(root, data, n)
            self._remember(recent_key, joined)
        cap = max(0, n - 1)
        max_hit_blocks = cap // bs
        block = min(matched, max_hit_blocks) * bs
        token = min(matched * bs + partial, cap)
        any_key = token
        if len(self._roots) > 1:
            for other, other_root in self._roots.items():
                if other != key:
                    any_key = max(any_key, min(self._match(other_root, data, n), cap))
        self._ideals[request_id] = _Ideal(block, token, any_key, n)
        self.ideal_block_tokens += block
        self.ideal_token_tokens += token
        ids = array("i")
        ids.frombytes(joined)
        self._paths[request_id] = (ids, num_prompt_blocks, max_hit_blocks, self._num_added)
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
            self._event_prompt.append(num_prompt_blocks)
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

    def record_pinned(
        self, time: float, num_pinned_blocks: int, num_released_blocks: int = 0
    ) -> None:
        """After a step that ended at ``time`` (steps in time order): the pool's blocks
        that running requests reference or that are promised to their prefills, which no
        pool size can cache, and at most how many blocks the step released (so that the
        step's peak was at most their sum). A lookup at time t reads the last record
        before t (the pool its admission saw); without records nothing is pinned."""
        self._pinned_time.append(time)
        self._pinned_blocks.append(num_pinned_blocks)
        self.peak_pinned_blocks = max(
            self.peak_pinned_blocks, num_pinned_blocks + num_released_blocks
        )

    def access_stream(self) -> AccessStream:
        """The finished requests' block accesses in the order of the run (module
        docstring), each lookup with the pinned blocks of the last record before it.
        Memory: 14 bytes per access."""
        lengths = np.frombuffer(self._event_length, dtype=np.int32)
        times = np.frombuffer(self._event_time, dtype=np.float64)
        kinds = np.frombuffer(self._event_kind, dtype=np.int8)
        events = np.lexsort((np.frombuffer(self._event_order, dtype=np.int64), kinds, times))
        record_times = np.frombuffer(self._pinned_time, dtype=np.float64)
        # a zero before the first record: nothing was pinned before any step ended
        record_pinned = np.zeros(len(record_times) + 1, dtype=np.int32)
        record_pinned[1:] = np.frombuffer(self._pinned_blocks, dtype=np.int64)
        pinned = record_pinned[np.searchsorted(record_times, times[events], "left")]
        del record_pinned
        is_release = kinds[events] == 1
        # the leading blocks of each event the kinds below split at: a lookup's that may
        # hit, a release's that it held (its prompt's)
        split = np.where(
            is_release,
            np.frombuffer(self._event_prompt, dtype=np.int32)[events],
            np.frombuffer(self._event_eligible, dtype=np.int32)[events],
        ).astype(np.int32)
        old_starts = (np.cumsum(lengths, dtype=np.int64) - lengths)[events]
        lengths = lengths[events]
        ends = np.cumsum(lengths, dtype=np.int64)  # in the new order
        del events
        event = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        # each access's source in the recorded order, and its place from its event's end
        position = np.arange(len(event), dtype=np.int32)
        ids = np.frombuffer(self._access_ids, dtype=np.int32)[
            np.repeat((old_starts - (ends - lengths)).astype(np.int32), lengths) + position
        ]
        del old_starts
        from_end = np.repeat((ends - 1).astype(np.int32), lengths)
        from_end -= position
        del position
        below = from_end < np.repeat(split, lengths)  # a deepest-first event's last ones
        del from_end
        release = np.repeat(is_release, lengths)
        kind = np.full(len(event), LOOKUP, dtype=np.int8)
        kind[release] = RELEASE_WRITTEN
        release &= below
        kind[release] = RELEASE_HELD
        below &= kind == LOOKUP  # a lookup's last ones: those that may hit
        return AccessStream(ids, event, kind, below, np.repeat(pinned, lengths))

    def hit_rate_curve(
        self, num_prompt_tokens: int, extra_sizes: Sequence[int] = (), watermark: float = 0.0
    ) -> HitRateCurve:
        """The hit rate (hit tokens / ``num_prompt_tokens``) at cache sizes on a
        geometric grid up to the size that holds every reuse, plus ``extra_sizes`` (e.g.
        the run's pool, beyond that size too) and the smallest size that would have run
        this run's schedule (its peak of pinned blocks, with ``watermark``, the share of
        the pool admission keeps reclaimable, to spare), which the curve also carries."""
        smallest = min_num_blocks(self.peak_pinned_blocks, watermark)
        if not len(self._access_ids) or not num_prompt_tokens:
            return HitRateCurve((), (), 0.0, smallest, self.peak_pinned_blocks)
        _, sizes = query_pool_sizes(self.access_stream())
        return hit_rate_curve(
            sizes,
            self.block_size,
            num_prompt_tokens,
            tuple(extra_sizes),
            smallest,
            self.peak_pinned_blocks,
        )

    def opt_hit_rates(self, num_prompt_tokens: int, sizes: Sequence[int]) -> list[float]:
        """Belady's OPT hit rate (``enginekit.reuse.opt``: hits per block, each a block of
        tokens, over ``num_prompt_tokens``) at each of ``sizes``, on the same access
        stream as ``hit_rate_curve``: at least what any eviction policy hits there. One
        sweep in Python per size that evicts (about the whole curve's time each)."""
        if not len(self._access_ids) or not num_prompt_tokens or not len(sizes):
            return [0.0] * len(sizes)
        hits = opt_curve(self.access_stream(), list(sizes))
        return [h * self.block_size / num_prompt_tokens for h in hits.tolist()]

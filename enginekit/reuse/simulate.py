"""A pool simulated block by block on one run's access stream (``AccessStream``): the
reference that the hit-rate curve (``enginekit.reuse.curve``) and OPT
(``enginekit.reuse.opt``) are checked against.

The model is OPT's (``enginekit.reuse.opt``): referenced blocks stay in the pool; a
block whose last reference is released enters the unreferenced cache (again, as its most
recent block, when a request that wrote it releases it); a lookup takes it out. At each
query the unreferenced cache is cut down to ``max(0, C - pinned)`` blocks (the query's own
block included), evicting per the policy; then the query hits if its block is
referenced (and ``C >= pinned``) or cached. Nothing is evicted between queries.

Policies: ``"lru"`` evicts the least recently released block; ``"opt"`` the block whose
next access is furthest away, a block whose next access is no query (a lookup past the
cap, a release, none) first: Belady's MIN, which may evict the block just released.

Hits are counted per block and as the pool's prefix match (a lookup hits its queried
blocks up to the first that misses). One pass over the stream in Python: for tests and
small streams.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, NamedTuple

import numpy as np

from enginekit.reuse.curve import LOOKUP, RELEASE_HELD, AccessStream

Policy = Literal["lru", "opt"]


class SimulatedHits(NamedTuple):
    """Queried blocks a simulated pool hit: each on its own (``per_block``), and up to
    each lookup's first miss (``prefix``, the curve's unit)."""

    per_block: int
    prefix: int


def _next_query(stream: AccessStream) -> list[float]:
    """For each access: the position of its block's next access if that is a query,
    else infinity."""
    ids = np.asarray(stream.ids).tolist()
    is_query = (np.asarray(stream.query, dtype=bool) & (np.asarray(stream.kind) == LOOKUP)).tolist()
    out = [float("inf")] * len(ids)
    last: dict[int, int] = {}
    for i in range(len(ids) - 1, -1, -1):
        later = last.get(ids[i])
        if later is not None and is_query[later]:
            out[i] = float(later)
        last[ids[i]] = i
    return out


def simulate_pool(stream: AccessStream, num_blocks: int, policy: Policy) -> SimulatedHits:
    """The hits of a pool of ``num_blocks`` blocks evicting per ``policy`` (module
    docstring)."""
    if policy not in ("lru", "opt"):
        raise ValueError(f"unknown policy {policy!r}: 'lru' or 'opt'")
    ids = np.asarray(stream.ids).tolist()
    kinds = np.asarray(stream.kind).tolist()
    events = np.asarray(stream.event).tolist()
    queries = np.asarray(stream.query, dtype=bool).tolist()
    pinned = np.asarray(stream.pinned).tolist()
    next_query = _next_query(stream) if policy == "opt" else []
    references: dict[int, int] = {}
    cached: OrderedDict[int, float] = OrderedDict()  # block -> its next query; oldest first
    per_block = prefix = 0
    event_hits: list[bool] = []  # the current lookup's queries, deepest first

    def close_event() -> int:
        hits = 0
        for hit in reversed(event_hits):  # from the root-most block
            if not hit:
                break
            hits += 1
        event_hits.clear()
        return hits

    for i, block in enumerate(ids):
        if i and events[i] != events[i - 1]:
            prefix += close_event()
        kind = kinds[i]
        if kind == LOOKUP:
            if queries[i]:
                capacity = max(0, num_blocks - pinned[i])
                while len(cached) > capacity:
                    if policy == "lru":
                        cached.popitem(last=False)
                    else:
                        del cached[max(cached, key=cached.__getitem__)]
                held = references.get(block, 0) > 0
                hit = (held or block in cached) and num_blocks >= pinned[i]
                per_block += hit
                event_hits.append(hit)
            cached.pop(block, None)
            references[block] = references.get(block, 0) + 1
            continue
        if kind == RELEASE_HELD:
            references[block] -= 1
        if not references.get(block, 0):
            cached.pop(block, None)
            cached[block] = next_query[i] if next_query else 0.0
    prefix += close_event()
    return SimulatedHits(per_block, prefix)


def simulate_lru(stream: AccessStream, num_blocks: int) -> SimulatedHits:
    """``simulate_pool`` evicting the least recently released block."""
    return simulate_pool(stream, num_blocks, "lru")


def simulate_opt(stream: AccessStream, num_blocks: int) -> SimulatedHits:
    """``simulate_pool`` evicting the block whose next query is furthest (Belady)."""
    return simulate_pool(stream, num_blocks, "opt")

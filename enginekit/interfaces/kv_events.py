"""KV events: the changes to the set of full blocks whose contents a cache holds, as a
cache-aware router follows them (``KVCacheManager.record_kv_events``).

A block is named by its chain hash (``Backend.hash_block``: XXH64 with seed 0 over its
parent's hash, the request's extra key and its tokens; the first block's parent is
``Backend.root_hash``), which depends on nothing but the tokens from the sequence's start
and the extra key, so every process names the same content alike, whichever prefix cache
holds it. Each name is stored once and then removed once: a subscriber that adds the names
of ``StoredBlocks`` and drops those of ``RemovedBlocks`` (everything at ``CacheCleared``)
holds exactly the names the cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheCleared", "KVEvent", "RemovedBlocks", "StoredBlocks"]


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """Consecutive full blocks of one sequence whose contents entered the cache.

    ``block_hashes[i]`` names the sequence's block ``first + i`` (its chain hash);
    ``parent_hash`` names block ``first - 1``, or is None when ``first`` is 0;
    ``token_ids`` are the blocks' tokens, ``block_size`` each, in order.
    """

    block_hashes: list[int]
    parent_hash: int | None
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class RemovedBlocks:
    """Full blocks whose contents left the cache (evicted), by their chain hashes."""

    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class CacheCleared:
    """The cache holds no block: a subscriber forgets every name it holds. The first event
    of every log (the cache starts empty)."""


KVEvent = StoredBlocks | RemovedBlocks | CacheCleared

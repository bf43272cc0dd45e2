"""KVEventLog: the KV events of one cache manager (``enginekit.interfaces.kv_events``), in
the order the cache changed, until they are taken.

Two sources feed it. Blocks cached in the pool's hash map (``block_hash``) come from the
pool's access log: an insertion stores its block's hash, an eviction removes it; the pool
names each hash by one block at most, so each is stored once until it is removed. The
manager hands over the pool's accesses right after each publication, with the requests
whose blocks it published, which give a stored block its tokens (its position in the
request's table) and, where the pool's access lacks it, its parent's hash. Blocks a prefix
cache holds itself (``radix``) come from the cache's own events
(``PrefixCache.take_block_events``), already named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from enginekit.errors import KVCacheError
from enginekit.interfaces.kv_events import CacheCleared, KVEvent, RemovedBlocks, StoredBlocks
from enginekit.interfaces.structures import Access, AccessKind, BlockTables
from enginekit.request import Request

__all__ = ["KVEventLog", "Published"]

Published = tuple[Request, int]
"""A request whose blocks were just published, and how many of its leading blocks are full
(computed): the pool's insertions of that publication are among those blocks."""


class KVEventLog:
    """The events since the last ``take``, oldest first; the first is ``CacheCleared``.

    ``hash_blocks`` is the backend's (``Backend.hash_blocks``): the chain hashes of a token
    list's full blocks.
    """

    def __init__(
        self,
        tables: BlockTables,
        hash_blocks: Callable[[list[int], int, bytes | None], list[int]],
        block_size: int,
    ) -> None:
        self._tables = tables
        self._hash_blocks = hash_blocks
        self._block_size = block_size
        self._events: list[KVEvent] = [CacheCleared()]

    def take(self) -> list[KVEvent]:
        """The events since the last call, oldest first."""
        taken, self._events = self._events, []
        return taken

    def extend(self, events: Sequence[KVEvent]) -> None:
        """Appends events already named (a prefix cache's own)."""
        self._events += events

    def hear_pool(self, accesses: Sequence[Access], published: Sequence[Published]) -> None:
        """Turns the pool's accesses into events: each insertion's block is looked up among
        the full blocks of ``published`` (raises KVCacheError if it is not there: a block
        published outside the manager's publications), consecutive blocks of one request
        making one ``StoredBlocks``; consecutive evictions make one ``RemovedBlocks``.
        Hits and releases change no content."""
        where: dict[int, tuple[Request, int]] | None = None
        run: tuple[Request, int, list[int], int | None] | None = None  # request, first, names
        removed: list[int] = []
        for kind, block_id, content, parent in accesses:
            if kind == AccessKind.INSERT:
                if removed:
                    self._events.append(RemovedBlocks(removed))
                    removed = []
                if where is None:
                    where = self._locate(accesses, published)
                request, index = where[block_id]
                if run is not None and run[0] is request and run[1] + len(run[2]) == index:
                    run[2].append(content)
                    continue
                if run is not None:
                    self._store(*run)
                run = (request, index, [content], parent)
            elif kind == AccessKind.EVICT:
                if run is not None:
                    self._store(*run)
                    run = None
                removed.append(content)
        if run is not None:
            self._store(*run)
        if removed:
            self._events.append(RemovedBlocks(removed))

    def _store(self, request: Request, first: int, names: list[int], parent: int | None) -> None:
        """Logs blocks ``first ..`` of ``request``, named ``names``; ``parent`` is the hash
        the pool gave block ``first``'s predecessor (None where that block carried none: a
        duplicate of a block cached before, or a hole), computed then."""
        block_size = self._block_size
        if first and parent is None:
            parent = self._hash_blocks(
                request.token_ids[: first * block_size], block_size, request.extra_key
            )[-1]
        tokens = request.token_ids[first * block_size : (first + len(names)) * block_size]
        self._events.append(StoredBlocks(names, parent if first else None, tokens))

    def _locate(
        self, accesses: Sequence[Access], published: Sequence[Published]
    ) -> dict[int, tuple[Request, int]]:
        """Where the inserted blocks of ``accesses`` lie: block id -> (the published request
        whose table holds it, its index). The last full block of each request first (a
        decode that filled a block inserts that one), then the requests' whole tables.
        Raises KVCacheError for a block no published request holds."""
        wanted = {block_id for kind, block_id, _, _ in accesses if kind == AccessKind.INSERT}
        tables = self._tables
        where: dict[int, tuple[Request, int]] = {}
        for request, num_full in published:
            if num_full:
                block_id = tables.block_id_at(request.seq_id, num_full - 1)
                if block_id in wanted:
                    where[block_id] = (request, num_full - 1)
        if len(where) < len(wanted):
            for request, num_full in published:
                for index, block_id in enumerate(tables.block_ids(request.seq_id)[:num_full]):
                    if block_id in wanted:
                        where.setdefault(block_id, (request, index))
        missing = wanted - where.keys()
        if missing:
            raise KVCacheError(
                f"blocks {sorted(missing)} were cached outside a publication the KV events "
                "know of: no request just published holds them"
            )
        return where

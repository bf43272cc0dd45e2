"""TierStack: the KV tiers under one device pool, and what moves between them.

The cache manager owns one. It names the full blocks of a request by their content keys
(``enginekit.interfaces.tier``), finds where the prompt's next blocks wait below device
memory, decides whether loading them beats computing them again, queues the device
blocks to write down (``TierSave``) and the payloads to load back (``TierLoad``) for the
executor, and files what the executor read out into the levels, each level's evictions
going to the next one down. It counts what each level did.

When a block is written down is the write policy:

- ``on_evict``: as the device pool evicts it (and nobody holds it any more);
- ``write_through``: as the request that computed it releases it;
- ``second_hit``: as ``on_evict``, once two requests have used the block.

A block's key is known from the request that last released it: every release records the
key of each of its full blocks (and forgets the others), so a block's record always
describes the content its last holder left in it. A save is queued only for a block no
one holds, and the executor reads it out before anything in the same step writes into
device blocks, so what is written under a key is that key's content.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from enginekit.errors import ConfigError, KVCacheError
from enginekit.interfaces.backend import Backend
from enginekit.interfaces.tier import KVTier, Payload, TierLevelStats
from enginekit.request import Request
from enginekit.spec.restore_cost import RestoreCost
from enginekit.step import TierLoad, TierSave

WRITE_POLICIES = ("on_evict", "write_through", "second_hit")


class TierRun(NamedTuple):
    """``num_blocks`` consecutive prompt blocks found in level ``level``."""

    level: int
    num_blocks: int


class TierRead(NamedTuple):
    """Payloads read out of the levels for consecutive blocks, in block order, and the
    runs (level, count) they came in."""

    runs: list[TierRun]
    payloads: list[Payload]

    @property
    def num_blocks(self) -> int:
        return len(self.payloads)

    def load_ops(self, block_ids: Sequence[int]) -> list[TierLoad]:
        """The executor's loads of these payloads into ``block_ids`` (one each)."""
        levels = [run.level for run in self.runs for _ in range(run.num_blocks)]
        return [
            TierLoad(block_id, level, payload)
            for block_id, level, payload in zip(block_ids, levels, self.payloads, strict=True)
        ]


class _LevelCounts:
    """Running counters of one level (see ``TierLevelStats``)."""

    __slots__ = (
        "num_hit_blocks",
        "num_loaded_bytes",
        "num_written_blocks",
        "num_written_bytes",
        "num_evicted_blocks",
        "load_time_s",
    )

    def __init__(self) -> None:
        self.num_hit_blocks = 0
        self.num_loaded_bytes = 0
        self.num_written_blocks = 0
        self.num_written_bytes = 0
        self.num_evicted_blocks = 0
        self.load_time_s = 0.0


class TierStack:
    """The levels below one device pool, fastest first, and the blocks in flight between
    them and the device.

    Owns: the per-sequence key lists (from first lookup to release), the records of what
    released device blocks hold, the saves queued for the next step and those the step
    being run reads out, and the counters. The levels own their contents."""

    def __init__(
        self,
        levels: Sequence[KVTier],
        names: Sequence[str],
        backend: Backend,
        block_size: int,
        block_bytes: int,
        write_policy: str,
        costs: RestoreCost | None,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ConfigError(
                f"tier.write_policy must be one of {', '.join(WRITE_POLICIES)}, got "
                f"{write_policy!r}"
            )
        self.levels = list(levels)
        self.names = list(names)
        self._hash_blocks = backend.hash_blocks
        self._block_size = block_size
        self._block_bytes = block_bytes
        self.write_policy = write_policy
        self._costs = costs  # None: always load
        # on_evict writes a block down each time the device evicts it, so a block loaded
        # back leaves its level (exclusive levels: their room goes to other blocks);
        # second_hit would not write it again, write_through keeps every level inclusive.
        self._exclusive = write_policy == "on_evict"
        self._keys: dict[int, list[int]] = {}  # seq id -> keys of its full blocks so far
        # Released device block -> the key of its content, and how many releases held it
        # with that content (a prefix hit is a use). Two dicts: no object per block.
        self._record_keys: dict[int, int] = {}
        self._record_uses: dict[int, int] = {}
        self._queued: dict[int, int] = {}  # device block -> key, saves for the next step
        self._in_flight: dict[int, int] = {}  # device block -> key, the step reads out
        self._counts = [_LevelCounts() for _ in levels]
        self.num_avoided_blocks = 0  # tier hits computed again: cheaper than loading

    @property
    def hears_evictions(self) -> bool:
        """Whether the policy writes blocks down as the device evicts them."""
        return self.write_policy != "write_through"

    # -- keys ----------------------------------------------------------------------------

    def keys(self, request: Request, num_blocks: int) -> list[int]:
        """The keys of ``request``'s first ``num_blocks`` full blocks (computed once per
        sequence, extended as it grows)."""
        keys = self._keys.get(request.seq_id)
        if keys is None or len(keys) < num_blocks:
            tokens = request.token_ids[: num_blocks * self._block_size]
            keys = self._hash_blocks(list(tokens), self._block_size, request.extra_key)
            self._keys[request.seq_id] = keys
        return keys[:num_blocks]

    def forget(self, request: Request) -> None:
        """Drops what is kept per sequence for ``request`` (it holds no blocks now)."""
        self._keys.pop(request.seq_id, None)

    # -- lookup and load ------------------------------------------------------------------

    def find(self, request: Request, first_block: int, end_block: int) -> list[TierRun]:
        """Where the request's blocks ``first_block .. end_block - 1`` wait below device
        memory: runs of consecutive blocks, each in the fastest level holding it, up to the
        first block no level holds. Pure (a shared level asks its server)."""
        if end_block <= first_block or not self.levels:
            return []
        keys = self.keys(request, end_block)
        runs: list[TierRun] = []
        position = first_block
        while position < end_block:
            for level_index, level in enumerate(self.levels):
                num_found = level.num_present(keys[position:end_block])
                if num_found:
                    runs.append(TierRun(level_index, num_found))
                    position += num_found
                    break
            else:
                break
        return runs

    def worth_loading(self, runs: Sequence[TierRun], first_token: int) -> bool:
        """Whether moving ``runs``' bytes to the device takes less time than computing
        their tokens again after the ``first_token`` tokens before them (the restore-cost
        model: bytes over each level's link against prefill FLOPs). Counts the blocks of
        a refused load as avoided."""
        if self._costs is None or not runs:
            return True
        load_s = sum(
            run.num_blocks * self._block_bytes / self.levels[run.level].bytes_per_s for run in runs
        )
        num_tokens = sum(run.num_blocks for run in runs) * self._block_size
        costs = self._costs
        pairs = num_tokens * first_token + num_tokens * (num_tokens + 1) // 2
        compute_s = num_tokens * costs.prefill_s_per_token + pairs * costs.attention_s_per_pair
        if load_s < compute_s:
            return True
        self.num_avoided_blocks += num_tokens // self._block_size
        return False

    def load(self, request: Request, first_block: int, runs: Sequence[TierRun]) -> TierRead:
        """Reads the payloads of ``runs`` (from ``first_block`` on) out of their levels,
        up to the first block a level cannot return intact, and counts them as hits."""
        keys = self.keys(request, first_block + sum(run.num_blocks for run in runs))
        loaded: list[TierRun] = []
        payloads: list[Payload] = []
        position = first_block
        for run in runs:
            level = self.levels[run.level]
            got = level.load(keys[position : position + run.num_blocks])
            if got and self._exclusive and not level.is_shared:
                level.discard(keys[position : position + len(got)])
            if got:
                loaded.append(TierRun(run.level, len(got)))
                payloads.extend(got)
                counts = self._counts[run.level]
                counts.num_hit_blocks += len(got)
                counts.num_loaded_bytes += len(got) * self._block_bytes
                counts.load_time_s += len(got) * self._block_bytes / level.bytes_per_s
            if len(got) < run.num_blocks:
                break
            position += run.num_blocks
        return TierRead(loaded, payloads)

    # -- writing down ----------------------------------------------------------------------

    def on_released(self, request: Request, block_ids: Sequence[int]) -> None:
        """``request`` releases ``block_ids`` (its table, in order; -1 for a hole): each
        full computed block's content is recorded under its key, every other block's
        record is dropped; under ``write_through`` the full blocks the fastest level lacks
        are queued to be written down."""
        num_full = min(request.num_computed_tokens // self._block_size, len(block_ids))
        keys = self.keys(request, num_full) if num_full else []
        record_keys, record_uses = self._record_keys, self._record_uses
        for block_id in block_ids[num_full:]:
            if block_id >= 0:
                record_keys.pop(block_id, None)
                record_uses.pop(block_id, None)
        if self.write_policy == "write_through":
            for block_id, key in zip(block_ids[:num_full], keys, strict=True):
                if block_id >= 0:
                    self._queue(block_id, key)
        else:
            for block_id, key in zip(block_ids[:num_full], keys, strict=True):
                if block_id < 0:
                    continue
                if record_keys.get(block_id) == key:
                    record_uses[block_id] += 1
                else:
                    record_keys[block_id] = key
                    record_uses[block_id] = 1
        self.forget(request)

    def on_evicted(self, block_ids: Sequence[int], is_free: Sequence[bool]) -> None:
        """The device pool gave up ``block_ids`` (``is_free[i]``: no one holds block i any
        more); under ``on_evict`` (``second_hit``: once used twice) each free one with a
        record is queued to be written down."""
        if not self.hears_evictions:
            return
        min_uses = 2 if self.write_policy == "second_hit" else 1
        record_keys, record_uses = self._record_keys, self._record_uses
        for block_id, free in zip(block_ids, is_free, strict=True):
            if not free or block_id not in record_keys:
                continue
            key = record_keys.pop(block_id)
            if record_uses.pop(block_id) >= min_uses:
                self._queue(block_id, key)

    def _queue(self, block_id: int, key: int) -> None:
        """Queues device block ``block_id`` to be written down under ``key``, unless the
        fastest level holds that key already (then it is refreshed there)."""
        level = self.levels[0]
        if not level.is_shared and level.num_present((key,)):
            level.touch(key)  # written down already: as recent as a fresh write
            return  # (a shared level is not asked: a round trip each)
        self._queued[block_id] = key

    def take_saves(self) -> list[TierSave]:
        """The saves queued since the last call, for the next step; they are in flight
        until ``complete_saves``."""
        if not self._queued:
            return []
        if self._in_flight:
            raise KVCacheError("tier saves taken for a step before the last step's were completed")
        saves = [TierSave(block_id, 0) for block_id in self._queued]
        self._in_flight, self._queued = self._queued, {}
        return saves

    @property
    def num_queued(self) -> int:
        """Saves queued for the next step."""
        return len(self._queued)

    def complete_saves(self, payloads: Sequence[Payload]) -> None:
        """The executor read out the step's saves (``payloads`` in order; empty from an
        executor that moves no data): each is stored in the fastest level, and what a
        level evicts for it goes to the next one down."""
        in_flight, self._in_flight = self._in_flight, {}
        if payloads and len(payloads) != len(in_flight):
            raise KVCacheError(
                f"the executor returned {len(payloads)} payloads for {len(in_flight)} saves"
            )
        self._store(0, zip(in_flight.values(), payloads or itertools.repeat(None), strict=False))

    def _store(self, level_index: int, pairs: Iterable[tuple[int, Payload]]) -> None:
        """Stores the (key, payload) ``pairs`` in level ``level_index``; what it evicts for
        them goes to the next level down (or is dropped below the last)."""
        level = self.levels[level_index]
        counts = self._counts[level_index]
        evicted: list[tuple[int, Payload]] = []
        num_written = 0
        for key, payload in pairs:
            num_written += 1
            dropped = level.store(key, payload)
            if dropped:
                evicted += dropped
        counts.num_written_blocks += num_written
        counts.num_written_bytes += num_written * self._block_bytes
        counts.num_evicted_blocks += len(evicted)
        if evicted and level_index + 1 < len(self.levels):
            self._store(level_index + 1, evicted)

    # -- reading ---------------------------------------------------------------------------

    def stats(self) -> list[TierLevelStats]:
        """What each level did so far, fastest first."""
        return [
            TierLevelStats(
                name,
                level.num_blocks(),
                level.capacity_blocks,
                counts.num_hit_blocks,
                counts.num_loaded_bytes,
                counts.num_written_blocks,
                counts.num_written_bytes,
                counts.num_evicted_blocks,
                level.num_failures,
                counts.load_time_s,
            )
            for name, level, counts in zip(self.names, self.levels, self._counts, strict=True)
        ]

    def check_integrity(self, num_device_blocks: int) -> None:
        """Raises KVCacheError if a level is inconsistent or over capacity, or a record or
        queued save names no device block."""
        for name, level in zip(self.names, self.levels, strict=True):
            level.check_integrity()
            if not level.is_shared and level.num_blocks() > level.capacity_blocks:
                raise KVCacheError(
                    f"tier {name!r} holds {level.num_blocks()} blocks, more than its "
                    f"capacity {level.capacity_blocks}"
                )
        if self._record_keys.keys() != self._record_uses.keys():
            raise KVCacheError("a tier record has a key without a use count, or the reverse")
        for block_id in (*self._record_keys, *self._queued, *self._in_flight):
            if not 0 <= block_id < num_device_blocks:
                raise KVCacheError(f"a tier record names block {block_id}, not a device block")

    def close(self) -> None:
        for level in self.levels:
            level.close()

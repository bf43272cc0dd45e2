"""KVCacheManager: coordinates the allocator, prefix-cache and eviction plugins over one
block pool and one set of block tables. The scheduler reaches it only through its door,
``enginekit.interfaces.scheduler_cache.SchedulerCache``; the engine reads its usage and
checks it, the preemption plugin reads it as a ``CacheView``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from enginekit.errors import KVCacheError, OutOfBlocksError
from enginekit.interfaces.capabilities import HoleAllocator, WindowedEviction
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.eviction import BlockRange, Eviction
from enginekit.interfaces.kv_events import KVEvent
from enginekit.interfaces.prefix import NO_MATCH, PrefixCache, PrefixMatch
from enginekit.interfaces.scheduler_cache import Admission, StepBlocks
from enginekit.interfaces.structures import Access, IntBatch
from enginekit.kv.block_ops import BlockOps
from enginekit.kv.events import KVEventLog, Published
from enginekit.kv.forks import SharedTails
from enginekit.kv.promises import PrefillPromises
from enginekit.kv.swap_space import SwapSpace
from enginekit.kv.tiers import TierStack
from enginekit.request import Request
from enginekit.spec.kv import KVSpec
from enginekit.step import KVUsage, TierSave

if TYPE_CHECKING:
    from enginekit.interfaces import Allocator
    from enginekit.interfaces.tier import Payload, TierLevelStats


def _overrides(plugin: object, base: type, method: str) -> bool:
    """Whether ``plugin``'s class replaces ``base``'s default ``method``."""
    return getattr(type(plugin), method) is not getattr(base, method)


class _Admission(NamedTuple):
    """How ``request`` would be admitted with a prefix match."""

    shared: list[int]  # fully matched blocks the request's table starts with
    partial: int | None  # partially matched block it copies (copy-on-write), or None
    peak: int  # most blocks it holds at once while it prefills
    num_new: int  # free blocks admission takes: promised, or allocated now


class _Refusal(NamedTuple):
    """The last waiting request ``_admissible`` refused, and what that refusal rests on."""

    seq_id: int
    num_tokens: int
    match: PrefixMatch  # the match it was refused with
    num_needed: int  # blocks admitting it with that match would take (the fewest of both)


class KVCacheManager:
    """Admission, growth, forking, swapping and release of sequences' KV blocks.

    A prefill gets its blocks chunk by chunk (``reserve_prefill``), out of the free blocks
    admission promised it (``enginekit.kv.promises``); decodes, copy-on-write, forks and
    admissions only use the room beyond those promises, and make it by evicting cached
    blocks or preempting.

    Swapping (the preemption plugin decides it; the scheduler asks for it) copies a
    sequence's blocks to the host swap space and back, with its table's holes where they
    were. Forked sequences share blocks; a partly filled one is copied before a second
    writer writes into it.

    Owns: the plugins' shared structures (``context``), the prefill promises, the block
    operations queued for the next step, the shared tails of forks, the swap space and the
    KV tiers below the pool (``enginekit.kv.tiers``), if any.

    Invariants between calls (checked by ``check_integrity``): every block's reference
    count equals the references held on it by block tables, copy-on-write pins and the
    prefix cache itself; the free blocks cover the prefill promises; every swapped-out
    sequence's blocks are in the swap space.
    """

    def __init__(
        self,
        context: KVContext,
        allocator: Allocator,
        prefix: PrefixCache,
        eviction: Eviction,
        watermark: float,
        num_swap_blocks: int = 0,
        tiers: TierStack | None = None,
    ) -> None:
        self.context = context
        self.pool = context.pool
        self.tables = context.tables
        self.allocator = allocator
        self.prefix = prefix
        self.eviction = eviction
        self.num_watermark_blocks = int(watermark * context.num_blocks)
        self._block_size = context.spec.block_size
        self._block_ops = BlockOps()  # handed to the executor by take_block_ops
        self._promises = PrefillPromises()
        self._shared_tails = SharedTails(self.pool, self.tables, allocator, self._block_ops)
        self.swap_space = SwapSpace(num_swap_blocks)
        # The KV tiers below the pool, or None. Without a window only: a windowed
        # sequence's blocks are not its prompt's prefix.
        self.tiers = tiers if tiers is not None and tiers.levels else None
        if self.tiers is not None and isinstance(eviction, WindowedEviction):
            raise KVCacheError(
                f"KV tiers need a whole prompt's blocks; eviction {eviction.config.name!r} "
                "releases them out of a window"
            )
        # The tiers again, where they write blocks down as the pool evicts them.
        self._tiers_on_evict = self.tiers if tiers is not None and tiers.hears_evictions else None
        # A policy that bounds the blocks a sequence holds (sliding_window), or None.
        self._window = eviction if isinstance(eviction, WindowedEviction) else None
        # The allocator, if it can leave holes in a table (checked once: a Protocol
        # isinstance walks its attributes).
        self._holes = allocator if isinstance(allocator, HoleAllocator) else None
        # Which optional hooks the plugins override (the defaults do nothing): the per-step
        # calls skip the others. Windows to release; pool references the prefix cache
        # holds itself (radix: blocks only it keeps are reclaimable); listening to
        # evictions and to executed steps.
        self._has_windows = _overrides(eviction, Eviction, "ranges_out_of_window")
        self._cache_holds_blocks = _overrides(prefix, PrefixCache, "num_evictable_blocks")
        self._hears_evictions = _overrides(prefix, PrefixCache, "on_evicted")
        self._hears_steps = _overrides(prefix, PrefixCache, "on_step_executed")
        # A policy that hears the pool's accesses: the pool logs them for it, and
        # ``_deliver_accesses`` hands them over.
        self._hears_accesses = type(eviction).hears_accesses()
        self.pool.record_accesses(self._hears_accesses)
        prefix.record_accesses(self._hears_accesses)
        # How a prefix cache holding its own blocks (radix) picks each victim: the policy's
        # choice among its candidates, or (None) its own order.
        self._choose_victim = (
            eviction.choose_victim if _overrides(eviction, Eviction, "choose_victim") else None
        )
        # The call back that makes room for growing tables (all or nothing, beyond the
        # promises): where evicting in the pool's LRU order is all ``_try_make_room`` would
        # do (the eviction policy keeps the default order, the prefix cache neither hears
        # evictions nor holds blocks of its own), the structures' own, which the Rust
        # tables run without calling back into Python.
        is_pool_lru = not (
            _overrides(eviction, Eviction, "evict")
            or self._hears_evictions
            or self._cache_holds_blocks
            or self._tiers_on_evict is not None
        )
        self._make_room_to_grow: Callable[[int], bool] = (
            context.backend.new_lru_room(self.pool, self._promises)
            if is_pool_lru
            else self._try_make_room
        )
        self._refusal: _Refusal | None = None  # see still_refused
        # The KV events while they are logged (record_kv_events), else None; and the pool
        # accesses the event log took before the eviction policy (if it hears) heard them.
        self._kv_events: KVEventLog | None = None
        self._unheard: list[Access] = []

    @property
    def spec(self) -> KVSpec:
        return self.context.spec

    @property
    def block_size(self) -> int:
        return self.context.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.context.num_blocks

    @property
    def num_free_swap_blocks(self) -> int:
        """Host blocks the swap space has free (a swap-out of more is refused)."""
        return self.swap_space.num_free_blocks

    def num_held_blocks(self, seq_id: int) -> int:
        """Blocks the sequence's table holds, holes excluded. Pure."""
        return self.tables.num_blocks(seq_id) - self.tables.num_holes(seq_id)

    def usage(self, num_computed_tokens: int) -> KVUsage:
        """Block and slot counts by state (``num_computed_tokens``: the computed tokens of
        every request holding a table, added up, which the caller keeps as they change).
        Blocks that only a prefix cache holding its own references keeps (radix) count as
        evictable, not used (an estimate from above). Pure; reads no request."""
        pool = self.pool
        cache_only = self._num_cache_only_blocks()
        num_table_blocks = self.allocator.num_reserved_blocks()
        return KVUsage(
            pool.num_blocks,
            max(0, pool.num_used_blocks - cache_only),
            pool.num_evictable_blocks + cache_only,
            pool.num_free_blocks,
            num_table_blocks,
            num_table_blocks * self._block_size,
            self.num_unused_slots(num_computed_tokens),
        )

    def num_reclaimable_blocks(self) -> int:
        """Blocks that can be handed out now beyond the prefill promises: free ones,
        evictable ones, and those only a prefix cache that holds its own references (radix)
        would release, less the promised ones. The radix part may be an estimate from
        above; make_room then falls short and callers back off."""
        pool = self.pool
        num_cache_only = self._num_cache_only_blocks()
        num_reclaimable = pool.num_free_blocks + pool.num_evictable_blocks + num_cache_only
        return num_reclaimable - self._promises.total

    @property
    def num_promised_blocks(self) -> int:
        """Free blocks set aside for the chunks that running prefills have left."""
        return self._promises.total

    # -- the scheduler's door (``enginekit.interfaces.scheduler_cache.SchedulerCache``) ----

    def admit(self, request: Request, step_has_work: bool) -> Admission | None:
        """See ``SchedulerCache.admit``. A restore (the request is swapped out) is checked
        against the room without a prefix hit, then brought back. An admission matches
        the prefix and takes the hit if it fits, else no hit if that fits; one that falls
        short of the room estimated (cached blocks it evicted trying stay evicted) is
        matched and tried once more against what is left. A request refused before, with
        nothing since that can have let it in, is refused without a match."""
        if self._is_swapped(request):
            if not self._can_admit(request, NO_MATCH):
                return None
            try:
                return Admission(True, 0, self._swap_in(request))
            except OutOfBlocksError:
                return None  # the room _can_admit estimated was not all reclaimable
        for _ in range(2):
            if self._still_refused(request):
                return None
            match = self.prefix.match(request)
            if match.num_deferred_tokens and step_has_work:
                return None  # its prefix is being computed by this step: admit it next
            admissible = self._admissible(request, match)
            if admissible is None:
                return None
            try:
                self._admit_match(request, admissible)
            except OutOfBlocksError:
                continue  # the room _admissible estimated was not all reclaimable
            num_loaded = 0 if self.tiers is None else self._load_from_tiers(request)
            return Admission(False, admissible.num_tokens + num_loaded, 0, num_loaded)
        return None

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """See ``SchedulerCache.num_cached_prefix_tokens``: the prefix cache's ``match``
        (pure), its length in tokens."""
        return self.prefix.match(request).num_tokens

    def admit_together(
        self, requests: Sequence[Request], step_has_work: bool
    ) -> list[Admission] | None:
        """See ``SchedulerCache.admit_together``. The blocks every member needs without a
        prefix hit (a swapped-out one: to be restored) are freed first, evicting cached
        blocks; then each member is admitted as ``admit`` would, out of free blocks only.
        A hit never takes more free blocks than no hit (it shares what it matched), so
        every member fits once the first does; taking it from the free blocks, not from
        the evictable ones a hit pins, is what keeps one member's hit from leaving a
        sibling short. A match whose last tokens the step computes is not waited for: that
        member is admitted without a hit."""
        num_needed = 0
        for request in requests:
            if self._is_swapped(request):
                num_needed += self._num_blocks_to_restore(request)
            else:
                num_needed += self._num_new_blocks(request, NO_MATCH)
        if num_needed > self._admission_room():
            return None
        if not self._try_make_room(num_needed + self._num_short_promised()):
            return None  # the room estimated was not all reclaimable
        admissions = []
        for request in requests:
            if self._is_swapped(request):
                admissions.append(Admission(True, 0, self._swap_in(request)))
                continue
            match = self.prefix.match(request)
            if match.num_deferred_tokens and step_has_work:
                match = NO_MATCH
            self._admit_match(request, match)
            admissions.append(Admission(False, match.num_tokens, 0))
        return admissions

    def grow(self, seq_ids: IntBatch, num_tokens: IntBatch, decodes: Sequence[Request]) -> bool:
        """See ``SchedulerCache.grow``: the tables grow (all or nothing), then the copies
        of shared tails are made (all or nothing)."""
        return self._try_grow(seq_ids, num_tokens) and self._try_copy_on_write(decodes)

    def take_step_blocks(
        self,
        filled: Sequence[Request],
        num_computed_tokens: Sequence[int],
        table_seq_ids: list[int] | None,
    ) -> StepBlocks:
        """See ``SchedulerCache.take_step_blocks``."""
        if filled:
            self.prefix.on_decodes_computed(filled, num_computed_tokens)
            if self._kv_events is not None:
                block_size = self._block_size
                self._log_kv_events(
                    [(r, n // block_size) for r, n in zip(filled, num_computed_tokens, strict=True)]
                )
        copies, swap_outs, swap_ins = self._block_ops.take()
        tables = None if table_seq_ids is None else self._export_tables(table_seq_ids)
        if self.tiers is None:
            return StepBlocks(copies, swap_outs, swap_ins, tables)
        saves = self.tiers.take_saves()
        loads = self._block_ops.take_tier_loads()
        return StepBlocks(copies, swap_outs, swap_ins, tables, saves, loads)

    def release(self, request: Request, swap_out: bool = False) -> int | None:
        """See ``SchedulerCache.release``."""
        if self._is_swapped(request):
            self.swap_space.take(request.seq_id)  # its host blocks are free again
            return None
        if request.seq_id not in self.tables.seq_ids():  # waiting: it holds no table
            self._forget(request)
            return None
        if swap_out:
            num_swapped = self._swap_out(request)
            if num_swapped is not None:
                return num_swapped
        self._release_blocks(request)
        return None

    def finish_step(self, finished: Sequence[Request], running: Sequence[Request]) -> None:
        """See ``SchedulerCache.finish_step``."""
        self._on_step_executed()
        for request in finished:
            self._release_blocks(request)
        self._release_out_of_window(running)
        if self._hears_accesses:
            self._deliver_accesses()

    def _deliver_accesses(self) -> None:
        """Hands the accesses the pool logged since the last call to the eviction policy
        (one that hears them: ``Eviction.hears_accesses``), those the KV events took in
        the meantime first."""
        accesses = self.pool.take_accesses()
        if self._kv_events is not None and accesses:
            self._kv_events.hear_pool(accesses, ())
        if self._unheard:
            accesses = self._unheard + accesses
            self._unheard = []
        if self._cache_holds_blocks:
            accesses += self.prefix.take_accesses()
        if accesses:
            self.eviction.hear(accesses)

    # -- KV events -----------------------------------------------------------------------

    def record_kv_events(self, on: bool) -> None:
        """Starts (``on``) or stops logging KV events (``take_kv_events``): the changes to
        the set of full blocks whose contents the cache holds, named by their chain hashes
        (``enginekit.interfaces.kv_events``). Starting needs an empty cache, every block
        free (KVCacheError otherwise: what it held before would be unknown to the events);
        its first event is ``CacheCleared``. While on, the pool logs its accesses (for the
        eviction policy as before, if it hears them: it hears the same ones, at the same
        calls) and the prefix cache its own block events; off, neither costs anything."""
        pool = self.pool
        if not on:
            if self._kv_events is not None and self._hears_accesses:
                self._unheard += pool.take_accesses()
            self._kv_events = None
            pool.record_accesses(self._hears_accesses)
            self.prefix.record_block_events(False)
            return
        if self._kv_events is not None:
            return
        if pool.num_free_blocks != pool.num_blocks:
            raise KVCacheError(
                f"KV events must start on an empty cache: {pool.num_blocks - pool.num_free_blocks} "
                "blocks are in use or cached"
            )
        if self._hears_accesses:
            self._unheard += pool.take_accesses()  # before the events start: the policy's
        pool.record_accesses(True)
        self.prefix.record_block_events(True)
        backend = self.context.backend
        self._kv_events = KVEventLog(self.tables, backend.hash_blocks, self._block_size)

    def take_kv_events(self) -> list[KVEvent]:
        """The KV events since the last call, oldest first (none while not logging)."""
        if self._kv_events is None:
            return []
        self._log_kv_events(())
        return self._kv_events.take()

    def _log_kv_events(self, published: Sequence[Published]) -> None:
        """Moves what the pool and the prefix cache logged into the KV events, right after
        the blocks of ``published`` were published; keeps the pool's accesses for the
        eviction policy, if it hears them (``_deliver_accesses``)."""
        log = self._kv_events
        assert log is not None
        accesses = self.pool.take_accesses()
        if accesses:
            if self._hears_accesses:
                self._unheard += accesses
            log.hear_pool(accesses, published)
        events = self.prefix.take_block_events()
        if events:
            log.extend(events)

    # -- admission -----------------------------------------------------------------------

    def _split(self, match: PrefixMatch) -> tuple[list[int], int | None]:
        """(the matched blocks the request shares, the partially matched last block whose
        valid slots it copies into a block of its own, or None)."""
        if match.num_tokens % self.block_size == 0:
            return match.block_ids, None
        return match.block_ids[:-1], match.block_ids[-1]

    def _plan(self, request: Request, match: PrefixMatch) -> _Admission:
        shared, partial = self._split(match)
        peak = len(shared) + self.allocator.num_blocks_to_admit(request, len(shared))
        kept = shared
        if self._window is not None:
            # Matched blocks outside the window are released as the request is admitted.
            peak = min(peak, self._window.max_blocks_per_sequence)
            kept = self._window.kept_blocks(shared, match.num_tokens)
        return _Admission(shared, partial, peak, max(0, peak - len(kept)))

    def _num_new_blocks(self, request: Request, match: PrefixMatch) -> int:
        """``_plan(request, match).num_new``, without building the plan where no window
        bounds the sequence (then the matched blocks are all kept)."""
        if self._window is not None:
            return self._plan(request, match).num_new
        num_shared = len(match.block_ids) - (1 if match.num_tokens % self._block_size else 0)
        return max(0, self.allocator.num_blocks_to_admit(request, num_shared))

    def max_blocks_held(self, num_tokens: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens holds at most: what the allocator
        reserves for it, capped by the window policy's bound when there is one. Pure."""
        num_blocks = self.allocator.num_blocks_for_longest(num_tokens)
        if self._window is not None:
            num_blocks = min(num_blocks, self._window.max_blocks_per_sequence)
        return num_blocks

    def _can_admit(self, request: Request, match: PrefixMatch) -> bool:
        """True if admitting ``request`` with ``match`` (or restoring it, if it is swapped
        out: ``match`` is then NO_MATCH) leaves at least the watermark of blocks
        (``_admission_watermark``) reclaimable beyond the prefill promises, its own included,
        and beyond what short promises still need. Matched blocks that are
        evictable stop being reclaimable while the request holds them, so they count against
        the room: all of them, those a window releases right after admission included
        (they are held while admission makes room), those only a prefix cache that holds
        its own references keeps (radix) too. Pure."""
        if self._is_swapped(request):
            num_needed, pinned = self._num_blocks_to_restore(request), []
        else:
            num_needed, pinned = self._plan(request, match).num_new, match.block_ids
        num_pinned_evictable = self._num_pinned_evictable(pinned)
        room = self.num_reclaimable_blocks() - num_pinned_evictable - self._num_short_promised()
        return num_needed + self._admission_watermark() <= room

    def _admissible(self, request: Request, match: PrefixMatch) -> PrefixMatch | None:
        """How the waiting ``request`` (not swapped out) can be admitted now: with
        ``match`` if ``_can_admit(request, match)``, else with NO_MATCH if that fits (a hit
        pins evictable blocks that no hit leaves reclaimable), else None: the two checks,
        sharing their room. Pure, but for remembering a refusal (``_still_refused``)."""
        room = self._admission_room()
        num_needed = self._num_new_blocks(request, match)
        if not match.block_ids:
            if num_needed <= room:
                return match
        # Pinning only takes room: when the hit does not fit the whole room, skip the count.
        elif num_needed <= room and num_needed <= room - self._num_pinned_evictable(
            match.block_ids
        ):
            return match
        elif self._num_new_blocks(request, NO_MATCH) <= room:
            return NO_MATCH
        self._refusal = _Refusal(request.seq_id, request.num_tokens, match, num_needed)
        return None

    def _still_refused(self, request: Request) -> bool:
        """True if the waiting ``request`` was the last one ``_admissible`` refused and
        nothing since can have made it admissible: its prefix cache says no match of it
        can be longer than the match it was refused with, and the room is still short of
        the blocks that match needed. Then ``_admissible(request, prefix.match(request))`` is None
        (a shorter match needs no fewer blocks, pinning only takes room), and a scheduler
        retrying the head of its queue every step skips the match. False says nothing.
        Pure."""
        refusal = self._refusal
        if (
            refusal is None
            or refusal.seq_id != request.seq_id
            or refusal.num_tokens != request.num_tokens
        ):
            return False
        if refusal.num_needed <= self._admission_room():
            return False
        return not self.prefix.may_match_more(request, refusal.match)

    def _admission_room(self) -> int:
        """Blocks an admission may take now: the reclaimable ones less what short
        promises still need and the watermark."""
        room = self.num_reclaimable_blocks() - self._num_short_promised()
        return room - self._admission_watermark()

    def _num_pinned_evictable(self, block_ids: list[int]) -> int:
        """Of a match's blocks, those that stop being reclaimable while a request holds
        them: evictable in the pool, or kept only by a prefix cache holding references of
        its own (radix)."""
        if not block_ids:
            return 0
        num_unreferenced = self.pool.num_unreferenced(block_ids)
        if self._cache_holds_blocks:
            num_unreferenced += self.prefix.num_evictable_among(block_ids)
        return num_unreferenced

    def _admission_watermark(self) -> int:
        """Blocks admission keeps reclaimable for the running sequences to grow into: the
        watermark, or 0 while no sequence holds a block (then it protects nothing, and a
        request that fits the whole pool must still be admitted). Pure."""
        return self.num_watermark_blocks if self.allocator.num_reserved_blocks() else 0

    def _num_short_promised(self) -> int:
        """Blocks the prefills' promises fall short of ``peak - held`` by (a window released
        a block another sequence still holds): admission leaves them for those prefills."""
        if self._window is None:
            return 0  # without a window a promise is always peak - held
        # A loop, not sum() over a generator: that would make the function build a closure
        # cell at every call, the common early return above included (every step's
        # admission check calls it).
        promises = self._promises
        num_short = 0
        for s in promises:
            num_short += max(0, promises.peak(s) - self.num_held_blocks(s) - promises.promised(s))
        return num_short

    def _admit_match(self, request: Request, match: PrefixMatch) -> None:
        """Gives ``request`` a block table: the fully matched blocks (pinned first, so
        eviction cannot take them), evicting cached blocks until the free list also holds
        the blocks it is promised for its prefill (``reserve_prefill`` takes them chunk by
        chunk; an allocator that reserves at admission takes them now). A match ending
        inside a block (token-granular prefix caches) is copy-on-write: the request's first
        fresh block, allocated now, receives a copy of that block, whose pin is held until
        the copy has run (``_on_step_executed``). With a sliding window, the matched blocks
        outside it are released at once. Sets ``num_computed_tokens`` to the match. Raises
        OutOfBlocksError, changing nothing, if the room is not there (call _can_admit
        first)."""
        pool = self.pool
        plan = self._plan(request, match)
        pool.incref_all(match.block_ids)
        try:
            if not self._make_room(plan.num_new):
                raise OutOfBlocksError(
                    f"admitting request {request.request_id!r} needs {plan.num_new} free "
                    f"blocks; only {pool.num_free_blocks - self._promises.total} could be "
                    "reclaimed beyond the prefill promises"
                )
            self.allocator.admit(request, plan.shared)
        except Exception:
            pool.free(match.block_ids[::-1])  # tail first, as a release gives them back
            raise
        if plan.partial is not None:
            num_slots = (len(plan.shared) + 1) * self.block_size
            self.allocator.grow([request.seq_id], [num_slots])
            # The match's reference to the partial block becomes the copy's pin.
            self._block_ops.copy(
                plan.partial, self.tables.block_id_at(request.seq_id, len(plan.shared))
            )
        request.num_computed_tokens = match.num_tokens
        if self._window is not None:
            self._release_ranges(self.eviction.ranges_out_of_window([request]))
        self._promise(request, plan.peak)

    def _promise(self, request: Request, peak: int) -> None:
        """Promises the prefilling ``request`` the blocks up to ``peak`` it does not hold."""
        self._promises.set(
            request.seq_id, peak, max(0, peak - self.num_held_blocks(request.seq_id))
        )

    # -- growth --------------------------------------------------------------------------

    def reserve_prefill(self, request: Request, num_tokens: int) -> int:
        """Grows the prefilling ``request``'s table for its next chunk of up to
        ``num_tokens`` tokens, out of its promise; returns how many tokens the chunk may
        compute. That is ``num_tokens``, except with a sliding window, whose chunk holds at
        most the blocks promised to the request plus, unless the policy's bound is strict,
        the free blocks no one is promised (these come back after the step, when the window
        moves on). A promise that fell short (blocks a window released were shared: see
        ``_release_out_of_window``) is topped up first, evicting cached blocks if need be;
        0 only if it is still short of a block: the chunk then waits (the scheduler
        preempts if nothing else can run). The promise ends with the prefill's last chunk
        (a request with outputs computes its last token as a decode). The prefix cache
        hears of the chunk's tokens (``PrefixCache.on_computed``): it may publish the full
        blocks. The caller advances ``num_computed_tokens``. Never fails."""
        seq_id = request.seq_id
        start = request.num_computed_tokens
        end = start + num_tokens
        promised = self._promises.promised(seq_id)
        num_slots = self.tables.num_blocks(seq_id)
        if self._window is not None and seq_id in self._promises:
            if promised < self._promises.peak(seq_id) - self.num_held_blocks(seq_id):
                self._repromise()  # short: top it up, evicting cached blocks if need be
                promised = self._promises.promised(seq_id)
            num_new = promised
            if not self._window.strict_bound:
                num_new += self.pool.num_free_blocks - self._promises.total
            end = min(end, (num_slots + num_new) * self.block_size)
            if end <= start:
                return 0
        self.allocator.grow([seq_id], [end])
        if seq_id in self._promises:
            num_left = request.num_tokens - end
            if num_left == 0 or (num_left == 1 and request.num_output_tokens):
                self._promises.drop(seq_id)  # what is left is a decode (or nothing)
            else:
                num_taken = self.tables.num_blocks(seq_id) - num_slots
                self._promises.set(
                    seq_id, self._promises.peak(seq_id), max(0, promised - num_taken)
                )
        if end > start:
            self.prefix.on_computed(request, end)
            if self._kv_events is not None:
                self._log_kv_events([(request, end // self._block_size)])
        return end - start

    def _try_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> bool:
        """Makes each sequence's table hold num_tokens[i] tokens, evicting if needed.
        Returns False, changing nothing, if the blocks are not there."""
        return self.allocator.try_grow(seq_ids, num_tokens, self._make_room_to_grow)

    def _try_make_room(self, num_blocks: int) -> bool:
        """``_make_room(num_blocks)`` if the reclaimable blocks cover them (``num_blocks <=
        num_reclaimable_blocks()``); else False, evicting nothing."""
        return self._reclaim(num_blocks + self._promises.total, all_or_nothing=True)

    def _make_room(self, num_blocks: int) -> bool:
        """Reclaims cached blocks until ``num_blocks`` are free beyond the prefill promises:
        first the pool's evictable blocks (the eviction plugin picks them), then those the
        prefix cache holds itself. Returns whether that many are free now (blocks reclaimed
        stay reclaimed)."""
        return self._reclaim(num_blocks + self._promises.total)

    def _reclaim(self, num_free_blocks: int, all_or_nothing: bool = False) -> bool:
        """Reclaims cached blocks until ``num_free_blocks`` are free; returns whether.
        ``all_or_nothing``: reclaims nothing, returning False, unless the evictable blocks
        and those the prefix cache would release cover the shortfall."""
        pool = self.pool
        shortfall = num_free_blocks - pool.num_free_blocks
        if shortfall <= 0:
            return True
        num_evictable = pool.num_evictable_blocks
        if all_or_nothing and shortfall > num_evictable + self._num_cache_only_blocks():
            return False
        if num_evictable:
            if self._hears_accesses:
                self._deliver_accesses()
            evicted = self.eviction.evict(min(shortfall, num_evictable))
            if self._hears_evictions:
                self.prefix.on_evicted(evicted)
            if self._tiers_on_evict is not None:
                self._tiers_on_evict.on_evicted(evicted, [True] * len(evicted))
            shortfall = num_free_blocks - pool.num_free_blocks
        while shortfall > 0 and self._num_cache_only_blocks():
            if self._hears_accesses:
                self._deliver_accesses()
            released = self.prefix.evict(shortfall, self._choose_victim)
            pool.free(released)
            if self._tiers_on_evict is not None:  # a block a table still holds stays
                is_free = [pool.ref_count(b) == 0 for b in released]
                self._tiers_on_evict.on_evicted(released, is_free)
            shortfall = num_free_blocks - pool.num_free_blocks
        return shortfall <= 0

    def _num_cache_only_blocks(self) -> int:
        """Blocks only a prefix cache holding references of its own (radix) keeps, which it
        would release (``PrefixCache.num_evictable_blocks``: an estimate from above)."""
        return self.prefix.num_evictable_blocks() if self._cache_holds_blocks else 0

    # -- computed tokens and release -----------------------------------------------------

    def _release_blocks(self, request: Request) -> int:
        """Drops every block reference of the request, and its prefill promise; returns how
        many blocks its table spans. Published blocks stay resident as evictable cache."""
        num_blocks: int = self.tables.num_blocks(request.seq_id)
        if self.tiers is not None:
            self.tiers.on_released(request, self.tables.block_ids(request.seq_id))
        self._promises.drop(request.seq_id)
        self._shared_tails.forget(request.seq_id)
        self.prefix.on_released(request)  # first: it may still publish the request's blocks
        self.allocator.release(request.seq_id)
        return num_blocks

    def _release_out_of_window(self, running: Sequence[Request]) -> int:
        """Lets the eviction policy give back blocks no future query of ``running`` can
        attend to; returns how many. With such a policy, the prefills are then promised
        again what they gave back (up to their peak), as far as the free blocks, after
        evicting cached ones, cover it: a released block another sequence still holds frees
        nothing, so a promise may stay short until that sequence lets go (this runs after
        every step, once the step's finished requests are released, so a short promise is
        topped up before anyone else takes the blocks they freed)."""
        if not self._has_windows:
            return 0
        num_released = self._release_ranges(self.eviction.ranges_out_of_window(running))
        if self._window is not None and len(self._promises):
            self._repromise()
        return num_released

    def _release_ranges(self, ranges: Sequence[BlockRange]) -> int:
        """Gives back the blocks of ``ranges`` (the eviction policy's decision), leaving
        holes; returns how many were still held."""
        if not ranges:
            return 0
        holes = self._hole_allocator()
        return sum(holes.release_range(r.seq_id, r.first, r.end) for r in ranges)

    def _repromise(self) -> None:
        """Raises each prefill's promise toward ``peak - held``, in admission order, as far
        as the free blocks (after evicting cached ones) cover all promises."""
        promises = self._promises
        wanted = {s: max(0, promises.peak(s) - self.num_held_blocks(s)) for s in promises}
        self._reclaim(sum(wanted.values()))
        room = self.pool.num_free_blocks - promises.total
        for seq_id, num_wanted in wanted.items():
            num_more = min(room, max(0, num_wanted - promises.promised(seq_id)))
            promises.set(seq_id, promises.peak(seq_id), promises.promised(seq_id) + num_more)
            room -= num_more

    def _export_tables(self, seq_ids: list[int]) -> np.ndarray:
        """int32 [len(seq_ids), widest table]: the sequences' block tables, padded (holes
        and padding are -1). Pure."""
        width = self.tables.max_num_blocks(seq_ids)
        out = np.empty((len(seq_ids), width), dtype=np.int32)
        self.tables.export_into(seq_ids, out, width)
        return out

    def _hole_allocator(self) -> HoleAllocator:
        if self._holes is None:
            raise KVCacheError(
                f"allocator {self.allocator.config.name!r} cannot leave holes in a block table"
            )
        return self._holes

    def _on_step_executed(self) -> None:
        """The executor has run the step last scheduled: copy-on-write sources are
        unpinned (a source that nothing else holds becomes evictable or free), host blocks
        swapped in are free for new swap-outs, and the prefix cache may index what the step
        computed."""
        if self._block_ops.pinned_block_ids:
            self.pool.free(self._block_ops.take_pins())
        self.swap_space.release_quarantined()
        if self._hears_steps:
            self.prefix.on_step_executed()

    def num_unused_slots(self, num_computed_tokens: int) -> int:
        """Token slots the block tables hold that no computed token fills: partial last
        blocks and reservations (``num_computed_tokens``: as for ``usage``). Pure."""
        allocator = self.allocator
        num_blocks = allocator.num_reserved_blocks() + allocator.num_hole_blocks()  # holes
        return num_blocks * self._block_size - num_computed_tokens

    # -- KV tiers ------------------------------------------------------------------------

    def _load_from_tiers(self, request: Request) -> int:
        """Right after ``request``'s admission with its cached prefix: loads the prompt's
        next full blocks that the tiers hold (up to its last token, which is computed to
        give logits), if moving them beats computing them; they are taken from its
        promise as a prefill chunk would take them, published to the prefix cache, and
        queued for the executor. Returns the tokens loaded (its ``num_computed_tokens``
        grows by them)."""
        tiers = self.tiers
        assert tiers is not None
        block_size = self._block_size
        start = request.num_computed_tokens
        if start % block_size:
            return 0  # the match ends inside a block; a tier holds whole blocks only
        first = start // block_size
        runs = tiers.find(request, first, (request.num_tokens - 1) // block_size)
        if not runs or not tiers.worth_loading(runs, start):
            return 0
        read = tiers.load(request, first, runs)
        if not read.num_blocks:
            return 0
        num_tokens = self.reserve_prefill(request, read.num_blocks * block_size)
        block_ids = self.tables.block_ids(request.seq_id)[first : first + read.num_blocks]
        self._block_ops.tier_load(read.load_ops(block_ids))
        request.num_computed_tokens = start + num_tokens
        return num_tokens

    def complete_tier_saves(self, payloads: Sequence[Payload]) -> None:
        """The executor ran the step: ``payloads`` are the blocks its tier saves read out
        (empty from one that moves no data); the tiers store them."""
        if self.tiers is not None:
            self.tiers.complete_saves(payloads)

    def take_tier_saves(self) -> list[TierSave]:
        """The tier saves queued since the last step, for a step of their own (the engine's
        while nothing else runs); completed by ``complete_tier_saves``."""
        return [] if self.tiers is None else self.tiers.take_saves()

    @property
    def has_queued_tier_saves(self) -> bool:
        """Whether blocks wait to be written down to a tier at the next step."""
        return self.tiers is not None and self.tiers.num_queued > 0

    def tier_stats(self) -> list[TierLevelStats]:
        """What each KV tier level did so far, fastest first (none without tiers)."""
        return [] if self.tiers is None else self.tiers.stats()

    # -- forks ---------------------------------------------------------------------------

    def fork(self, parent: Request, child: Request) -> None:
        """Gives ``child`` the parent's blocks, shared, and its computed tokens. If the
        parent's last block is only partly filled, each writer but the last gets a copy
        (``_try_copy_on_write``) before its write. Mutates pool and tables."""
        self._shared_tails.fork(parent, child)

    def _try_copy_on_write(self, decodes: Sequence[Request]) -> bool:
        """Before ``decodes`` write their next token: each that would write into a block
        another sequence still writes into gets a copy of it (queued for the executor).
        Returns False, copying nothing, if the blocks for the copies are not there
        (cached blocks it evicted trying stay evicted)."""
        writes = self._shared_tails.tail_writes(decodes)
        if not writes:
            return True
        # len(writes) is an upper bound: the last writer of a block copies nothing
        if not self._make_room_to_grow(len(writes)):
            return False
        self._shared_tails.copy_on_write(writes)
        return True

    # -- swapping ------------------------------------------------------------------------

    def _is_swapped(self, request: Request) -> bool:
        """True if the request's KV waits in the swap space for ``_swap_in``. Pure."""
        return request.seq_id in self.swap_space.swapped

    def _swap_out(self, request: Request) -> int | None:
        """Queues copies of the request's blocks (in logical order, holes skipped) to host
        blocks of the swap space, remembers where its table has holes, and releases the
        blocks; the request keeps its computed tokens. Returns the number of blocks, or
        None, changing nothing, if the swap space lacks room for them."""
        entries = self.tables.block_ids(request.seq_id)
        block_ids = [b for b in entries if b >= 0]
        if len(block_ids) > self.swap_space.num_free_blocks:
            return None
        self._block_ops.swap_out(block_ids, self.swap_space.put(request.seq_id, entries))
        self._release_blocks(request)
        return len(block_ids)

    def _num_blocks_to_restore(self, request: Request) -> int:
        """Free blocks swap_in takes for a swapped-out request (promised ones included)."""
        swapped = self.swap_space.swapped[request.seq_id]
        if request.is_prefilling:
            return max(swapped.num_blocks, self._peak_to_restore(request))
        return self.allocator.num_blocks_to_admit(request, 0) - swapped.num_holes

    def _peak_to_restore(self, request: Request) -> int:
        peak = self.allocator.num_blocks_to_admit(request, 0)
        return peak if self._window is None else min(peak, self._window.max_blocks_per_sequence)

    def _swap_in(self, request: Request) -> int:
        """Gives the swapped-out request a fresh block table with the layout it was swapped
        out with (through the allocator, making room): a block for each host block, in
        order, and its holes where they were; queues the copies back and returns their
        number. A request past its prompt gets room for its next token too, one still
        prefilling its promise. Keeps ``num_computed_tokens``. Raises OutOfBlocksError,
        changing nothing, if the room is not there (call _can_admit(request, NO_MATCH)
        first)."""
        seq_id = request.seq_id
        num_needed = self._num_blocks_to_restore(request)
        if not self._make_room(num_needed):
            raise OutOfBlocksError(
                f"restoring sequence {seq_id} needs {num_needed} free blocks beyond the "
                "prefill promises"
            )
        swapped = self.swap_space.take(seq_id)
        self.allocator.admit(request, [])
        num_slots = self.tables.num_blocks(seq_id)  # a reserving allocator's whole slab
        position = 0
        for is_hole, length in swapped.layout:
            position += length
            if position <= num_slots or length == 0:
                continue
            if is_hole:
                self._hole_allocator().append_holes(
                    seq_id, position - max(num_slots, position - length)
                )
            else:
                self.allocator.grow([seq_id], [position * self.block_size])
        entries = self.tables.block_ids(seq_id)[:position]
        self._block_ops.swap_in([b for b in entries if b >= 0], swapped.host_block_ids)
        if request.is_prefilling:
            self._promise(request, self._peak_to_restore(request))
        else:
            self.allocator.grow([seq_id], [request.num_tokens])
        return swapped.num_blocks

    def _forget(self, request: Request) -> None:
        """A waiting request that holds no blocks and has no computed tokens (never
        admitted, or preempted by recompute) will never be admitted (aborted): the prefix
        cache drops what it keeps for it (a match's memoized hashes), and a refusal of it is
        forgotten."""
        if self._refusal is not None and self._refusal.seq_id == request.seq_id:
            self._refusal = None
        self.prefix.on_released(request)
        if self.tiers is not None:
            self.tiers.forget(request)

    # -- checks --------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raises KVCacheError unless the pool, tables, swap space and prefix cache are each
        consistent,
        the free blocks cover the prefill promises, and every block's reference count equals
        the references held on it: by block tables, by copy-on-write pins, and by the prefix
        cache itself."""
        pool, tables = self.pool, self.tables
        pool.check_integrity()
        tables.check_integrity(pool)
        self.prefix.check_integrity()
        if self._hears_accesses:
            self._deliver_accesses()
            self.eviction.check_integrity()
        table_refs: Counter[int] = Counter()
        for seq_id in tables.seq_ids():
            table_refs.update(b for b in tables.block_ids(seq_id) if b >= 0)  # -1: a hole
        num_table_refs = sum(table_refs.values())
        if self.allocator.num_reserved_blocks() != num_table_refs:
            raise KVCacheError(
                f"the allocator counts {self.allocator.num_reserved_blocks()} reserved blocks "
                f"but the tables hold {num_table_refs}"
            )
        num_holes = sum(tables.num_holes(s) for s in tables.seq_ids())
        if self.allocator.num_hole_blocks() != num_holes:
            raise KVCacheError(
                f"the allocator counts {self.allocator.num_hole_blocks()} hole blocks but the "
                f"tables have {num_holes}"
            )
        held = {s: self.num_held_blocks(s) for s in tables.seq_ids()}
        self._promises.check(pool.num_free_blocks, held)
        self.swap_space.check_integrity()
        if self.tiers is not None:
            self.tiers.check_integrity(pool.num_blocks)
        holders = (
            table_refs
            + Counter(self._block_ops.pinned_block_ids)
            + Counter(self.prefix.held_block_ids())
        )
        for block_id, ref_count in enumerate(pool.ref_counts()):
            if ref_count != holders[block_id]:
                raise KVCacheError(
                    f"block {block_id} has ref_count {ref_count} but block tables, "
                    f"copy-on-write pins and prefix-cache references hold it {holders[block_id]} "
                    "times"
                )

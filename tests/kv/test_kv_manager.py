"""KVCacheManager built by hand, without an Engine: a backend (Rust or the Python twins), a
KV context over a small pool of the tiny model's blocks, and the built-in allocator,
prefix-cache and eviction plugins. Each test drives the manager through the scheduler's door
(``SchedulerCache``: admission, prefill chunks, decodes, forks, the step's block operations,
swaps, releases) the way the scheduler does, and asserts exact block counts after each
operation, with every cache invariant checked after every one.

Block ids follow from the pool's documented order: a new pool hands out 0, 1, 2, ...; a
freed block is the next one handed out (LIFO); a released table is freed last block first,
so of a released sequence's published blocks the tail is the least recently used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest
from enginekit_plugins.allocator.paged import PagedAllocator, PagedConfig
from enginekit_plugins.eviction.lru import LRUConfig, LRUEviction
from enginekit_plugins.eviction.sliding_window import SlidingWindowConfig, SlidingWindowEviction
from enginekit_plugins.prefix.block_hash import BlockHashConfig, BlockHashPrefixCache
from enginekit_plugins.prefix.none import NoPrefixCache, NoPrefixConfig
from enginekit_plugins.prefix.radix import RadixConfig, RadixPrefixCache
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit.interfaces.eviction import AttentionSpan
from enginekit.interfaces.prefix import NO_MATCH, PrefixMatch
from enginekit.interfaces.scheduler_cache import Admission, StepBlocks
from enginekit.kv.backend import make_backend, make_context
from enginekit.kv.manager import KVCacheManager
from enginekit.request import Request, SamplingParams
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.step import BlockCopy, BlockSwap

BLOCK = 4
SPEC = KVSpec.of(model_preset("tiny"), bits_per_element=32, block_size=BLOCK)
MAX_MODEL_LEN = 64
PREFIXES = {
    "none": lambda context: NoPrefixCache(NoPrefixConfig(), context),
    "block_hash": lambda context: BlockHashPrefixCache(BlockHashConfig(), context),
    "radix": lambda context: RadixPrefixCache(RadixConfig(), context),
}


def make_manager(
    native: bool,
    num_blocks: int = 16,
    prefix: str = "block_hash",
    window: int | None = None,
    sinks: int | None = None,
    strict_bound: bool = False,
    watermark: float = 0.0,
    num_swap_blocks: int = 0,
) -> KVCacheManager:
    """A manager over ``num_blocks`` blocks of 4 tokens: paged allocator, the named prefix
    cache, and lru eviction, or sliding_window when ``window`` is set (attention resolved by
    the policy itself, as the engine does)."""
    backend = make_backend(native)
    if window is None:
        eviction_cls, eviction_config = LRUEviction, LRUConfig()
    else:
        eviction_cls = SlidingWindowEviction
        eviction_config = SlidingWindowConfig(
            window=window, sink_tokens=sinks, strict_bound=strict_bound
        )
    attention = eviction_cls.attention(eviction_config, None)
    context = make_context(backend, num_blocks, SPEC, MAX_MODEL_LEN, attention)
    return KVCacheManager(
        context,
        PagedAllocator(PagedConfig(), context),
        PREFIXES[prefix](context),
        eviction_cls(eviction_config, context),  # type: ignore[arg-type]
        watermark=watermark,
        num_swap_blocks=num_swap_blocks,
    )


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def request(seq_id: int, prompt: Sequence[int], extra_key: bytes | None = None) -> Request:
    return Request(str(seq_id), seq_id, list(prompt), SamplingParams(max_tokens=32), 0.0, extra_key)


def match(manager: KVCacheManager, r: Request) -> PrefixMatch:
    """What the prefix cache serves ``r`` now (a probe: ``r`` is not admitted)."""
    return manager.prefix.match(r)


def admit(manager: KVCacheManager, r: Request) -> Admission:
    """Admits (or restores) ``r`` as the scheduler does when the step schedules nothing
    else; it must fit. Returns how."""
    admission = manager.admit(r, step_has_work=False)
    assert admission is not None
    if not admission.restored:
        assert r.num_computed_tokens == admission.num_matched_tokens
    manager.check_integrity()
    return admission


def prefill(manager: KVCacheManager, r: Request, num_tokens: int | None = None) -> int:
    """Schedules a chunk of ``r``'s prefill (the rest by default) as the scheduler does:
    reserve (the prefix cache hears of the chunk), advance its computed tokens. Returns the
    chunk's length."""
    if num_tokens is None:
        num_tokens = r.num_tokens - r.num_computed_tokens
    num_new = manager.reserve_prefill(r, num_tokens)
    r.num_computed_tokens += num_new
    manager.check_integrity()
    return num_new


def take_ops(manager: KVCacheManager) -> tuple[list[BlockCopy], list[BlockSwap], list[BlockSwap]]:
    """The block operations queued since the last step: (copies, swap-outs, swap-ins)."""
    copies, swap_outs, swap_ins, tables, *_ = manager.take_step_blocks([], [], None)
    assert tables is None
    return copies, swap_outs, swap_ins


def step_done(manager: KVCacheManager, running: Sequence[Request] = ()) -> int:
    """The step is scheduled (its block operations taken) and the executor ran it: pins
    dropped, swapped-in host blocks freed, and the blocks out of ``running``'s windows
    released. Returns how many blocks ``running`` held before less after: those the window
    released."""
    take_ops(manager)
    num_held = sum(manager.num_held_blocks(r.seq_id) for r in running)
    manager.finish_step([], running)
    manager.check_integrity()
    return num_held - sum(manager.num_held_blocks(r.seq_id) for r in running)


def decode(manager: KVCacheManager, requests: Sequence[Request]) -> StepBlocks:
    """One decode of each request (one token left to compute), as the scheduler does: grow
    (with the copies of shared tails), then the step closes, publishing the blocks the
    decodes fill. Returns what the step hands the executor."""
    assert manager.grow([r.seq_id for r in requests], [r.num_tokens for r in requests], requests)
    for r in requests:
        r.num_computed_tokens = r.num_tokens
    filled = [r for r in requests if r.num_computed_tokens % BLOCK == 0]
    blocks = manager.take_step_blocks(filled, [r.num_computed_tokens for r in filled], None)
    manager.check_integrity()
    return blocks


def release(manager: KVCacheManager, r: Request) -> int:
    """Releases the running ``r`` (finished or aborted); returns how many blocks its table
    spanned."""
    num_blocks = manager.tables.num_blocks(r.seq_id)
    assert manager.release(r) is None
    assert r.seq_id not in manager.tables.seq_ids()
    manager.check_integrity()
    return num_blocks


def is_swapped(manager: KVCacheManager, r: Request) -> bool:
    return r.seq_id in manager.swap_space.swapped


def free_and_evictable(manager: KVCacheManager) -> tuple[int, int]:
    return manager.pool.num_free_blocks, manager.pool.num_evictable_blocks


def count_matches(manager: KVCacheManager) -> Callable[[Request], tuple[Admission | None, int]]:
    """Counts the prefix cache's matches (a refused request that nothing since can have let
    in is refused without one): returns a function that admits a request through the door
    and says how, and how many matches that took."""
    matches: list[int] = []
    prefix_match = manager.prefix.match

    def counted(r: Request) -> PrefixMatch:
        matches.append(r.seq_id)
        return prefix_match(r)

    manager.prefix.match = counted  # type: ignore[method-assign, assignment]

    def try_admit(r: Request) -> tuple[Admission | None, int]:
        num_before = len(matches)
        admission = manager.admit(r, step_has_work=False)
        manager.check_integrity()
        return admission, len(matches) - num_before

    return try_admit


@contextmanager
def room_estimated_from_above(manager: KVCacheManager, num_blocks: int) -> Iterator[None]:
    """Admission's estimate of the room (``num_reclaimable_blocks``) counts ``num_blocks``
    more than can be reclaimed, as a prefix cache holding blocks of its own (radix) may
    estimate: an admission it allows can then fall short while it makes room."""
    actual = manager.num_reclaimable_blocks
    manager.num_reclaimable_blocks = lambda: actual() + num_blocks  # type: ignore[method-assign]
    try:
        yield
    finally:
        del manager.num_reclaimable_blocks


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


# -- admission and the prefill promise ----------------------------------------------------


def test_admission_without_a_hit_promises_the_prompt_and_each_chunk_takes_its_blocks(native):
    manager = make_manager(native)
    r = request(0, tokens(10))
    assert match(manager, r) == PrefixMatch([], 0)
    assert manager.admit(r, step_has_work=False) == Admission(False, 0, 0)
    manager.check_integrity()
    # Paged admission allocates nothing: it promises ceil(10 / 4) = 3 blocks.
    assert manager.tables.block_ids(0) == []
    assert r.num_computed_tokens == 0
    assert manager.num_promised_blocks == 3
    assert manager.num_reclaimable_blocks() == 16 - 3
    assert prefill(manager, r, 6) == 6  # tokens 0..5: blocks 0 and 1, out of the promise
    assert manager.tables.block_ids(0) == [0, 1]
    assert manager.num_promised_blocks == 1
    assert free_and_evictable(manager) == (14, 0)
    assert prefill(manager, r, 4) == 4  # the last chunk ends the promise
    assert manager.tables.block_ids(0) == [0, 1, 2]
    assert manager.num_promised_blocks == 0
    usage = manager.usage(r.num_computed_tokens)
    assert (usage.num_table_blocks, usage.num_unused_slots) == (3, 12 - 10)


def test_promised_blocks_are_kept_from_other_admissions(native):
    manager = make_manager(native, num_blocks=8, prefix="none")
    first = request(0, tokens(20))  # 5 blocks promised, none held yet
    admit(manager, first)
    assert manager.num_promised_blocks == 5
    assert manager.num_reclaimable_blocks() == 3
    # Together with another, or alone: 4 blocks are not there.
    assert manager.admit_together([request(1, tokens(13, 100))], step_has_work=False) is None
    assert manager.tables.seq_ids() == [0]
    assert prefill(manager, first, 8) == 8  # 2 blocks out of the promise: 3 still promised
    assert manager.num_promised_blocks == 3
    assert manager.num_reclaimable_blocks() == 8 - 2 - 3
    # Admission makes room beyond the promise: 3 free blocks beyond it exist, 4 do not.
    assert manager.admit(request(1, tokens(13, 100)), step_has_work=False) is None
    manager.check_integrity()
    assert manager.tables.seq_ids() == [0]
    assert manager.num_promised_blocks == 3
    assert admit(manager, request(2, tokens(12, 100))) == Admission(False, 0, 0)
    assert manager.num_promised_blocks == 6
    assert manager.pool.num_free_blocks == 6
    assert manager.num_reclaimable_blocks() == 0


def test_a_prefix_hit_shares_the_cached_blocks_and_never_the_last_token(native):
    manager = make_manager(native)
    first = request(0, tokens(10))
    admit(manager, first)
    prefill(manager, first)  # blocks 0, 1, 2; the full ones (0, 1) are published
    step_done(manager)
    second = request(1, tokens(8) + tokens(4, 100))
    assert match(manager, second) == PrefixMatch([0, 1], 8)
    assert admit(manager, second) == Admission(False, 8, 0)
    assert second.num_computed_tokens == 8
    assert manager.tables.block_ids(1) == [0, 1]
    assert [manager.pool.ref_count(b) for b in (0, 1, 2)] == [2, 2, 1]
    assert manager.num_promised_blocks == 1  # 3 blocks at its peak, 2 shared
    assert prefill(manager, second) == 4
    assert manager.tables.block_ids(1) == [0, 1, 3]
    # A prompt that is all cached still computes its last token: (8 - 1) // 4 = 1 block.
    assert match(manager, request(2, tokens(8))) == PrefixMatch([0], 4)
    # Another extra key (tenant salt) shares nothing.
    assert match(manager, request(3, tokens(10), extra_key=b"tenant")) == NO_MATCH


def test_the_watermark_guards_admission_only_once_a_sequence_holds_blocks(native):
    manager = make_manager(native, prefix="none", watermark=0.25)
    assert manager.num_watermark_blocks == 4  # int(0.25 * 16)
    # No sequence holds a block: the watermark protects nothing (it counts 0 blocks), and a
    # request that takes the whole pool is admitted.
    whole = request(9, tokens(63))  # 16 blocks: the whole pool
    assert manager.admit_together([whole], step_has_work=False) == [Admission(False, 0, 0)]
    release(manager, whole)
    first = request(0, tokens(20))
    admit(manager, first)
    prefill(manager, first)  # holds 5 blocks: 11 reclaimable
    assert manager.num_reclaimable_blocks() == 11
    # Now the watermark counts its 4 blocks.
    assert manager.admit_together([request(1, tokens(29, 100))], False) is None  # 8 + 4 > 11
    assert manager.admit(request(1, tokens(29, 100)), step_has_work=False) is None
    assert manager.tables.seq_ids() == [0]
    assert admit(manager, request(2, tokens(28, 100))) == Admission(False, 0, 0)
    assert manager.num_promised_blocks == 7


def _evictable_prefix_and_a_holder(native: bool) -> KVCacheManager:
    """12 blocks: a released 17-token prompt left blocks 0..3 evictable (in LRU order
    3, 2, 1, 0; block 4 was never published and is free again); a running 8-token request
    then took blocks 4 and 5. Free 6, evictable 4."""
    manager = make_manager(native, num_blocks=12)
    gone = request(0, tokens(17))
    admit(manager, gone)
    prefill(manager, gone)
    step_done(manager)
    assert release(manager, gone) == 5
    holder = request(1, tokens(8, 200))
    admit(manager, holder)
    prefill(manager, holder)
    assert manager.tables.block_ids(1) == [4, 5]
    assert free_and_evictable(manager) == (6, 4)
    assert manager.pool.evictable_block_ids() == [3, 2, 1, 0]
    return manager


def test_matched_evictable_blocks_count_against_the_room(native):
    manager = _evictable_prefix_and_a_holder(native)
    # 16 matched tokens (blocks 0..3, all evictable) + 24 more: 10 blocks, 6 new. Room:
    # 6 free + 4 evictable, less the 4 evictable ones it would pin = 6.
    fits = request(2, tokens(16) + tokens(24, 100))
    assert match(manager, fits) == PrefixMatch([0, 1, 2, 3], 16)
    # One token more needs 7 new blocks: 10 would be free or evictable, but not once 4 of
    # them are pinned by the match (and without the hit it needs 11). Refused: nothing
    # changes.
    too_long = request(2, tokens(16) + tokens(25, 100))
    assert match(manager, too_long) == PrefixMatch([0, 1, 2, 3], 16)
    assert manager.admit(too_long, step_has_work=False) is None
    manager.check_integrity()
    assert free_and_evictable(manager) == (6, 4)
    assert manager.tables.seq_ids() == [1]
    assert too_long.num_computed_tokens == 0
    # The one that fits is admitted with the hit.
    assert admit(manager, fits) == Admission(False, 16, 0)
    assert manager.tables.block_ids(2) == [0, 1, 2, 3]
    assert manager.num_promised_blocks == 6
    assert free_and_evictable(manager) == (6, 0)


def test_a_failed_admission_leaves_the_eviction_order_as_it_was(native):
    manager = _evictable_prefix_and_a_holder(native)
    too_long = request(2, tokens(16) + tokens(25, 100))
    # With one block too many in the estimate, the hit is let in (7 new <= 11 - 4 pinned),
    # and falls short once its 4 matched blocks are pinned: both tries give up.
    with room_estimated_from_above(manager, 1):
        assert manager.admit(too_long, step_has_work=False) is None
    manager.check_integrity()
    assert manager.pool.evictable_block_ids() == [3, 2, 1, 0]
    assert free_and_evictable(manager) == (6, 4)
    assert manager.tables.seq_ids() == [1]
    # Evicting one block must cost the prefix one block, not all of it: 7 blocks promised
    # with 6 free evict one.
    assert admit(manager, request(3, tokens(28, 300))) == Admission(False, 0, 0)
    assert free_and_evictable(manager) == (7, 3)
    assert match(manager, request(4, tokens(17))) == PrefixMatch([0, 1, 2], 12)


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_a_refused_request_stays_refused_until_room_frees(native, prefix):
    manager = make_manager(native, num_blocks=8, prefix=prefix)
    holder = request(1, tokens(24, 500))  # 6 blocks, 2 left
    admit(manager, holder)
    prefill(manager, holder)
    try_admit = count_matches(manager)
    waiting = request(2, tokens(16, 900))  # needs 4
    assert try_admit(waiting) == (None, 1)  # never refused: it must be matched
    assert try_admit(waiting) == (None, 0)  # still refused: not matched again
    assert try_admit(request(2, tokens(17, 900))) == (None, 1)  # its tokens changed
    assert try_admit(waiting) == (None, 1)  # the last refusal was of 17 tokens
    assert try_admit(waiting) == (None, 0)
    assert try_admit(request(3, tokens(16, 900))) == (None, 1)  # another request
    assert try_admit(waiting) == (None, 1)  # the last refusal was of another request
    assert try_admit(waiting) == (None, 0)
    assert manager.tables.seq_ids() == [1]
    release(manager, holder)
    assert try_admit(waiting) == (Admission(False, 0, 0), 1)  # room freed: matched, admitted
    assert manager.num_promised_blocks == 4


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_a_refused_request_is_matched_again_once_its_next_block_is_cached(native, prefix):
    # The refused request's prompt continues a running one: when that one computes the
    # block after the refused match, a longer match may fit where the room has not grown.
    manager = make_manager(native, num_blocks=8, prefix=prefix)
    writer = request(1, tokens(8))
    admit(manager, writer)
    prefill(manager, writer, 4)  # its first block is cached, its second not yet
    other = request(3, tokens(8, 500))
    admit(manager, other)
    prefill(manager, other)
    step_done(manager)
    waiting = request(2, tokens(12) + tokens(12, 900))  # 6 blocks, 1 matched
    assert match(manager, waiting).num_tokens == 4
    try_admit = count_matches(manager)
    assert try_admit(waiting) == (None, 1)  # 5 new blocks (6 without the hit), room for 4
    assert try_admit(waiting) == (None, 0)  # still refused
    room = manager.num_reclaimable_blocks()
    prefill(manager, writer)  # computes the block after the match
    step_done(manager)
    assert manager.num_reclaimable_blocks() == room  # its promised block: no more room
    # Matched again: 8 tokens now, 4 new blocks, which fit.
    assert try_admit(waiting) == (Admission(False, 8, 0), 1)
    assert manager.tables.block_ids(2) == manager.tables.block_ids(1)  # the writer's
    # A waiting request given up is forgotten, its refusal with it.
    late = request(4, tokens(8, 700))  # 2 blocks, no room left
    assert try_admit(late) == (None, 1)
    assert try_admit(late) == (None, 0)
    assert manager.release(late) is None
    manager.check_integrity()
    assert try_admit(late) == (None, 1)


# -- growth and eviction ------------------------------------------------------------------


def test_admission_evicts_the_shortfall_oldest_first_and_the_cache_forgets_it(native):
    manager = make_manager(native, num_blocks=8)
    gone = request(0, tokens(17))
    admit(manager, gone)
    prefill(manager, gone)
    step_done(manager)
    release(manager, gone)
    assert free_and_evictable(manager) == (4, 4)  # blocks 4..7 free; 3, 2, 1, 0 evictable
    assert match(manager, request(9, tokens(17))) == PrefixMatch([0, 1, 2, 3], 16)
    # Admission makes room for the 5 blocks it promises, with 4 free: short of 1, it evicts
    # block 3, the tail released first.
    assert admit(manager, request(1, tokens(20, 500))) == Admission(False, 0, 0)
    assert manager.num_promised_blocks == 5
    assert free_and_evictable(manager) == (5, 3)
    assert match(manager, request(9, tokens(17))) == PrefixMatch([0, 1, 2], 12)
    # The promise of 5 blocks raises what the next admission must leave free: 1 + 5 = 6,
    # one more.
    assert admit(manager, request(2, tokens(4, 100))) == Admission(False, 0, 0)
    assert manager.num_promised_blocks == 6
    assert free_and_evictable(manager) == (6, 2)
    assert match(manager, request(9, tokens(17))) == PrefixMatch([0, 1], 8)
    # Asking for more than exists (an estimate from above let it in) evicts everything and
    # says no: 3 more blocks with 2 reclaimable.
    with room_estimated_from_above(manager, 1):
        assert manager.admit(request(3, tokens(12, 200)), step_has_work=False) is None
    manager.check_integrity()
    assert free_and_evictable(manager) == (8, 0)
    assert manager.tables.seq_ids() == [1, 2]
    assert match(manager, request(9, tokens(17))) == NO_MATCH


def test_decode_growth_takes_a_block_per_four_tokens_and_evicts_under_pressure(native):
    manager = make_manager(native, num_blocks=4)
    a, b = request(0, tokens(8)), request(1, tokens(8, 100))
    admit(manager, a)
    admit(manager, b)
    prefill(manager, a)
    prefill(manager, b)
    assert (manager.tables.block_ids(0), manager.tables.block_ids(1)) == ([0, 1], [2, 3])
    a.token_ids.append(50)
    b.token_ids.append(51)
    assert not manager.grow([0, 1], [9, 9], [a, b])  # 2 blocks needed, none free or evictable
    manager.check_integrity()
    assert (manager.tables.block_ids(0), manager.tables.block_ids(1)) == ([0, 1], [2, 3])
    assert release(manager, b) == 2  # its published blocks stay, evictable: 3 then 2
    assert free_and_evictable(manager) == (0, 2)
    assert not manager.grow([0], [17], [a])  # 3 blocks needed, 2 evictable: none evicted
    assert free_and_evictable(manager) == (0, 2)
    assert manager.grow([0], [9], [a])  # evicts block 3 and takes it
    manager.check_integrity()
    assert manager.tables.block_ids(0) == [0, 1, 3]
    assert match(manager, request(2, tokens(8, 100))) == PrefixMatch([2], 4)
    assert manager.grow([0], [12], [a])  # 3 blocks hold 12 tokens: nothing taken
    assert free_and_evictable(manager) == (0, 1)
    assert manager.grow([0], [13], [a])
    manager.check_integrity()
    assert manager.tables.block_ids(0) == [0, 1, 3, 2]
    assert match(manager, request(2, tokens(8, 100))) == NO_MATCH
    assert not manager.grow([0], [17], [a])
    assert manager.tables.block_ids(0) == [0, 1, 3, 2]


class NewestFirstEviction(LRUEviction):
    """A policy with an ``evict`` of its own: the block released last goes first."""

    def evict(self, num_blocks: int) -> list[int]:
        victims = self.kv.pool.evictable_block_ids()[::-1][:num_blocks]
        for block_id in victims:
            self.kv.pool.evict(block_id)
        return victims


def test_decode_growth_evicts_what_an_eviction_policy_of_its_own_chooses(native):
    context = make_context(make_backend(native), 4, SPEC, MAX_MODEL_LEN, AttentionSpan(None))
    manager = KVCacheManager(
        context,
        PagedAllocator(PagedConfig(), context),
        BlockHashPrefixCache(BlockHashConfig(), context),
        NewestFirstEviction(LRUConfig(), context),
        watermark=0.0,
    )
    a, b = request(0, tokens(8)), request(1, tokens(8, 100))
    for r in (a, b):
        admit(manager, r)
        prefill(manager, r)
    a.token_ids.append(50)
    assert release(manager, b) == 2  # evictable: 3 then 2
    assert manager.grow([0], [9], [a])  # the policy's choice: block 2, not block 3
    manager.check_integrity()
    assert manager.tables.block_ids(0) == [0, 1, 2]
    assert match(manager, request(2, tokens(8, 100))) == NO_MATCH  # its first block is gone
    assert free_and_evictable(manager) == (0, 1)


def test_a_released_prompt_and_its_outputs_are_matched_again(native):
    manager = make_manager(native)
    first = request(0, tokens(13))
    admit(manager, first)
    prefill(manager, first)  # blocks 0..3; blocks 0..2 full and published
    step_done(manager)
    for token in (100, 101, 102):
        first.token_ids.append(token)
        decode(manager, [first])  # at 16 computed tokens block 3 fills and is published
        step_done(manager)
    first.token_ids.append(103)  # sampled by the last decode, not computed yet
    assert (first.num_tokens, first.num_computed_tokens) == (17, 16)
    assert manager.tables.block_ids(0) == [0, 1, 2, 3]
    assert release(manager, first) == 4
    assert free_and_evictable(manager) == (12, 4)
    assert match(manager, request(1, tokens(13))) == PrefixMatch([0, 1, 2], 12)
    again = request(1, first.token_ids)  # prompt and outputs, as a recomputed request
    assert match(manager, again) == PrefixMatch([0, 1, 2, 3], 16)
    assert admit(manager, again) == Admission(False, 16, 0)
    assert again.num_computed_tokens == 16
    assert manager.num_promised_blocks == 1  # 5 blocks at its peak, 4 matched
    assert free_and_evictable(manager) == (12, 0)
    assert prefill(manager, again) == 1
    assert manager.tables.block_ids(1) == [0, 1, 2, 3, 4]


# -- forks and copy-on-write --------------------------------------------------------------


def test_a_fork_shares_every_block_and_copies_the_partly_filled_one_before_writing(native):
    manager = make_manager(native, prefix="none")
    parent = request(0, tokens(10))
    admit(manager, parent)
    prefill(manager, parent)
    step_done(manager)
    child = request(1, tokens(10))
    manager.fork(parent, child)
    manager.check_integrity()
    assert child.num_computed_tokens == 10
    assert manager.tables.block_ids(1) == [0, 1, 2]
    assert [manager.pool.ref_count(b) for b in (0, 1, 2)] == [2, 2, 2]
    parent.token_ids.append(50)
    child.token_ids.append(60)
    assert manager.pool.num_free_blocks == 13
    # Block 2 has room for token 10 of both: the tables grow by no block. Both write slot 2
    # of block 2: the first writer gets a copy (the one block taken), the last writes in
    # place.
    assert manager.grow([0, 1], [11, 11], [parent, child])
    manager.check_integrity()
    assert manager.tables.block_ids(0) == [0, 1, 3]
    assert manager.tables.block_ids(1) == [0, 1, 2]
    assert manager.pool.num_free_blocks == 12
    assert manager.pool.ref_count(2) == 2  # the child's table and the copy's pin
    assert manager.take_step_blocks([], [], None) == StepBlocks([BlockCopy(2, 3)], [], [], None)
    assert take_ops(manager) == ([], [], [])
    manager.finish_step([], [parent, child])  # the copy ran: its source is unpinned
    manager.check_integrity()
    assert [manager.pool.ref_count(b) for b in (0, 1, 2, 3)] == [2, 2, 1, 1]
    for r in (parent, child):
        r.num_computed_tokens = 11
        r.token_ids.append(70)
    assert manager.grow([0, 1], [12, 12], [parent, child])  # each owns its tail now
    assert manager.pool.num_free_blocks == 12
    assert take_ops(manager) == ([], [], [])


def test_forks_of_a_full_last_block_write_fresh_blocks_and_copy_nothing(native):
    manager = make_manager(native, prefix="none")
    parent = request(0, tokens(8))
    admit(manager, parent)
    prefill(manager, parent)
    child = request(1, tokens(8))
    manager.fork(parent, child)
    parent.token_ids.append(50)
    child.token_ids.append(60)
    assert decode(manager, [parent, child])[:3] == ([], [], [])
    assert manager.tables.block_ids(0) == [0, 1, 2]
    assert manager.tables.block_ids(1) == [0, 1, 3]


def test_copy_on_write_without_room_copies_nothing_and_the_last_writer_needs_none(native):
    manager = make_manager(native, num_blocks=3, prefix="none")
    parent = request(0, tokens(10))
    admit(manager, parent)
    prefill(manager, parent)
    child = request(1, tokens(10))
    manager.fork(parent, child)
    parent.token_ids.append(50)
    child.token_ids.append(60)
    assert not manager.grow([0, 1], [11, 11], [parent, child])  # no block for the copy
    manager.check_integrity()
    assert take_ops(manager) == ([], [], [])
    assert manager.tables.block_ids(0) == manager.tables.block_ids(1) == [0, 1, 2]
    assert release(manager, child) == 3
    assert manager.grow([0], [11], [parent])  # the only writer left writes in place
    assert take_ops(manager) == ([], [], [])
    assert [manager.pool.ref_count(b) for b in (0, 1, 2)] == [1, 1, 1]


def test_a_fork_does_not_share_the_block_held_for_the_next_token(native):
    manager = make_manager(native, prefix="none", num_swap_blocks=4)
    parent = request(0, tokens(8))
    admit(manager, parent)
    prefill(manager, parent)
    step_done(manager)
    parent.token_ids.append(50)  # decoding: 8 computed, its token 8 opens block index 2
    assert manager.release(parent, swap_out=True) == 2
    assert admit(manager, parent) == Admission(True, 0, 2)  # and a block for token 8
    step_done(manager)
    assert manager.tables.block_ids(0) == [0, 1, 2]
    child = request(1, tokens(8))
    child.token_ids.append(60)
    manager.fork(parent, child)
    decode(manager, [parent, child])
    # Both wrote position 8, a different token each: not into one block.
    assert manager.tables.block_id_at(0, 2) != manager.tables.block_id_at(1, 2)


# -- swapping ------------------------------------------------------------------------------


def test_swap_out_and_in_move_the_blocks_through_the_swap_space(native):
    manager = make_manager(native, num_swap_blocks=4)
    r = request(0, tokens(10))
    admit(manager, r)
    prefill(manager, r)
    step_done(manager)
    r.token_ids.append(50)  # decoding: 10 computed, 11 tokens
    assert manager.release(r, swap_out=True) == 3
    manager.check_integrity()
    assert is_swapped(manager, r)
    assert manager.tables.seq_ids() == []
    assert r.num_computed_tokens == 10
    assert free_and_evictable(manager) == (14, 2)  # its 2 published blocks stay cached
    assert manager.swap_space.num_free_blocks == 1
    assert take_ops(manager) == ([], [BlockSwap(0, 0), BlockSwap(1, 1), BlockSwap(2, 2)], [])
    other = request(1, tokens(10, 100))
    admit(manager, other)
    prefill(manager, other)
    assert manager.tables.block_ids(1) == [2, 3, 4]  # block 2 was freed last
    # Back in: fresh blocks, copies queued from host blocks 0..2 in order.
    assert manager.admit(r, step_has_work=False) == Admission(True, 0, 3)
    manager.check_integrity()
    assert not is_swapped(manager, r)
    assert manager.tables.block_ids(0) == [5, 6, 7]
    assert r.num_computed_tokens == 10
    assert take_ops(manager) == ([], [], [BlockSwap(5, 0), BlockSwap(6, 1), BlockSwap(7, 2)])
    # The host blocks stay quarantined until the step reading them has run.
    assert manager.swap_space.num_free_blocks == 1
    # Another 3-block sequence finds 1 host block free: its swap-out is refused (no host
    # block taken, no copy queued), and it is released instead, to compute again.
    assert manager.release(other, swap_out=True) is None
    manager.check_integrity()
    assert not is_swapped(manager, other)
    assert manager.swap_space.num_free_blocks == 1
    assert take_ops(manager) == ([], [], [])
    assert manager.tables.seq_ids() == [0]
    manager.finish_step([], [r])
    manager.check_integrity()
    assert manager.swap_space.num_free_blocks == 4


def test_a_prefill_swapped_in_gets_its_promise_back(native):
    manager = make_manager(native, prefix="none", num_swap_blocks=8)
    r = request(0, tokens(20))
    admit(manager, r)
    prefill(manager, r, 8)
    assert manager.num_promised_blocks == 3
    assert manager.release(r, swap_out=True) == 2
    manager.check_integrity()
    assert manager.num_promised_blocks == 0
    assert manager.pool.num_free_blocks == 16
    assert admit(manager, r) == Admission(True, 0, 2)
    assert manager.tables.block_ids(0) == [0, 1]  # freed last block first: 0 is on top
    assert manager.num_promised_blocks == 3  # peak 5, 2 held
    assert prefill(manager, r) == 12
    assert manager.num_held_blocks(0) == 5


def test_a_swapped_sequence_that_is_dropped_gives_its_host_blocks_back(native):
    manager = make_manager(native, prefix="none", num_swap_blocks=4)
    r = request(0, tokens(10))
    admit(manager, r)
    prefill(manager, r)
    assert manager.release(r, swap_out=True) == 3
    assert manager.swap_space.num_used_blocks == 3
    assert manager.release(r) is None  # swapped out: its host blocks go
    manager.check_integrity()
    assert not is_swapped(manager, r)
    assert manager.swap_space.num_used_blocks == 0
    assert manager.swap_space.num_free_blocks == 1  # quarantined until the step ran
    step_done(manager)
    assert manager.swap_space.num_free_blocks == 4
    assert manager.pool.num_free_blocks == 16


# -- the sliding window -------------------------------------------------------------------

# window 8 tokens, 4 sink tokens, 4-token blocks: 1 sink block, and a sequence holds at most
# 1 + ceil(8 / 4) + 1 = 4 blocks. The next query at position p reaches blocks from
# (p - 8 + 1) // 4 on. The blocks out of the window are released when a step has run
# (``finish_step``, which ``step_done`` counts them by).


def test_the_window_releases_the_blocks_it_no_longer_reaches(native):
    manager = make_manager(native, window=8, sinks=4)
    assert manager.eviction.max_blocks_per_sequence == 4
    r = request(0, tokens(24))
    admit(manager, r)
    assert manager.num_promised_blocks == 4  # the bound, not the prompt's 6 blocks
    # Not strict: the chunk may also use the 12 blocks no one is promised.
    assert prefill(manager, r) == 24
    assert manager.tables.block_ids(0) == [0, 1, 2, 3, 4, 5]
    # Next query at 24 reaches from block (24 - 7) // 4 = 4: blocks 1..3 go.
    assert step_done(manager, [r]) == 3
    assert manager.tables.block_ids(0) == [0, -1, -1, -1, 4, 5]
    assert manager.num_held_blocks(0) == 3
    assert free_and_evictable(manager) == (10, 3)  # published before release: cached
    assert step_done(manager, [r]) == 0
    for token, released in ((50, 0), (51, 0), (52, 1), (53, 0)):
        r.token_ids.append(token)
        decode(manager, [r])
        # computed 25..28: the window starts at block 18 // 4 = 4, 19 // 4 = 4, then
        # 20 // 4 = 5 (block 4 goes) and 21 // 4 = 5
        assert step_done(manager, [r]) == released
    assert manager.tables.block_ids(0) == [0, -1, -1, -1, -1, 5, 6]
    assert manager.num_held_blocks(0) == 3
    assert release(manager, r) == 7  # the table spans its holes too


def test_a_strict_window_grows_a_long_prefill_by_its_promise(native):
    manager = make_manager(native, prefix="none", window=8, sinks=4, strict_bound=True)
    r = request(0, tokens(24))
    admit(manager, r)
    assert prefill(manager, r) == 16  # 4 promised blocks hold 16 tokens
    assert manager.num_promised_blocks == 0
    # The query at 16 reaches from block 9 // 4 = 2: block 1 goes, and is promised again.
    assert step_done(manager, [r]) == 1
    assert manager.num_promised_blocks == 1
    assert prefill(manager, r) == 4  # one block per step past the window
    assert step_done(manager, [r]) == 1  # at 20: from block 13 // 4 = 3
    assert prefill(manager, r) == 4
    assert manager.num_promised_blocks == 0  # the prefill is done
    # Without a prefix cache each released block is free, and the next one handed out.
    assert manager.tables.block_ids(0) == [0, -1, -1, 3, 1, 2]
    assert step_done(manager, [r]) == 1  # at 24: from block 4
    assert manager.num_held_blocks(0) == 3


def test_a_windowed_hit_releases_the_matched_blocks_outside_the_window(native):
    manager = make_manager(native, window=8, sinks=4)
    first = request(0, tokens(24))
    admit(manager, first)
    prefill(manager, first)  # 6 full blocks, all published
    step_done(manager)
    release(manager, first)
    assert free_and_evictable(manager) == (10, 6)
    second = request(1, tokens(28))
    assert match(manager, second) == PrefixMatch([0, 1, 2, 3, 4, 5], 24)
    assert admit(manager, second) == Admission(False, 24, 0)
    # It keeps the sink block and those from block 4: peak 4, 3 kept, 1 promised.
    assert manager.tables.block_ids(1) == [0, -1, -1, -1, 4, 5]
    assert manager.num_promised_blocks == 1
    assert free_and_evictable(manager) == (10, 3)


def radix_with_a_released_prompt(native: bool, num_blocks: int) -> KVCacheManager:
    """A radix manager of ``num_blocks`` blocks of 4 in which a 6-token prompt ran and was
    released: block 0 (full) and block 1 (2 tokens) stay cached, the rest are free."""
    manager = make_manager(native, num_blocks=num_blocks, prefix="radix")
    gone = request(0, tokens(6))
    admit(manager, gone)
    prefill(manager, gone)
    step_done(manager)
    release(manager, gone)
    return manager


def test_a_group_is_admitted_whole_even_where_one_members_hit_would_leave_another_short(native):
    # 4 blocks of 4 tokens under radix. A released 6-token prompt left block 0 (full) and
    # block 1 (2 tokens) cached; 2 blocks are free. Alone, the first member's hit would
    # share block 0, copy block 1 into a fresh block and pin both: 1 free block left, and
    # the second member (2 blocks, no hit) would not fit. Together: the 4 blocks both need
    # without a hit are freed first, so both are admitted (the first without its hit).
    manager = radix_with_a_released_prompt(native, num_blocks=4)
    assert (manager.pool.num_free_blocks, manager.num_reclaimable_blocks()) == (2, 4)
    first, second = request(1, tokens(6) + [9]), request(2, tokens(7, 100))
    assert match(manager, first).num_tokens == 6
    assert manager.admit_together([first, second], step_has_work=False) == [
        Admission(False, 0, 0),
        Admission(False, 0, 0),
    ]
    manager.check_integrity()
    assert manager.tables.seq_ids() == [1, 2]
    assert manager.num_promised_blocks == 4
    assert (manager.pool.num_free_blocks, manager.num_reclaimable_blocks()) == (4, 0)
    # A third member would need 2 more: the group is refused whole, nothing admitted.
    for r in (first, second):
        release(manager, r)
    third = request(3, tokens(7, 200))
    assert manager.admit_together([first, second, third], step_has_work=False) is None
    assert manager.tables.seq_ids() == []
    manager.check_integrity()


def test_a_group_member_takes_its_hit_when_the_free_blocks_cover_every_member(native):
    manager = radix_with_a_released_prompt(native, num_blocks=8)
    first, second = request(1, tokens(6) + [9]), request(2, tokens(7, 100))
    assert manager.admit_together([first, second], step_has_work=False) == [
        Admission(False, 6, 0),  # shares block 0, copies block 1's 2 tokens
        Admission(False, 0, 0),
    ]
    assert first.num_computed_tokens == 6
    manager.check_integrity()


def test_a_windowed_hit_whose_held_blocks_leave_no_room_is_refused_and_no_hit_fits(native):
    # 4 blocks, the window's bound. A released 16-token prompt left blocks 0..3 evictable.
    # Its 17-token continuation matches all 4 and keeps 0, 2, 3 (the query at 16 reaches
    # from block 9 // 4 = 2): peak 4, 1 new block, which only block 1 could give; but
    # admission holds every matched block while it makes room (block 1 is released only
    # after), so the hit has no room: admission refuses the hit rather than fail with it.
    # Without the hit, the request takes 4 fresh blocks by evicting all 4 cached ones.
    manager = make_manager(native, num_blocks=4, window=8, sinks=4)
    first = request(0, tokens(16))
    admit(manager, first)
    prefill(manager, first)
    step_done(manager)
    release(manager, first)
    assert free_and_evictable(manager) == (0, 4)
    second = request(1, tokens(17))
    assert match(manager, second) == PrefixMatch([0, 1, 2, 3], 16)
    assert admit(manager, second) == Admission(False, 0, 0)  # the hit refused, none taken
    assert second.num_computed_tokens == 0
    assert free_and_evictable(manager) == (4, 0)  # evicted; all 4 promised to the prefill
    assert manager.num_promised_blocks == 4


def test_a_table_with_holes_is_swapped_back_with_its_holes_where_they_were(native):
    manager = make_manager(native, window=8, sinks=4, num_swap_blocks=8)
    r = request(0, tokens(24))
    admit(manager, r)
    prefill(manager, r)
    assert step_done(manager, [r]) == 3
    r.token_ids.append(50)  # decoding: 25 tokens, 24 computed
    assert manager.release(r, swap_out=True) == 3  # holes are not moved
    manager.check_integrity()
    swapped = manager.swap_space.swapped[0]
    assert swapped.layout == [(False, 1), (True, 3), (False, 2)]
    assert take_ops(manager)[1] == [BlockSwap(0, 0), BlockSwap(4, 1), BlockSwap(5, 2)]
    # Blocks 0, 4, 5 are published, so cached, not free: fresh ones start at 6. Past its
    # prompt, it also gets the block for its next token (token 24 opens block 6).
    assert admit(manager, r) == Admission(True, 0, 3)
    assert manager.tables.block_ids(0) == [6, -1, -1, -1, 7, 8, 9]
    assert take_ops(manager)[2] == [BlockSwap(6, 0), BlockSwap(7, 1), BlockSwap(8, 2)]
    assert manager.num_held_blocks(0) == 4


# -- radix: copy-on-write of a partially matched block ------------------------------------


def test_radix_copies_a_partially_matched_block_into_the_requests_own(native):
    manager = make_manager(native, prefix="radix")
    first = request(0, tokens(10))
    admit(manager, first)
    prefill(manager, first)  # in the tree: 10 tokens over blocks 0, 1, 2 (2 slots of 2)
    second = request(1, tokens(10) + [90, 91, 92])
    # Block 2's tokens are still being computed: the match stops at its edge, and a step
    # that already schedules something admits it next step.
    assert match(manager, second) == PrefixMatch([0, 1], 8, 2)
    assert manager.admit(second, step_has_work=True) is None
    manager.check_integrity()
    assert manager.tables.seq_ids() == [0]
    step_done(manager)
    assert match(manager, second) == PrefixMatch([0, 1, 2], 10)
    assert admit(manager, second) == Admission(False, 10, 0)
    assert second.num_computed_tokens == 10
    assert manager.tables.block_ids(1) == [0, 1, 3]  # block 3 receives block 2's slots
    assert manager.num_promised_blocks == 1  # peak 4 blocks, 3 held
    # Block 2: the first request's table, the tree, and the copy's pin.
    assert manager.pool.ref_count(2) == 3
    assert manager.take_step_blocks([], [], None) == StepBlocks([BlockCopy(2, 3)], [], [], None)
    manager.finish_step([], [first, second])
    manager.check_integrity()
    assert manager.pool.ref_count(2) == 2
    assert prefill(manager, second) == 3
    assert manager.tables.block_ids(1) == [0, 1, 3, 4]


def test_radix_matched_blocks_only_the_tree_holds_count_against_the_room(native):
    manager = make_manager(native, num_blocks=12, prefix="radix")
    gone = request(0, tokens(17))
    admit(manager, gone)
    prefill(manager, gone)
    step_done(manager)
    release(manager, gone)  # the tree alone holds its 5 blocks now
    holder = request(1, tokens(8, 200))
    admit(manager, holder)
    prefill(manager, holder)
    assert (manager.pool.num_free_blocks, manager.prefix.num_evictable_blocks()) == (5, 5)
    # 16 matched tokens (4 blocks the tree alone holds) + 24 more: 6 new blocks. Room: 5 free
    # + 5 the tree would give back, less the 4 the match would pin = 6.
    fits = request(2, tokens(16) + tokens(24, 100))
    fit = match(manager, fits)
    assert fit.num_tokens == 16
    assert manager.prefix.num_evictable_among(fit.block_ids) == 4
    # One token more needs 7 (11 without the hit): refused up front, rather than admitted
    # to evict the tree's blocks and fail (the tree would have lost the very prefix the
    # request matched).
    too_long = request(2, tokens(16) + tokens(25, 100))
    assert match(manager, too_long).num_tokens == 16
    assert manager.admit(too_long, step_has_work=False) is None
    manager.check_integrity()
    assert (manager.pool.num_free_blocks, manager.prefix.num_evictable_blocks()) == (5, 5)
    assert match(manager, too_long).num_tokens == 16
    assert admit(manager, fits) == Admission(False, 16, 0)
    assert manager.pool.num_free_blocks - manager.num_promised_blocks == 0


# -- property: random operations keep every invariant, and nothing leaks ------------------

# Prefill and decode steps are drawn more often than the rest, so that sequences grow
# past their first blocks before they are forked, swapped or released.
OPS: tuple[str, ...] = ("admit", "prefill", "prefill", "decode", "decode", "decode", "fork")
OPS += ("swap_out", "swap_in", "release", "window")
CONFIGS = [
    ("none", None),
    ("block_hash", None),
    ("radix", None),
    ("block_hash", 8),  # sliding window of 8 tokens, 4 sinks
]


class _Driver:
    """Applies random operations to a manager through the scheduler's door, the way the
    scheduler would (a step closes with ``take_step_blocks`` and, once run, ``finish_step``),
    and checks every invariant after each one."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.waiting: list[Request] = []  # refused, or preempted to compute again
        # The running sequences whose prefill is scheduled chunk by chunk (admitted, or
        # restored while prefilling), as the scheduler's chunks run them; the others decode.
        self.prefilling: set[int] = set()
        self.next_seq_id = 0

    def _new_request(self, length: int, shared: int) -> Request:
        # Prompts share a leading run of tokens of random length, so prefixes hit.
        seq_id = self.next_seq_id
        self.next_seq_id += 1
        prompt = tokens(min(shared, length)) + tokens(length - min(shared, length), 1000 * seq_id)
        return request(seq_id, prompt)

    def apply(self, op: str, pick: int, size: int) -> None:
        m = self.manager
        running = self.running
        if op == "admit":
            if self.waiting and pick % 2:
                r = self.waiting.pop(pick % len(self.waiting))
            else:
                r = self._new_request(size, pick * 3)
            admission = m.admit(r, step_has_work=False)
            if admission is None:
                assert r.num_computed_tokens == 0
                self.waiting.append(r)
            else:
                assert admission == Admission(False, r.num_computed_tokens, 0)
                running.append(r)
                self.prefilling.add(r.seq_id)
        elif op == "prefill":
            prefilling = [r for r in running if r.seq_id in self.prefilling]
            if prefilling:
                r = prefilling[pick % len(prefilling)]
                num_new = m.reserve_prefill(r, min(size, r.num_tokens_to_compute))
                r.num_computed_tokens += num_new
                if r.num_tokens_to_compute == 0:
                    self.prefilling.remove(r.seq_id)
                self._step([], [r] if r.num_tokens_to_compute == 0 else [], pick)
        elif op == "decode":
            decodes = [
                r for r in running if r.seq_id not in self.prefilling and r.num_tokens_to_compute
            ]
            batch = decodes[pick % max(1, len(decodes)) :][:size]
            seq_ids = [r.seq_id for r in batch]
            if batch and m.grow(seq_ids, [r.num_tokens for r in batch], batch):
                for r in batch:
                    r.num_computed_tokens = r.num_tokens
                self._step([r for r in batch if r.num_computed_tokens % BLOCK == 0], batch, pick)
        elif op == "fork":
            # A beam's fork: the child copies the parent's computed tokens and shares its
            # blocks; each then has its own next token to compute. As the scheduler forks,
            # the parent's table ends with its computed tokens (a parent holding a block
            # for its next token: see test_a_fork_does_not_share_the_block_held_for_the_
            # next_token).
            decodes = [
                r
                for r in running
                if r.seq_id not in self.prefilling
                and r.num_tokens_to_compute
                and m.tables.num_blocks(r.seq_id) == SPEC.num_blocks_for(r.num_computed_tokens)
            ]
            if decodes:
                parent = decodes[pick % len(decodes)]
                child = request(self.next_seq_id, parent.prompt_token_ids)
                self.next_seq_id += 1
                child.token_ids = [*parent.token_ids[:-1], parent.token_ids[-1] + 1]
                m.fork(parent, child)
                running.append(child)
        elif op == "swap_out":
            if running:
                r = running.pop(pick % len(running))
                self.prefilling.discard(r.seq_id)
                if m.release(r, swap_out=True) is None:  # no host room: released instead
                    assert r.seq_id not in m.swap_space.swapped
                    r.num_computed_tokens = 0
                    self.waiting.append(r)
                else:
                    self.swapped.append(r)
        elif op == "swap_in":
            if self.swapped:
                r = self.swapped[pick % len(self.swapped)]
                admission = m.admit(r, step_has_work=False)
                if admission is not None:
                    assert admission.restored and admission.num_matched_tokens == 0
                    self.swapped.remove(r)
                    running.append(r)
                    if r.is_prefilling:  # it is promised its prefill's blocks again
                        self.prefilling.add(r.seq_id)
        elif op == "release":
            if running and pick % 2:
                r = running.pop(pick % len(running))
                self.prefilling.discard(r.seq_id)
                assert m.release(r) is None
            elif self.swapped:
                assert m.release(self.swapped.pop(pick % len(self.swapped))) is None
            elif self.waiting:
                assert m.release(self.waiting.pop(pick % len(self.waiting))) is None
        elif op == "window":
            self._step([], [], pick)  # a step that computes nothing: only windows move
        m.check_integrity()

    def _step(self, filled: list[Request], sampled: list[Request], pick: int) -> None:
        """Closes the step (``filled``: decodes that fill a block), checks the block tables
        it exports, runs it, samples a token for each of ``sampled`` and finishes it."""
        m = self.manager
        seq_ids = [r.seq_id for r in self.running]
        blocks = m.take_step_blocks(filled, [r.num_computed_tokens for r in filled], seq_ids)
        assert blocks.block_tables is not None
        assert blocks.block_tables.shape[0] == len(seq_ids)
        for row, seq_id in zip(blocks.block_tables.tolist(), seq_ids, strict=True):
            num_blocks = m.tables.num_blocks(seq_id)
            assert row[:num_blocks] == m.tables.block_ids(seq_id)
            assert row[num_blocks:] == [-1] * (len(row) - num_blocks)
        finished = [r for r in sampled if self._sample(r, pick)]
        for r in finished:
            self.running.remove(r)
        m.finish_step(finished, self.running)

    def _sample(self, r: Request, pick: int) -> bool:
        """Appends a token; a sequence at the context's end or past 8 outputs finishes
        (True) instead."""
        if r.num_tokens >= MAX_MODEL_LEN or r.num_output_tokens >= 8:
            return True
        r.token_ids.append(5000 + pick)
        return False


@pytest.mark.parametrize("prefix,window", CONFIGS, ids=[f"{p}-{w}" for p, w in CONFIGS])
@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    native=st.booleans(),
    num_blocks=st.integers(6, 14),
    ops=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.integers(1, 20)),
        min_size=20,
        max_size=80,
    ),
)
def test_random_operations_keep_every_invariant_and_release_every_block(
    prefix, window, native, num_blocks, ops
):
    manager = make_manager(
        native,
        num_blocks=num_blocks,
        prefix=prefix,
        window=window,
        sinks=None if window is None else 4,
        num_swap_blocks=num_blocks // 2,
    )
    driver = _Driver(manager)
    for op, pick, size in ops:
        driver.apply(op, pick, size)
    for r in driver.running + driver.swapped + driver.waiting:
        assert manager.release(r) is None
    manager.take_step_blocks([], [], None)
    manager.finish_step([], [])
    manager.check_integrity()
    pool = manager.pool
    assert manager.tables.seq_ids() == []
    assert manager.num_promised_blocks == 0
    assert manager.swap_space.num_used_blocks == 0
    assert manager.swap_space.num_free_blocks == manager.swap_space.num_blocks
    # Every block is free or evictable, or (radix) held by the tree alone, which gives
    # every one of them back.
    assert pool.num_used_blocks == len(set(manager.prefix.held_block_ids()))
    assert manager.usage(0).num_used_blocks == 0
    # Admissions that share nothing (another extra key) and promise every block of the pool
    # (at most 4 each, a window's bound) fit, and make room for it all.
    fresh = []
    for first in range(0, num_blocks, 4):
        fresh.append(request(10_000 + first, tokens(4 * min(4, num_blocks - first)), b"fresh"))
        assert manager.admit(fresh[-1], step_has_work=False) == Admission(False, 0, 0)
        manager.check_integrity()
    assert manager.num_promised_blocks == num_blocks
    assert pool.num_free_blocks == num_blocks
    for r in fresh:
        assert manager.release(r) is None
    manager.check_integrity()
    assert manager.num_promised_blocks == 0

"""Each built-in plugin alone: built on a KV context of its own (a small pool of 4-token
blocks of the tiny model, Rust or Python structures), or with a stand-in cache view, and
called the way the cache manager and the scheduler call it.

Compatibility is checked by capability, never by name: the refusals are shown with
stand-in plugin classes defined here, which declare (or lack) a capability and share no
code or name with the built-ins.

Block ids follow from the pool's order: a new pool hands out 0, 1, 2, ...; a freed block
is the next one handed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from enginekit_plugins.allocator.contiguous import ContiguousAllocator, ContiguousConfig
from enginekit_plugins.allocator.paged import PagedAllocator, PagedConfig
from enginekit_plugins.eviction.lru import LRUConfig, LRUEviction
from enginekit_plugins.eviction.sliding_window import SlidingWindowConfig, SlidingWindowEviction
from enginekit_plugins.preemption.recompute import RecomputeConfig, RecomputePreemption
from enginekit_plugins.preemption.swap import SwapConfig, SwapPreemption
from enginekit_plugins.prefix.block_hash import BlockHashConfig, BlockHashPrefixCache
from enginekit_plugins.prefix.none import NoPrefixCache, NoPrefixConfig
from enginekit_plugins.prefix.radix import RadixConfig, RadixPrefixCache
from enginekit_plugins.quantizer.fp8 import FP8Quantizer, FP8QuantizerConfig
from enginekit_plugins.quantizer.int4 import Int4Quantizer, Int4QuantizerConfig
from enginekit_plugins.quantizer.none import NoQuantizer, NoQuantizerConfig

from enginekit.config import AllocatorConfig, PrefixConfig
from enginekit.errors import ConfigError, KVCacheError, OutOfBlocksError
from enginekit.interfaces import (
    NO_MATCH,
    Allocator,
    AttentionSpan,
    BlockRange,
    HoleAllocator,
    KVContext,
    KVQuant,
    PreemptionMode,
    PrefixCache,
    PrefixMatch,
    RestoreCost,
    WindowedEviction,
)
from enginekit.kv.backend import make_backend
from enginekit.request import Request, SamplingParams
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset

BLOCK = 4
TINY = model_preset("tiny")  # 2 layers, 2 kv heads, head_dim 16
SPEC = KVSpec.of(TINY, bits_per_element=32, block_size=BLOCK)


def make_context(
    native: bool,
    num_blocks: int = 16,
    max_model_len: int = 64,
    window: int | None = None,
    sinks: int = 0,
) -> KVContext:
    backend = make_backend(native)
    return KVContext(
        backend.new_block_pool(num_blocks),
        backend.new_block_tables(BLOCK),
        SPEC,
        max_model_len,
        backend,
        window,
        sinks,
    )


def request(seq_id: int, prompt: Sequence[int], extra_key: bytes | None = None) -> Request:
    return Request(str(seq_id), seq_id, list(prompt), SamplingParams(), 0.0, extra_key)


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def computed(allocator: Allocator, r: Request, num_tokens: int) -> Request:
    """Gives ``r`` a table holding ``num_tokens`` tokens (fresh blocks) and marks them
    computed."""
    allocator.admit(r, [])
    allocator.grow([r.seq_id], [num_tokens])
    r.num_computed_tokens = num_tokens
    return r


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


# -- stand-ins: capabilities without the built-ins' names or code ---------------------------


@dataclass
class _HoleKeepingConfig(AllocatorConfig):
    name: str = "hole_keeping"


class HoleKeepingAllocator(Allocator):
    """Declares the hole capability (``HoleAllocator``'s methods) and nothing else."""

    Config = _HoleKeepingConfig

    def release_range(self, seq_id: int, first: int, end: int) -> int:
        raise AssertionError("a compatibility check never calls a plugin")

    def append_holes(self, seq_id: int, num_holes: int) -> None:
        raise AssertionError("a compatibility check never calls a plugin")


@dataclass
class _HolelessConfig(AllocatorConfig):
    name: str = "holeless"


class HolelessAllocator(Allocator):
    """An allocator that cannot leave holes in a table."""

    Config = _HolelessConfig


@dataclass
class _SharingConfig(PrefixConfig):
    name: str = "sharing"


class SharingPrefix(PrefixCache):
    """Shares cached blocks (the default) and works with holes (the default)."""

    Config = _SharingConfig


@dataclass
class _NeverHitsConfig(PrefixConfig):
    name: str = "never_hits"


class NeverHitsPrefix(PrefixCache):
    Config = _NeverHitsConfig
    shares_blocks = False


@dataclass
class _WholeSequencesConfig(PrefixConfig):
    name: str = "whole_sequences"


class WholeSequencesPrefix(PrefixCache):
    Config = _WholeSequencesConfig
    supports_table_holes = False


# -- paged ---------------------------------------------------------------------------------


def test_paged_takes_a_block_per_four_tokens_on_demand(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    r = request(0, tokens(10))
    assert paged.num_blocks_to_admit(r, 0) == 3
    assert paged.num_blocks_to_admit(r, 1) == 2
    paged.admit(r, [])
    assert context.tables.block_ids(0) == []  # nothing at admission
    assert paged.num_blocks_to_grow([0], [10]) == 3
    paged.grow([0], [10])
    assert context.tables.block_ids(0) == [0, 1, 2]
    assert paged.num_blocks_to_grow([0], [12]) == 0
    assert paged.num_blocks_to_grow([0], [13]) == 1
    assert paged.num_reserved_blocks() == 3
    assert paged.num_blocks_for_longest(17) == 5
    # A second sequence admitted with the first's 2 leading blocks (the manager took a
    # reference to each for it) holds them without new blocks.
    for block_id in (0, 1):
        context.pool.incref(block_id)
    paged.admit(request(1, tokens(12)), [0, 1])
    assert context.tables.block_ids(1) == [0, 1]
    assert paged.num_reserved_blocks() == 5
    assert context.pool.num_free_blocks == 13
    paged.release(0)  # block 2 freed first, then 1 and 0, which sequence 1 still holds
    context.pool.check_integrity()
    assert context.pool.ref_counts()[:3] == [1, 1, 0]
    assert context.pool.free_block_ids()[:2] == [2, 3]
    assert paged.num_reserved_blocks() == 2


def test_paged_leaves_holes_and_gives_them_back(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    assert isinstance(paged, HoleAllocator) and paged.supports_fork
    computed(paged, request(0, tokens(20)), 20)  # blocks 0..4
    assert paged.release_range(0, 1, 3) == 2
    assert context.tables.block_ids(0) == [0, -1, -1, 3, 4]
    assert paged.release_range(0, 1, 3) == 0  # already holes
    assert (paged.num_hole_blocks(), paged.num_reserved_blocks()) == (2, 3)
    assert context.pool.free_block_ids()[:2] == [2, 1]  # freed in order: 2 is on top
    paged.append_holes(0, 2)
    assert context.tables.block_ids(0) == [0, -1, -1, 3, 4, -1, -1]
    assert paged.num_hole_blocks() == 4
    paged.fork(0, 1)  # the child shares 3 blocks and copies the 4 holes
    assert (paged.num_hole_blocks(), paged.num_reserved_blocks()) == (8, 6)
    assert [context.pool.ref_count(b) for b in (0, 3, 4)] == [2, 2, 2]
    paged.release(0)
    paged.release(1)
    context.tables.check_integrity(context.pool)
    assert (paged.num_hole_blocks(), paged.num_reserved_blocks()) == (0, 0)
    assert context.pool.num_free_blocks == 16


# -- contiguous ----------------------------------------------------------------------------


def test_contiguous_reserves_a_max_length_run_at_admission(native):
    # max_model_len 12 over 4-token blocks: each request reserves 3 consecutive blocks.
    context = make_context(native, num_blocks=10, max_model_len=12)
    contiguous = ContiguousAllocator(ContiguousConfig(), context)
    assert not isinstance(contiguous, HoleAllocator) and not contiguous.supports_fork
    r = request(0, tokens(2))
    assert contiguous.num_blocks_to_admit(r, 0) == 3
    assert contiguous.num_blocks_for_longest(1) == 3
    contiguous.admit(r, [])
    assert context.tables.block_ids(0) == [0, 1, 2]
    assert contiguous.num_blocks_to_grow([0], [12]) == 0
    contiguous.grow([0], [12])  # within the reservation: nothing changes
    assert context.tables.block_ids(0) == [0, 1, 2]
    with pytest.raises(KVCacheError, match="outgrew its reservation of 12 tokens"):
        contiguous.grow([0], [13])
    with pytest.raises(KVCacheError, match="takes no cached blocks"):
        contiguous.admit(request(1, tokens(2)), [0])
    contiguous.admit(request(1, tokens(2)), [])
    contiguous.admit(request(2, tokens(2)), [])
    assert context.tables.block_ids(2) == [6, 7, 8]
    assert contiguous.num_reserved_blocks() == 9
    assert contiguous.num_unusable_free_blocks() == 1  # block 9 alone
    contiguous.release(1)  # free: 3, 4, 5 (a whole reservation) and 9
    assert contiguous.num_reserved_blocks() == 6
    assert contiguous.num_unusable_free_blocks() == 1
    contiguous.release(2)  # free: 3..9, a run of 7: two reservations, 1 block over
    assert contiguous.num_unusable_free_blocks() == 1
    contiguous.admit(request(3, tokens(2)), [])  # first fit
    assert context.tables.block_ids(3) == [3, 4, 5]


def test_contiguous_is_refused_room_when_no_run_is_long_enough(native):
    context = make_context(native, num_blocks=6, max_model_len=12)
    contiguous = ContiguousAllocator(ContiguousConfig(), context)
    context.pool.allocate(6)
    context.pool.free([0, 2, 4])  # 3 free blocks, no 2 of them adjacent
    assert contiguous.num_unusable_free_blocks() == 3
    with pytest.raises(OutOfBlocksError, match="no run of 3 consecutive free blocks"):
        contiguous.admit(request(0, tokens(2)), [])
    context.pool.check_integrity()
    assert context.tables.seq_ids() == []
    assert context.pool.num_free_blocks == 3


def test_contiguous_refuses_a_prefix_cache_that_shares_blocks_by_capability():
    for sharing in (SharingPrefix, BlockHashPrefixCache, RadixPrefixCache):
        with pytest.raises(ConfigError, match="cannot be combined with"):
            ContiguousAllocator.check_compatible({"prefix": sharing})
    with pytest.raises(ConfigError, match=r"\+prefix=sharing"):
        ContiguousAllocator.check_compatible({"prefix": SharingPrefix})
    for never_shares in (NeverHitsPrefix, NoPrefixCache):
        ContiguousAllocator.check_compatible({"prefix": never_shares})
    PagedAllocator.check_compatible({"prefix": SharingPrefix})


# -- block_hash ----------------------------------------------------------------------------


def test_block_hash_matches_the_full_blocks_published_never_the_last_token(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = BlockHashPrefixCache(BlockHashConfig(), context)
    assert (cache.shares_blocks, cache.token_granular, cache.supports_table_holes) == (
        True,
        False,
        True,
    )
    first = computed(paged, request(0, tokens(10)), 10)  # blocks 0, 1, 2
    probe = request(1, tokens(10) + [99])
    assert cache.match(probe) == PrefixMatch([], 0)
    cache.on_computed(first, 6)  # 1 full block
    assert cache.match(probe) == PrefixMatch([0], 4)
    cache.on_computed(first, 10)  # 2 full blocks; block 2 holds 2 tokens: never shared
    assert cache.match(probe) == PrefixMatch([0, 1], 8)
    # (n - 1) // 4 blocks at most: the last token is always computed again. (A sequence's
    # block names are kept by its seq id: each probe is a sequence of its own.)
    assert cache.match(request(2, tokens(9))) == PrefixMatch([0, 1], 8)
    assert cache.match(request(3, tokens(8))) == PrefixMatch([0], 4)
    assert cache.match(request(4, tokens(4) + tokens(6, 100))) == PrefixMatch([0], 4)
    assert cache.match(request(5, tokens(10), extra_key=b"a")) == NO_MATCH
    assert cache.held_block_ids() == [] and cache.num_evictable_blocks() == 0
    cache.check_integrity()


def test_block_hash_forgets_evicted_blocks_and_a_released_sequences_names(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = BlockHashPrefixCache(BlockHashConfig(), context)
    lru = LRUEviction(LRUConfig(), context)
    first = computed(paged, request(0, tokens(12), extra_key=b"a"), 12)
    cache.on_computed(first, 12)
    cache.on_released(first)
    paged.release(0)  # published blocks 2, 1, 0 become evictable, tail first
    assert context.pool.evictable_block_ids() == [2, 1, 0]
    probe = request(1, tokens(13), extra_key=b"a")
    assert cache.match(probe) == PrefixMatch([0, 1, 2], 12)
    evicted = lru.evict(1)
    cache.on_evicted(evicted)
    assert evicted == [2]
    assert cache.match(probe) == PrefixMatch([0, 1], 8)
    # Sequence id 0 again, another prompt: named afresh, not by the released one's names.
    again = computed(paged, request(0, tokens(8, 100), extra_key=b"a"), 8)
    cache.on_computed(again, 8)
    assert cache.match(request(2, tokens(8, 100) + [5], extra_key=b"a")).num_tokens == 8
    assert cache.match(probe) == PrefixMatch([0, 1], 8)


# -- radix ---------------------------------------------------------------------------------


def test_radix_matches_at_token_granularity_once_the_step_has_run(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = RadixPrefixCache(RadixConfig(), context)
    assert cache.token_granular and not cache.supports_table_holes
    first = computed(paged, request(0, tokens(10)), 10)
    cache.on_computed(first, 10)
    assert cache.held_block_ids() == [0, 1, 2]  # the tree's own references
    assert [context.pool.ref_count(b) for b in (0, 1, 2)] == [2, 2, 2]
    cache.check_integrity()
    probe = request(1, tokens(10) + [99])
    # Block 2's 2 tokens are being computed by the step: cut to the edge, 2 deferred.
    assert cache.match(probe) == PrefixMatch([0, 1], 8, 2)
    cache.on_step_executed()
    assert cache.match(probe) == PrefixMatch([0, 1, 2], 10)
    assert cache.match(request(1, tokens(6) + [99, 98])) == PrefixMatch([0, 1], 6)
    assert cache.match(request(1, tokens(10))) == PrefixMatch([0, 1, 2], 9)  # not the last
    assert cache.match(request(1, tokens(10), extra_key=b"b")) == NO_MATCH


def test_radix_evicts_only_what_no_running_request_locks(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = RadixPrefixCache(RadixConfig(), context)
    first = computed(paged, request(0, tokens(10)), 10)
    cache.on_computed(first, 10)
    cache.on_step_executed()
    assert cache.num_evictable_blocks() == 0  # its request locks the path
    assert cache.evict(3) == []
    first.token_ids.append(50)  # a decode's output enters the tree when it leaves
    first.num_computed_tokens = 11
    cache.on_computed(first, 11)
    assert cache.held_block_ids() == [0, 1, 2]
    cache.on_released(first)
    paged.release(0)
    assert cache.match(request(1, [*tokens(10), 50, 7])) == PrefixMatch([0, 1, 2], 11)
    # The tree: a node of tokens 0..9 over blocks 0, 1, 2, and a leaf of token 50, which
    # lies in block 2 too: 4 references, 3 distinct blocks.
    assert sorted(cache.held_block_ids()) == [0, 1, 2, 2]
    assert cache.num_evictable_blocks() == 3
    # One block asked, one freed: the leaf's reference to block 2 frees nothing (the node of
    # tokens 0..9 holds 2 too), so that node's 2 goes next, tail first.
    released = cache.evict(1)
    assert released == [2, 2]
    context.pool.free(released)
    cache.check_integrity()
    assert context.pool.ref_count(2) == 0
    assert cache.match(request(2, [*tokens(10), 50, 7])) == PrefixMatch([0, 1], 8)
    released = cache.evict(3)
    assert released == [1, 0]
    context.pool.free(released)
    cache.check_integrity()
    assert cache.held_block_ids() == []
    assert context.pool.num_free_blocks == 16
    assert cache.match(request(3, tokens(11))) == NO_MATCH


def admit_like_the_manager(
    context: KVContext, paged: PagedAllocator, r: Request, match: PrefixMatch
) -> None:
    """What KVCacheManager.admit does with a match (without the copy itself): a reference on
    every matched block, the full ones shared, a fresh block for a partially matched last
    one; then the table grown to the whole sequence, all of it computed."""
    for block_id in match.block_ids:
        context.pool.incref(block_id)
    shared = match.block_ids[: match.num_tokens // BLOCK]
    paged.admit(r, shared)
    if match.num_tokens % BLOCK:
        context.pool.free([match.block_ids[-1]])  # the copy has run: its pin goes
    paged.grow([r.seq_id], [r.num_tokens])
    r.num_computed_tokens = r.num_tokens


def test_radix_copy_on_write_leaf_lends_its_block_and_readmission_locks(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = RadixPrefixCache(RadixConfig(), context)
    first = computed(paged, request(0, tokens(10)), 10)
    cache.on_computed(first, 10)
    cache.on_step_executed()
    cache.on_released(first)
    paged.release(0)
    # A prompt going on from the 10 cached tokens copies block 2 (2 of its slots match) into
    # a block of its own, which then holds positions 8, 9 of the cached node too: the node
    # takes it, and block 2 leaves the pool.
    second = request(1, [*tokens(10), 99, 98, 97])
    match = cache.match(second)
    assert match == PrefixMatch([0, 1, 2], 10)
    admit_like_the_manager(context, paged, second, match)
    own = context.tables.block_ids(1)[2:]
    cache.on_computed(second, 13)
    cache.check_integrity()
    assert sorted(cache.held_block_ids()) == sorted([0, 1, own[0], own[0], own[1]])
    assert context.pool.ref_count(2) == 0
    assert cache.num_evictable_blocks() == 0  # the request locks its path
    assert cache.num_evictable_among([0, 1, own[0]]) == 0
    cache.on_step_executed()
    cache.on_released(second)
    paged.release(1)
    assert cache.num_evictable_blocks() == 4
    assert cache.num_evictable_among([0, 1, 2, own[0], 99]) == 3
    # A preempted request admitted again (it has an output) locks the path it matched at its
    # first chunk, so that the tree does not evict the blocks it holds.
    third = request(2, [*tokens(10), 99, 98, 97])
    third.token_ids.append(5)
    match = cache.match(third)
    assert match.num_tokens == 13
    admit_like_the_manager(context, paged, third, match)
    cache.on_computed(third, 14)
    cache.check_integrity()
    assert cache.num_evictable_blocks() == 0
    assert cache.evict(4) == []
    held = sorted(cache.held_block_ids())
    third.token_ids.extend([6, 7])  # decodes: their outputs enter the tree when it leaves
    paged.grow([2], [16])
    third.num_computed_tokens = 16
    cache.on_computed(third, 16)
    assert sorted(cache.held_block_ids()) == held
    cache.on_released(third)
    paged.release(2)
    cache.check_integrity()
    assert cache.match(request(3, [*tokens(10), 99, 98, 97, 5, 6, 7, 1])).num_tokens == 16
    assert context.pool.num_used_blocks == cache.num_evictable_blocks()


def test_none_never_matches_and_never_publishes(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = NoPrefixCache(NoPrefixConfig(), context)
    assert not cache.shares_blocks
    first = computed(paged, request(0, tokens(8)), 8)
    cache.on_computed(first, 8)
    paged.release(0)
    assert context.pool.num_evictable_blocks == 0
    assert cache.match(request(1, tokens(9))) == NO_MATCH


# -- lru -----------------------------------------------------------------------------------


def test_lru_evicts_the_blocks_released_longest_ago(native):
    context = make_context(native)
    paged = PagedAllocator(PagedConfig(), context)
    cache = BlockHashPrefixCache(BlockHashConfig(), context)
    lru = LRUEviction(LRUConfig(), context)
    for seq_id in (0, 1):  # 0: blocks 0, 1; 1: blocks 2, 3; all published
        cache.on_computed(computed(paged, request(seq_id, tokens(8, 100 * seq_id)), 8), 8)
    paged.release(1)
    paged.release(0)
    assert context.pool.evictable_block_ids() == [3, 2, 1, 0]
    context.pool.incref(2)  # a hit takes block 2 out of the order...
    context.pool.free([2])  # ...and its release puts it at the end
    assert lru.evict(2) == [3, 1]
    assert context.pool.evictable_block_ids() == [0, 2]
    assert context.pool.free_block_ids()[:2] == [1, 3]  # the newest evicted first
    context.pool.check_integrity()


# -- sliding_window ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window,sinks,model_window,span",
    [
        (8, None, None, AttentionSpan(8, 4)),  # approximation: StreamingLLM's 4 sinks
        (8, 0, None, AttentionSpan(8, 0)),
        (8, 2, None, AttentionSpan(8, 2)),
        (None, None, 16, AttentionSpan(16, 0)),  # the model's own window, exact
        (32, None, 16, AttentionSpan(16, 0)),  # capped by the model's
        (8, 0, 16, AttentionSpan(8, 0)),
        (None, None, None, AttentionSpan(None, 0)),  # refused when the policy is built
    ],
)
def test_sliding_window_resolves_its_window_and_sinks(window, sinks, model_window, span):
    config = SlidingWindowConfig(window=window, sink_tokens=sinks)
    assert SlidingWindowEviction.attention(config, model_window) == span


@pytest.mark.parametrize(
    "window,sinks,model_window,message",
    [
        (0, None, None, "eviction.window must be >= 1"),
        (8, -1, None, "eviction.sink_tokens must be >= 0"),
        (8, 2, 16, "sink_tokens=2 is refused"),
    ],
)
def test_sliding_window_refuses_bad_settings(window, sinks, model_window, message):
    config = SlidingWindowConfig(window=window, sink_tokens=sinks)
    with pytest.raises(ConfigError, match=message):
        SlidingWindowEviction.attention(config, model_window)


def test_sliding_window_needs_a_window_and_lru_keeps_the_models(native):
    with pytest.raises(ConfigError, match="eviction.window is not set"):
        SlidingWindowEviction(SlidingWindowConfig(), make_context(native))
    assert LRUEviction.attention(LRUConfig(), 16) == AttentionSpan(16, 0)
    assert LRUEviction.attention(LRUConfig(), None) == AttentionSpan(None, 0)


def test_sliding_window_returns_exactly_the_ranges_out_of_the_window(native):
    # Window 8, 4 sinks: 1 sink block, at most 1 + 2 + 1 = 4 blocks. The next query at
    # position p reaches blocks from (p - 7) // 4 on.
    context = make_context(native, window=8, sinks=4)
    paged = PagedAllocator(PagedConfig(), context)
    policy = SlidingWindowEviction(SlidingWindowConfig(window=8), context)
    assert isinstance(policy, WindowedEviction)
    assert (policy.max_blocks_per_sequence, policy.num_sink_blocks) == (4, 1)
    assert not policy.strict_bound
    long = computed(paged, request(0, tokens(24)), 24)  # from block 17 // 4 = 4
    short = computed(paged, request(1, tokens(12)), 12)  # from block 5 // 4 = 1: sinks
    edge = computed(paged, request(2, tokens(15)), 15)  # from block 8 // 4 = 2
    assert policy.ranges_out_of_window([long, short, edge]) == [
        BlockRange(0, 1, 4),
        BlockRange(2, 1, 2),
    ]
    assert policy.kept_blocks([10, 11, 12, 13, 14, 15], 24) == [10, 14, 15]
    paged.release_range(0, 1, 4)
    assert policy.ranges_out_of_window([long]) == []  # what it held is given back
    long.token_ids += [50, 51, 52]
    paged.grow([0], [27])
    long.num_computed_tokens = 27  # from block 20 // 4 = 5: only block 4 is new
    assert policy.ranges_out_of_window([long]) == [BlockRange(0, 4, 5)]
    # Without sinks nothing is kept in front.
    plain = make_context(native, window=8)
    plain_paged = PagedAllocator(PagedConfig(), plain)
    no_sinks = SlidingWindowEviction(SlidingWindowConfig(window=8, sink_tokens=0), plain)
    assert no_sinks.max_blocks_per_sequence == 0 + 2 + 1
    r = computed(plain_paged, request(0, tokens(12)), 12)  # from block 1
    assert no_sinks.ranges_out_of_window([r]) == [BlockRange(0, 0, 1)]


def test_sliding_window_refuses_by_capability():
    SlidingWindowEviction.check_compatible(
        {"allocator": HoleKeepingAllocator, "prefix": SharingPrefix}
    )
    SlidingWindowEviction.check_compatible({"allocator": PagedAllocator, "prefix": NoPrefixCache})
    for holeless in (HolelessAllocator, ContiguousAllocator):
        with pytest.raises(ConfigError, match="needs an allocator that can leave holes"):
            SlidingWindowEviction.check_compatible({"allocator": holeless})
    with pytest.raises(ConfigError, match="holeless cannot"):
        SlidingWindowEviction.check_compatible({"allocator": HolelessAllocator})
    for whole in (WholeSequencesPrefix, RadixPrefixCache):
        with pytest.raises(ConfigError, match="cannot be combined with"):
            SlidingWindowEviction.check_compatible({"allocator": PagedAllocator, "prefix": whole})
    with pytest.raises(ConfigError, match=r"\+prefix=whole_sequences"):
        SlidingWindowEviction.check_compatible({"prefix": WholeSequencesPrefix})
    LRUEviction.check_compatible({"allocator": HolelessAllocator, "prefix": WholeSequencesPrefix})


# -- recompute and swap --------------------------------------------------------------------


class StandInCache:
    """A CacheView: the blocks each sequence holds, as the test says, and a swap space
    that always has room (the built-in policies decide without asking)."""

    def __init__(self, context: KVContext, held: dict[int, int]) -> None:
        self._context = context
        self._held = held
        self.num_free_swap_blocks = 1 << 20

    @property
    def spec(self) -> KVSpec:
        return self._context.spec

    @property
    def tables(self) -> Any:  # the context's tables, whichever backend
        return self._context.tables

    def num_held_blocks(self, seq_id: int) -> int:
        return self._held[seq_id]


def running(*num_computed_tokens: int) -> list[Request]:
    """Requests 0, 1, ... in priority order, with these computed tokens."""
    rs = [request(i, tokens(max(n, 1))) for i, n in enumerate(num_computed_tokens)]
    for r, n in zip(rs, num_computed_tokens, strict=True):
        r.num_computed_tokens = n
    return rs


def test_recompute_preempts_the_last_admitted_and_never_swaps(native):
    cache = StandInCache(make_context(native), {0: 1, 1: 1, 2: 1})
    policy = RecomputePreemption(RecomputeConfig(), RestoreCost(0.0, 1.0, 0.0), cache)
    queue = running(40, 8, 30)
    assert policy.choose_victim(queue) is queue[2]
    assert policy.mode(queue[2]) is PreemptionMode.RECOMPUTE
    assert RecomputePreemption.swap_space_gib(RecomputeConfig()) == 0.0


def test_swap_weighs_the_cheaper_restore_among_its_candidates(native):
    # Swap: 2 x 1 s per block held. Recompute: 0.1 s per computed token.
    costs = RestoreCost(swap_s_per_block=1.0, prefill_s_per_token=0.1, attention_s_per_pair=0.0)
    held = {0: 1, 1: 1, 2: 1, 3: 1}
    cache = StandInCache(make_context(native), held)
    policy = SwapPreemption(SwapConfig(num_candidates=2), costs, cache)
    # Restore costs: 0 s (nothing computed), 0.8 s, 0.2 s, 0.4 s (recompute is cheaper
    # than the 2 s swap for each); the candidates are the last 2: requests 2 and 3.
    queue = running(0, 8, 2, 4)
    assert policy.choose_victim(queue) is queue[2]
    assert policy.restore_cost_s(queue[2]) == (pytest.approx(0.2), False)
    assert policy.mode(queue[2]) is PreemptionMode.RECOMPUTE
    tied = running(0, 4, 4)
    assert policy.choose_victim(tied) is tied[2]  # a tie goes to the lower priority
    # 40 computed tokens (4 s) against 1 block (2 s): swap; at 20 tokens both cost 2 s
    # and the swap wins the tie.
    (long,) = running(40)
    assert policy.mode(long) is PreemptionMode.SWAP
    (even,) = running(20)
    assert policy.mode(even) is PreemptionMode.SWAP
    held[0] = 3  # 6 s of swapping against 4 s of recompute
    assert policy.mode(long) is PreemptionMode.RECOMPUTE
    # The attention term: 0.01 s per (query, key) pair, 10 * 11 / 2 = 55 pairs.
    attention = SwapPreemption(SwapConfig(), RestoreCost(1.0, 0.0, 0.01), cache)
    (r,) = running(10)
    held[0] = 1
    assert attention.restore_cost_s(r) == (pytest.approx(0.55), False)


def test_swap_validates_its_settings(native):
    assert SwapPreemption.swap_space_gib(SwapConfig()) == 4.0
    assert SwapPreemption.swap_space_gib(SwapConfig(swap_space_gib=0.5)) == 0.5
    assert SwapPreemption.swap_space_gib(RecomputeConfig()) == 0.0  # no such key: none
    with pytest.raises(ConfigError, match="preemption.swap_space_gib must be >= 0"):
        SwapPreemption.swap_space_gib(SwapConfig(swap_space_gib=-1.0))
    cache = StandInCache(make_context(native), {})
    with pytest.raises(ConfigError, match="preemption.num_candidates must be >= 1"):
        SwapPreemption(SwapConfig(num_candidates=0), RestoreCost(1.0, 1.0, 0.0), cache)


# -- quantizers ----------------------------------------------------------------------------


def test_none_stores_the_models_dtype():
    quant = NoQuantizer(NoQuantizerConfig()).kv_quant(TINY, 16)
    assert quant == KVQuant()
    # 2 x 2 layers x 2 kv heads x 16 dims = 128 values a token, 16 tokens, 4 bytes each.
    assert KVSpec.of(TINY, 32, 16, quant).bytes_per_block == 128 * 16 * 4


def test_fp8_carries_where_its_scales_come_from():
    quant = FP8Quantizer(FP8QuantizerConfig()).kv_quant(TINY, 16)
    assert quant == KVQuant("fp8", fp8_scales="auto", fp8_calibration_margin=2.0)
    config = FP8QuantizerConfig(scales="calibrate", calibration_margin=1.5)
    quant = FP8Quantizer(config).kv_quant(TINY, 16)
    assert (quant.kind, quant.fp8_scales, quant.fp8_calibration_margin) == ("fp8", "calibrate", 1.5)
    assert FP8Quantizer(FP8QuantizerConfig(scales="checkpoint")).kv_quant(TINY, 16).fp8_scales == (
        "checkpoint"
    )
    spec = KVSpec.of(TINY, 32, 16, quant)  # 1 byte a value, scales outside the blocks
    assert (spec.bits_per_element, spec.bytes_per_block) == (8, 128 * 16)
    with pytest.raises(ConfigError, match="quantizer.scales='max'"):
        FP8Quantizer(FP8QuantizerConfig(scales="max"))
    with pytest.raises(ConfigError, match="quantizer.calibration_margin must be >= 1"):
        FP8Quantizer(FP8QuantizerConfig(calibration_margin=0.5))


def test_int4_groups_are_capped_by_the_block_and_the_head():
    quant = Int4Quantizer(Int4QuantizerConfig()).kv_quant(TINY, 16)  # group 64
    assert quant == KVQuant("int4", key_group_tokens=16, value_group_channels=16)
    quant = Int4Quantizer(Int4QuantizerConfig(group_size=8)).kv_quant(TINY, 16)
    assert (quant.key_group_tokens, quant.value_group_channels) == (8, 8)
    # Half a byte a value; per layer and kv head, 16 / 8 x 16 key groups and 16 x 16 / 8
    # value groups, each a float16 scale and zero: 2 x 2 x (32 + 32) x 4 bytes.
    spec = KVSpec.of(TINY, 32, 16, quant)
    assert spec.bytes_per_block == 128 * 16 // 2 + 2 * 2 * 64 * 4
    with pytest.raises(ConfigError, match="quantizer.group_size=3 must divide"):
        Int4Quantizer(Int4QuantizerConfig(group_size=3)).kv_quant(TINY, 16)
    with pytest.raises(ConfigError, match="quantizer.group_size must be >= 1"):
        Int4Quantizer(Int4QuantizerConfig(group_size=0)).kv_quant(TINY, 16)

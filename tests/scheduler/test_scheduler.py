"""Scheduler built by hand, without an Engine or an executor: a cache manager over a small
pool of the tiny model's 4-token blocks, a preemption plugin, and ``schedule`` /
``update`` called with tokens the test chooses. Asserts the SchedulerOutput of each step,
what the StepUpdate reports, and the cache after each step (every invariant checked).

Block ids follow from the pool's order: a new pool hands out 0, 1, 2, ...; a freed block
is the next one handed out.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import test_kv_manager as kv_manager_tests
from enginekit_plugins.preemption.recompute import RecomputeConfig, RecomputePreemption
from enginekit_plugins.preemption.swap import SwapConfig, SwapPreemption
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit.admission import ServingLimits, check_servable
from enginekit.config import SchedulerConfig
from enginekit.errors import RequestRejectedError
from enginekit.kv.manager import KVCacheManager
from enginekit.metrics import PreemptionEvent, PrefixQuery
from enginekit.request import Request, RequestStatus, SamplingParams
from enginekit.scheduler.scheduler import Scheduler, StepUpdate
from enginekit.spec.restore_cost import RestoreCost
from enginekit.step import BlockCopy, BlockSwap, Fork, ModelOutput, SchedulerOutput

BLOCK = kv_manager_tests.BLOCK  # 4-token blocks of the tiny model
MAX_MODEL_LEN = kv_manager_tests.MAX_MODEL_LEN
VOCAB = 10_000
FIRST_FORK_ID = 100  # seq ids of forked samples: 100, 101, ...
# swap: 2 x 0.1 s per block held; recompute: 1 s per computed token. Swapping is cheaper.
SWAP_CHEAPER = RestoreCost(swap_s_per_block=0.1, prefill_s_per_token=1.0, attention_s_per_pair=0.0)
# swap: 2 x 1 s per block held; recompute: 0.1 s per computed token. Recompute is cheaper
# for a sequence of 3 blocks and 12 tokens (6 s against 1.2 s).
RECOMPUTE_CHEAPER = RestoreCost(1.0, 0.1, 0.0)


def make_manager(
    native: bool,
    num_blocks: int,
    prefix: str = "none",
    window: int | None = None,
    num_swap_blocks: int = 0,
    watermark: float = 0.0,
) -> KVCacheManager:
    """test_kv_manager's manager (paged, 4-token blocks), with no prefix cache by default."""
    return kv_manager_tests.make_manager(
        native,
        num_blocks,
        prefix,
        window,
        watermark=watermark,
        num_swap_blocks=num_swap_blocks,
    )


def make_scheduler(
    manager: KVCacheManager,
    budget: int = 16,
    max_num_seqs: int = 4,
    preemption: str = "recompute",
    costs: RestoreCost = SWAP_CHEAPER,
    eos_token_id: int | None = None,
    export_block_tables: bool = True,
) -> Scheduler:
    if preemption == "recompute":
        plugin = RecomputePreemption(RecomputeConfig(), costs, manager)
    else:
        plugin = SwapPreemption(SwapConfig(), costs, manager)
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs),
        manager,
        plugin,
        eos_token_id=eos_token_id,
        export_block_tables=export_block_tables,
        new_seq_id=itertools.count(FIRST_FORK_ID).__next__,
        native=manager.context.backend.name == "native",
    )


def is_swapped(manager: KVCacheManager, request: Request) -> bool:
    """Whether ``request``'s blocks wait in the manager's swap space."""
    return request.seq_id in manager.swap_space.swapped


def request(seq_id: int, prompt: Sequence[int], **sampling: object) -> Request:
    return Request(str(seq_id), seq_id, list(prompt), SamplingParams(**sampling))  # type: ignore[arg-type]


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def step(
    scheduler: Scheduler, next_tokens: Sequence[int] | None = None
) -> tuple[SchedulerOutput, StepUpdate]:
    """One step: schedule, then update with ``next_tokens`` (default: token 50 for every
    sequence sampled); checks every cache and scheduler invariant."""
    scheduled = scheduler.schedule()
    if next_tokens is None:
        next_tokens = [50] * len(scheduled.sample_seq_ids)
    update = scheduler.update(scheduled, ModelOutput(list(next_tokens), 0.01))
    scheduler.cache.check_integrity()
    scheduler.check_integrity()
    return scheduled, update


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


# -- chunks, decodes, samples, tables ------------------------------------------------------


def test_prefill_chunks_fill_the_token_budget_then_decodes_take_one_token_each(native):
    manager = make_manager(native, num_blocks=16)
    scheduler = make_scheduler(manager, budget=8)
    a, b = request(0, tokens(10)), request(1, tokens(6, 100))
    scheduler.add_request(a)
    scheduler.add_request(b)
    # Step 1: the budget of 8 goes to a's first chunk; b is not admitted (no budget left).
    scheduled, update = step(scheduler)
    assert scheduled.step == 1
    assert (scheduled.prefill_seq_ids, scheduled.prefill_starts, scheduled.prefill_lens) == (
        [0],
        [0],
        [8],
    )
    assert scheduled.prefill_token_ids == [tokens(8)]
    assert scheduled.decode_seq_ids == [] and scheduled.sample_seq_ids == []
    assert scheduled.block_tables.tolist() == [[0, 1]]
    assert [r.seq_id for r in scheduler.running] == [0]
    assert list(scheduler.waiting) == [b]
    assert (a.status, b.status) == (RequestStatus.RUNNING, RequestStatus.WAITING)
    assert update.stats.prefix_queries == [PrefixQuery(10, 0, False)]
    # Step 2: a's last 2 tokens, then b's 6 in the 6 left; both reach their ends: sampled.
    scheduled, update = step(scheduler, [200, 201])
    assert (scheduled.prefill_seq_ids, scheduled.prefill_starts, scheduled.prefill_lens) == (
        [0, 1],
        [8, 0],
        [2, 6],
    )
    assert scheduled.sample_seq_ids == [0, 1]
    assert scheduled.block_tables.tolist() == [[0, 1, 2], [3, 4, -1]]
    assert update.first_tokens == [a, b]
    assert (a.output_token_ids, b.output_token_ids) == ([200], [201])
    # Step 3: two decodes, each attending to its whole context, its last token computed.
    scheduled, _ = step(scheduler, [300, 301])
    assert scheduled.prefill_seq_ids == []
    assert (scheduled.decode_seq_ids, scheduled.decode_context_lens) == ([0, 1], [11, 7])
    assert scheduled.decode_token_ids == [200, 201]
    assert scheduled.sample_seq_ids == [0, 1]
    assert scheduled.num_batched_tokens == 2
    assert (a.num_computed_tokens, b.num_computed_tokens) == (11, 7)
    # Token 11 of a opens no block (3 hold 12); b's token 7 fits block 4.
    assert scheduled.block_tables.tolist() == [[0, 1, 2], [3, 4, -1]]


def test_block_tables_are_exported_only_when_asked(native):
    manager = make_manager(native, num_blocks=16)
    scheduler = make_scheduler(manager, export_block_tables=False)
    scheduler.add_request(request(0, tokens(5)))
    scheduled, _ = step(scheduler)
    assert scheduled.block_tables is None
    assert scheduled.prefill_lens == [5]


def test_a_prefix_hit_is_reported_and_skips_the_cached_tokens(native):
    manager = make_manager(native, num_blocks=16, prefix="block_hash")
    scheduler = make_scheduler(manager)
    scheduler.add_request(request(0, tokens(10)))
    step(scheduler)  # blocks 0, 1 (full) published
    late = request(1, tokens(8) + tokens(5, 100))
    scheduler.add_request(late)
    scheduled, update = step(scheduler)
    assert scheduled.prefill_seq_ids == [1]
    assert (scheduled.prefill_starts, scheduled.prefill_lens) == ([8], [5])
    assert scheduled.decode_seq_ids == [0]
    # Rows: the prefill (sharing blocks 0 and 1), then the decode.
    assert scheduled.block_tables.tolist() == [[0, 1, 3, 4], [0, 1, 2, -1]]
    assert update.stats.prefix_queries == [PrefixQuery(13, 8, False)]
    assert late.num_cached_tokens == 8


# -- finishing ---------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["none", "block_hash", "radix"])
def test_the_blocked_head_of_the_queue_is_matched_once_until_room_frees(native, prefix):
    manager = make_manager(native, num_blocks=8, prefix=prefix)
    scheduler = make_scheduler(manager, budget=32)
    matched: list[int] = []
    match = manager.prefix.match
    manager.prefix.match = lambda r: matched.append(r.seq_id) or match(r)  # type: ignore[method-assign]
    running = request(0, tokens(20), max_tokens=6)  # 5 blocks, then a sixth
    blocked = request(1, tokens(16, 100), max_tokens=1)  # 4 blocks
    scheduler.add_request(running)
    scheduler.add_request(blocked)
    step(scheduler)
    assert matched == [0, 1]  # admitted; refused
    for _ in range(5):
        step(scheduler)
    assert running.is_finished and blocked.status is RequestStatus.WAITING
    # The room never reached the 4 blocks it needs. Radix matches it once more, when the
    # prefill's blocks in flight are computed (a match may end inside them from then on).
    refusals = [0] + [1] * (2 if prefix == "radix" else 1)
    assert matched == refusals
    step(scheduler)  # the finished request's blocks came back: matched and admitted
    assert matched == [*refusals, 1]
    assert blocked.status is RequestStatus.FINISHED_LENGTH


def test_max_tokens_finishes_a_request_and_releases_its_blocks(native):
    manager = make_manager(native, num_blocks=8)
    scheduler = make_scheduler(manager)
    r = request(0, tokens(6), max_tokens=2)
    scheduler.add_request(r)
    _, update = step(scheduler, [10])  # the prefill samples the first output
    assert update.finished == []
    assert manager.pool.num_free_blocks == 6
    _, update = step(scheduler, [11])  # the second output: max_tokens
    assert update.finished == [r]
    assert r.status is RequestStatus.FINISHED_LENGTH
    assert r.output_token_ids == [10, 11]
    assert manager.pool.num_free_blocks == 8
    assert scheduler.num_unfinished == 0
    # The executor learns of it with the next step that runs.
    scheduler.add_request(request(1, tokens(3, 100)))
    scheduled, _ = step(scheduler)
    assert scheduled.finished_seq_ids == [0]


def test_a_stop_token_or_eos_finishes_a_request(native):
    manager = make_manager(native, num_blocks=8)
    scheduler = make_scheduler(manager, eos_token_id=2)
    stops = request(0, tokens(5), max_tokens=10, stop_token_ids=(7,))
    eos = request(1, tokens(5, 100), max_tokens=10)
    ignores = request(2, tokens(5, 200), max_tokens=10, ignore_eos=True)
    for r in (stops, eos, ignores):
        scheduler.add_request(r)
    _, update = step(scheduler, [7, 2, 2])
    assert update.finished == [stops, eos]
    assert stops.status is eos.status is RequestStatus.FINISHED_STOPPED
    assert ignores.status is RequestStatus.RUNNING
    assert ignores.output_token_ids == [2]
    assert [r.seq_id for r in scheduler.running] == [2]
    assert manager.pool.num_free_blocks == 8 - 2  # only the one left holds 2 blocks


# -- preemption ----------------------------------------------------------------------------

# Two 8-token prompts on a pool of 6 blocks: after the prefill (2 blocks each) and 4
# decodes (a third block each at token 9) the pool is full; at token 13 each needs a fourth
# block: the plugin's victim, the last admitted (b), gives its 3 blocks up in step 6.


def _two_decoders(manager: KVCacheManager, scheduler: Scheduler) -> tuple[Request, Request]:
    a = request(0, tokens(8), max_tokens=6)
    b = request(1, tokens(8, 100), max_tokens=10)
    scheduler.add_request(a)
    scheduler.add_request(b)
    for _ in range(5):
        scheduled, update = step(scheduler)
        assert update.stats.preemptions == []
    assert manager.pool.num_free_blocks == 0
    assert (a.num_computed_tokens, b.num_computed_tokens) == (12, 12)
    return a, b


def test_recompute_preemption_drops_the_victims_tokens_when_the_pool_runs_dry(native):
    manager = make_manager(native, num_blocks=6)
    scheduler = make_scheduler(manager, preemption="recompute")
    a, b = _two_decoders(manager, scheduler)
    scheduled, update = step(scheduler)
    assert scheduled.decode_seq_ids == [0]
    assert scheduled.preempted_seq_ids == [1]
    assert update.stats.preemptions == [PreemptionEvent("recompute", 12)]
    assert update.stats.num_blocks_swapped_out == 0
    assert (b.status, b.num_computed_tokens, b.num_preemptions) == (RequestStatus.WAITING, 0, 1)
    assert list(scheduler.waiting) == [b]
    # a took one of b's 3 blocks and finished (6 outputs): b is admitted again and
    # prefills its prompt and 5 outputs (13 tokens) in one chunk, as a readmission.
    assert update.finished == [a]
    assert manager.pool.num_free_blocks == 6
    scheduled, update = step(scheduler)
    assert (scheduled.prefill_seq_ids, scheduled.prefill_lens) == ([1], [13])
    assert scheduled.sample_seq_ids == [1]
    assert scheduled.finished_seq_ids == [0]
    assert update.stats.prefix_queries == [PrefixQuery(13, 0, True)]
    assert b.status is RequestStatus.RUNNING


def test_swap_preemption_keeps_the_victims_tokens_and_restores_it_first(native):
    manager = make_manager(native, num_blocks=6, num_swap_blocks=6)
    scheduler = make_scheduler(manager, preemption="swap", costs=SWAP_CHEAPER)
    a, b = _two_decoders(manager, scheduler)
    scheduled, update = step(scheduler)
    assert scheduled.preempted_seq_ids == [1]
    # b's blocks: 2 and 3 from its prefill, 5 from its first decode.
    assert list(scheduled.swap_outs) == [BlockSwap(2, 0), BlockSwap(3, 1), BlockSwap(5, 2)]
    assert update.stats.preemptions == [PreemptionEvent("swap", 0)]
    assert update.stats.num_blocks_swapped_out == 3
    assert (b.status, b.num_computed_tokens) == (RequestStatus.WAITING, 12)
    assert is_swapped(manager, b)
    assert manager.swap_space.num_used_blocks == 3
    assert update.finished == [a]
    # Back in 3 fresh blocks and a fourth for its token 13: it decodes at once.
    scheduled, update = step(scheduler)
    assert len(scheduled.swap_ins) == 3
    assert [s.host_block_id for s in scheduled.swap_ins] == [0, 1, 2]
    assert update.stats.num_blocks_swapped_in == 3
    assert scheduled.prefill_seq_ids == []
    assert (scheduled.decode_seq_ids, scheduled.decode_context_lens) == ([1], [13])
    assert not is_swapped(manager, b)
    assert manager.num_held_blocks(1) == 4
    assert update.stats.prefix_queries == []  # a restore looks nothing up


def test_the_swap_plugin_recomputes_when_that_is_cheaper_or_the_swap_space_is_full(native):
    manager = make_manager(native, num_blocks=6, num_swap_blocks=6)
    scheduler = make_scheduler(manager, preemption="swap", costs=RECOMPUTE_CHEAPER)
    _, b = _two_decoders(manager, scheduler)
    _, update = step(scheduler)
    assert update.stats.preemptions == [PreemptionEvent("recompute", 12)]
    assert (b.num_computed_tokens, is_swapped(manager, b)) == (0, False)
    # Swapping preferred, but no host block to swap into.
    manager = make_manager(native, num_blocks=6, num_swap_blocks=0)
    scheduler = make_scheduler(manager, preemption="swap", costs=SWAP_CHEAPER)
    _, b = _two_decoders(manager, scheduler)
    _, update = step(scheduler)
    assert update.stats.preemptions == [PreemptionEvent("recompute_fallback", 12)]
    assert update.stats.num_blocks_swapped_out == 0
    assert (b.status, b.num_computed_tokens) == (RequestStatus.WAITING, 0)


# -- parallel sampling -----------------------------------------------------------------------


def test_n_samples_fork_when_the_prompt_is_computed_and_copy_the_shared_tail(native):
    manager = make_manager(native, num_blocks=16)
    scheduler = make_scheduler(manager)
    r = request(0, tokens(6), max_tokens=3, n=2)
    scheduler.add_request(r)
    scheduled, update = step(scheduler, [10, 11])
    assert scheduled.forks == [Fork(0, FIRST_FORK_ID, 1)]
    assert scheduled.sample_seq_ids == [0, FIRST_FORK_ID]  # the child samples from r's logits
    (child,) = r.children
    assert (child.seq_id, child.parent, child.status) == (FIRST_FORK_ID, r, RequestStatus.RUNNING)
    assert update.first_tokens == [r]  # a sample's first token is its request's
    assert (r.output_token_ids, child.output_token_ids) == ([10], [11])
    assert manager.tables.block_ids(FIRST_FORK_ID) == [0, 1]
    assert [manager.pool.ref_count(b) for b in (0, 1)] == [2, 2]
    # Both write token 6 into block 1 (2 of its slots hold the prompt): r gets a copy.
    scheduled, _ = step(scheduler, [20, 21])
    assert scheduled.decode_seq_ids == [0, FIRST_FORK_ID]
    assert scheduled.block_copies == [BlockCopy(1, 2)]
    assert scheduled.block_tables.tolist() == [[0, 2], [0, 1]]
    _, update = step(scheduler, [30, 31])
    assert update.finished == [r, child]
    assert r.is_group_finished
    assert (r.output_token_ids, child.output_token_ids) == ([10, 20, 30], [11, 21, 31])
    assert manager.pool.num_free_blocks == 16


def test_a_request_waits_while_samples_owed_fill_max_num_seqs(native):
    manager = make_manager(native, num_blocks=16)
    scheduler = make_scheduler(manager, max_num_seqs=2)
    r = request(0, tokens(6), max_tokens=2, n=2)
    other = request(1, tokens(4, 100), max_tokens=1)
    scheduler.add_request(r)
    scheduler.add_request(other)
    scheduled, _ = step(scheduler)
    assert scheduled.prefill_seq_ids == [0]  # r and its sample fill the 2 sequences
    assert list(scheduler.waiting) == [other]
    scheduled, update = step(scheduler)
    assert scheduled.decode_seq_ids == [0, FIRST_FORK_ID]
    assert scheduled.prefill_seq_ids == []
    assert update.finished == [r, *r.children]
    scheduled, _ = step(scheduler)
    assert scheduled.prefill_seq_ids == [1]


# -- abort ---------------------------------------------------------------------------------


def test_abort_of_a_running_a_waiting_and_a_swapped_request_returns_their_blocks(native):
    manager = make_manager(native, num_blocks=6, num_swap_blocks=6)
    scheduler = make_scheduler(manager, preemption="swap", costs=SWAP_CHEAPER)
    a = request(0, tokens(8), max_tokens=20)
    b = request(1, tokens(8, 100), max_tokens=20)
    scheduler.add_request(a)
    scheduler.add_request(b)
    for _ in range(6):  # as in _two_decoders, and b is swapped out in step 6
        step(scheduler)
    assert is_swapped(manager, b)
    waiting = request(2, tokens(4, 200))
    scheduler.add_request(waiting)
    assert list(scheduler.waiting) == [b, waiting]
    assert scheduler.abort(b) == [b]
    assert not is_swapped(manager, b)
    assert manager.swap_space.num_used_blocks == 0
    assert scheduler.abort(waiting) == [waiting]
    assert list(scheduler.waiting) == []
    assert manager.num_held_blocks(0) == 4
    assert scheduler.abort(a) == [a]
    manager.check_integrity()
    scheduler.check_integrity()
    assert scheduler.running == []
    assert scheduler.num_running_computed_tokens == 0
    assert all(r.status is RequestStatus.ABORTED for r in (a, b, waiting))
    assert manager.pool.num_free_blocks == 6
    assert scheduler.abort(a) == []  # already finished
    scheduler.add_request(request(3, tokens(4, 300)))
    scheduled, _ = step(scheduler)
    assert scheduled.finished_seq_ids == [1, 2, 0]


def test_abort_ends_every_sample_of_a_request(native):
    manager = make_manager(native, num_blocks=16)
    scheduler = make_scheduler(manager)
    r = request(0, tokens(6), max_tokens=8, n=3)
    scheduler.add_request(r)
    step(scheduler)
    assert len(scheduler.running) == 3
    assert scheduler.num_running_computed_tokens == 3 * 6  # the samples share the prompt
    assert scheduler.abort(r) == [r, *r.children]
    manager.check_integrity()
    scheduler.check_integrity()
    assert scheduler.running == []
    assert scheduler.num_running_computed_tokens == 0
    assert manager.pool.num_free_blocks == 16


def test_a_request_that_fits_the_empty_pool_is_admitted_after_a_windowed_hit(native):
    # Window 8, 4 sinks: a sequence holds at most 4 blocks, the whole pool. The first
    # request leaves its 4 published blocks evictable; the second matches all 4 of them,
    # a hit with no room (see test_kv_manager's windowed hit test for the counts): it is
    # admitted without the hit, prefilling all 17 tokens, rather than never.
    manager = make_manager(native, num_blocks=4, prefix="block_hash", window=8)
    scheduler = make_scheduler(manager, budget=32)
    limits = ServingLimits(MAX_MODEL_LEN, VOCAB, 4, "test", True, False)
    first = request(0, tokens(16), max_tokens=1)
    second = request(1, tokens(17), max_tokens=1)
    for r in (first, second):
        check_servable(r.request_id, r.prompt_token_ids, r.sampling, limits, manager)
    scheduler.add_request(first)
    _, update = step(scheduler)
    assert update.finished == [first]
    assert manager.pool.num_evictable_blocks == 4
    scheduler.add_request(second)
    scheduled, update = step(scheduler)  # its 4 blocks hold the first 16 tokens
    assert (scheduled.prefill_seq_ids, scheduled.prefill_starts) == ([1], [0])
    assert (scheduled.prefill_lens, update.finished) == ([16], [])
    scheduled, update = step(scheduler)  # the window moved on: a block came back
    assert (scheduled.prefill_starts, scheduled.prefill_lens) == ([16], [1])
    assert update.finished == [second]


# -- property: every step runs something, and everything finishes --------------------------

CONFIGS = [  # (prefix, window)
    ("none", None),
    ("block_hash", None),
    ("radix", None),
    ("block_hash", 8),  # sliding window of 8 tokens, 4 sinks
]
STOP_TOKEN = 3


@st.composite
def request_mixes(draw: st.DrawFn) -> list[tuple[int, int, int, int, bool]]:
    """(prompt length, leading tokens shared with the others, max_tokens, n, stops)."""
    return draw(
        st.lists(
            st.tuples(
                st.integers(1, 24),
                st.integers(0, 16),
                st.integers(1, 12),
                st.sampled_from([1, 1, 2]),
                st.booleans(),
            ),
            min_size=2,
            max_size=12,
        )
    )


def check_refusals(manager: KVCacheManager) -> None:
    """Makes every refusal that ``manager`` remembers, and that lets its admission skip a
    request unmatched, check that matching and checking it again would have refused it too
    (its memo left as it was). The memo is private to the manager: the door does not show
    it, so the check reaches in."""
    still_refused = manager._still_refused

    def checked(request: Request) -> bool:
        refused = still_refused(request)
        if refused:
            memo = manager._refusal
            assert manager._admissible(request, manager.prefix.match(request)) is None
            manager._refusal = memo
        return refused

    manager._still_refused = checked  # type: ignore[method-assign]


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("prefix,window", CONFIGS, ids=[f"{p}-{w}" for p, w in CONFIGS])
@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    native=st.booleans(),
    num_blocks=st.integers(6, 12),
    budget=st.integers(4, 24),
    max_num_seqs=st.integers(1, 4),
    mix=request_mixes(),
)
def test_every_step_runs_something_and_every_request_finishes(
    prefix, window, native, preemption, num_blocks, budget, max_num_seqs, mix
):
    manager = make_manager(
        native, num_blocks, prefix, window, num_swap_blocks=num_blocks // 2, watermark=0.1
    )
    check_refusals(manager)
    budget = max(budget, max_num_seqs)
    scheduler = make_scheduler(manager, budget, max_num_seqs, preemption, SWAP_CHEAPER)
    limits = ServingLimits(MAX_MODEL_LEN, VOCAB, max_num_seqs, "test", True, False)
    requests = []
    for i, (length, shared, max_tokens, n, stops) in enumerate(mix):
        prompt = tokens(min(shared, length), 10) + tokens(length - min(shared, length), 100 * i)
        sampling = SamplingParams(
            max_tokens=max_tokens, n=n, stop_token_ids=(STOP_TOKEN,) if stops else ()
        )
        try:
            check_servable(str(i), prompt, sampling, limits, manager)
        except RequestRejectedError:
            continue  # the engine refuses it when it is added
        r = Request(str(i), i, prompt, sampling)
        scheduler.add_request(r)
        requests.append(r)
    for _ in range(500):
        if not scheduler.num_unfinished:
            break
        scheduled = scheduler.schedule()
        assert not scheduled.is_empty, "an empty step while requests are unfinished"
        assert scheduled.num_batched_tokens <= budget
        assert len(scheduler.running) <= max_num_seqs
        assert len(set(scheduled.sample_seq_ids)) == len(scheduled.sample_seq_ids)
        # Tokens vary by sequence and step; a request that stops meets its stop token
        # about one step in five.
        next_tokens = [
            (seq_id * 7 + scheduled.step) % 5 + STOP_TOKEN for seq_id in scheduled.sample_seq_ids
        ]
        scheduler.update(scheduled, ModelOutput(next_tokens, 0.01))
        manager.check_integrity()
        scheduler.check_integrity()  # among others: the running requests' computed tokens
    assert scheduler.num_unfinished == 0
    assert scheduler.num_running_computed_tokens == 0
    for r in requests:
        assert r.is_group_finished
        assert len(r.children) == r.sampling.n - 1
        for sample in (r, *r.children):
            assert 1 <= sample.num_output_tokens <= r.sampling.max_tokens
    assert manager.tables.seq_ids() == []
    assert manager.swap_space.num_used_blocks == 0
    assert manager.num_promised_blocks == 0
    assert manager.pool.num_used_blocks == len(set(manager.prefix.held_block_ids()))

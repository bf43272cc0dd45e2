"""Liveness under memory pressure: every request admission accepts finishes (or ends as
its caller aborts it) under every valid plugin combination, with every cache invariant
intact after every step and no block left behind.

A property-based test drives random tight workloads (ragged prompts sharing random
prefixes, parallel samples and beams where the allocator can fork, stop tokens, aborts
between steps, blocks of 4 and 16, watermark 0, pools between what the longest request
needs and twice that) through the simulator over every valid combination of allocator ×
prefix cache × eviction (window, sinks, strict bound) × preemption × quantizer × Rust or
Python structures; a quarter of the examples are beam groups under radix in pools their
beams just fill. A smaller run drives the torch executor on the tiny model, so the
executor's side of the step contract is covered too. A run fails at a stall: too many
steps in a row that produce no token (``step_to_the_end``), however busy the scheduler.

Sizing: run against the scheduler as it was before this test existed, the simulator
property as derandomized here (hypothesis' generate phase) met its first scheduler stall
("no progress") at example 15 and its second at example 27; with random seeds the first
came at example 206 for seed 0 and not within 3,000 for seed 1. Its first failure of any
kind there (the radix cache's usage counting a block twice) came within 5-89 examples
over 8 seeds. Later, against the code before beam groups were admitted whole, the default
run failed on each of the three faults in turn (fixing one to find the next): a beam group
under radix preempted and readmitted forever, the simulator losing the beam width of a
beam forked from a parent finishing in the same step, an aborted request reporting its
first sample's reason. ``SIM_EXAMPLES`` runs 500 on every CI run (about 40 s);
``ENGINEKIT_LIVENESS_EXAMPLES`` runs more, and ``ENGINEKIT_LIVENESS_SEED`` draws them from
a seed instead of the fixed derandomized sequence (a soak: one process per seed).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from enginekit import Engine, SamplingParams
from enginekit.config import (
    DEFAULT_PLUGINS,
    PLUGIN_GROUPS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from enginekit.errors import RequestRejectedError
from enginekit.kv.backend import make_backend
from enginekit.plugins import load_plugin

SIM_EXAMPLES = int(os.environ.get("ENGINEKIT_LIVENESS_EXAMPLES", "500"))
TORCH_EXAMPLES = int(os.environ.get("ENGINEKIT_LIVENESS_TORCH_EXAMPLES", "25"))
SOAK_SEED = os.environ.get("ENGINEKIT_LIVENESS_SEED")
STALL_SLACK_STEPS = 64  # steps beyond the recomputation bound before a stall is declared

CHOICES = {
    "allocator": ("paged", "contiguous"),
    "prefix": ("none", "block_hash", "radix"),
    "eviction": ("lru", "sliding_window"),
    "preemption": ("recompute", "swap"),
    "quantizer": ("none", "fp8", "int4"),
    "tier": ("none", "host"),
    "queue": ("fcfs", "lpm", "priority", "fair"),
}


def _is_valid(combination: dict[str, str]) -> bool:
    selected = {group: load_plugin(group, combination[group]) for group in PLUGIN_GROUPS}
    for plugin_cls in selected.values():
        try:
            plugin_cls.check_compatible(selected)
        except Exception:
            return False
    return True


def _valid_combinations() -> list[dict[str, str]]:
    groups = list(CHOICES)
    combinations = [
        dict(zip(groups, names, strict=True))
        for names in itertools.product(*(CHOICES[g] for g in groups))
    ]
    return [c for c in combinations if _is_valid(c)]


VALID = _valid_combinations()


def test_the_combinations_cover_every_plugin_and_leave_out_only_refused_ones():
    assert {DEFAULT_PLUGINS[g] for g in PLUGIN_GROUPS} <= {n for c in VALID for n in c.values()}
    for group, names in CHOICES.items():
        assert {c[group] for c in VALID} == set(names)
    # paged: 3 prefix caches with lru, 2 with sliding_window (not radix); contiguous: no
    # prefix cache, lru only; each with 2 preemptions and 3 quantizers; a host tier is
    # refused with sliding_window only; every queue with every combination
    assert len(VALID) == ((3 + 2) * 2 * 3 + 1 * 2 * 3 + (3 * 2 * 3 + 1 * 2 * 3)) * 4


def _plugin_config(group: str, name: str, **keys: Any) -> Any:
    return load_plugin(group, name).Config(**keys)


# 1,500 of the tiny model's 32,000 tokens: about one in twenty of the simulator's, spread
# over the vocabulary, is a stop token.
STOP_TOKEN_IDS = tuple(range(100, 1600))


class Workload(NamedTuple):
    """One request of a workload, as ``run_to_the_end`` adds it."""

    prompt: list[int]
    max_tokens: int
    n: int
    beam_width: int
    arrival: float
    stop_token_ids: tuple[int, ...]
    abort_after: int | None  # the step after which its caller aborts it, if unfinished

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            ignore_eos=True,
            n=self.n,
            beam_width=self.beam_width,
            seed=1,
            stop_token_ids=self.stop_token_ids,
        )


@st.composite
def workloads(draw: Any, executor: str) -> dict[str, Any]:
    """An engine config and its requests (``Workload``).
    Half the examples run a sliding window (its promises and holes are where admission is
    most intricate), and the pool is drawn around what the longest request needs, so
    requests share it and preempt."""
    # Chosen uniformly (hypothesis would lean toward the first of a sampled_from).
    choose = draw(st.randoms(use_true_random=False))
    # A quarter of the examples: beam groups under radix in a pool their beams just fill,
    # where a preempted group fits back only whole (one beam's partial hit pins a block).
    beams_in_a_tight_radix_pool = choose.random() < 0.25
    is_windowed = not beams_in_a_tight_radix_pool and choose.random() < 0.5
    combination = choose.choice(
        [c for c in VALID if c["prefix"] == "radix"]
        if beams_in_a_tight_radix_pool
        else [c for c in VALID if (c["eviction"] == "sliding_window") == is_windowed]
    )
    plugin_keys: dict[str, dict[str, Any]] = {group: {} for group in PLUGIN_GROUPS}
    if combination["eviction"] == "sliding_window":
        plugin_keys["eviction"] = {
            "window": draw(st.sampled_from((48, 16, 6))),
            "sink_tokens": draw(st.sampled_from((0, 4))),
            "strict_bound": draw(st.booleans()),
        }
    if combination["tier"] == "host":  # a few blocks, so the tier evicts too
        plugin_keys["tier"] = {"host_gib": draw(st.sampled_from((1e-4, 1e-3, 0.1)))}
    if combination["preemption"] == "swap":
        plugin_keys["preemption"] = {"swap_space_gib": draw(st.sampled_from((0.0, 1e-5, 1.0)))}
    max_num_seqs = draw(st.sampled_from((4, 2, 8)))
    max_model_len = None
    if combination["allocator"] == "contiguous":
        max_model_len = draw(st.sampled_from((48, 96)))  # a slab is max_model_len tokens
    block_size = 16 if beams_in_a_tight_radix_pool else draw(st.sampled_from((4, 16)))
    # Lengths come from short lists of typical values rather than wide ranges: hypothesis
    # leans toward small values, and a few long prompts sharing a prefix are what stress
    # the cache. The token values themselves never matter, only which prompts share them.
    tokens = random.Random(draw(st.integers(0, 2**16)))
    base = tokens.choices(range(3, 500), k=draw(st.sampled_from((100, 64, 40, 17, 0))))
    can_fork = combination["allocator"] == "paged"
    fan_outs = ((1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (1, 3)) if can_fork else ((1, 1),)
    if beams_in_a_tight_radix_pool:  # each beam within a block or two
        base = base[: choose.randint(1, 15)]
        fan_outs = ((1, 3), (2, 3), (1, 2), (3, 3))
    requests = []
    for _ in range(draw(st.sampled_from((3, 2, 4, 5, 1)))):
        shared = base[: int(len(base) * draw(st.sampled_from((1.0, 0.5, 0.8, 0.2, 0.0))))]
        num_own = draw(st.sampled_from((3, 0, 1, 9, 24, 12)))
        if beams_in_a_tight_radix_pool:
            shared, num_own = base, draw(st.sampled_from((0, 1, 2)))
        own = tokens.choices(range(3, 500), k=num_own if num_own or shared else 1)
        n, beam_width = draw(st.sampled_from(fan_outs))
        arrival = draw(st.sampled_from((0.0, 0.0, 1e-3, 1e-2)))
        max_tokens = draw(st.sampled_from((8, 1, 2, 3, 16)))
        # Samples that stop early (the simulator's tokens are spread over the vocabulary),
        # so that the samples of one request end at different steps.
        stop = draw(st.sampled_from(((), (), STOP_TOKEN_IDS)))
        # Aborted by its caller after that many steps (if it has not finished by then).
        abort_after = draw(st.sampled_from((None, None, None, 1, 3, 6)))
        requests.append(
            Workload(shared + own, max_tokens, n, beam_width, arrival, stop, abort_after)
        )
    # The pool: between the blocks the longest request holds at most (a windowed one: its
    # bound) and twice that, where requests must share it and preempt.
    bound = None
    if is_windowed:
        keys = plugin_keys["eviction"]
        bound = -(-keys["sink_tokens"] // block_size) + -(-keys["window"] // block_size) + 1
    need = 1
    for r in requests:
        num_longest = -(-(len(r.prompt) + r.max_tokens) // block_size)
        need = max(need, r.beam_width * min(num_longest, bound or num_longest))
    num_blocks = draw(st.integers(need, need + 1 if beams_in_a_tight_radix_pool else 2 * need))
    native = draw(st.booleans())  # the Rust structures, or their Python twins
    config = EngineConfig(
        **{
            group: _plugin_config(group, name, **plugin_keys[group])
            for group, name in combination.items()
        },
        model=ModelConfig(name="tiny", max_model_len=max_model_len),
        cache=CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            watermark=0.0,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=draw(st.sampled_from((12, 64, max_num_seqs))),
        ),
        executor=executor,
        progress=False,
    )
    return {
        "config": config,
        "native": native,
        "requests": requests,
        "cheap_swap": draw(st.booleans()),
    }


def num_tokens_produced(engine: Engine) -> int:
    """Output tokens the engine's requests hold (every sample, every surviving beam), plus
    one per finished request: what grows when a step makes progress. A preemption, a
    readmission or a recomputed prefill chunk changes state but produces nothing."""
    return sum(
        sum(map(len, output.samples)) + (output.finish_reason is not None)
        for output in engine.outputs()
    )


def stall_bound(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> int:
    """Steps without a produced token after which a run is stalled: computing every
    sequence's every token (prompt and outputs, each sample and beam) twice over at the
    smallest step budget, plus slack. A live scheduler produces a token well within it:
    a prefill chunk spends at least one budget token, and a request computed again after a
    preemption recomputes at most what it held."""
    num_tokens = 0
    for prompt, sampling in requests:
        num_tokens += max(sampling.n, sampling.beam_width) * (len(prompt) + sampling.max_tokens)
    budget = engine.config.scheduler.max_num_batched_tokens
    return 2 * -(-num_tokens // budget) + STALL_SLACK_STEPS


def step_to_the_end(
    engine: Engine,
    requests: list[tuple[list[int], SamplingParams]],
    aborts: dict[int, list[str]] | None = None,
) -> set[str]:
    """Steps until every request has finished, checking every invariant after every step,
    and aborts the requests ``aborts`` lists under a step number before that step (those
    still unfinished then). Returns the ids aborted. Raises AssertionError on a stall:
    ``stall_bound`` steps in a row that produce no token (a scheduler that preempts and
    readmits forever changes state at every step, so the count of steps alone would only
    catch it late). ``requests``: what was added."""
    bound = stall_bound(engine, requests)
    produced, num_idle_steps = num_tokens_produced(engine), 0
    aborted: set[str] = set()
    num_steps = 0
    while engine.has_unfinished_requests():
        for request_id in (aborts or {}).get(num_steps, []):
            if engine.abort_request(request_id):
                aborted.add(request_id)
                engine.check_integrity()
        engine.step()
        num_steps += 1
        engine.check_integrity()
        now = num_tokens_produced(engine)
        num_idle_steps = 0 if now > produced else num_idle_steps + 1
        produced = now
        if num_idle_steps > bound:
            raise AssertionError(
                f"stalled: {num_idle_steps} steps in a row produced no token "
                f"({engine.metrics.summary(1)['num_preemptions_total']} preemptions so far)"
            )
    return aborted


def run_to_the_end(
    workload: dict[str, Any],
) -> tuple[Engine, dict[str, SamplingParams], set[str]]:
    """Adds the workload's requests (those add_request rejects are left out), steps until
    every accepted one has finished or been aborted (``step_to_the_end``); returns the
    engine, each accepted request's sampling and the ids aborted."""
    engine = Engine(workload["config"], make_backend(workload["native"]))
    preemption = engine.scheduler.preemption
    if workload["cheap_swap"] and hasattr(preemption, "costs"):
        preemption.costs = dataclasses.replace(preemption.costs, swap_s_per_block=1e-12)
    accepted: dict[str, SamplingParams] = {}
    added = []
    aborts: dict[int, list[str]] = {}
    for request in workload["requests"]:
        sampling = request.sampling()
        try:
            request_id = engine.add_request(request.prompt, sampling, arrival_time=request.arrival)
        except RequestRejectedError:
            continue
        accepted[request_id] = sampling
        added.append((request.prompt, sampling))
        if request.abort_after is not None:
            aborts.setdefault(request.abort_after, []).append(request_id)
    aborted = step_to_the_end(engine, added, aborts)
    return engine, accepted, aborted


def assert_finished_and_nothing_leaked(
    engine: Engine,
    accepted: dict[str, SamplingParams],
    aborted: Collection[str] = (),
) -> None:
    """Every accepted request ended as it should: each sample at ``max_tokens`` (length)
    or at a stop token (stop), or, for an aborted one, ``abort`` with samples no longer;
    no block, promise or host block is left held."""
    for request_id, sampling in accepted.items():
        output = engine.output(request_id)
        reasons = output.finish_reasons
        assert len(reasons) == len(output.samples), request_id
        if request_id in aborted:
            assert output.finish_reason == "abort", (request_id, reasons)
            # Parallel samples: one at least was cut short. Beams: the best may have ended.
            assert sampling.beam_width > 1 or "abort" in reasons, (request_id, reasons)
        else:
            assert output.finish_reason == reasons[0] != "abort", (request_id, reasons)
        for sample, reason in zip(output.samples, reasons, strict=True):
            assert len(sample) <= sampling.max_tokens, (request_id, sample)
            if reason == "length":
                assert len(sample) == sampling.max_tokens, (request_id, sample)
            elif reason == "stop":
                assert sample[-1] in sampling.stop_token_ids, (request_id, sample)
            else:
                assert reason == "abort" and request_id in aborted, (request_id, reason)
    kv = engine.cache
    assert list(kv.tables.seq_ids()) == []
    assert kv.num_promised_blocks == 0
    usage = engine.kv_usage()
    assert usage.num_used_blocks == 0
    assert usage.num_free_blocks + usage.num_evictable_blocks == usage.num_total_blocks
    assert kv.swap_space.num_used_blocks == 0


def _examples(num_examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Derandomized, so every CI run drives the same workloads (a failure reproduces);
    drawn from ``ENGINEKIT_LIVENESS_SEED`` instead where it is set (a soak run by hand
    spreads its examples over processes with a seed each)."""

    def apply(test: Callable[..., None]) -> Callable[..., None]:
        test = settings(
            max_examples=num_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            derandomize=SOAK_SEED is None,
        )(test)
        return test if SOAK_SEED is None else seed(int(SOAK_SEED))(test)

    return apply


@_examples(SIM_EXAMPLES)
@given(workloads("sim"))
def test_every_accepted_request_finishes_in_the_simulator(workload):
    assert_finished_and_nothing_leaked(*run_to_the_end(workload))


@_examples(TORCH_EXAMPLES)
@given(workloads("torch"))
def test_every_accepted_request_finishes_on_the_torch_executor(workload):
    assert_finished_and_nothing_leaked(*run_to_the_end(workload))


# -- the stalls the property found, one test each -----------------------------------------


def _sim(*overrides: str) -> Engine:
    return Engine.from_overrides(
        ["executor=sim", "model=tiny", "progress=false", "cache.watermark=0", *overrides]
    )


def _run_checked(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> Engine:
    for prompt, sampling in requests:
        engine.add_request(prompt, sampling)
    step_to_the_end(engine, requests)
    for output in engine.outputs():
        assert output.finish_reason == "length"
    return engine


def _greedy(max_tokens: int, **kwargs: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


WINDOWED = ["+eviction=sliding_window", "eviction.window=48", "eviction.sink_tokens=0"]


def test_a_window_releasing_a_block_another_prefill_matched_tops_its_promise_up():
    """The window gives back a block a second request matched: the promise falls short
    until that request lets go (here: it is preempted when its decode cannot grow)."""
    y = [3 + (i * 37) % 490 for i in range(63)]
    z = y[:16] + [3 + (i * 11) % 490 for i in range(14)]
    x = list(range(100, 114))
    engine = _sim(*WINDOWED, "+prefix=block_hash", "cache.block_size=16", "cache.num_blocks=5")
    _run_checked(engine, [(x, _greedy(4)), (y, _greedy(4)), (z, _greedy(4))])
    assert engine.metrics.summary(1)["num_preemptions_total"] > 0


def test_two_strictly_bounded_prefills_short_of_a_block_each_are_unblocked_by_a_preemption():
    a = [3 + (i * 37) % 490 for i in range(101)]
    engine = _sim(
        *WINDOWED,
        "+prefix=block_hash",
        "eviction.strict_bound=true",
        "cache.block_size=4",
        "cache.num_blocks=16",
    )
    _run_checked(engine, [(a, _greedy(8)), (a[:48], _greedy(8))])


def test_a_prefill_swapped_out_with_one_prompt_token_left_is_restored_as_a_prefill():
    engine = _sim(
        "+prefix=none",
        "+preemption=swap",
        "preemption.swap_space_gib=0.001",
        "cache.block_size=4",
        "cache.num_blocks=4",
        "scheduler.max_num_batched_tokens=12",
        "scheduler.max_num_seqs=4",
    )
    swap = engine.scheduler.preemption
    swap.costs = dataclasses.replace(swap.costs, swap_s_per_block=1e-12)  # type: ignore[attr-defined]
    _run_checked(engine, [(list(range(10, 18)), _greedy(2)), (list(range(20, 25)), _greedy(3))])
    assert engine.metrics.num_preemptions_by_kind.get("swap", 0) > 0


def test_a_request_whose_slab_is_the_whole_pool_is_admitted_despite_the_watermark():
    """One 2,048-token slab is all 128 blocks: the watermark keeps blocks for running
    sequences to grow into, and with none running it keeps nothing."""
    engine = Engine.from_overrides(
        ["executor=sim", "model=tiny", "progress=false", "+allocator=contiguous", "+prefix=none"]
        + ["cache.num_blocks=128"]
    )
    assert engine.cache.num_watermark_blocks == 1
    _run_checked(engine, [([1, 2, 3], _greedy(2)), ([4, 5], _greedy(2))])


def test_a_preempted_beam_group_does_not_block_another_groups_waiting_beam():
    p = [470, 23, 139, 307]
    engine = _sim("cache.block_size=16", "cache.num_blocks=6", "+prefix=radix")
    requests = [
        (p, _greedy(14, beam_width=2)),
        (p + [23, 10, 496, 264, 451, 117, 309, 122], _greedy(23, beam_width=2)),
        (p + [23, 10, 496, 387, 496, 304, 88, 136, 169, 365, 262], _greedy(3)),
    ]
    _run_checked(engine, requests)


def test_a_copy_on_write_source_that_is_the_only_block_is_evicted_and_the_prompt_prefilled():
    engine = _sim("+prefix=radix", "cache.num_blocks=1")
    _run_checked(engine, [([1, 2], _greedy(2)), ([1, 2, 3], _greedy(1))])
    assert engine.output("1").num_cached_tokens == 0


def test_a_preempted_beam_group_is_readmitted_whole_when_a_radix_hit_would_split_it():
    """Three beams of one block each fill the pool; preempted, the first beam's radix hit
    (ending inside a block: a copy, with the cached block pinned) left no room for its
    siblings, so it ran alone, waited for them, was preempted and readmitted, forever."""
    engine = _sim("+prefix=radix", "cache.block_size=16", "cache.num_blocks=3")
    _run_checked(engine, [(list(range(3, 15)), _greedy(3, beam_width=3))])
    assert engine.metrics.summary(1)["num_preemptions_total"] > 0


def test_beam_groups_sharing_a_prefix_under_radix_all_finish():
    prefix = list(range(3, 15))
    own = [[297, 315, 120], [232, 361, 348], [307, 255, 344]]
    engine = _sim("+prefix=radix", "cache.block_size=16", "cache.num_blocks=6")
    _run_checked(engine, [(prefix + tokens, _greedy(4, beam_width=3)) for tokens in own])

"""Liveness under memory pressure: every request admission accepts finishes, under every
valid plugin combination, with every cache invariant intact after every step and no block
left behind.

A property-based test drives random tight workloads (ragged prompts sharing random
prefixes, parallel samples and beams where the allocator can fork, blocks of 4 and 16,
watermark 0, pools between what the longest request needs and twice that) through the
simulator over every valid combination of allocator × prefix cache × eviction (window,
sinks, strict bound) × preemption × quantizer × Rust or Python structures. A smaller run
drives the torch executor on the tiny model, so the executor's side of the step contract
is covered too.

Sizing: run against the scheduler as it was before this test existed, the simulator
property as derandomized here (hypothesis' generate phase) met its first scheduler stall
("no progress") at example 15 and its second at example 27; with random seeds the first
came at example 206 for seed 0 and not within 3,000 for seed 1. Its first failure of any
kind there (the radix cache's usage counting a block twice) came within 5-89 examples
over 8 seeds. ``SIM_EXAMPLES`` runs 500 on every CI run (about
25 s); ``ENGINEKIT_LIVENESS_EXAMPLES`` runs more.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
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
MAX_STEPS = 3000  # far above what these workloads need: a run past it is a livelock

CHOICES = {
    "allocator": ("paged", "contiguous"),
    "prefix": ("none", "block_hash", "radix"),
    "eviction": ("lru", "sliding_window"),
    "preemption": ("recompute", "swap"),
    "quantizer": ("none", "fp8", "int4"),
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
    # prefix cache, lru only; each with 2 preemptions and 3 quantizers
    assert len(VALID) == (3 + 2) * 2 * 3 + 1 * 2 * 3


def _plugin_config(group: str, name: str, **keys: Any) -> Any:
    return load_plugin(group, name).Config(**keys)


@st.composite
def workloads(draw: Any, executor: str) -> dict[str, Any]:
    """An engine config and its requests: (prompt, max_tokens, n, beam_width, arrival).
    Half the examples run a sliding window (its promises and holes are where admission is
    most intricate), and the pool is drawn around what the longest request needs, so
    requests share it and preempt."""
    # Chosen uniformly (hypothesis would lean toward the first of a sampled_from).
    choose = draw(st.randoms(use_true_random=False))
    is_windowed = choose.random() < 0.5
    combination = choose.choice(
        [c for c in VALID if (c["eviction"] == "sliding_window") == is_windowed]
    )
    plugin_keys: dict[str, dict[str, Any]] = {group: {} for group in PLUGIN_GROUPS}
    if combination["eviction"] == "sliding_window":
        plugin_keys["eviction"] = {
            "window": draw(st.sampled_from((48, 16, 6))),
            "sink_tokens": draw(st.sampled_from((0, 4))),
            "strict_bound": draw(st.booleans()),
        }
    if combination["preemption"] == "swap":
        plugin_keys["preemption"] = {"swap_space_gib": draw(st.sampled_from((0.0, 1e-5, 1.0)))}
    max_num_seqs = draw(st.sampled_from((4, 2, 8)))
    max_model_len = None
    if combination["allocator"] == "contiguous":
        max_model_len = draw(st.sampled_from((48, 96)))  # a slab is max_model_len tokens
    block_size = draw(st.sampled_from((4, 16)))
    # Lengths come from short lists of typical values rather than wide ranges: hypothesis
    # leans toward small values, and a few long prompts sharing a prefix are what stress
    # the cache. The token values themselves never matter, only which prompts share them.
    tokens = random.Random(draw(st.integers(0, 2**16)))
    base = tokens.choices(range(3, 500), k=draw(st.sampled_from((100, 64, 40, 17, 0))))
    can_fork = combination["allocator"] == "paged"
    fan_outs = ((1, 1), (2, 1), (1, 2), (2, 2)) if can_fork else ((1, 1),)
    requests = []
    for _ in range(draw(st.sampled_from((3, 2, 4, 5, 1)))):
        shared = base[: int(len(base) * draw(st.sampled_from((1.0, 0.5, 0.8, 0.2, 0.0))))]
        num_own = draw(st.sampled_from((3, 0, 1, 9, 24)))
        own = tokens.choices(range(3, 500), k=num_own if num_own or shared else 1)
        n, beam_width = draw(st.sampled_from(fan_outs))
        arrival = draw(st.sampled_from((0.0, 0.0, 1e-3, 1e-2)))
        max_tokens = draw(st.sampled_from((8, 1, 2, 3, 16)))
        requests.append((shared + own, max_tokens, n, beam_width, arrival))
    # The pool: between the blocks the longest request holds at most (a windowed one: its
    # bound) and twice that, where requests must share it and preempt.
    bound = None
    if is_windowed:
        keys = plugin_keys["eviction"]
        bound = -(-keys["sink_tokens"] // block_size) + -(-keys["window"] // block_size) + 1
    need = 1
    for prompt, max_tokens, _, beam_width, _ in requests:
        num_longest = -(-(len(prompt) + max_tokens) // block_size)
        need = max(need, beam_width * min(num_longest, bound or num_longest))
    num_blocks = draw(st.integers(need, 2 * need))
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


def run_to_the_end(workload: dict[str, Any]) -> tuple[Engine, dict[str, int]]:
    """Adds the workload's requests (those add_request rejects are left out), steps until
    every accepted one has finished, checking every invariant after every step; returns the
    engine and each accepted request's output length."""
    engine = Engine(workload["config"], make_backend(workload["native"]))
    preemption = engine.scheduler.preemption
    if workload["cheap_swap"] and hasattr(preemption, "costs"):
        preemption.costs = dataclasses.replace(preemption.costs, swap_s_per_block=1e-12)
    accepted: dict[str, int] = {}
    for prompt, max_tokens, n, beam_width, arrival in workload["requests"]:
        sampling = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, n=n, beam_width=beam_width, seed=1
        )
        try:
            request_id = engine.add_request(prompt, sampling, arrival_time=arrival)
        except RequestRejectedError:
            continue
        accepted[request_id] = max_tokens
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.check_integrity()
    else:
        raise AssertionError(f"unfinished after {MAX_STEPS} steps: a livelock")
    return engine, accepted


def assert_finished_and_nothing_leaked(engine: Engine, accepted: dict[str, int]) -> None:
    for request_id, max_tokens in accepted.items():
        output = engine.output(request_id)
        assert output.finish_reason == "length", request_id
        for sample in output.samples:
            assert len(sample) == max_tokens, (request_id, sample)
    kv = engine.cache
    assert list(kv.tables.seq_ids()) == []
    assert kv.num_promised_blocks == 0
    usage = engine.kv_usage()
    assert usage.num_used_blocks == 0
    assert usage.num_free_blocks + usage.num_evictable_blocks == usage.num_total_blocks
    assert kv.swap_space.num_used_blocks == 0


def _examples(num_examples: int) -> settings:
    """Derandomized, so every CI run drives the same workloads (a failure reproduces)."""
    return settings(
        max_examples=num_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,
    )


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
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished_requests()
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

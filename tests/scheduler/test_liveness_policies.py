"""Liveness under the eviction policies that hear accesses: the liveness property's random
tight workloads (every allocator, prefix cache, preemption, quantizer, tier and queue, Rust
or Python structures) with ``slru``, ``lfu`` or ``chain_aware`` in place of ``lru``. Every
accepted request finishes, every invariant (the policy's agreement with the pool
included) holds after every step, and nothing is left held.
"""

from __future__ import annotations

import dataclasses

from hypothesis import assume, given
from hypothesis import strategies as st
from test_liveness import _examples, assert_finished_and_nothing_leaked, run_to_the_end, workloads

from enginekit.plugins import load_plugin

POLICIES = ("slru", "lfu", "chain_aware")


@_examples(80)
@given(workloads("sim"), st.sampled_from(POLICIES), st.integers(1, 64))
def test_every_accepted_request_finishes_under_each_policy(workload, policy, half_life):
    config = workload["config"]
    assume(config.eviction.name == "lru")  # a windowed run keeps its own policy
    keys = {"half_life": half_life} if policy == "lfu" else {}
    eviction = load_plugin("eviction", policy).Config(**keys)
    workload = {**workload, "config": dataclasses.replace(config, eviction=eviction)}
    engine, accepted, aborted = run_to_the_end(workload)
    assert engine.cache.eviction.config.name == policy
    assert_finished_and_nothing_leaked(engine, accepted, aborted)

"""Seeded workloads and the ideal prefix-cache hits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.workloads import WORKLOADS, WorkloadRequest, ideal_prefix_hit_tokens, make_workload

VOCAB = 128256


def small(**kw) -> WorkloadConfig:
    return replace(WorkloadConfig(num_requests=200), **kw)


@pytest.mark.parametrize("name", WORKLOADS)
def test_seeded_and_reproducible(name):
    a = make_workload(small(name=name, arrival_rate=5.0), VOCAB, 8192)
    b = make_workload(small(name=name, arrival_rate=5.0), VOCAB, 8192)
    c = make_workload(small(name=name, arrival_rate=5.0, seed=1), VOCAB, 8192)
    assert a == b
    assert a != c
    ids = [r.request_id for r in a]
    if name == "multiturn":  # conversation s<k>, turn t<j>
        assert len(set(ids)) == 200 and ids[0] == "s0-t0"
    else:
        assert ids == [f"req-{i}" for i in range(200)]
    # The arrival stream is independent of the token streams.
    d = make_workload(small(name=name, arrival_rate=50.0), VOCAB, 8192)
    assert [r.prompt_token_ids for r in d] == [r.prompt_token_ids for r in a]
    assert [r.arrival_time for r in d] != [r.arrival_time for r in a]


def test_shared_prefix_lengths_and_sharing():
    cfg = small(
        shared_prefix_len=1200, unique_prompt_len=600, min_output_len=200, max_output_len=900
    )
    reqs = make_workload(cfg, VOCAB, 8192)
    prefix = reqs[0].prompt_token_ids[:1200]
    uniques = set()
    for r in reqs:
        assert r.prompt_token_ids[:1200] == prefix
        assert 450 <= len(r.prompt_token_ids) - 1200 <= 750
        assert 200 <= len(r.output_token_ids) <= 900
        assert r.max_tokens == len(r.output_token_ids)
        assert all(0 <= t < VOCAB for t in r.prompt_token_ids + r.output_token_ids)
        uniques.add(r.prompt_token_ids[1200:1216])
    assert len(uniques) == len(reqs)  # nothing shared after the system prompt
    # 1200 = 75 blocks of 16: every request after the first hits exactly the system prompt.
    assert ideal_prefix_hit_tokens(reqs, 16) == (len(reqs) - 1) * 1200
    # Token granularity adds what later tokens share by chance, found here by brute force.
    assert ideal_prefix_hit_tokens(reqs, 1) == (len(reqs) - 1) * 1200 + _token_extra(reqs, 1200)


def _token_extra(reqs: list[WorkloadRequest], n: int) -> int:
    """Hits past the shared prefix by chance at token granularity (brute force)."""
    extra = 0
    for i, r in enumerate(reqs):
        best = 0
        for q in reqs[:i]:
            k = n
            while (
                k < len(r.prompt_token_ids) - 1
                and k < len(q.prompt_token_ids)
                and q.prompt_token_ids[k] == r.prompt_token_ids[k]
            ):
                k += 1
            best = max(best, k - n)
        extra += best
    return extra


def test_shared_prefix_capped_by_max_model_len():
    cfg = small(shared_prefix_len=200, unique_prompt_len=150, min_output_len=50, max_output_len=100)
    reqs = make_workload(cfg, VOCAB, 300)
    assert max(len(r.prompt_token_ids) for r in reqs) == 299
    for r in reqs:
        assert len(r.prompt_token_ids) <= 299
        assert 1 <= len(r.output_token_ids)
        assert len(r.prompt_token_ids) + len(r.output_token_ids) <= 300
    with pytest.raises(ConfigError, match="shared_prefix_len"):
        make_workload(small(shared_prefix_len=299), VOCAB, 300)


def test_unique_is_sharegpt_like_and_capped():
    reqs = make_workload(small(name="unique", num_requests=4000), VOCAB, 8192)
    prompts = np.array([len(r.prompt_token_ids) for r in reqs])
    outputs = np.array([len(r.output_token_ids) for r in reqs])
    assert abs(prompts.mean() - 200) < 15
    assert abs(outputs.mean() - 180) < 15
    assert np.median(prompts) < prompts.mean()  # heavy right tail
    assert prompts.min() >= 1 and outputs.min() >= 1
    # Random tokens: no two prompts share even a first block.
    assert ideal_prefix_hit_tokens(reqs, 16) == 0
    capped = make_workload(small(name="unique", num_requests=2000), VOCAB, 256)
    assert all(len(r.prompt_token_ids) + r.max_tokens <= 256 for r in capped)
    assert max(len(r.prompt_token_ids) for r in capped) == 255


def test_arrivals():
    assert all(r.arrival_time == 0.0 for r in make_workload(small(), VOCAB, 8192))
    reqs = make_workload(small(num_requests=5000, name="unique", arrival_rate=10.0), VOCAB, 8192)
    times = np.array([r.arrival_time for r in reqs])
    assert np.all(np.diff(times) >= 0)
    assert times[0] > 0
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert abs(gaps.mean() - 0.1) < 0.005
    assert abs(gaps.std() - 0.1) < 0.01  # exponential: sd == mean
    with pytest.raises(ConfigError, match="arrival_rate"):
        make_workload(small(arrival_rate=0.0), VOCAB, 8192)


def test_unknown_workload_lists_names():
    with pytest.raises(ConfigError, match="shared_prefix, unique, odd_lengths, multiturn"):
        make_workload(small(name="sharegpt"), VOCAB, 8192)


def req(i: int, prompt: list[int], arrival: float, output: list[int] = ()) -> WorkloadRequest:
    return WorkloadRequest(f"r{i}", tuple(prompt), tuple(output), arrival, max(1, len(output)))


def test_ideal_hits_by_hand():
    reqs = [
        req(1, [1, 2, 3, 4, 5], 0.0, [6, 7]),
        req(2, [1, 2, 3, 4, 9], 1.0),  # cap (5-1)//2 = 2 blocks: [1,2],[3,4] -> 4
        req(3, [1, 2, 3, 4], 2.0),  # cap (4-1)//2 = 1 block although 2 match -> 2
        req(4, [1, 2, 7, 8, 9, 9], 3.0),  # [1,2] hit, [7,8] miss -> 2
        req(5, [3, 4, 1, 2, 1], 4.0),  # [3,4] is no first block -> 0
        req(6, [1, 2, 3, 4, 5, 6, 0], 5.0),  # [1,2],[3,4] hit; [5,6] only in req 1's output -> 4
        req(0, [1, 2, 3], -1.0),  # arrives first: a cold miss, and its [1,2] is cached
    ]
    # Request 1 (arrival 0) now hits [1,2] from request 0: +2.
    assert ideal_prefix_hit_tokens(reqs, 2) == 2 + 4 + 2 + 2 + 0 + 4
    assert ideal_prefix_hit_tokens(reqs, 2, include_outputs=True) == 2 + 4 + 2 + 2 + 0 + 6
    # Token granularity: r1 hits 1,2,3 of r0 -> 3; r2: 1,2,3,4 (cap 4) -> 4; r3: cap 3 -> 3;
    # r4: 1,2 -> 2; r5: 0; r6: 1,2,3,4,5 of r1 (cap 6; no prompt has 6 there) -> 5.
    assert ideal_prefix_hit_tokens(reqs, 1) == 3 + 4 + 3 + 2 + 0 + 5
    assert ideal_prefix_hit_tokens([], 16) == 0
    with pytest.raises(ValueError):
        ideal_prefix_hit_tokens(reqs, 0)


def test_ideal_hits_take_bare_prompts_in_list_order():
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5], (1, 2, 3, 4)]
    # [1,2] of the first is hit by the second (cap 2 blocks; [3,4] is new) and third (cap 1).
    assert ideal_prefix_hit_tokens(prompts, 2) == 2 + 2
    assert ideal_prefix_hit_tokens(prompts, 1) == 3 + 3


def test_odd_lengths_share_documents_of_lengths_off_the_block_grid():
    reqs = make_workload(small(name="odd_lengths", num_documents=4, max_suffix_len=5), VOCAB, 8192)
    for k in range(4):
        group = [r.prompt_token_ids for r in reqs[k::4]]
        document_len = 0  # the group's common prefix is its document
        while (
            all(len(p) > document_len for p in group) and len({p[document_len] for p in group}) == 1
        ):
            document_len += 1
        assert document_len % 16 != 0
        assert all(1 <= len(p) - document_len <= 5 for p in group)
    # a token-granular ideal beats the block-granular one on these prompts
    assert ideal_prefix_hit_tokens(reqs, 1) > ideal_prefix_hit_tokens(reqs, 16)


def test_multiturn_conversations_follow_their_previous_turn():
    cfg = small(name="multiturn", min_turns=3, max_turns=5, message_len=50, think_time_s=2.0,
                min_output_len=10, max_output_len=40)  # fmt: skip
    reqs = make_workload(cfg, VOCAB, 8192)
    assert len(reqs) == 200
    by_id = {r.request_id: r for r in reqs}
    firsts = [r for r in reqs if r.follows is None]
    system = firsts[0].prompt_token_ids[: cfg.shared_prefix_len]
    assert all(r.prompt_token_ids[: cfg.shared_prefix_len] == system for r in firsts)
    for r in reqs:
        if r.follows is not None:
            previous = by_id[r.follows]
            conversation, turn = r.request_id[1:].split("-t")
            assert previous.request_id == f"s{conversation}-t{int(turn) - 1}"
            assert 25 <= len(r.prompt_token_ids) <= 75  # the new message only
            assert r.think_time_s >= 0
    turns = {}
    for r in reqs:
        conversation = r.request_id.split("-")[0]
        turns[conversation] = turns.get(conversation, 0) + 1
    assert all(3 <= n <= 5 for n in list(turns.values())[:-1])  # the last may be cut short

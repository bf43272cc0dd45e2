"""Logprobs of the torch executor against transformers on the same weights: every output
token's and every prompt token's logprob is the log_softmax of transformers' own forward
logits (raw: before penalties and temperature), with the same rank and the same most
likely alternatives; through parallel samples, prefix hits and preemption (recompute, swap)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_helpers import FP32_ATOL, prompts, saved_engine

from enginekit import SamplingParams
from enginekit.executor.torch.logprobs import token_logprobs
from enginekit.executor.torch.shaping import SequenceTokens
from enginekit.request import RequestOutput, TokenLogprob

NUM_TOP = 4


def hf_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """float32 [len(token_ids), V]: transformers' log_softmax after each token."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_entry_matches(entry: TokenLogprob, row: torch.Tensor, token: int, num_top: int):
    """``entry`` is ``token``'s TokenLogprob in transformers' log-probability ``row``."""
    assert entry.token_id == token
    assert entry.logprob == pytest.approx(float(row[token]), abs=FP32_ATOL)
    assert entry.rank == int((row >= row[token]).sum())
    top = torch.topk(row, num_top)
    assert [t for t, _ in entry.top] == top.indices.tolist()
    assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=FP32_ATOL)


def assert_output_matches(model, output: RequestOutput, num_top: int) -> None:
    """Every sample's logprobs and the prompt's are transformers' on the same tokens."""
    prompt = output.prompt_token_ids
    assert output.logprobs is not None and len(output.logprobs) == len(output.samples)
    for sample, entries in zip(output.samples, output.logprobs, strict=True):
        assert len(entries) == len(sample) > 0
        rows = hf_logprobs(model, prompt + sample)
        for j, (token, entry) in enumerate(zip(sample, entries, strict=True)):
            assert_entry_matches(entry, rows[len(prompt) + j - 1], token, num_top)


def assert_prompt_matches(model, output: RequestOutput, num_top: int) -> None:
    prompt = output.prompt_token_ids
    assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(prompt)
    assert output.prompt_logprobs[0] is None
    rows = hf_logprobs(model, prompt)
    for i in range(1, len(prompt)):
        entry = output.prompt_logprobs[i]
        assert entry is not None
        assert_entry_matches(entry, rows[i - 1], prompt[i], num_top)


def test_logprobs_are_transformers_raw_log_softmax_through_penalties_samples_and_hits(
    saved_tiny,
):
    """Greedy, sampled, penalized and parallel requests in one batch, then the same
    prompts again: the second wave hits the prefix cache and its prompt logprobs are the
    first wave's."""
    folder, model = saved_tiny
    eng = saved_engine(folder, "+prefix=block_hash")
    vocab = model.config.vocab_size
    batch = prompts(vocab, shared=9, seed=5, n=4)
    kinds = [
        SamplingParams(max_tokens=5, logprobs=NUM_TOP, prompt_logprobs=NUM_TOP, ignore_eos=True),
        SamplingParams(
            max_tokens=5,
            logprobs=NUM_TOP,
            prompt_logprobs=2,
            temperature=1.3,
            seed=11,
            repetition_penalty=1.7,
            presence_penalty=1.0,
            frequency_penalty=0.5,
            min_p=0.01,
            ignore_eos=True,
        ),
        SamplingParams(max_tokens=4, logprobs=0, n=3, temperature=1.0, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=4, ignore_eos=True),  # asks nothing: None
    ]
    waves = []
    for wave in range(2):
        ids = [
            eng.add_request(p, s, request_id=f"{wave}-{i}")
            for i, (p, s) in enumerate(zip(batch, kinds, strict=True))
        ]
        eng.run()
        waves.append([eng.output(r) for r in ids])
    first, second = waves
    assert sum(o.num_cached_tokens for o in second) > 0
    for out, sampling in zip(first + second, kinds + kinds, strict=True):
        if sampling.logprobs is None:
            assert out.logprobs is None and out.prompt_logprobs is None
            continue
        assert_output_matches(model, out, sampling.logprobs)
        if sampling.prompt_logprobs is not None:
            assert_prompt_matches(model, out, sampling.prompt_logprobs)
        else:
            assert out.prompt_logprobs is None
    assert len(first[2].samples) == 3 and len(set(map(tuple, first[2].samples))) > 1
    for a, b in zip(first, second, strict=True):
        assert a.prompt_logprobs == b.prompt_logprobs  # a prefix hit changes nothing


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_neither_loses_nor_repeats_logprob_entries(saved_tiny, preemption):
    """Recompute prefills a victim's tokens again and samples only the next one; swap
    brings its KV back. Either way each token keeps exactly its own entry. (Swap is made
    cheap so the swap plugin swaps: for a model this small it would recompute.)"""
    folder, model = saved_tiny
    eng = saved_engine(
        folder,
        f"+preemption={preemption}",
        *(["preemption.swap_space_gib=0.01"] if preemption == "swap" else []),
        "cache.num_blocks=20",
        "cache.watermark=0",
    )
    if preemption == "swap":
        policy = eng.scheduler.preemption
        policy.costs = dataclasses.replace(policy.costs, swap_s_per_block=1e-12)
    vocab = model.config.vocab_size
    sampling = SamplingParams(max_tokens=12, logprobs=1, ignore_eos=True)
    ids = [eng.add_request(p, sampling) for p in prompts(vocab, shared=4, seed=8, n=5)]
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    outputs = [eng.output(r) for r in ids]
    assert eng.summary()["num_preemptions_by_kind"].get(preemption, 0) > 0
    for out in outputs:
        assert len(out.samples[0]) == 12
        assert_output_matches(model, out, 1)


def test_token_logprobs_rank_counts_ties_and_top_zero_is_empty():
    rows = torch.log_softmax(torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 1.0, 0.5, 5.0]]), -1)
    first, second = token_logprobs(rows, [2, 3], [0, 2])
    assert (first.token_id, first.rank, first.top) == (2, 2, ())  # tied with token 1
    assert first.logprob == pytest.approx(float(rows[0, 2]))
    assert second.rank == 1 and [t for t, _ in second.top] == [3, 1]


def test_sequence_tokens_learn_each_computed_token_once():
    tokens = SequenceTokens([5, 6, 7], 3)
    tokens.record(0, [5, 6])  # a prompt chunk: known
    tokens.record(3, [9])  # the first output's decode
    tokens.record(0, [5, 6, 7, 9, 4])  # a recompute's prefill: learns 4 only
    assert tokens.token_ids == [5, 6, 7, 9, 4] and tokens.num_output_tokens == 2
    child = tokens.copy()
    child.record(5, [8])
    assert tokens.token_ids == [5, 6, 7, 9, 4] and child.num_output_tokens == 3
    with pytest.raises(ValueError, match="computed position 7"):
        tokens.record(7, [1])

"""The distribution-shaping fields of SamplingParams (penalties, min_p, min_tokens,
logprobs, prompt_logprobs): every bad value refused by name, the stop rule of min_tokens
and the shapes a caller reads back; on the torch executor, greedy decoding with penalties
and min_tokens equals a greedy loop over transformers' logits with the same processing,
min_p equals transformers' warper, and seeded draws do not depend on the batch; the
simulator refuses what needs a distribution and keeps min_tokens and seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_helpers import prompts, saved_engine

from enginekit import Engine
from enginekit.errors import InvalidRequestError
from enginekit.executor.torch.sampler import beam_candidates, filter_logits
from enginekit.request import (
    MAX_LOGPROBS,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    TokenLogprob,
)

EOS = 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"presence_penalty": 2.5}, r"sampling.presence_penalty must be in \[-2.0, 2.0\], got 2.5"),
        ({"presence_penalty": -3}, r"sampling.presence_penalty must be in \[-2.0, 2.0\], got -3.0"),
        ({"presence_penalty": "1"}, r"sampling.presence_penalty must be a number, got '1'"),
        ({"presence_penalty": math.nan}, "sampling.presence_penalty must be finite, got nan"),
        ({"frequency_penalty": 2.01}, r"sampling.frequency_penalty must be in \[-2.0, 2.0\]"),
        ({"frequency_penalty": None}, "sampling.frequency_penalty must be a number, got None"),
        ({"frequency_penalty": True}, r"sampling.frequency_penalty must be a number, got True"),
        ({"repetition_penalty": 0}, r"sampling.repetition_penalty must be > 0 \(1 = off\), got 0"),
        ({"repetition_penalty": -1.2}, r"sampling.repetition_penalty must be > 0 .*got -1.2"),
        ({"repetition_penalty": math.inf}, "sampling.repetition_penalty must be finite, got inf"),
        ({"min_p": -0.1}, r"sampling.min_p must be in \[0, 1\], got -0.1"),
        ({"min_p": 1.5}, r"sampling.min_p must be in \[0, 1\], got 1.5"),
        ({"min_p": "0.1"}, r"sampling.min_p must be a number, got '0.1' \(str\)"),
        ({"min_tokens": -1}, "sampling.min_tokens must be >= 0, got -1"),
        ({"min_tokens": 1.0}, r"sampling.min_tokens must be an int, got 1.0 \(float\)"),
        (
            {"min_tokens": 5, "max_tokens": 4},
            r"sampling.min_tokens \(5\) cannot exceed sampling.max_tokens \(4\)",
        ),
        ({"logprobs": -1}, "sampling.logprobs must be >= 0, got -1"),
        ({"logprobs": 21}, r"sampling.logprobs must be in \[0, 20\] or None, got 21"),
        ({"logprobs": 2.0}, r"sampling.logprobs must be an int or None, got 2.0 \(float\)"),
        ({"logprobs": True}, r"sampling.logprobs must be an int or None, got True \(bool\)"),
        ({"prompt_logprobs": -2}, "sampling.prompt_logprobs must be >= 0, got -2"),
        ({"prompt_logprobs": 99}, r"sampling.prompt_logprobs must be in \[0, 20\] or None"),
        ({"prompt_logprobs": "1"}, r"sampling.prompt_logprobs must be an int or None, got '1'"),
        (
            {"beam_width": 2, "logprobs": 1},
            r"sampling.logprobs=1 is not available with beam search",
        ),
        (
            {"beam_width": 2, "repetition_penalty": 1.1},
            r"sampling.repetition_penalty=1.1 is not available with beam search",
        ),
        (
            {"beam_width": 3, "presence_penalty": -0.5},
            r"sampling.presence_penalty=-0.5 is not available with beam search",
        ),
    ],
)
def test_every_bad_value_is_refused_naming_its_field(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_good_values_are_kept_and_numpy_scalars_normalized():
    params = SamplingParams(
        max_tokens=8,
        presence_penalty=np.float32(-2),
        frequency_penalty=2,
        repetition_penalty=np.float64(1.3),
        min_p=1,
        min_tokens=np.int64(8),
        logprobs=np.int32(MAX_LOGPROBS),
        prompt_logprobs=0,
    )
    assert (params.presence_penalty, params.frequency_penalty) == (-2.0, 2.0)
    assert (params.repetition_penalty, params.min_p) == (1.3, 1.0)
    assert (params.min_tokens, params.logprobs, params.prompt_logprobs) == (8, 20, 0)
    assert type(params.presence_penalty) is float and type(params.min_p) is float
    assert type(params.min_tokens) is int and type(params.logprobs) is int
    # Beams take min_tokens and prompt logprobs (neither changes how beams are scored).
    beams = SamplingParams(beam_width=2, min_tokens=3, prompt_logprobs=2, min_p=0.5)
    assert beams.min_tokens == 3


def test_distribution_fields_name_what_only_a_model_can_do():
    unshaped = SamplingParams(min_tokens=3, seed=4, temperature=0.5)
    assert unshaped.distribution_fields() == [] and not unshaped.needs_distribution
    assert not SamplingParams().has_penalties
    shaped = SamplingParams(logprobs=0, repetition_penalty=0.9, min_p=0.2, prompt_logprobs=1)
    assert shaped.distribution_fields() == [
        "logprobs=0",
        "prompt_logprobs=1",
        "repetition_penalty=0.9",
        "min_p=0.2",
    ]
    assert shaped.has_penalties and shaped.needs_distribution
    for field in ("logprobs", "prompt_logprobs", "min_p", "frequency_penalty"):
        assert SamplingParams(**{field: 1}).needs_distribution, field
    assert SamplingParams(frequency_penalty=-1).has_penalties


def appended(request: Request, tokens: list[int]) -> list[RequestStatus | None]:
    """The stop status after each of ``tokens``, appended one by one."""
    statuses = []
    for token in tokens:
        request.token_ids.append(token)
        statuses.append(request.stop_status(token, EOS))
    return statuses


def test_min_tokens_holds_off_eos_and_stop_tokens_for_the_first_outputs():
    sampling = SamplingParams(max_tokens=6, min_tokens=2, stop_token_ids=(7,))
    request = Request("r", 0, [5, 6], sampling)
    assert appended(request, [EOS, 7, EOS]) == [None, None, RequestStatus.FINISHED_STOPPED]
    request = Request("s", 1, [5, 6], sampling)
    assert appended(request, [9, 9, 7]) == [None, None, RequestStatus.FINISHED_STOPPED]
    # min_tokens == max_tokens: no stop token ends it, the length does.
    full = Request("t", 2, [5], SamplingParams(max_tokens=2, min_tokens=2))
    assert appended(full, [EOS, EOS]) == [None, RequestStatus.FINISHED_LENGTH]
    # Without min_tokens EOS stops at once, as before.
    plain = Request("u", 3, [5], SamplingParams(max_tokens=4))
    assert appended(plain, [EOS]) == [RequestStatus.FINISHED_STOPPED]
    ignoring = Request("v", 4, [5], SamplingParams(max_tokens=3, min_tokens=1, ignore_eos=True))
    assert appended(ignoring, [EOS, EOS, EOS]) == [None, None, RequestStatus.FINISHED_LENGTH]


def entry(token_id: int, logprob: float = -1.0) -> TokenLogprob:
    return TokenLogprob(token_id, logprob, 1, ((token_id, logprob),))


def test_request_output_carries_per_sample_logprobs_only_when_asked():
    plain = Request("p", 0, [3, 4], SamplingParams(max_tokens=2))
    out = RequestOutput.of(plain)
    assert out.logprobs is None and out.prompt_logprobs is None
    asked = Request("a", 1, [3, 4], SamplingParams(max_tokens=2, logprobs=1, prompt_logprobs=0))
    assert asked.output_logprobs == [] and asked.prompt_logprobs is None
    asked.token_ids.append(9)
    asked.output_logprobs.append(entry(9))
    asked.prompt_logprobs = [None, TokenLogprob(4, -2.5, 3, ())]
    out = RequestOutput.of(asked)
    assert out.samples == [[9]]
    assert out.logprobs == [[entry(9)]]
    assert out.prompt_logprobs == [None, TokenLogprob(4, -2.5, 3, ())]
    # A snapshot: later tokens do not change an output already read.
    asked.output_logprobs.append(entry(10))
    assert out.logprobs == [[entry(9)]]


def test_token_logprob_is_a_frozen_value():
    first = TokenLogprob(5, -0.25, 1, ((5, -0.25), (7, -1.5)))
    assert first == TokenLogprob(5, -0.25, 1, ((5, -0.25), (7, -1.5)))
    with pytest.raises(AttributeError):
        first.rank = 2  # type: ignore[misc]
    assert TokenLogprob(5, -0.25, 1).top == ()


# -- the torch executor against transformers ---------------------------------------------


def hf_shaped_greedy(model, prompt: list[int], sampling: SamplingParams) -> list[int]:
    """A greedy loop over transformers' logits: the min_tokens mask, transformers'
    RepetitionPenaltyLogitsProcessor, then frequency and presence penalties by their
    formula over the output so far; stops as the engine does."""
    from transformers import RepetitionPenaltyLogitsProcessor

    eos = model.config.eos_token_id
    vocab = model.config.vocab_size
    repetition = RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
    stops = set(sampling.stop_token_ids) | ({eos} if not sampling.ignore_eos else set())
    ids, out = list(prompt), []
    while len(out) < sampling.max_tokens:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1].float()
        if len(out) < sampling.min_tokens:
            logits[0, sorted(stops)] = float("-inf")
        logits = repetition(torch.tensor([ids]), logits)[0]
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=vocab).float()
        logits = logits - sampling.frequency_penalty * counts
        logits = logits - sampling.presence_penalty * (counts > 0).float()
        token = int(torch.argmax(logits))
        ids.append(token)
        out.append(token)
        if token in stops and len(out) > sampling.min_tokens:
            break
    return out


def run_engine(folder, requests: list[tuple[list[int], SamplingParams]]) -> list[RequestOutput]:
    eng = saved_engine(folder)
    ids = [eng.add_request(prompt, sampling) for prompt, sampling in requests]
    eng.run()
    return [eng.output(r) for r in ids]


def test_greedy_with_penalties_equals_a_greedy_loop_over_transformers_logits(saved_tiny):
    """Penalized rows beside a plain one in the same steps; each equals transformers'
    loop with the same penalties, and each penalty changes the tokens of the row it
    extends (a repetition penalty below 1 and a negative presence penalty make the
    output repeat, so the penalties against repeats have repeats to act on)."""
    folder, model = saved_tiny
    vocab = model.config.vocab_size
    prompt = prompts(vocab, shared=6, seed=3, n=1)[0]
    base = dict(max_tokens=10, ignore_eos=True)
    kinds = [
        SamplingParams(**base),
        SamplingParams(**base, repetition_penalty=0.6),
        SamplingParams(**base, repetition_penalty=0.6, frequency_penalty=1.5),
        SamplingParams(**base, repetition_penalty=0.6, presence_penalty=2.0),
        SamplingParams(**base, presence_penalty=-2.0),
        SamplingParams(**base, presence_penalty=-2.0, repetition_penalty=1.8),
    ]
    outputs = run_engine(folder, [(prompt, sampling) for sampling in kinds])
    expected = [hf_shaped_greedy(model, prompt, sampling) for sampling in kinds]
    assert [o.output_token_ids for o in outputs] == expected
    for extended, extending in ((0, 1), (1, 2), (1, 3), (0, 4), (4, 5)):
        assert expected[extended] != expected[extending], (extended, extending)


def test_min_tokens_holds_off_the_stop_token_greedy_would_emit_first(saved_tiny):
    folder, model = saved_tiny
    vocab = model.config.vocab_size
    prompt = prompts(vocab, shared=6, seed=4, n=1)[0]
    first = hf_shaped_greedy(model, prompt, SamplingParams(max_tokens=1))[0]
    stopping = SamplingParams(max_tokens=12, stop_token_ids=(first,))
    held = SamplingParams(max_tokens=12, stop_token_ids=(first,), min_tokens=5)
    outputs = run_engine(folder, [(prompt, stopping), (prompt, held)])
    assert outputs[0].output_token_ids == [first]
    tokens = outputs[1].output_token_ids
    assert len(tokens) >= 5 and first not in tokens[:5]
    assert tokens == hf_shaped_greedy(model, prompt, held)


def test_min_p_drops_what_transformers_min_p_warper_drops(saved_tiny):
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper

    _, model = saved_tiny
    prompt = prompts(model.config.vocab_size, shared=6, seed=6, n=1)[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[:, -1].float()
    ids = torch.tensor([prompt])
    for temperature, min_p in ((0.5, 0.2), (1.0, 0.05), (2.0, 0.6)):
        ours = filter_logits(logits[0], SamplingParams(temperature=temperature, min_p=min_p))
        warped = TemperatureLogitsWarper(temperature)(ids, logits.clone())
        theirs = MinPLogitsWarper(min_p)(ids, warped)[0]
        kept = torch.isfinite(ours)
        assert torch.equal(kept, torch.isfinite(theirs))
        assert 1 < int(kept.sum()) < logits.shape[-1]  # some kept, some dropped
        assert torch.allclose(ours[kept], theirs[kept])


def test_min_p_of_one_samples_the_greedy_tokens(saved_tiny):
    folder, model = saved_tiny
    prompt = prompts(model.config.vocab_size, shared=6, seed=7, n=1)[0]
    sampled = SamplingParams(max_tokens=6, temperature=1.0, min_p=1.0, ignore_eos=True)
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    (output,) = run_engine(folder, [(prompt, sampled)])
    assert output.output_token_ids == hf_shaped_greedy(model, prompt, greedy)


def test_seeded_shaped_draws_repeat_whatever_shares_the_batch(saved_tiny):
    folder, model = saved_tiny
    batch = prompts(model.config.vocab_size, shared=3, seed=9, n=4)

    def seeded(seed: int, **shaping) -> SamplingParams:
        return SamplingParams(
            max_tokens=8, temperature=1.0, seed=seed, ignore_eos=True, top_k=50, **shaping
        )

    shaping = dict(repetition_penalty=1.2, presence_penalty=0.4, min_p=0.02, logprobs=1)
    alone = run_engine(folder, [(batch[0], seeded(7, **shaping)), (batch[0], seeded(7))])
    others = [(p, seeded(100 + i, **shaping)) for i, p in enumerate(batch[1:])]
    crowded = run_engine(
        folder, [others[0], (batch[0], seeded(7, **shaping)), *others[1:], (batch[0], seeded(7))]
    )
    assert crowded[1].output_token_ids == alone[0].output_token_ids
    assert crowded[-1].output_token_ids == alone[1].output_token_ids
    # The same raw logprobs (up to the float noise of a different batch).
    assert crowded[1].logprobs is not None and alone[0].logprobs is not None
    for ours, theirs in zip(crowded[1].logprobs[0], alone[0].logprobs[0], strict=True):
        assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-5)
    reseeded = run_engine(folder, [(batch[0], seeded(8, **shaping))])
    assert reseeded[0].output_token_ids != alone[0].output_token_ids


def test_beams_hold_off_stop_tokens_for_min_tokens_and_take_prompt_logprobs(saved_tiny):
    folder, model = saved_tiny
    prompt = prompts(model.config.vocab_size, shared=6, seed=4, n=1)[0]
    first = hf_shaped_greedy(model, prompt, SamplingParams(max_tokens=1))[0]
    beams = SamplingParams(
        max_tokens=6, beam_width=2, n=2, stop_token_ids=(first,), min_tokens=4, prompt_logprobs=1
    )
    (output,) = run_engine(folder, [(prompt, beams)])
    assert len(output.samples) == 2
    for sample in output.samples:
        assert len(sample) >= 4 and first not in sample[:4]
    assert output.prompt_logprobs is not None and len(output.prompt_logprobs) == len(prompt)
    assert output.logprobs is None


def test_beam_candidates_leave_out_the_tokens_min_tokens_holds():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    assert [t for t, _ in beam_candidates(logits, [2])[0]] == [0, 1, 2, 3]
    held = beam_candidates(logits, [2], [[0, 2]])[0]
    assert [t for t, _ in held] == [1, 3, 4]  # the raw logprobs of the rest
    assert held[0][1] == pytest.approx(math.log(0.3))


# -- the simulator ---------------------------------------------------------------------------


def sim_engine() -> Engine:
    return Engine.from_overrides(["progress=false", "model=tiny", "cache.num_blocks=64"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logprobs", 0),
        ("prompt_logprobs", 3),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1.0),
        ("repetition_penalty", 1.1),
        ("min_p", 0.1),
    ],
)
def test_the_simulator_refuses_what_needs_a_distribution_by_name(field, value):
    engine = sim_engine()
    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, **{field: value}))
    message = str(refused.value)
    assert f"sampling.{field}={value}" in message
    assert "scripts its tokens and has none" in message
    ok = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.run()
    assert len(engine.output(ok).output_token_ids) == 3


def test_the_simulator_keeps_min_tokens_and_seeds():
    engine = sim_engine()
    script = [9, 4, 4, 9, 4, 9]
    held = SamplingParams(max_tokens=6, stop_token_ids=(4,), min_tokens=2, seed=5, temperature=1)
    plain = SamplingParams(max_tokens=6, stop_token_ids=(4,))
    a = engine.add_request([5, 6, 7], held, scripted_output_ids=script)
    b = engine.add_request([5, 6, 7], plain, scripted_output_ids=script)
    engine.run()
    assert engine.output(a).output_token_ids == [9, 4, 4]  # the 2nd token stops nothing
    assert engine.output(b).output_token_ids == [9, 4]

"""The distribution-shaping fields of SamplingParams (penalties, min_p, min_tokens,
logprobs, prompt_logprobs): every bad value refused by name, the neutral values as
before, the stop rule of min_tokens, and the shapes a caller reads back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from enginekit.errors import InvalidRequestError
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
    assert SamplingParams(min_tokens=3, seed=4, temperature=0.5).distribution_fields() == []
    assert not SamplingParams().has_penalties
    shaped = SamplingParams(logprobs=0, repetition_penalty=0.9, min_p=0.2, prompt_logprobs=1)
    assert shaped.distribution_fields() == [
        "logprobs=0",
        "prompt_logprobs=1",
        "repetition_penalty=0.9",
        "min_p=0.2",
    ]
    assert shaped.has_penalties
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

"""Requests at the door: every field of SamplingParams and every argument of add_request is
checked where it is given, with an error naming it, and nothing the engine accepts can make
a later step raise for the other requests."""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig

from enginekit import Engine, SamplingParams
from enginekit.app import compose_config
from enginekit.errors import ConfigError, InvalidRequestError, RequestRejectedError
from enginekit.request import MIN_TEMPERATURE

PROMPT = list(range(1, 40))  # two full blocks of 16 and a partial one


@functools.cache
def _config(prefix: str, overrides: tuple[str, ...]) -> DictConfig:
    return compose_config(
        ["progress=false", f"+prefix={prefix}", "cache.num_blocks=64", *overrides]
    )


def make_engine(*overrides: str, prefix: str = "block_hash") -> Engine:
    return Engine(copy.deepcopy(_config(prefix, overrides)))  # composing is most of the cost


def run_checked(engine: Engine) -> None:
    engine.check_integrity()
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return
        engine.step()
        engine.check_integrity()
    raise AssertionError("engine did not finish")


def test_invalid_request_error_is_a_rejection_and_a_value_error():
    assert issubclass(InvalidRequestError, RequestRejectedError)
    assert issubclass(InvalidRequestError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": "8"}, r"sampling.max_tokens must be an int, got '8' \(str\)"),
        ({"max_tokens": 8.0}, r"sampling.max_tokens must be an int, got 8.0 \(float\)"),
        ({"max_tokens": True}, r"sampling.max_tokens must be an int, got True \(bool\)"),
        ({"max_tokens": 0}, "sampling.max_tokens must be >= 1, got 0"),
        ({"max_tokens": None}, r"sampling.max_tokens must be an int, got None \(NoneType\)"),
        ({"stop_token_ids": 2}, "sampling.stop_token_ids must be a list of token ids, got int"),
        ({"stop_token_ids": "12"}, "sampling.stop_token_ids must be a list of token ids, got str"),
        ({"stop_token_ids": [1, 2.0]}, "sampling.stop_token_ids token 1 is 2.0, not an int"),
        ({"stop_token_ids": [False]}, "sampling.stop_token_ids token 0 is False, not an int"),
        ({"stop_token_ids": [3, -1]}, r"sampling.stop_token_ids must be >= 0, got \[3, -1\]"),
        ({"ignore_eos": 1}, r"sampling.ignore_eos must be a bool, got 1 \(int\)"),
        ({"ignore_eos": "no"}, r"sampling.ignore_eos must be a bool, got 'no' \(str\)"),
        ({"temperature": "0.7"}, r"sampling.temperature must be a number, got '0.7' \(str\)"),
        ({"temperature": None}, r"sampling.temperature must be a number, got None"),
        ({"temperature": -0.5}, r"sampling.temperature must be 0 \(greedy\) or >= 1e-05"),
        ({"temperature": 1e-30}, r"sampling.temperature must be 0 \(greedy\) or >= 1e-05"),
        ({"temperature": math.nan}, "sampling.temperature must be finite, got nan"),
        ({"temperature": math.inf}, "sampling.temperature must be finite, got inf"),
        ({"top_k": 2.0}, r"sampling.top_k must be an int, got 2.0 \(float\)"),
        ({"top_k": -1}, r"sampling.top_k must be >= 0 \(0 = off\), got -1"),
        ({"top_p": 0}, r"sampling.top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"sampling.top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": math.nan}, "sampling.top_p must be finite, got nan"),
        ({"top_p": "1"}, r"sampling.top_p must be a number, got '1' \(str\)"),
        ({"seed": 1.5}, r"sampling.seed must be an int or None, got 1.5 \(float\)"),
        ({"seed": "7"}, r"sampling.seed must be an int or None, got '7' \(str\)"),
        ({"seed": True}, r"sampling.seed must be an int or None, got True \(bool\)"),
        ({"n": 0}, "sampling.n must be >= 1, got 0"),
        ({"n": 2.0}, r"sampling.n must be an int, got 2.0 \(float\)"),
        ({"beam_width": 0}, "sampling.beam_width must be >= 1, got 0"),
        ({"beam_width": "2"}, r"sampling.beam_width must be an int, got '2' \(str\)"),
        ({"beam_width": 2, "temperature": 0.5}, "beam search is deterministic"),
        ({"beam_width": 2, "n": 3}, r"sampling.n \(3\) cannot exceed sampling.beam_width \(2\)"),
    ],
)
def test_every_sampling_field_is_checked_at_construction(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_normalize_numpy_values_and_keep_valid_ones():
    params = SamplingParams(
        max_tokens=np.int64(5),
        stop_token_ids=np.array([3, 4], dtype=np.int32),
        temperature=np.float32(0.5),
        top_k=np.int16(7),
        top_p=1,
        seed=np.uint8(9),
        n=np.int64(2),
    )
    assert params == SamplingParams(
        max_tokens=5, stop_token_ids=(3, 4), temperature=0.5, top_k=7, top_p=1.0, seed=9, n=2
    )
    assert type(params.max_tokens) is int and type(params.temperature) is float
    assert type(params.seed) is int and all(type(t) is int for t in params.stop_token_ids)
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE
    assert SamplingParams(seed=-3).seed == -3  # any int seeds (the sampler masks it)
    assert SamplingParams(stop_token_ids=[2, 3]).stop_token_ids == (2, 3)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (None, "prompt must be a list of token ids or a string, got NoneType"),
        (7, "prompt must be a list of token ids or a string, got int"),
        (b"\x01\x02", "prompt must be a list of token ids or a string, got bytes"),
        ({1, 2}, "prompt must be a list of token ids or a string, got set"),
        ([1, 2.5], "prompt token 1 is 2.5, not an int"),
        ([1.0, 2.5], "prompt token 0 is 1.0, not an int"),
        ([1, True], "prompt token 1 is True, not an int"),
        ([1, "2"], "prompt token 1 is '2', not an int"),
        ([1, None], "prompt token 1 is None, not an int"),
        ([[1, 2]], r"prompt token 0 is \[1, 2\], not an int"),
        (np.array([1.0, 2.0]), "prompt token 0 is 1.0, not an int"),
        (np.array([True, False]), "prompt token 0 is True, not an int"),
        (np.array([[1, 2], [3, 4]]), r"prompt token 0 is \[1, 2\], not an int"),
    ],
)
def test_a_prompt_that_is_not_token_ids_is_refused_by_name(prompt, message):
    engine = make_engine()
    with pytest.raises(InvalidRequestError, match=f"request 'bad': {message}"):
        engine.add_request(prompt, SamplingParams(max_tokens=2), request_id="bad")
    assert not engine.has_unfinished_requests()
    assert engine.summary()["num_requests_rejected"] == 1


def test_numpy_integer_prompts_are_token_ids():
    engine = make_engine()
    engine.add_request(
        np.arange(1, 40, dtype=np.int32), SamplingParams(max_tokens=2), request_id="a"
    )
    engine.add_request([np.int64(t) for t in PROMPT], SamplingParams(max_tokens=2), request_id="b")
    engine.add_request(tuple(PROMPT), SamplingParams(max_tokens=2), request_id="c")
    run_checked(engine)
    for request_id in "abc":
        out = engine.output(request_id)
        assert out.prompt_token_ids == PROMPT and all(type(t) is int for t in out.prompt_token_ids)
        assert out.finish_reason is not None
    assert engine.output("c").num_cached_tokens == 32  # the same blocks, hashed alike


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_a_str_extra_key_is_its_utf8_bytes_and_never_wedges_the_engine(prefix):
    engine = make_engine(prefix=prefix)
    engine.add_request(PROMPT, SamplingParams(max_tokens=4), extra_key="tenant-é", request_id="s")
    engine.add_request(PROMPT, SamplingParams(max_tokens=4), request_id="other")
    run_checked(engine)
    engine.add_request(
        PROMPT, SamplingParams(max_tokens=4), extra_key="tenant-é".encode(), request_id="b"
    )
    engine.add_request(
        PROMPT, SamplingParams(max_tokens=4), extra_key=bytearray(b"x"), request_id="x"
    )
    run_checked(engine)
    outputs = {o.request_id: o for o in engine.outputs()}
    assert all(o.finish_reason == "length" for o in outputs.values())
    assert outputs["s"].num_cached_tokens == 0
    assert outputs["other"].num_cached_tokens == 0  # a salted request shares nothing unsalted
    assert outputs["b"].num_cached_tokens >= 32  # the str salt was these bytes
    assert outputs["x"].num_cached_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"extra_key": 5}, InvalidRequestError, r"extra_key must be bytes, a str .* got 5 \(int"),
        ({"extra_key": ["a"]}, InvalidRequestError, "extra_key must be bytes"),
        ({"extra_key": "\ud800"}, InvalidRequestError, "extra_key '\\\\ud800' is not valid UTF-8"),
        ({"arrival_time": math.nan}, InvalidRequestError, "arrival_time must be finite, got nan"),
        ({"arrival_time": math.inf}, InvalidRequestError, "arrival_time must be finite, got inf"),
        ({"arrival_time": "1"}, InvalidRequestError, r"arrival_time must be a number, got '1'"),
        ({"arrival_time": True}, InvalidRequestError, "arrival_time must be a number, got True"),
        (
            {"scripted_output_ids": 3},
            InvalidRequestError,
            "scripted_output_ids must be a list of token ids, got int",
        ),
        (
            {"scripted_output_ids": [5, 2.5]},
            InvalidRequestError,
            "scripted_output_ids token 1 is 2.5, not an int",
        ),
        (
            {"scripted_output_ids": [5, -1]},
            RequestRejectedError,
            r"scripted output ids must be in \[0, 128256\)",
        ),
        (
            {"scripted_output_ids": [128256]},
            RequestRejectedError,
            r"scripted output ids must be in \[0, 128256\)",
        ),
        ({"sampling": {"max_tokens": 3}}, InvalidRequestError, "sampling must be a SamplingParams"),
    ],
)
def test_bad_arguments_are_refused_at_add_request_and_the_rest_run(kwargs, error, message):
    engine = make_engine()
    engine.add_request(PROMPT, SamplingParams(max_tokens=40), request_id="good")
    sampling = kwargs.pop("sampling", SamplingParams(max_tokens=4))
    with pytest.raises(error, match=f"request 'bad': {message}"):
        engine.add_request(PROMPT, sampling, request_id="bad", **kwargs)
    run_checked(engine)
    assert [o.request_id for o in engine.outputs()] == ["good"]
    assert engine.output("good").finish_reason is not None


def test_request_ids_are_strs_and_a_callers_id_never_blocks_a_generated_one():
    engine = make_engine()
    with pytest.raises(InvalidRequestError, match="request_id must be a str or None, got int"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id=5)
    taken = engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id="2")
    generated = [engine.add_request(PROMPT, SamplingParams(max_tokens=2)) for _ in range(3)]
    assert taken == "2" and "2" not in generated and len(set(generated)) == 3
    with pytest.raises(RequestRejectedError, match="request id '2' is already in use"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=2), request_id="2")
    run_checked(engine)


def test_arrival_times_are_clamped_at_zero_and_numpy_times_accepted():
    engine = make_engine()
    engine.add_request(PROMPT, SamplingParams(max_tokens=2), arrival_time=-5, request_id="a")
    engine.add_request(
        PROMPT, SamplingParams(max_tokens=2), arrival_time=np.float64(0.25), request_id="b"
    )
    assert engine.output("a").arrival_time == 0.0
    assert engine.output("b").arrival_time == 0.25
    run_checked(engine)


# Anything a caller might pass, well-formed or not.
_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.one_of(st.integers(-3, 200_000), st.floats(), st.booleans()), max_size=6),
)
_TOKENS = st.lists(st.integers(0, 130_000), min_size=1, max_size=40)
_SAMPLING_KEYS = (
    "max_tokens",
    "stop_token_ids",
    "ignore_eos",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "n",
    "beam_width",
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    prefix=st.sampled_from(["block_hash", "radix", "none"]),
)
def test_no_accepted_request_makes_a_step_raise_for_the_others(data, prefix):
    """A well-formed request runs to its end beside requests built from junk: each junk
    request is refused at the door (InvalidRequestError from SamplingParams, a
    RequestRejectedError from add_request, nothing queued) or runs too."""
    engine = make_engine("model.max_model_len=512", prefix=prefix)
    engine.add_request(PROMPT, SamplingParams(max_tokens=20), request_id="good")
    num_accepted = 1
    for i in range(3):
        sampling_kwargs = {
            key: data.draw(st.one_of(_JUNK, st.integers(0, 4)), label=key)
            for key in data.draw(st.sets(st.sampled_from(_SAMPLING_KEYS)), label="keys")
        }
        try:
            sampling = SamplingParams(**sampling_kwargs)
        except InvalidRequestError:
            sampling = SamplingParams(max_tokens=3)
        kwargs = {
            key: data.draw(st.one_of(st.none(), _JUNK, _TOKENS), label=key)
            for key in data.draw(
                st.sets(st.sampled_from(["extra_key", "arrival_time", "scripted_output_ids"])),
                label="arguments",
            )
        }
        prompt = data.draw(st.one_of(_JUNK, _TOKENS), label="prompt")
        try:
            engine.add_request(prompt, sampling, request_id=f"junk-{i}", **kwargs)
            num_accepted += 1
        except RequestRejectedError:
            pass
        except ConfigError as exc:  # a text prompt needs a model folder's tokenizer
            assert isinstance(prompt, str), exc
    run_checked(engine)
    outputs = engine.outputs()
    assert len(outputs) == num_accepted
    assert all(o.finish_reason is not None for o in outputs)
    assert engine.output("good").finish_reason == "length"


# -- abort ------------------------------------------------------------------------------------


def _steps_until(engine: Engine, done) -> None:
    for _ in range(1_000):
        if done():
            return
        engine.step()
        engine.check_integrity()
    raise AssertionError("condition never reached")


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_abort_releases_a_running_a_waiting_and_an_unarrived_request(preemption):
    """Two requests run at a time (``max_num_seqs=2``), the rest wait; one more arrives
    later. Aborting a running one, a waiting one and the unarrived one gives back every
    block they held (the pool ends with no block in use) and the others still finish with
    every token."""
    engine = make_engine(f"+preemption={preemption}", "scheduler.max_num_seqs=2")
    sampling = SamplingParams(max_tokens=200, ignore_eos=True)
    running = engine.add_request(PROMPT, sampling)
    waiting = engine.add_request(PROMPT, sampling)
    queued = engine.add_request(PROMPT, sampling)  # beyond max_num_seqs: waits
    later = engine.add_request(PROMPT, sampling, arrival_time=1e6)  # not arrived
    survivor = engine.add_request(PROMPT, sampling)
    _steps_until(engine, lambda: len(engine.output(running).output_token_ids) >= 5)
    assert engine.abort_request(running) is True
    assert engine.abort_request(queued) is True
    assert engine.abort_request(later) is True
    engine.check_integrity()
    assert engine.abort_request(running) is False  # already ended
    with pytest.raises(KeyError):
        engine.abort_request("no such request")
    run_checked(engine)
    for request_id in (running, queued, later):
        assert engine.output(request_id).finish_reason == "abort"
    assert 5 <= len(engine.output(running).output_token_ids) < 200
    assert engine.output(later).output_token_ids == []
    for request_id in (waiting, survivor):
        output = engine.output(request_id)
        assert (output.finish_reason, len(output.output_token_ids)) == ("length", 200)
    usage = engine.kv_usage()
    assert usage.num_used_blocks == 0 and engine.cache.swap_space.num_used_blocks == 0
    assert engine.metrics.num_requests_aborted == 2  # the unarrived one never arrived


def test_an_aborted_request_reports_abort_even_where_its_first_sample_had_stopped():
    """Sample 0 stops at its first token (its script's stop token); sample 1 runs on
    until the request is aborted. The request ended by abort: that is its reason, and each
    sample keeps its own."""
    engine = make_engine()
    sampling = SamplingParams(max_tokens=50, n=2, seed=3, temperature=1.0, stop_token_ids=[7])
    request_id = engine.add_request(PROMPT, sampling, scripted_output_ids=[7])
    _steps_until(engine, lambda: len(engine.output(request_id).samples[-1]) >= 3)
    assert engine.output(request_id).samples[0] == [7]
    assert engine.abort_request(request_id) is True
    output = engine.output(request_id)
    assert output.finish_reason == "abort"
    assert output.finish_reasons == ["stop", "abort"]
    run_checked(engine)
    assert engine.kv_usage().num_used_blocks == 0


def test_an_aborted_beam_search_reports_abort():
    engine = make_engine()
    sampling = SamplingParams(max_tokens=50, n=2, beam_width=3, ignore_eos=True)
    request_id = engine.add_request(PROMPT, sampling)
    _steps_until(engine, lambda: len(engine.output(request_id).samples[0]) >= 3)
    assert engine.abort_request(request_id) is True
    output = engine.output(request_id)
    assert (output.finish_reason, output.finish_reasons) == ("abort", ["abort", "abort"])
    assert len(output.samples) == 2
    run_checked(engine)
    assert engine.kv_usage().num_used_blocks == 0


def test_a_request_id_released_can_be_used_again():
    """A long-running caller forgets finished requests (release_request); a later request
    with the same id is a new request: it runs, finishes and is counted on its own."""
    engine = make_engine()
    sampling = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request(PROMPT, sampling, request_id="chat-1")
    run_checked(engine)
    first = engine.release_request("chat-1")
    assert engine.add_request(PROMPT[:20], sampling, request_id="chat-1") == "chat-1"
    run_checked(engine)
    second = engine.output("chat-1")
    assert (first.finish_reason, second.finish_reason) == ("length", "length")
    assert second.prompt_token_ids == PROMPT[:20]
    assert engine.summary()["num_requests_finished"] == 2


def test_abort_of_a_swapped_out_request_frees_its_host_blocks():
    """A pool of 24 blocks for two requests that end at 15 each: one is swapped out;
    aborting it then returns its host blocks."""
    engine = make_engine(
        "+preemption=swap", "cache.num_blocks=24", "cache.watermark=0", prefix="none"
    )
    sampling = SamplingParams(max_tokens=200, ignore_eos=True)  # 15 blocks each at the end
    first = engine.add_request(PROMPT, sampling)
    second = engine.add_request(PROMPT, sampling)
    _steps_until(engine, lambda: engine.cache.swap_space.num_used_blocks > 0)
    swapped_seq_ids = engine.cache.swap_space.swapped
    swapped = [r for r in (first, second) if engine._requests[r].seq_id in swapped_seq_ids]
    assert len(swapped) == 1
    assert engine.abort_request(swapped[0]) is True
    assert engine.cache.swap_space.num_used_blocks == 0
    run_checked(engine)
    assert engine.output(swapped[0]).finish_reason == "abort"
    other = first if swapped[0] == second else second
    assert len(engine.output(other).output_token_ids) == 200

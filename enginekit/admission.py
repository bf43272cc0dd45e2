"""Admission checks, run when a request is added: its arguments normalized
(``check_arguments``) and whether it can ever be served (``check_servable``), so that
whatever is accepted never fails later (the scheduler then admits it as the cache allows)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from enginekit.errors import InvalidRequestError, RequestRejectedError
from enginekit.kv.manager import KVCacheManager
from enginekit.request import SamplingParams, as_arrival_time, as_extra_key, as_token_ids


class ServingLimits(NamedTuple):
    """What the model, the executor and the scheduler allow a request."""

    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    executor: str  # its name, for messages
    supports_forks: bool  # the executor can run forked sequences (n > 1, beams)
    supports_beam_search: bool  # the executor returns beam candidates
    has_distribution: bool = False  # the executor computes a next-token distribution
    # readies a structured output (compiles its grammar) or raises InvalidRequestError:
    # the executor's ``prepare_structured``; None refuses every structured output
    prepare_structured: Callable[[SamplingParams], None] | None = None


class Arguments(NamedTuple):
    """A request's arguments, checked and normalized by ``check_arguments``."""

    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float | None  # None: now
    extra_key: bytes | None
    scripted_output_ids: list[int] | None


def check_arguments(
    request_id: str,
    tokenize: Callable[[str], list[int]] | None,
    vocab_size: int,
    prompt: object,
    sampling: object,
    arrival_time: object,
    extra_key: object,
    script: object,
) -> Arguments:
    """``Engine.add_request``'s arguments as the scheduler and the caches take them: token
    ids as lists of ints (a text prompt tokenized by ``tokenize``), the salt as bytes, the
    arrival time as a float clamped at 0. Raises InvalidRequestError for a value of the
    wrong type (naming it, and a token by its position), RequestRejectedError for a
    scripted token outside the vocabulary (the prompt's are ``check_servable``'s)."""
    what = f"request {request_id!r}"
    if sampling is None:
        sampling = SamplingParams()
    try:
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError(
                f"sampling must be a SamplingParams or None, got {type(sampling).__name__}"
            )
        if isinstance(prompt, str) and tokenize is not None:
            prompt = tokenize(prompt)
        token_ids = as_token_ids("prompt", prompt, "a list of token ids or a string")
        script_ids = None if script is None else as_token_ids("scripted_output_ids", script)
        salt = as_extra_key(extra_key)
        arrival = as_arrival_time(arrival_time)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{what}: {exc}") from None
    if script_ids and (min(script_ids) < 0 or max(script_ids) >= vocab_size):
        raise RequestRejectedError(f"{what}: scripted output ids must be in [0, {vocab_size})")
    return Arguments(
        token_ids, sampling, None if arrival is None else max(arrival, 0.0), salt, script_ids
    )


def check_servable(
    request_id: str,
    prompt: Sequence[int],
    sampling: SamplingParams,
    limits: ServingLimits,
    cache: KVCacheManager,
) -> None:
    """Raises RequestRejectedError, saying why, if the request can never be served: empty,
    a token outside the vocabulary, prompt plus max_tokens beyond the model's context, more
    blocks than the whole cache (with the watermark, and with every beam brought back at
    once after a preemption), or forks this executor or allocator cannot run;
    InvalidRequestError (naming the field) for sampling that needs a next-token
    distribution the executor does not have (``SamplingParams.distribution_fields``), or
    a structured output the executor cannot serve (``limits.prepare_structured``: no
    tokenizer, a grammar that does not compile). Pure but for that last check, which
    compiles the grammar (the executor keeps it for the request)."""
    what = f"request {request_id!r}"
    if sampling.needs_distribution and not limits.has_distribution:
        raise InvalidRequestError(
            f"{what}: sampling.{sampling.distribution_fields()[0]} needs the model's "
            f"next-token distribution; the {limits.executor} executor scripts its tokens "
            "and has none"
        )
    if sampling.beam_width > 1 and not limits.supports_beam_search:
        raise RequestRejectedError(
            f"{what}: beam search needs an executor that returns candidates; "
            f"{limits.executor} does not"
        )
    if sampling.n > 1 or sampling.beam_width > 1:
        if not (limits.supports_forks and cache.allocator.supports_fork):
            raise RequestRejectedError(
                f"{what}: n={sampling.n}, beam_width={sampling.beam_width} needs forked "
                f"sequences, which this executor ({limits.executor}) or allocator "
                f"({cache.allocator.config.name}) cannot run"
            )
        if max(sampling.n, sampling.beam_width) > limits.max_num_seqs:
            raise RequestRejectedError(
                f"{what}: n={sampling.n}, beam_width={sampling.beam_width} exceed "
                f"scheduler.max_num_seqs={limits.max_num_seqs}"
            )
    if not prompt:
        raise RequestRejectedError(f"{what}: the prompt is empty")
    vocab = limits.vocab_size
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise RequestRejectedError(f"{what}: token ids must be in [0, {vocab})")
    total = len(prompt) + sampling.max_tokens
    if total > limits.max_model_len:
        raise RequestRejectedError(
            f"{what}: prompt ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) "
            f"= {total} exceeds the model's context of {limits.max_model_len} tokens"
        )
    num_blocks = cache.num_blocks
    num_watermark = cache.num_watermark_blocks
    num_longest = cache.max_blocks_held(total)
    num_prompt_blocks = min(cache.spec.num_blocks_for(len(prompt)), num_longest)
    if num_longest > num_blocks:
        raise RequestRejectedError(
            f"{what}: needs {num_longest} KV blocks at its longest, "
            f"but the whole cache has {num_blocks}"
        )
    # Beams are preempted and brought back together, each with all its blocks.
    num_beam_blocks = sampling.beam_width * num_longest + num_watermark
    if sampling.beam_width > 1 and num_beam_blocks > num_blocks:
        raise RequestRejectedError(
            f"{what}: its {sampling.beam_width} beams need up to {num_beam_blocks} KV "
            f"blocks when brought back after a preemption, but the whole cache has "
            f"{num_blocks}"
        )
    if num_prompt_blocks + num_watermark > num_blocks:
        raise RequestRejectedError(
            f"{what}: its prompt needs {num_prompt_blocks} blocks "
            f"plus the watermark of {num_watermark}, more than the "
            f"{num_blocks} the cache has"
        )
    if sampling.structured is not None:  # last: the one check that costs (a compilation)
        if limits.prepare_structured is None:
            raise InvalidRequestError(
                f"{what}: sampling.structured.{sampling.structured.kind} needs an executor "
                f"that compiles grammars; {limits.executor} does not"
            )
        try:
            limits.prepare_structured(sampling)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"{what}: {exc}") from None

"""Seeded synthetic workloads: prompts, scripted outputs and arrival times.

Every random draw comes from ``numpy.random.Generator`` streams spawned from
``SeedSequence(config.seed)``: one for lengths, one for token ids, one for arrivals. The same
config therefore gives the same requests on every run and platform, and changing the
arrival rate does not change the prompts.

Workloads (``config.name``):

``shared_prefix``
    Every prompt is one ``shared_prefix_len``-token system prompt followed by
    ``round(unique_prompt_len × U(0.75, 1.25))`` (at least 1) unique random tokens; the
    output length is uniform in ``[min_output_len, max_output_len]``.
``unique``
    ShareGPT-like lengths with nothing shared: prompt and output lengths are lognormal,
    prompt mean ``UNIQUE_PROMPT_MEAN`` = 200 tokens (sigma ``UNIQUE_PROMPT_SIGMA`` = 1.0),
    output mean ``UNIQUE_OUTPUT_MEAN`` = 180 (sigma ``UNIQUE_OUTPUT_SIGMA`` = 0.9), rounded,
    at least 1. (Close to ShareGPT-v3 under a Llama tokenizer: a heavy right tail, median
    well under the mean.) Every token is random, so prompts share no prefix beyond chance.

(``odd_lengths`` and ``multiturn`` are described in enginekit.workloads.multi_prefix.
``parallel`` and ``beam`` are ``unique``'s requests asking for ``num_samples`` samples, or
a beam search of width ``beam_width`` returning ``num_samples`` beams.)

Both cap every request at ``max_model_len``: the prompt at ``max_model_len - 1`` tokens, then
the output at ``max_model_len - prompt``. Token ids are uniform in ``[0, vocab_size)``, so
a run should stop on ``max_tokens`` (``ignore_eos``), not on an EOS id drawn by chance.
Arrivals: all at 0.0 when ``arrival_rate`` is None, else a Poisson process (exponential gaps
of mean ``1 / arrival_rate`` s, the first gap included).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.workloads import multi_prefix
from enginekit.workloads.request import WorkloadRequest

UNIQUE_PROMPT_MEAN = 200.0
UNIQUE_PROMPT_SIGMA = 1.0
UNIQUE_OUTPUT_MEAN = 180.0
UNIQUE_OUTPUT_SIGMA = 0.9
UNIQUE_PROMPT_SPREAD = 0.25  # shared_prefix: unique part is mean × U(1 - spread, 1 + spread)


class _Streams(NamedTuple):
    """The independent random streams of one workload, and the vocabulary to draw from."""

    lengths: np.random.Generator
    tokens: np.random.Generator
    arrivals: np.random.Generator
    vocab_size: int


def _lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """Lognormal with the given mean (mu = ln(mean) - sigma² / 2), rounded, at least 1."""
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(np.int64)


def _shared_prefix_lengths(
    config: WorkloadConfig, streams: _Streams, max_model_len: int
) -> tuple[list[int], np.ndarray, np.ndarray]:
    if config.shared_prefix_len < 0 or config.unique_prompt_len < 1:
        raise ConfigError(
            "workload.shared_prefix_len must be >= 0 and workload.unique_prompt_len >= 1, got "
            f"{config.shared_prefix_len} and {config.unique_prompt_len}"
        )
    multi_prefix.check_output_lengths(config)
    if config.shared_prefix_len + 2 > max_model_len:
        raise ConfigError(
            f"workload.shared_prefix_len={config.shared_prefix_len} leaves no room for a "
            f"unique token and an output within max_model_len={max_model_len}"
        )
    n = config.num_requests
    rng = streams.lengths
    scale = rng.uniform(1 - UNIQUE_PROMPT_SPREAD, 1 + UNIQUE_PROMPT_SPREAD, n)
    unique = np.maximum(1, np.rint(config.unique_prompt_len * scale)).astype(np.int64)
    unique = np.minimum(unique, max_model_len - 1 - config.shared_prefix_len)
    outputs = rng.integers(config.min_output_len, config.max_output_len + 1, n)
    prefix = streams.tokens.integers(0, streams.vocab_size, config.shared_prefix_len).tolist()
    return prefix, unique, outputs


def _unique_lengths(
    config: WorkloadConfig, streams: _Streams, max_model_len: int
) -> tuple[list[int], np.ndarray, np.ndarray]:
    n = config.num_requests
    rng = streams.lengths
    prompts = _lognormal_lengths(rng, UNIQUE_PROMPT_MEAN, UNIQUE_PROMPT_SIGMA, n)
    outputs = _lognormal_lengths(rng, UNIQUE_OUTPUT_MEAN, UNIQUE_OUTPUT_SIGMA, n)
    return [], np.minimum(prompts, max_model_len - 1), outputs


_LengthFn = Callable[[WorkloadConfig, _Streams, int], tuple[list[int], np.ndarray, np.ndarray]]

_GENERATORS: MappingProxyType[str, _LengthFn] = MappingProxyType(
    {"shared_prefix": _shared_prefix_lengths, "unique": _unique_lengths}
)
_SessionFn = Callable[
    [WorkloadConfig, np.random.Generator, list[float], int, int], list[WorkloadRequest]
]
_SESSION_GENERATORS: MappingProxyType[str, _SessionFn] = MappingProxyType(
    {"odd_lengths": multi_prefix.odd_lengths, "multiturn": multi_prefix.multiturn}
)
# Sampling variants of ``unique``: same requests, each asking for several outputs.
_SAMPLING_VARIANTS = ("parallel", "beam")
WORKLOADS: tuple[str, ...] = (*_GENERATORS, *_SESSION_GENERATORS, *_SAMPLING_VARIANTS)


def _arrival_times(config: WorkloadConfig, rng: np.random.Generator) -> list[float]:
    n = config.num_requests
    if config.arrival_rate is None:
        return [0.0] * n
    if not config.arrival_rate > 0:
        raise ConfigError(
            f"workload.arrival_rate must be > 0 requests/s or null, got {config.arrival_rate}"
        )
    return np.cumsum(rng.exponential(1.0 / config.arrival_rate, n)).tolist()


def _with_sampling(
    config: WorkloadConfig, vocab_size: int, max_model_len: int
) -> list[WorkloadRequest]:
    """``parallel``: ``unique``'s requests with n = num_samples; ``beam``: with beam search of
    width beam_width returning num_samples beams."""
    if config.num_samples < 1 or config.beam_width < 1:
        raise ConfigError(
            "workload.num_samples and workload.beam_width must be >= 1, got "
            f"{config.num_samples} and {config.beam_width}"
        )
    if config.name == "beam" and config.num_samples > config.beam_width:
        raise ConfigError(
            f"workload.num_samples ({config.num_samples}) cannot exceed workload.beam_width "
            f"({config.beam_width}) for beam search"
        )
    base = _single_prompt_workload(config, _unique_lengths, vocab_size, max_model_len)
    width = config.beam_width if config.name == "beam" else 1
    return [r._replace(n=config.num_samples, beam_width=width) for r in base]


def make_workload(
    config: WorkloadConfig, vocab_size: int, max_model_len: int
) -> list[WorkloadRequest]:
    """The ``config.num_requests`` requests of workload ``config.name``, in arrival order,
    with ids ``req-0 .. req-{n-1}``. Pure and deterministic in its arguments. Raises
    ConfigError for an unknown name (listing the workloads) or an invalid field."""
    if config.name not in WORKLOADS:
        raise ConfigError(
            f"workload.name={config.name!r} is not a known workload; known: {', '.join(WORKLOADS)}"
        )
    if config.num_requests < 0:
        raise ConfigError(f"workload.num_requests must be >= 0, got {config.num_requests}")
    if vocab_size < 1 or max_model_len < 2:
        raise ConfigError(
            f"workloads need vocab_size >= 1 and max_model_len >= 2, got {vocab_size} "
            f"and {max_model_len}"
        )
    if config.name in _SAMPLING_VARIANTS:
        return _with_sampling(config, vocab_size, max_model_len)
    if config.name in _SESSION_GENERATORS:
        _, tokens_seed, arrivals_seed = np.random.SeedSequence(config.seed).spawn(3)
        rng = np.random.default_rng(tokens_seed)
        arrivals = _arrival_times(config, np.random.default_rng(arrivals_seed))
        return _SESSION_GENERATORS[config.name](config, rng, arrivals, vocab_size, max_model_len)
    return _single_prompt_workload(config, _GENERATORS[config.name], vocab_size, max_model_len)


def _single_prompt_workload(
    config: WorkloadConfig, lengths_fn: _LengthFn, vocab_size: int, max_model_len: int
) -> list[WorkloadRequest]:
    """Requests of one (optional) shared prefix and random tails, lengths by ``lengths_fn``."""
    lengths_seed, tokens_seed, arrivals_seed = np.random.SeedSequence(config.seed).spawn(3)
    streams = _Streams(
        np.random.default_rng(lengths_seed),
        np.random.default_rng(tokens_seed),
        np.random.default_rng(arrivals_seed),
        vocab_size,
    )
    prefix, unique_lens, output_lens = lengths_fn(config, streams, max_model_len)
    prompt_lens = unique_lens + len(prefix)
    output_lens = np.minimum(output_lens, max_model_len - prompt_lens)
    arrivals = _arrival_times(config, streams.arrivals)

    # One draw for every random token, in request order: unique prompt part, then output.
    drawn = streams.tokens.integers(0, vocab_size, int((unique_lens + output_lens).sum()))
    tokens = drawn.tolist()
    prefix_t = tuple(prefix)
    requests = []
    offset = 0
    for i, (num_unique, num_out) in enumerate(
        zip(unique_lens.tolist(), output_lens.tolist(), strict=True)
    ):
        prompt = prefix_t + tuple(tokens[offset : offset + num_unique])
        offset += num_unique
        output = tuple(tokens[offset : offset + num_out])
        offset += num_out
        requests.append(WorkloadRequest(f"req-{i}", prompt, output, arrivals[i], num_out))
    return requests

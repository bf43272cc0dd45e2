"""Workloads whose prompts share more than one prefix: ``odd_lengths`` and ``multiturn``.

``odd_lengths``
    ``num_documents`` shared documents of lengths drawn from [shared_prefix_len / 4,
    shared_prefix_len] and never a multiple of 16 (the default block size), each
    followed, per request, by 1..``max_suffix_len`` unique tokens. Requests cycle through
    the documents. A block-granular cache can reuse only a document's whole blocks; a
    token-granular one reuses the whole document.
``multiturn``
    Conversations of ``min_turns``..``max_turns`` turns. The first turn's prompt is a
    ``shared_prefix_len``-token system prompt, the same for every conversation, and a
    user message; each later turn's prompt is the whole previous turn (its prompt and
    its output) followed by a new message. A later turn arrives ``think_time_s``
    (exponential mean) after the previous turn finishes, so its ``prompt_token_ids``
    hold only the new message and ``follows`` names the previous turn: the engine
    prepends that turn's tokens when it arrives. Messages are ``message_len`` × U(0.5,
    1.5) tokens, outputs uniform in [min_output_len, max_output_len]; a conversation ends
    early rather than outgrow ``max_model_len``. ``num_requests`` counts turns;
    conversations start at 0 or, with ``arrival_rate``, as a Poisson process (the first
    turns' arrivals; think times are drawn with the tokens).
"""

from __future__ import annotations

import numpy as np

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.workloads.request import WorkloadRequest

ODD_MODULUS = 16  # document lengths avoid multiples of this (the default block size)


def check_output_lengths(config: WorkloadConfig) -> None:
    """ConfigError unless 1 <= min_output_len <= max_output_len."""
    if not 1 <= config.min_output_len <= config.max_output_len:
        raise ConfigError(
            "workload needs 1 <= min_output_len <= max_output_len, got "
            f"{config.min_output_len} and {config.max_output_len}"
        )


def odd_lengths(
    config: WorkloadConfig,
    rng: np.random.Generator,
    arrivals: list[float],
    vocab_size: int,
    max_model_len: int,
) -> list[WorkloadRequest]:
    check_output_lengths(config)
    if config.num_documents < 1 or config.max_suffix_len < 1:
        raise ConfigError(
            "workload.num_documents and workload.max_suffix_len must be >= 1, got "
            f"{config.num_documents} and {config.max_suffix_len}"
        )
    longest = min(config.shared_prefix_len, max_model_len - config.max_suffix_len - 1)
    if longest < ODD_MODULUS + 1:
        raise ConfigError(
            f"workload.shared_prefix_len={config.shared_prefix_len} is too short for "
            f"odd_lengths documents within max_model_len={max_model_len}"
        )
    documents = []
    for _ in range(config.num_documents):
        length = int(rng.integers(max(ODD_MODULUS + 1, longest // 4), longest + 1))
        if length % ODD_MODULUS == 0:
            length -= 1
        documents.append(tuple(rng.integers(0, vocab_size, length).tolist()))
    requests = []
    for i in range(config.num_requests):
        document = documents[i % len(documents)]
        suffix = rng.integers(0, vocab_size, int(rng.integers(1, config.max_suffix_len + 1)))
        prompt = document + tuple(suffix.tolist())
        room = max_model_len - len(prompt)
        num_out = min(room, int(rng.integers(config.min_output_len, config.max_output_len + 1)))
        output = tuple(rng.integers(0, vocab_size, num_out).tolist())
        requests.append(WorkloadRequest(f"req-{i}", prompt, output, arrivals[i], num_out))
    return requests


def multiturn(
    config: WorkloadConfig,
    rng: np.random.Generator,
    arrivals: list[float],
    vocab_size: int,
    max_model_len: int,
) -> list[WorkloadRequest]:
    check_output_lengths(config)
    if not 1 <= config.min_turns <= config.max_turns or config.message_len < 1:
        raise ConfigError(
            "workload needs 1 <= min_turns <= max_turns and message_len >= 1, got "
            f"{config.min_turns}, {config.max_turns} and {config.message_len}"
        )
    if config.think_time_s < 0:
        raise ConfigError(f"workload.think_time_s must be >= 0, got {config.think_time_s}")
    if config.shared_prefix_len + 1 + config.min_output_len > max_model_len:
        raise ConfigError(
            f"workload.shared_prefix_len={config.shared_prefix_len} leaves no room for a "
            f"message and min_output_len={config.min_output_len} tokens within "
            f"max_model_len={max_model_len}"
        )
    system = tuple(rng.integers(0, vocab_size, config.shared_prefix_len).tolist())
    requests: list[WorkloadRequest] = []
    conversation = 0
    while len(requests) < config.num_requests:
        start = arrivals[conversation]
        num_turns = int(rng.integers(config.min_turns, config.max_turns + 1))
        context = len(system)
        previous = None
        for turn in range(min(num_turns, config.num_requests - len(requests))):
            num_message = max(1, round(config.message_len * rng.uniform(0.5, 1.5)))
            num_out = int(rng.integers(config.min_output_len, config.max_output_len + 1))
            if context + num_message + num_out > max_model_len:
                if previous is not None:
                    break  # the conversation would outgrow the context: it ends here
                num_message = 1
                num_out = min(num_out, max_model_len - context - 1)
            message = tuple(rng.integers(0, vocab_size, num_message).tolist())
            output = tuple(rng.integers(0, vocab_size, num_out).tolist())
            request_id = f"s{conversation}-t{turn}"
            if previous is None:
                prompt, arrival, think = system + message, start, 0.0
            else:
                prompt, arrival, think = message, 0.0, float(rng.exponential(config.think_time_s))
            requests.append(
                WorkloadRequest(request_id, prompt, output, arrival, num_out, previous, think)
            )
            context += num_message + num_out
            previous = request_id
        conversation += 1
    return requests

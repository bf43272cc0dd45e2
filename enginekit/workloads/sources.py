"""``open_workload``: the ``Workload`` of any ``workload.name`` (see
``enginekit.workloads.traffic``)."""

from __future__ import annotations

from collections.abc import Callable

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.workloads.traffic import (
    SHAREGPT,
    TRACE,
    TRAFFIC_WORKLOADS,
    Encoder,
    TrafficRequest,
    Workload,
)


def open_workload(
    config: WorkloadConfig,
    vocab_size: int,
    max_model_len: int,
    encoder: Callable[[], Encoder],
) -> Workload:
    """The workload ``config`` names, for a model of ``vocab_size`` ids and a context of
    ``max_model_len`` tokens. ``encoder`` builds the tokenizer, called only by workloads
    made of text. Raises ConfigError for an unknown name or a bad field, and for a trace
    file with a bad line (before any request is made)."""
    if config.name == SHAREGPT:
        from enginekit.workloads import sharegpt

        return sharegpt.open_sharegpt(config, vocab_size, max_model_len, encoder())
    if config.name == TRACE:
        from enginekit.workloads import trace

        return trace.open_trace(config, vocab_size, max_model_len)
    from enginekit.workloads.generators import WORKLOADS, make_workload

    if config.name not in WORKLOADS:
        known = ", ".join((*WORKLOADS, *TRAFFIC_WORKLOADS))
        raise ConfigError(f"workload.name={config.name!r} is not a known workload; known: {known}")
    requests = [
        TrafficRequest(
            r.request_id,
            r.prompt_token_ids,
            r.output_token_ids,
            r.arrival_time,
            r.max_tokens,
            r.follows,
            r.think_time_s,
            r.n,
            r.beam_width,
        )
        for r in make_workload(config, vocab_size, max_model_len)
    ]
    return Workload(
        len(requests), lambda: requests, f"{config.name} (generated, seed {config.seed})"
    )

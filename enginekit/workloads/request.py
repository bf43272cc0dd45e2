"""WorkloadRequest: one request a workload generator describes."""

from __future__ import annotations

from typing import NamedTuple


class WorkloadRequest(NamedTuple):
    """``output_token_ids`` is what the simulator will "generate";
    ``max_tokens == len(output_token_ids)``.

    A request that ``follows`` another (a later turn of a conversation) arrives
    ``think_time_s`` after that one finishes, with that one's prompt and output in front of
    its own ``prompt_token_ids``; its ``arrival_time`` is unused.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    arrival_time: float
    max_tokens: int
    follows: str | None = None
    think_time_s: float = 0.0
    n: int = 1  # samples (parallel sampling) or beams returned (beam search)
    beam_width: int = 1

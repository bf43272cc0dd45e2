"""Workloads as streams: the requests of any workload, read or generated as a run needs them.

``enginekit.workloads.sources.open_workload`` gives a ``Workload`` for every
``workload.name``: the synthetic generators of ``enginekit.workloads.generators``
(materialised, as they always were), ``sharegpt`` (``enginekit.workloads.sharegpt``) and
``trace`` (``enginekit.workloads.trace``), whose requests are made one at a time.
Iterating a workload yields ``TrafficRequest`` values in arrival order of the first turns;
a later turn of a session comes right after the turn it follows, so a consumer that has
read up to a first turn has read every turn before it.

Token ids are held once: a request's ``prompt_token_ids`` and ``output_token_ids`` are
views into the arrays its source tokenized or generated (int32 numpy arrays for
ShareGPT and traces), so requests that repeat a conversation share its tokens by
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np

SHAREGPT, TRACE = "sharegpt", "trace"
TokenIds = Sequence[int] | np.ndarray  # token ids: a sequence, or an int array
TRAFFIC_WORKLOADS: tuple[str, ...] = (SHAREGPT, TRACE)


class TrafficRequest(NamedTuple):
    """One request of a workload, as a driver adds it to an engine.

    ``output_token_ids`` is what the simulator will "generate" (``max_tokens`` of them).
    A request that ``follows`` another (a later turn of a session) arrives
    ``think_time_s`` after that one finishes, or at ``arrival_time`` if that is later;
    with ``prepend_context`` its ``prompt_token_ids`` hold only the new part, and the
    earlier turn's prompt and output go in front of it when it arrives; without, they are
    the whole prompt. ``extra_key`` salts the prefix cache (None: shared globally).
    """

    request_id: str
    prompt_token_ids: TokenIds
    output_token_ids: TokenIds
    arrival_time: float
    max_tokens: int
    follows: str | None = None
    think_time_s: float = 0.0
    n: int = 1
    beam_width: int = 1
    extra_key: str | None = None
    prepend_context: bool = True


class Encoder(Protocol):
    """What a text workload needs of a tokenizer (enginekit.tokenizer's classes)."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


class Workload:
    """A workload's requests: ``num_requests`` of them (every turn counted), iterated
    in the order of the module docstring; each iteration starts over and yields the same
    requests. ``source`` says where they come from, in one line for the report."""

    def __init__(
        self, num_requests: int, make: Callable[[], Iterable[TrafficRequest]], source: str
    ) -> None:
        self.num_requests = num_requests
        self._make = make
        self.source = source

    def __iter__(self) -> Iterator[TrafficRequest]:
        return iter(self._make())

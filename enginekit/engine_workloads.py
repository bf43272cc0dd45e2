"""The Engine's workload half: generated requests, turns that follow turns, and the ideal
prefix-cache hits they allow."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from enginekit.errors import RequestRejectedError
from enginekit.request import Request, SamplingParams
from enginekit.workloads.request import WorkloadRequest

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from enginekit.metrics import RunMetrics
    from enginekit.spec.kv import KVSpec
    from enginekit.spec.model import ModelShape

_log = logging.getLogger("enginekit")


class WorkloadMixin:
    """Needs the engine's config, shape, KV spec, metrics, requests and add_request."""

    config: DictConfig
    shape: ModelShape
    kv_spec: KVSpec
    metrics: RunMetrics
    max_model_len: int
    clock: float
    _requests: dict[str, Request]
    _followers: dict[str, list[WorkloadRequest]]
    add_request: Callable[..., str]

    def add_workload(self) -> int:
        """Queues the configured workload's requests; returns how many were accepted.

        A request that can never be served is counted (``num_requests_rejected``) and
        logged, and the rest run: one oversized request does not void a sweep's job."""
        from enginekit.workloads import make_workload

        requests = make_workload(self.config.workload, self.shape.vocab_size, self.max_model_len)
        num_accepted = 0
        rejections: list[str] = []
        for item in requests:
            if item.follows is not None:
                self._followers.setdefault(item.follows, []).append(item)
                continue
            try:
                self.add_request(
                    item.prompt_token_ids,
                    _sampling_of(item),
                    request_id=item.request_id,
                    arrival_time=item.arrival_time,
                    scripted_output_ids=item.output_token_ids,
                )
                num_accepted += 1
            except RequestRejectedError as exc:
                rejections.append(str(exc))
        if rejections:
            _log.warning(
                "%d of %d requests rejected; the first: %s",
                len(rejections),
                len(requests),
                rejections[0],
            )
        return num_accepted

    def _add_followers(self, finished: Request) -> None:
        """Queues the turns that follow ``finished``: each arrives its think time from now,
        with ``finished``'s prompt and output in front of its own message."""
        for item in self._followers.pop(finished.request_id, ()):
            try:
                self.add_request(
                    finished.token_ids + list(item.prompt_token_ids),
                    _sampling_of(item),
                    request_id=item.request_id,
                    arrival_time=self.clock + item.think_time_s,
                    scripted_output_ids=item.output_token_ids,
                )
            except RequestRejectedError as exc:
                _log.warning("rejected %s", exc)
                self._drop_followers(item.request_id)

    def _drop_followers(self, request_id: str) -> None:
        """The turns after a rejected turn never come: counted as rejected too."""
        for item in self._followers.pop(request_id, ()):
            self.metrics.on_request_rejected()
            self._drop_followers(item.request_id)

    def ideal_prefix_hit_tokens(self, block_size: int | None = None) -> int:
        """Hits a perfect, unbounded prefix cache of ``block_size`` granularity (default:
        the cache's) would get on the requests added so far, each seeing the prompts and
        outputs of every request that arrived before it."""
        from enginekit.workloads import ideal_prefix_hit_tokens

        return ideal_prefix_hit_tokens(
            list(self._requests.values()),
            block_size or self.kv_spec.block_size,
            include_outputs=True,
        )


def _sampling_of(item: WorkloadRequest) -> SamplingParams:
    """A generated request runs to its scripted length (its random tokens may hold EOS)."""
    return SamplingParams(
        max_tokens=item.max_tokens, ignore_eos=True, n=item.n, beam_width=item.beam_width
    )

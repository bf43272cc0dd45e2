"""WorkloadDriver: runs a configured workload (``workload.*``) on an engine.

It uses the engine's public API only: it adds the workload's requests, steps the engine,
and adds each later turn of a multi-turn session once the turn it follows has finished
(its think time after that, with the earlier turn's prompt and output in front of its
own message). ``python -m enginekit``, the claims and the benchmarks run workloads
through it.
"""

from __future__ import annotations

import logging

from enginekit.engine import Engine, RunResult
from enginekit.errors import RequestRejectedError
from enginekit.request import RequestOutput, SamplingParams
from enginekit.workloads import WorkloadRequest, make_workload

_log = logging.getLogger("enginekit")


class WorkloadDriver:
    """Owns the turns that wait on an earlier turn (request id -> the turns after it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._followers: dict[str, list[WorkloadRequest]] = {}

    def add_workload(self) -> int:
        """Queues the configured workload's requests; returns how many were accepted.

        A request that can never be served is counted (``num_requests_rejected``) and
        logged, and the rest run: one oversized request does not void a sweep's job."""
        engine = self.engine
        requests = make_workload(
            engine.config.workload, engine.shape.vocab_size, engine.max_model_len
        )
        num_accepted = 0
        rejections: list[str] = []
        for item in requests:
            if item.follows is not None:
                self._followers.setdefault(item.follows, []).append(item)
                continue
            try:
                engine.add_request(
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

    def step(self) -> list[RequestOutput]:
        """One engine step; the turns that follow the requests it finished are queued."""
        finished = self.engine.step()
        for output in finished:
            self._add_followers(output)
        return finished

    def run(self, progress: bool = False) -> RunResult:
        """Steps until every request, later turns included, has finished."""
        engine = self.engine
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=None, unit="req", desc="enginekit", leave=False)
        while engine.has_unfinished_requests():
            finished = self.step()
            if bar is not None and finished:
                bar.update(len(finished))
        if bar is not None:
            bar.close()
        return RunResult(engine.outputs(), engine.summary())

    def _add_followers(self, finished: RequestOutput) -> None:
        """Queues the turns that follow ``finished``: each arrives its think time from now,
        with ``finished``'s prompt and output in front of its own message."""
        for item in self._followers.pop(finished.request_id, ()):
            try:
                self.engine.add_request(
                    finished.prompt_token_ids
                    + finished.output_token_ids
                    + list(item.prompt_token_ids),
                    _sampling_of(item),
                    request_id=item.request_id,
                    arrival_time=self.engine.clock + item.think_time_s,
                    scripted_output_ids=item.output_token_ids,
                )
            except RequestRejectedError as exc:
                _log.warning("rejected %s", exc)
                self._drop_followers(item.request_id)

    def _drop_followers(self, request_id: str) -> None:
        """The turns after a rejected turn never come: counted as rejected too."""
        for item in self._followers.pop(request_id, ()):
            self.engine.metrics.on_request_rejected()
            self._drop_followers(item.request_id)


def _sampling_of(item: WorkloadRequest) -> SamplingParams:
    """A generated request runs to its scripted length (its random tokens may hold EOS)."""
    return SamplingParams(
        max_tokens=item.max_tokens, ignore_eos=True, n=item.n, beam_width=item.beam_width
    )

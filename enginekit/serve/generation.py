"""Generation: the engine requests one HTTP request runs, and its choices as they stream.

A completion request has one engine request per prompt; each gives ``n`` choices,
numbered prompt by prompt (choice ``i * n + j`` is sample ``j`` of prompt ``i``). Each
choice is a ``SampleText``: its text as it streams, cut at a stop string. When every
choice of a prompt has met a stop string, the engine request is finished then and there
(``EngineLoop.finish``: it counts as finished, with reason ``stop``); a choice that met
one while its siblings go on ignores its further tokens.

Beam search (``use_beam_search``) gives its choices when the request ends: until then
beams fork and are pruned, so no sample's tokens are final.

A choice's finish reason: ``stop`` for a stop string, a stop token or EOS; ``length``
when it reached ``max_tokens``; ``abort`` when the request was aborted (a shutdown).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from enginekit.errors import InvalidRequestError
from enginekit.request import RequestOutput, SamplingParams, TokenLogprob
from enginekit.serve.codec import TextCodec
from enginekit.serve.loop import Accepted, EngineLoop, Event, Job, Refused, Tokens
from enginekit.serve.prometheus import ServeMetrics
from enginekit.serve.protocol import ApiError, bad_request
from enginekit.serve.text import SampleText, TextOptions


@dataclass(frozen=True)
class ChoiceUpdate:
    """What one choice gained from one event: text, token ids (with their logprobs when
    the request asked for them), and its finish reason once it has ended (None while it
    goes on)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None


class Generation:
    """The engine requests of one HTTP request (see the module docstring). ``start``
    queues them, ``updates`` yields the choices' progress until every one has ended,
    ``abort`` ends whatever is still live (idempotent; for a client gone away)."""

    def __init__(
        self,
        loop: EngineLoop,
        metrics: ServeMetrics,
        codec: TextCodec | None,
        prompts: list[list[int]],
        sampling: SamplingParams,
        stop: list[str],
        extra_key: str | None,
        id_prefix: str,
        priority: int = 0,
        user: str | None = None,
        text_options: TextOptions | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
    ) -> None:
        self.loop = loop
        self.metrics = metrics
        self.id = f"{id_prefix}-{request_id or uuid.uuid4().hex}"
        self.prompts = prompts
        self.sampling = sampling
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        received = time.monotonic() if received_at is None else received_at
        self._jobs = [
            Job(
                f"{self.id}-{i}",
                prompt,
                sampling,
                i,
                self._events,
                extra_key,
                priority,
                user,
                received,
            )
            for i, prompt in enumerate(prompts)
        ]
        n = sampling.n
        self.choices = [
            [SampleText(codec, prompt, stop, text_options) for _ in range(n)] for prompt in prompts
        ]
        # Each choice's tokens' logprobs (kept only when the request asked for them).
        self.logprobs: list[list[list[TokenLogprob]]] = [[[] for _ in range(n)] for _ in prompts]
        self._finish_reasons: list[list[str | None]] = [[None] * n for _ in prompts]
        self._finals: list[RequestOutput | None] = [None] * len(prompts)
        self._live: set[int] = set()  # prompts whose engine request has not ended
        self._finishing: set[int] = set()  # prompts the loop was asked to finish
        self._early: list[Event] = []  # events that came while ``start`` waited

    async def start(self, max_waiting: int, retry_after_s: int) -> None:
        """Queues every prompt's request. Raises ApiError: 503 (with Retry-After) when
        the backlog would pass ``max_waiting``; 400 when the engine refuses a prompt
        (the others, if queued, are aborted)."""
        if not self.loop.backlog.reserve(len(self._jobs), max_waiting):
            self.metrics.request_rejected.labels("queue_full").inc()
            raise ApiError(
                503,
                f"the server has {max_waiting} requests waiting; retry later",
                code="queue_full",
                headers={"Retry-After": str(retry_after_s)},
            )
        for job in self._jobs:
            self.loop.submit(job)
        refusal: Refused | None = None
        num_answered = 0
        while num_answered < len(self._jobs):
            event = await self._events.get()
            if isinstance(event, Accepted):
                num_answered += 1
                self._live.add(event.index)
            elif isinstance(event, Refused) and event.index not in self._live:
                num_answered += 1
                refusal = refusal or event
            else:  # an accepted prompt's tokens, before the last prompt was answered
                self._early.append(event)
        if refusal is not None:
            self.abort()
            if refusal.status != 400:
                raise ApiError(refusal.status, f"the engine cannot serve: {refusal.error}")
            invalid = isinstance(refusal.error, InvalidRequestError)
            reason = "invalid" if invalid else "unservable"
            self.metrics.request_rejected.labels(reason).inc()
            raise bad_request(refusal.error)

    def abort(self) -> None:
        """Aborts every engine request not yet ended."""
        for index in self._live:
            self.loop.abort(self._jobs[index].request_id)

    async def updates(self) -> AsyncIterator[list[ChoiceUpdate]]:
        """The choices' updates, one list per engine event, until all have ended. Raises
        ApiError (500) if the engine loop fails."""
        while self._live:
            event = self._early.pop(0) if self._early else await self._events.get()
            if isinstance(event, Refused):  # the loop failed under us
                self._live.discard(event.index)
                raise ApiError(event.status, f"the engine cannot serve: {event.error}")
            if isinstance(event, Tokens):
                yield self._apply(event)

    def _apply(self, event: Tokens) -> list[ChoiceUpdate]:
        if self.sampling.beam_width > 1:
            # Beams fork and are pruned until the end: only the final best n are choices.
            if event.final is None:
                return []
            event = Tokens(event.index, [list(s) for s in event.final.samples], event.final)
        i, n = event.index, self.sampling.n
        updates = []
        for j in range(n):
            if self._finish_reasons[i][j] is not None:
                continue
            choice = self.choices[i][j]
            new = event.new_token_ids[j] if j < len(event.new_token_ids) else []
            num_before = choice.num_tokens
            text = choice.add(new)
            num_taken = choice.num_tokens - num_before  # a stop string drops what follows it
            logprobs = None
            if event.new_logprobs is not None:
                logprobs = event.new_logprobs[j][:num_taken]
                self.logprobs[i][j] += logprobs
            reason: str | None = "stop" if choice.is_stopped else None
            if reason is None and event.final is not None:
                text += choice.flush()
                reason = self._final_reason(event.final, j)
            if reason is not None:
                self._finish_reasons[i][j] = reason
            if text or choice.num_tokens > num_before or reason is not None:
                update = ChoiceUpdate(
                    i * n + j, text, choice.token_ids[num_before:], reason, logprobs
                )
                updates.append(update)
        if event.final is not None:
            self._finals[i] = event.final
            self._live.discard(i)
        elif i not in self._finishing and all(r is not None for r in self._finish_reasons[i]):
            self._finishing.add(i)  # every choice met a stop string: end the request now
            self.loop.finish(self._jobs[i].request_id)
        return updates

    def _final_reason(self, final: RequestOutput, sample: int) -> str:
        """The choice's reason once its request has ended: ``abort`` for a sample the abort
        ended (one that had stopped before keeps its reason), else ``length`` or ``stop``."""
        reasons = final.finish_reasons
        if (reasons[sample] if sample < len(reasons) else final.finish_reason) == "abort":
            return "abort"
        samples = final.samples
        num_tokens = len(samples[sample]) if sample < len(samples) else 0
        return "length" if num_tokens >= self.sampling.max_tokens else "stop"

    # -- results ---------------------------------------------------------------------------

    def finish_reason(self, choice_index: int) -> str | None:
        i, j = divmod(choice_index, self.sampling.n)
        return self._finish_reasons[i][j]

    def all_choices(self) -> list[tuple[int, SampleText]]:
        """(choice index, its text state) of every choice, in order."""
        n = self.sampling.n
        return [
            (i * n + j, choice)
            for i, row in enumerate(self.choices)
            for j, choice in enumerate(row)
        ]

    def prompt_of(self, choice_index: int) -> list[int]:
        return self.prompts[choice_index // self.sampling.n]

    def logprobs_of(self, choice_index: int) -> list[TokenLogprob]:
        """The logprobs of the choice's tokens so far (empty when none were asked)."""
        i, j = divmod(choice_index, self.sampling.n)
        return self.logprobs[i][j]

    def prompt_logprobs_of(self, choice_index: int) -> list[TokenLogprob | None] | None:
        """The logprobs of the choice's prompt tokens (the first None), once its request
        has ended; None when they were not asked."""
        final = self._finals[choice_index // self.sampling.n]
        return None if final is None else final.prompt_logprobs

    def usage(self) -> dict[str, object]:
        """OpenAI's usage: prompt tokens (each prompt once, whatever n), completion tokens
        (every choice's, up to its stop), and the prompt tokens the prefix cache served."""
        num_prompt = sum(map(len, self.prompts))
        num_completion = sum(c.num_tokens for row in self.choices for c in row)
        num_cached = sum(f.num_cached_tokens for f in self._finals if f is not None)
        return {
            "prompt_tokens": num_prompt,
            "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
            "prompt_tokens_details": {"cached_tokens": num_cached},
        }

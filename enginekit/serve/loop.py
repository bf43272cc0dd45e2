"""EngineLoop: the one thread that owns the engine.

The engine is not thread-safe, and a step of the torch executor holds the CPU for as long
as the model runs, so no HTTP handler touches it: handlers put commands in the loop's
inbox (``submit``, ``abort``, ``finish``, ``call``; each thread-safe and non-blocking) and
read their request's events from an asyncio queue of their own. The loop thread takes the
inbox between steps, steps while any request is live, and sleeps on an event while none
is. After each step it hands every touched request's new tokens to its queue, all in one
``call_soon_threadsafe`` (one wake-up of the event loop per step, whatever the number of
requests), and publishes a ``Snapshot`` of the engine's counters for ``/metrics`` (a
frozen value swapped in whole: readers on other threads never see a half-made one).

A step's tokens are released when the step is over. For the torch executor that is as
soon as ``engine.step()`` returns (its step times are wall times). ``executor=sim`` is
paced: a step that starts at wall time t0 and takes simulated time t releases its tokens
at t0 + t / time_scale, never earlier, so clients see the simulated latencies (scaled):
a long prompt's first token comes after its prefill, not before. While the engine is
busy, a step starts when the one before it was released (the device goes from step to
step), so the loop's own host work (releasing, publishing, the next schedule) overlaps
the simulated time instead of adding to it; after an idle wait, or when the host fell
behind the simulation, a step starts when it is run (no debt is carried: a late step
never makes a later one early). Requests sent while a step runs wait for the next one,
as on a GPU. The latency histograms observe the release
times: the server's TTFT is what a client on loopback measures, less the network.

Ownership: the engine, ``_live`` and the counters behind the snapshot belong to the loop
thread; the inbox (behind its lock) and the backlog are the only state both sides touch. Once
the loop has ended (stopped, or failed), whatever is sent to it is refused at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from enginekit.engine import Engine
from enginekit.errors import EngineKitError
from enginekit.metric_keys import BYTES_PER_GIB
from enginekit.request import RequestOutput, SamplingParams, TokenLogprob
from enginekit.serve.prometheus import ServeMetrics, Snapshot

_log = logging.getLogger("enginekit.serve")

RATE_WINDOW_S = 10.0  # the window of the output-rate gauge, in wall seconds


# ---- what handlers and the loop exchange ---------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """The engine queued prompt ``index`` of the HTTP request."""

    index: int


@dataclass(frozen=True)
class Refused:
    """Prompt ``index`` did not run, or stopped running: the engine refused it (``error``
    says why; ``status`` 400), the loop failed (500), or the loop had stopped (503)."""

    index: int
    error: Exception
    status: int = 400


@dataclass(frozen=True)
class Tokens:
    """New output tokens of prompt ``index``, one list per sample (some may be empty),
    with their logprobs when the request asked for them; ``final`` is the request's last
    output once it has ended (finished or aborted)."""

    index: int
    new_token_ids: list[list[int]]
    final: RequestOutput | None = None
    new_logprobs: list[list[TokenLogprob]] | None = None


Event = Accepted | Refused | Tokens


@dataclass(eq=False)
class Job:
    """One engine request an HTTP request asks for: its events go to ``events``."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    index: int
    events: asyncio.Queue[Event]
    extra_key: str | None = None
    priority: int = 0  # the queue's order under +queue=priority (lower first)
    user: str | None = None  # the tenant under +queue=fair
    received_at: float = field(default_factory=time.monotonic)


class Backlog:
    """The requests accepted but not running: those in the inbox and those the engine has
    not started (or preempted). ``reserve`` (handlers) and ``update`` (the loop) hold one
    lock, so that a request is counted on one side or the other, never neither."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_queued = 0
        self._num_engine_waiting = 0

    def reserve(self, num: int, limit: int) -> bool:
        """Counts ``num`` more queued requests if the total stays within ``limit``."""
        with self._lock:
            if self._num_queued + self._num_engine_waiting + num > limit:
                return False
            self._num_queued += num
            return True

    def update(self, num_taken: int, num_engine_waiting: int) -> None:
        """The loop took ``num_taken`` queued requests; the engine has this many waiting."""
        with self._lock:
            self._num_queued -= num_taken
            self._num_engine_waiting = num_engine_waiting

    @property
    def total(self) -> int:
        with self._lock:
            return self._num_queued + self._num_engine_waiting


@dataclass(eq=False)
class _Live:
    """A live request's progress, in wall-clock (``time.monotonic``) times: the start of
    the first step that scheduled it, and the releases of its first and latest tokens."""

    job: Job
    num_sent: list[int] = field(default_factory=list)  # tokens handed over, per sample
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None


class EngineLoop:
    """Steps ``engine`` on a thread of its own (see the module docstring).

    ``pace`` is the wall seconds a second of engine time takes at least (1 / time_scale
    for the simulator; None: unpaced, as for the torch executor, whose step times are
    wall times already). ``metrics`` receives the histograms' samples.
    """

    # Called with the engine on the loop thread after each step, each batch of commands
    # (adds, aborts, finishes, calls) and the last aborts (the KV events' publisher); must
    # not block. None: nothing.
    after_engine: Callable[[Engine], None] | None = None

    def __init__(
        self,
        engine: Engine,
        aio_loop: asyncio.AbstractEventLoop,
        metrics: ServeMetrics,
        backlog: Backlog,
        pace: float | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.backlog = backlog
        self.snapshot = Snapshot()
        self.error: BaseException | None = None  # set when the loop died
        self._aio_loop = aio_loop
        self._pace = pace
        self._released_at: float | None = None  # the last paced release, while busy
        self._added_at = 0.0  # when the loop last took a request from the inbox
        self._inbox: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="enginekit-engine", daemon=True)
        self._live: dict[str, _Live] = {}
        self._stop_requested = False
        self._lock = threading.Lock()  # orders sends against the loop's closing
        self._closed = False
        # The loop's own counters (tokens as released, requests as ended), and the
        # output-rate window.
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished_by_reason: dict[str, int] = {}
        self._rate_window: deque[tuple[float, int]] = deque()  # (wall time, tokens)
        # The wall span of the work: the first accepted request's arrival, the last end.
        self._first_arrival_at: float | None = None
        self._last_end_at: float | None = None
        self._publish(num_taken=0)

    # -- any thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, job: Job) -> None:
        """Queues ``job``; its first event is Accepted or Refused."""
        self._send("add", job)

    def abort(self, request_id: str) -> None:
        """Aborts the request if it is live (its blocks are released at once)."""
        self._send("abort", request_id)

    def finish(self, request_id: str) -> None:
        """Ends the request as finished (stop), if it is live: its caller matched a stop."""
        self._send("finish", request_id)

    def call(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future[Any]:
        """Runs ``fn(engine)`` on the loop thread between two steps; its result (or
        exception) comes back through the future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._send("call", (fn, future))
        return future

    def stop(self, timeout_s: float | None = None) -> None:
        """Aborts every live request (each gets its final event) and ends the thread;
        returns once it has ended (or after ``timeout_s``)."""
        self._send("stop", None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _send(self, kind: str, payload: Any) -> None:
        with self._lock:
            if not self._closed:
                self._inbox.append((kind, payload))
                self._wake.set()
                return
        self._refuse([(kind, payload)], RuntimeError("the engine loop has stopped"), 503)

    # -- the loop thread -------------------------------------------------------------------

    def _run(self) -> None:
        error: Exception = RuntimeError("the engine loop has stopped")
        status = 503
        try:
            while not self._stop_requested:
                self._take_inbox()
                if self._stop_requested:
                    break
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._released_at = None  # idle: the next step starts when it runs
                    self._wake.wait()
                    self._wake.clear()
            self._abort_all()
        except BaseException as exc:  # a bug: every live request is told, health turns 503
            _log.exception("the engine loop failed")
            self.error = exc
            error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
            status = 500
            self._post([
                (live.job.events, Refused(live.job.index, error, 500))
                for live in self._live.values()
            ])  # fmt: skip
            self._live.clear()
        finally:
            # Whatever is sent from now on, or was left in the inbox, is refused at once.
            with self._lock:
                self._closed = True
                left = list(self._inbox)
                self._inbox.clear()
            self._refuse(left, error, status)

    def _take_inbox(self) -> None:
        if not self._inbox:
            return
        num_taken = 0
        events: list[tuple[asyncio.Queue[Event], Event]] = []
        for _ in range(len(self._inbox)):  # what is there now: later sends wait a step
            kind, payload = self._inbox.popleft()
            if kind == "add":
                num_taken += 1
                events.append(self._add(payload))
                self._added_at = time.monotonic()
            elif kind == "abort":
                events += self._end(payload, self.engine.abort_request)
            elif kind == "finish":
                events += self._end(payload, self.engine.finish_request)
            elif kind == "call":
                fn, future = payload
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(self.engine))
                    except Exception as exc:
                        future.set_exception(exc)
            elif kind == "stop":
                self._stop_requested = True
        self._post(events)
        self._publish(num_taken)

    def _add(self, job: Job) -> tuple[asyncio.Queue[Event], Event]:
        try:
            self.engine.add_request(
                job.prompt_token_ids,
                job.sampling,
                request_id=job.request_id,
                extra_key=job.extra_key,
                priority=job.priority,
                user=job.user,
            )
        except EngineKitError as exc:
            return job.events, Refused(job.index, exc)
        self._live[job.request_id] = _Live(job)
        if self._first_arrival_at is None or job.received_at < self._first_arrival_at:
            self._first_arrival_at = job.received_at
        return job.events, Accepted(job.index)

    def _end(
        self, request_id: str, end: Callable[[str], bool]
    ) -> list[tuple[asyncio.Queue[Event], Event]]:
        """Ends a live request with ``end`` (abort or finish) and hands over its final
        tokens; nothing for a request that is not live."""
        if request_id not in self._live:
            return []
        end(request_id)
        output = self.engine.output(request_id)
        return self._collect({request_id: output}, [request_id], time.monotonic())

    def _step(self) -> None:
        """Runs one engine step and releases what it gave (see the module docstring):
        its tokens to the handlers, its samples to the histograms, a new snapshot."""
        engine = self.engine
        started = time.monotonic()
        if self._released_at is not None:  # busy: this step follows the last one, but
            started = max(self._released_at, self._added_at)  # not before what it takes
        clock = engine.clock
        steps_before, tokens_before = _work_done(engine)
        finished = {output.request_id: output for output in engine.step()}
        if self._pace is not None:
            _sleep_until(started + (engine.clock - clock) * self._pace)
        released = time.monotonic()
        if self._pace is not None:
            self._released_at = released
        running = {(r.parent or r).request_id for r in engine.scheduler.running}
        touched = [rid for rid in self._live if rid in running or rid in finished]
        self._note_scheduled(touched, started)
        steps_after, tokens_after = _work_done(engine)
        if steps_after > steps_before:  # not an empty step (nothing could run)
            self.metrics.iteration_tokens.observe(tokens_after - tokens_before)
        self._post(self._collect(finished, touched, released))
        self._publish(num_taken=0)

    def _note_scheduled(self, request_ids: list[str], step_started: float) -> None:
        """The requests a step ran were scheduled when it started, if not before."""
        for request_id in request_ids:
            live = self._live[request_id]
            if live.scheduled_at is None:
                live.scheduled_at = step_started

    def _collect(
        self, finished: dict[str, RequestOutput], request_ids: list[str], now: float
    ) -> list[tuple[asyncio.Queue[Event], Event]]:
        """The events of ``request_ids``, released at ``now``: their new tokens, and for
        those in ``finished`` (which leave the engine and ``_live``) the final output.
        Counts the released tokens, observes the latency histograms and counts the
        requests that ended."""
        events: list[tuple[asyncio.Queue[Event], Event]] = []
        num_new_total = 0
        for request_id in request_ids:
            live = self._live[request_id]
            final = finished.get(request_id)
            output = final or self.engine.output(request_id)
            if final is None and output.finish_reason is not None:
                final = output  # ended between steps (abort, finish)
            samples = output.samples
            live.num_sent += [0] * (len(samples) - len(live.num_sent))
            new = [s[n:] for s, n in zip(samples, live.num_sent, strict=True)]
            new_logprobs = None
            if output.logprobs is not None:
                new_logprobs = [
                    lp[n:] for lp, n in zip(output.logprobs, live.num_sent, strict=True)
                ]
            num_new = sum(map(len, new))
            if num_new:
                num_new_total += num_new
                live.num_sent = [len(s) for s in samples]
                self._count_released(live, num_new, now)
            if final is not None:
                self._count_finished(live, final, now)
                del self._live[request_id]
                self.engine.release_request(request_id)
            if num_new or final is not None:
                tokens = Tokens(live.job.index, new, final, new_logprobs)
                events.append((live.job.events, tokens))
        if num_new_total:
            self._rate_window.append((now, num_new_total))
        return events

    def _count_released(self, live: _Live, num_new: int, now: float) -> None:
        """``num_new`` tokens of ``live`` released at ``now``: the token counters move (the
        prompt's with the first token, as vLLM counts it), and TTFT or ITL is observed."""
        self._generation_tokens += num_new
        if live.first_token_at is None:
            live.first_token_at = now
            self._prompt_tokens += len(live.job.prompt_token_ids)
            self.metrics.time_to_first_token.observe(now - live.job.received_at)
        elif live.last_token_at is not None:
            self.metrics.inter_token_latency.observe(now - live.last_token_at)
        live.last_token_at = now

    def _count_finished(self, live: _Live, final: RequestOutput, now: float) -> None:
        """Counts the request's end by reason; for one that finished (aborted ones apart),
        observes its phases and sizes. A phase a request never reached (a finish before
        any token) lasts 0."""
        reason = final.finish_reason or "abort"
        self._finished_by_reason[reason] = self._finished_by_reason.get(reason, 0) + 1
        self._last_end_at = now
        if reason == "abort":
            return
        metrics = self.metrics
        arrived = live.job.received_at
        scheduled = live.scheduled_at if live.scheduled_at is not None else now
        first = live.first_token_at if live.first_token_at is not None else now
        last = live.last_token_at if live.last_token_at is not None else now
        metrics.e2e_request_latency.observe(now - arrived)
        metrics.request_queue_time.observe(scheduled - arrived)
        metrics.request_prefill_time.observe(first - scheduled)
        metrics.request_decode_time.observe(last - first)
        metrics.request_inference_time.observe(last - scheduled)
        lengths = [len(sample) for sample in final.samples]
        longest = max(lengths, default=0)
        if longest > 1:
            metrics.request_time_per_output_token.observe((last - first) / (longest - 1))
        metrics.request_prompt_tokens.observe(len(final.prompt_token_ids))
        metrics.request_generation_tokens.observe(sum(lengths))
        metrics.request_max_num_generation_tokens.observe(longest)
        metrics.request_params_n.observe(live.job.sampling.n)
        metrics.request_params_max_tokens.observe(live.job.sampling.max_tokens)

    def _post(self, events: list[tuple[asyncio.Queue[Event], Event]]) -> None:
        """Hands ``events`` to their queues on the event loop's thread, in one wake-up."""
        if not events:
            return
        try:
            self._aio_loop.call_soon_threadsafe(_put_all, events)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    def _publish(self, num_taken: int) -> None:
        """Swaps in a new snapshot, and tells the backlog what the engine has waiting."""
        engine = self.engine
        running = engine.scheduler.running
        num_running = len({id(r.parent or r) for r in running})
        num_waiting = len(self._live) - num_running
        usage = engine.kv_usage()
        metrics = engine.metrics
        block_bytes = engine.kv_spec.bytes_per_block
        tiers = engine.cache.tiers
        self.snapshot = Snapshot(
            num_requests_running=num_running,
            num_requests_waiting=num_waiting,
            kv_num_blocks=usage.num_total_blocks,
            kv_num_used_blocks=usage.num_used_blocks,
            kv_num_table_slots=usage.num_table_slots,
            kv_num_unused_slots=usage.num_unused_slots,
            kv_pool_gib=usage.num_total_blocks * block_bytes / BYTES_PER_GIB,
            prefix_cache_queries=metrics.prefix_cache_queries,
            prefix_cache_hits=metrics.prefix_cache_hits,
            num_preemptions_by_kind=dict(metrics.num_preemptions_by_kind),
            recomputed_tokens=metrics.recomputed_tokens_total,
            recomputed_tokens_by_kind=dict(metrics.recomputed_tokens_by_kind),
            swap_out_bytes=metrics.num_swapped_out_blocks * block_bytes,
            swap_in_bytes=metrics.num_swapped_in_blocks * block_bytes,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_finished_by_reason=dict(self._finished_by_reason),
            output_tokens_per_s=self._output_rate(),
            tier_stats=tuple(engine.cache.tier_stats()),
            tier_loads_avoided_blocks=tiers.num_avoided_blocks if tiers is not None else 0,
        )
        self.backlog.update(num_taken, num_waiting)
        if self.after_engine is not None:
            self.after_engine(engine)

    def wall_summary(self) -> dict[str, float | int | None]:
        """The output rate in wall-clock time, as a client computes its own: the tokens
        released (``generation_tokens_total``, as ``vllm:generation_tokens_total``) over
        ``duration_s``, from the first accepted request's arrival (``received_at``) to the
        last request's end (its final release, or its abort). ``duration_s`` and the rate
        are None until a request has ended. Call on the loop thread (``call``)."""
        duration = None
        if self._first_arrival_at is not None and self._last_end_at is not None:
            duration = self._last_end_at - self._first_arrival_at
        rate = self._generation_tokens / duration if duration else None
        return {
            "duration_s": duration,
            "generation_tokens_total": self._generation_tokens,
            "output_tokens_per_s": rate,
        }

    def _output_rate(self) -> float:
        """Tokens handed over in the last RATE_WINDOW_S wall seconds, per second of the
        engine's time (wall seconds / pace for the simulator)."""
        window = self._rate_window
        now = time.monotonic()
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()
        engine_seconds = RATE_WINDOW_S / (self._pace or 1.0)
        return sum(n for _, n in window) / engine_seconds

    def _abort_all(self) -> None:
        events: list[tuple[asyncio.Queue[Event], Event]] = []
        for request_id in list(self._live):
            events += self._end(request_id, self.engine.abort_request)
        self._post(events)
        self._publish(num_taken=0)

    def _refuse(self, commands: list[tuple[str, Any]], error: Exception, status: int) -> None:
        """Answers commands the loop will never run: adds are refused, calls fail."""
        events: list[tuple[asyncio.Queue[Event], Event]] = []
        for kind, payload in commands:
            if kind == "add":
                events.append((payload.events, Refused(payload.index, error, status)))
            elif kind == "call" and payload[1].set_running_or_notify_cancel():
                payload[1].set_exception(error)
        self._post(events)


def _put_all(events: list[tuple[asyncio.Queue[Event], Event]]) -> None:
    for queue, event in events:
        queue.put_nowait(event)


def _sleep_until(deadline: float) -> None:
    """Returns once ``time.monotonic()`` has reached ``deadline``, never before."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def _work_done(engine: Engine) -> tuple[int, int]:
    """The engine's steps so far and the tokens they computed (prefill and decode)."""
    metrics = engine.metrics
    num_tokens = metrics.num_prefill_tokens_computed + metrics.num_decode_tokens_computed
    return metrics.num_steps, num_tokens

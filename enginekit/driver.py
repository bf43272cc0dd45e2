"""WorkloadDriver: runs a configured workload (``workload.*``) on an engine.

It uses the engine's public API only: it adds the workload's requests, steps the engine,
and adds each later turn of a multi-turn session once the turn it follows has finished
(its think time after that, with the earlier turn's prompt and output in front of its
own message, unless the turn's prompt is complete). ``python -m enginekit``, the claims
and the benchmarks run workloads through it.

Streaming (``stream``; by default for workloads of more than ``STREAM_ABOVE`` requests):
requests are drawn from the workload as the run needs them and each is released from
the engine when it finishes (its metrics stay counted), so memory holds the live
requests only. The driver keeps every request that has arrived in the engine, up to
``scheduler.max_num_seqs + 1`` waiting ones (the scheduler admits at most
``max_num_seqs`` a step, from the front of its queue), and the next future arrival, so
the engine schedules exactly what it would with every request added up front. Only
``num_waiting_peak`` differs: it counts the requests the driver has handed over.
Without streaming, every first turn is added by ``add_workload`` and every request stays
in the engine (``RunResult.outputs``, ``Engine.outputs()``).

Every run also feeds its requests to an ``enginekit.reuse.ReuseTracker`` in the order they
join the engine's queue (their arrival, or when streaming handed them over if that is
later: a request held back can reuse what was computed while it waited), with their
scripted outputs: the summary's ideal hits come from it (one streamed pass, released
requests included; without streaming the same as ``Engine.ideal_prefix_hit_tokens``
whenever the outputs are the scripted ones, as in the simulator), and it adds the keys
of ``metric_keys.ADDED_BY_DRIVER``: the missed prompt tokens by cause, the hit-rate curve
over cache sizes and its value at the run's pool, Belady's OPT at the pool (and the
measured rate as a share of it); for a run with KV tiers, the curve's
values at the pool over tiers of several sizes (``KV_TIER_HIT_RATE_PREDICTED``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

from enginekit import metric_keys as mk
from enginekit.engine import Engine, RunResult
from enginekit.errors import RequestRejectedError
from enginekit.report import CURVE_POOL_MULTIPLES, TIER_POOL_MULTIPLES
from enginekit.request import RequestOutput, SamplingParams
from enginekit.reuse import HitRateCurve, ReuseTracker, tiered_pool_blocks
from enginekit.workloads.sources import open_workload
from enginekit.workloads.traffic import TokenIds, TrafficRequest, Workload

_log = logging.getLogger("enginekit")

STREAM_ABOVE = 10_000  # workloads of more requests stream unless told otherwise


class WorkloadDriver:
    """Owns the workload's stream, the turns that wait on an earlier turn (request id ->
    the turns after it) and the reuse tracker of the run."""

    def __init__(self, engine: Engine, stream: bool | None = None) -> None:
        self.engine = engine
        self.stream = stream
        self.workload: Workload | None = None
        self._items: Iterator[TrafficRequest] = iter(())
        self._next: TrafficRequest | None = None  # the next first turn to add
        self._followers: dict[str, list[TrafficRequest]] = {}
        self._latest_arrival = float("-inf")  # of the first turns added
        self._num_added_since_step = 0
        # streaming keeps up to this many requests waiting (read once: a config node's
        # attributes cost tens of microseconds to read)
        self._max_num_waiting = engine.limits.max_num_seqs + 1
        self._sampling: dict[tuple[int, int, int], SamplingParams] = {}  # shared, frozen
        self.tracker = ReuseTracker(engine.kv_spec.block_size)
        # (arrival, order, id, prompt, scripted output, salt): added, not yet tracked
        self._untracked: list[tuple[float, int, str, TokenIds, TokenIds, Any]] = []
        self._order = itertools.count()
        self._num_accepted = 0
        self._num_rejected = 0
        self._first_rejection: str | None = None
        self._last_rejection: str | None = None

    # ---- adding -------------------------------------------------------------------------

    def add_workload(self) -> int:
        """Opens the configured workload and queues its requests (streaming: the first
        ones; the rest as ``step`` needs them); returns how many were accepted so far.

        A request that can never be served is counted (``num_requests_rejected``), with
        the turns that follow it, and logged, and the rest run: one oversized request
        does not void a sweep's job."""
        engine = self.engine
        self.workload = open_workload(
            engine.config.workload,
            engine.shape.vocab_size,
            engine.max_model_len,
            self._encoder,
        )
        if self.stream is None:
            self.stream = self.workload.num_requests > STREAM_ABOVE
        self._items = iter(self.workload)
        self._advance()
        if self.stream:
            num_accepted = self._top_up()
        else:
            num_accepted = 0
            while self._next is not None:
                num_accepted += self._add_next()
            self._log_rejections()
        return num_accepted

    def _encoder(self) -> Any:
        from enginekit.tokenizer import Tokenizer

        return Tokenizer.for_workload(self.engine.config.model.path)

    def _advance(self) -> None:
        """Reads the workload up to its next first turn; the later turns read on the way
        wait for the turn they follow."""
        for item in self._items:
            if item.follows is None:
                self._next = item
                return
            self._followers.setdefault(item.follows, []).append(item)
        self._next = None

    def _add_next(self) -> int:
        item = self._next
        assert item is not None
        self._advance()
        self._latest_arrival = max(self._latest_arrival, item.arrival_time)
        return self._add(item, item.prompt_token_ids, item.arrival_time)

    def _add(self, item: TrafficRequest, prompt: TokenIds, arrival_time: float) -> int:
        """Adds one request; 1 if accepted, 0 if rejected (counted, its followers too)."""
        try:
            self.engine.add_request(  # int arrays are token ids to add_request too
                cast(Sequence[int], prompt),
                self._sampling_of(item),
                request_id=item.request_id,
                arrival_time=arrival_time,
                extra_key=item.extra_key,
                scripted_output_ids=cast(Sequence[int], item.output_token_ids),
            )
        except RequestRejectedError as exc:
            self._num_rejected += 1
            self._last_rejection = str(exc)
            self._first_rejection = self._first_rejection or self._last_rejection
            self._drop_followers(item.request_id)
            return 0
        self._num_accepted += 1
        # Tracked in the order requests join the engine's queue: at their arrival, or
        # when the driver hands them over if that is later (streaming held them back).
        entry = (
            max(0.0, arrival_time, self.engine.clock),
            next(self._order),
            item.request_id,
            prompt,
            item.output_token_ids,
            item.extra_key,
        )
        heapq.heappush(self._untracked, entry)
        return 1

    def _sampling_of(self, item: TrafficRequest) -> SamplingParams:
        """A generated request runs to its scripted length (its random tokens may hold
        EOS). One frozen SamplingParams per distinct (max_tokens, n, beam_width): checking
        its fields costs more than the rest of adding a request."""
        key = (item.max_tokens, item.n, item.beam_width)
        sampling = self._sampling.get(key)
        if sampling is None:
            sampling = self._sampling[key] = SamplingParams(
                max_tokens=item.max_tokens, ignore_eos=True, n=item.n, beam_width=item.beam_width
            )
        return sampling

    def _top_up(self) -> int:
        """Streaming: adds the first turns that have arrived while fewer than
        ``max_num_seqs + 1`` wait, and the next future arrival (with its ties) when the
        engine has none. Returns how many were accepted."""
        engine = self.engine
        target = self._max_num_waiting
        num_accepted = 0
        while self._next is not None:
            arrival = self._next.arrival_time
            if engine.num_waiting + self._num_added_since_step >= target:
                break
            if arrival > engine.clock and self._latest_arrival > engine.clock:
                if arrival > self._latest_arrival:
                    break  # the engine already holds an earlier future arrival
            num_accepted += self._add_next()
            self._num_added_since_step += 1
        return num_accepted

    # ---- running ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step (streaming: topped up first); the requests that arrived by
        its end are tracked, and the turns that follow the requests it finished are
        queued. Streaming releases the finished requests."""
        if self.stream:
            self._top_up()
        engine = self.engine
        finished = engine.step()
        self._num_added_since_step = 0
        self._track(engine.clock)
        cache = engine.cache
        block_size = cache.block_size
        self.tracker.record_pinned(
            engine.clock,
            cache.num_blocks - cache.num_reclaimable_blocks(),
            sum(
                (len(output.prompt_token_ids) + sum(map(len, output.samples))) // block_size
                + len(output.samples)
                for output in finished
            ),
        )
        token_granular = cache.prefix.token_granular
        for output in finished:
            self.tracker.finish(
                output.request_id,
                output.num_cached_tokens,
                token_granular,
                output.first_token_time,
                output.finish_time or self.engine.clock,
            )
            self._add_followers(output)
            if self.stream:
                engine.release_request(output.request_id)
        return finished

    def has_unfinished_requests(self) -> bool:
        """Whether the engine or the workload still holds requests."""
        return self.engine.has_unfinished_requests() or self._next is not None

    def run(self, progress: bool = False) -> RunResult:
        """Steps until every request, later turns included, has finished."""
        bar = None
        if progress:
            from tqdm import tqdm

            total = self.workload.num_requests if self.workload is not None else None
            bar = tqdm(total=total, unit="req", desc="enginekit", leave=False)
        while self.has_unfinished_requests():
            finished = self.step()
            if bar is not None and finished:
                bar.update(len(finished))
        if bar is not None:
            bar.close()
        if self.stream:
            self._log_rejections()
        return RunResult(self.engine.outputs(), self.summary())

    def summary(self) -> dict[str, Any]:
        """The engine's summary with the ideal of every request added (released ones
        included) and the keys of ``metric_keys.ADDED_BY_DRIVER``."""
        engine = self.engine
        self._track(float("inf"))
        token_granular = engine.cache.prefix.token_granular
        summary = engine.summary(ideal_hit_tokens=self.tracker.ideal_hit_tokens(token_granular))
        misses = self.tracker.miss_counts()
        total = misses.num_prompt_tokens
        for key, count in (
            (mk.PREFIX_CACHE_MISS_CAPACITY, misses.num_capacity),
            (mk.PREFIX_CACHE_MISS_GRANULARITY, misses.num_granularity),
            (mk.PREFIX_CACHE_MISS_OTHER_KEY, misses.num_other_key),
            (mk.PREFIX_CACHE_MISS_COMPULSORY, misses.num_compulsory),
        ):
            summary[key.key] = count / total if total else None
        pool = int(summary[mk.KV_CACHE_NUM_BLOCKS.key] or 0)
        # the pool and its multiples are points of the curve: what a rerun at a quarter,
        # half, twice or four times the pool is predicted to hit
        sizes = (pool, *(int(pool * scale) for scale in CURVE_POOL_MULTIPLES))
        # with KV tiers, the pool over tiers of its multiples and of the run's own size
        tier_sizes = self._tier_sizes(pool)
        sizes += tuple(tiered_pool_blocks(pool, size) for size in tier_sizes)
        curve = self.tracker.hit_rate_curve(
            self.tracker.num_prompt_tokens, sizes, engine.config.cache.watermark
        )
        if tier_sizes:
            # the device pool is the run's own at every tier size: its schedule ran
            summary[mk.KV_TIER_HIT_RATE_PREDICTED.key] = [
                [size, curve.at(tiered_pool_blocks(pool, size)) if curve.num_blocks else None]
                for size in tier_sizes
            ]
        predicted = curve.at(pool) if curve.num_blocks and pool else None
        summary[mk.PREFIX_CACHE_HIT_RATE_PREDICTED.key] = predicted
        self._add_opt(summary, curve, pool, tiered=bool(tier_sizes))
        # sizes that would have queued or preempted differently are not predicted; the
        # run's own pool ran this very schedule
        summary[mk.PREFIX_CACHE_HIT_RATE_CURVE.key] = [
            [size, rate if curve.is_predicted(size) or size == pool else None]
            for size, rate in zip(curve.num_blocks, curve.hit_rate, strict=True)
        ]
        summary[mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key] = curve.min_num_blocks or None
        summary[mk.WORKLOAD_SOURCE.key] = self.workload.source if self.workload else None
        return summary

    def _add_opt(
        self, summary: dict[str, Any], curve: HitRateCurve, pool: int, tiered: bool
    ) -> None:
        """Belady's OPT hit rate at the pool and at those of its multiples the curve
        predicts (one sweep of the stream each: the curve's other sizes are left out), and
        the measured first-admission rate as a share of OPT at the pool (not for a run
        with tiers, whose hits are the pool's and the tiers')."""
        sizes = [pool] if curve.num_blocks and pool else []
        sizes += [
            int(pool * scale)
            for scale in CURVE_POOL_MULTIPLES
            if sizes and int(pool * scale) and curve.is_predicted(int(pool * scale))
        ]
        sizes = sorted(set(sizes))
        rates = self.tracker.opt_hit_rates(self.tracker.num_prompt_tokens, sizes)
        opt = dict(zip(sizes, rates, strict=True))
        summary[mk.PREFIX_CACHE_HIT_RATE_OPT.key] = opt.get(pool)
        measured = summary.get(mk.PREFIX_CACHE_FIRST_HIT_RATE.key)
        share = None
        if opt.get(pool) and measured is not None and not tiered:
            share = measured / opt[pool]
        summary[mk.PREFIX_CACHE_HIT_RATE_OF_OPT.key] = share
        summary[mk.PREFIX_CACHE_HIT_RATE_CURVE_OPT.key] = [[size, opt[size]] for size in sizes]

    def _tier_sizes(self, pool: int) -> list[int]:
        """Tier sizes (blocks below the pool, all levels together) the summary predicts the
        hit rate at: ``TIER_POOL_MULTIPLES`` of ``pool`` and the run's own, ascending;
        none for a run without tiers."""
        stats = self.engine.cache.tier_stats()
        if not stats:
            return []
        own = sum(level.capacity_blocks for level in stats)
        return sorted({int(pool * scale) for scale in TIER_POOL_MULTIPLES} | {own})

    def _track(self, until: float) -> None:
        """Feeds the tracker, in the order they joined the engine's queue, the added
        requests that joined it by ``until`` (a later addition joins after the engine's
        clock)."""
        untracked = self._untracked
        while untracked and untracked[0][0] <= until:
            _, _, request_id, prompt, output, key = heapq.heappop(untracked)
            self.tracker.add(request_id, prompt, output, key)

    def _add_followers(self, finished: RequestOutput) -> None:
        """Queues the turns that follow ``finished``: each arrives its think time from now
        (or at its own arrival time, if later), with ``finished``'s prompt and output in
        front of its own message unless its prompt is complete."""
        for item in self._followers.pop(finished.request_id, ()):
            prompt: TokenIds = item.prompt_token_ids
            if item.prepend_context:
                prompt = finished.prompt_token_ids + finished.output_token_ids + list(prompt)
            arrival = max(item.arrival_time, self.engine.clock + item.think_time_s)
            if not self._add(item, prompt, arrival):
                _log.warning("rejected %s", self._last_rejection)

    def _drop_followers(self, request_id: str) -> None:
        """The turns after a rejected turn never come: counted as rejected too."""
        for item in self._followers.pop(request_id, ()):
            self.engine.metrics.on_request_rejected()
            self._num_rejected += 1
            self._drop_followers(item.request_id)

    def _log_rejections(self) -> None:
        if self._num_rejected:
            _log.warning(
                "%d of %d requests rejected; the first: %s",
                self._num_rejected,
                self._num_rejected + self._num_accepted,
                self._first_rejection,
            )

"""RunMetrics: the counters and latency samples of one run, and their summary.

The engine feeds it through the ``on_*`` calls; every call is O(1) and allocates nothing
but a request's record. ``summary()`` turns them into one flat-ish dict whose keys follow
vLLM's Prometheus metric names where the meaning is the same (``prompt_tokens_total``,
``generation_tokens_total``, ``num_preemptions_total``, ``prefix_cache_queries``,
``prefix_cache_hits``, ``kv_cache_usage_perc`` (as ``_mean`` and ``_peak``, a fraction),
``time_to_first_token_seconds``,
``time_per_output_token_seconds``, ``e2e_request_latency_seconds``).

Conventions: times are engine-clock seconds (simulated or wall). Percentiles interpolate
linearly between closest ranks (numpy's default). A value with no sample is None, never
NaN, so the summary is strict JSON.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from enginekit.errors import EngineKitError
from enginekit.step import KVUsage

LATENCY_KEYS: tuple[str, ...] = (
    "time_to_first_token_seconds",
    "time_to_first_token_seconds_cold",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
)


class PrefixQuery(NamedTuple):
    """One admission's prefix-cache lookup."""

    num_query_tokens: int
    num_hit_tokens: int
    is_readmission: bool  # the request was admitted before and preempted


class PreemptionEvent(NamedTuple):
    kind: str  # "recompute", "swap", or "recompute_fallback" (swap wanted, no host room)
    num_recomputed_tokens: int  # KV thrown away to compute again (0 for a swap)


@dataclass(slots=True)
class SchedulerStats:
    """What the scheduler did between two updates: admissions' prefix lookups,
    preemptions and blocks swapped. The scheduler fills one and hands it over with each
    update (``StepUpdate.stats``); ``RunMetrics.on_scheduler_stats`` counts it."""

    prefix_queries: list[PrefixQuery] = field(default_factory=list)
    preemptions: list[PreemptionEvent] = field(default_factory=list)
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0


@dataclass
class _RequestRecord:
    arrival_time: float
    num_prompt_tokens: int
    first_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0
    tenant: str = ""  # Request.tenant
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission, once known


def latency_stats(samples: list[float]) -> dict[str, float | int | None]:
    """``count``, ``mean``, ``p50``, ``p90``, ``p99`` of ``samples`` (None when empty)."""
    if not samples:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    values = np.asarray(samples, dtype=np.float64)
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"count": len(samples), "mean": float(values.mean()), "p50": p50, "p90": p90, "p99": p99}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


class RunMetrics:
    """Counters of one run. Mutated only by the ``on_*`` methods; ``summary`` is pure."""

    def __init__(self) -> None:
        # Keyed by a key unique over the run: the engine passes each request's seq_id, as a
        # request id may be used again once its request is released.
        self._requests: dict[Hashable, _RequestRecord] = {}
        # Every admission's prefix lookup, as vLLM counts them; the re-admissions of
        # preempted requests among them are also counted on their own.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prefix_cache_readmission_queries = 0
        self.prefix_cache_readmission_hits = 0
        self.num_preemptions_by_kind: dict[str, int] = {}
        self.recomputed_tokens_total = 0
        self.recomputed_tokens_by_kind: dict[str, int] = {}
        self.num_steps = 0
        self.num_prefill_tokens_computed = 0
        self.num_decode_tokens_computed = 0
        self.first_step_time: float | None = None  # start of the first step
        self.last_step_end: float | None = None
        self.busy_time_s = 0.0
        self._usage_step_sum = 0.0  # Σ used/total over steps
        self._usage_time_sum = 0.0  # Σ used/total × step_time_s
        self.kv_cache_usage_peak = 0.0
        self.num_total_blocks = 0
        self._unused_slots_sum = 0
        self._reserved_slots_sum = 0
        self._table_blocks_sum = 0
        self._used_blocks_sum = 0
        self._unusable_free_blocks_sum = 0
        self._num_fragmentation_samples = 0
        self.num_unused_slots_peak = 0
        self._running_sum = 0
        self.num_running_peak = 0
        self.num_waiting_peak = 0
        self.num_requests_rejected = 0
        self.num_requests_aborted = 0  # arrived, then aborted by their callers
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # ---- request lifecycle -------------------------------------------------------------

    def on_request_added(
        self, key: Hashable, arrival_time: float, num_prompt_tokens: int, tenant: str = ""
    ) -> None:
        """Starts the record of the request ``key`` names (unique over the run), served
        for ``tenant``. Raises EngineKitError for a key already added."""
        if key in self._requests:
            raise EngineKitError(f"metrics: request {key!r} was already added")
        self._requests[key] = _RequestRecord(arrival_time, num_prompt_tokens, tenant=tenant)

    def on_request_rejected(self) -> None:
        """A request was refused at admission to the engine (it could never be served)."""
        self.num_requests_rejected += 1

    def on_first_token(
        self, key: Hashable, time: float, num_cached_tokens: int | None = None
    ) -> None:
        """Records the first output token's time and the prefix-cache hit of the request's
        first admission (None: not known; 0 makes it a cold request); later calls (after
        a preemption) are ignored."""
        record = self._requests[key]
        if record.first_token_time is None:
            record.first_token_time = time
            record.num_cached_tokens = num_cached_tokens

    def on_request_aborted(self, key: Hashable, time: float) -> None:
        """The request (which had arrived) was aborted at ``time``; it counts in no
        latency."""
        self.num_requests_aborted += 1
        self._requests.pop(key, None)

    def on_request_finished(self, key: Hashable, time: float, num_output_tokens: int) -> None:
        record = self._requests[key]
        record.finish_time = time
        record.num_output_tokens = num_output_tokens

    # ---- cache and scheduler events ---------------------------------------------------

    def on_prefix_query(
        self, num_query_tokens: int, num_hit_tokens: int, is_readmission: bool = False
    ) -> None:
        """One admission's prefix-cache lookup of ``num_query_tokens`` tokens, of which
        ``num_hit_tokens`` were found; ``is_readmission``: the request was admitted before
        and preempted."""
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens
        if is_readmission:
            self.prefix_cache_readmission_queries += num_query_tokens
            self.prefix_cache_readmission_hits += num_hit_tokens

    def on_preemption(self, kind: str, num_recomputed_tokens: int) -> None:
        """One preemption of ``kind`` (e.g. "recompute", "swap"); ``num_recomputed_tokens``
        is the KV it throws away to compute again (0 for a swap)."""
        by_kind = self.num_preemptions_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        self.recomputed_tokens_total += num_recomputed_tokens
        recomputed = self.recomputed_tokens_by_kind
        recomputed[kind] = recomputed.get(kind, 0) + num_recomputed_tokens

    def on_fragmentation(self, num_unusable_free_blocks: int) -> None:
        """A sample of external fragmentation: free blocks no allocation can use."""
        self._unusable_free_blocks_sum += num_unusable_free_blocks
        self._num_fragmentation_samples += 1

    def on_swap(self, num_blocks_out: int, num_blocks_in: int) -> None:
        """Blocks copied to host memory (swap-out) or back to the device (swap-in)."""
        self.num_swapped_out_blocks += num_blocks_out
        self.num_swapped_in_blocks += num_blocks_in

    def on_scheduler_stats(self, stats: SchedulerStats) -> None:
        """Everything the scheduler reports for one step."""
        for query in stats.prefix_queries:
            self.on_prefix_query(*query)
        for preemption in stats.preemptions:
            self.on_preemption(*preemption)
        self.on_swap(stats.num_blocks_swapped_out, stats.num_blocks_swapped_in)

    def on_step(
        self,
        time: float,
        step_time_s: float,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        num_running: int,
        num_waiting: int,
        usage: KVUsage,
    ) -> None:
        """One executed step that ended at ``time`` (the clock already advanced by
        ``step_time_s``), with the cache's state after it. ``num_waiting``: the requests
        that have arrived and are not running (never one whose arrival is still ahead).
        ``usage.num_table_blocks``
        counts the blocks of every table, a shared block once per table (so
        ``num_used_blocks / num_table_blocks`` is what sharing leaves of the memory)."""
        self.num_steps += 1
        if self.first_step_time is None:
            self.first_step_time = time - step_time_s
        self.last_step_end = time
        self.busy_time_s += step_time_s
        self.num_prefill_tokens_computed += num_prefill_tokens
        self.num_decode_tokens_computed += num_decode_tokens
        total = usage.num_total_blocks
        used = usage.num_used_blocks / total if total else 0.0
        self._usage_step_sum += used
        self._usage_time_sum += used * step_time_s
        self.kv_cache_usage_peak = max(self.kv_cache_usage_peak, used)
        self.num_total_blocks = total
        self._unused_slots_sum += usage.num_unused_slots
        self._reserved_slots_sum += usage.num_table_slots
        self._table_blocks_sum += usage.num_table_blocks
        self._used_blocks_sum += usage.num_used_blocks
        self.num_unused_slots_peak = max(self.num_unused_slots_peak, usage.num_unused_slots)
        self._running_sum += num_running
        if num_running > self.num_running_peak:
            self.num_running_peak = num_running
        if num_waiting > self.num_waiting_peak:
            self.num_waiting_peak = num_waiting

    # ---- summary ------------------------------------------------------------------------

    def summary(self, kv_bytes_per_block: int, ideal_hit_tokens: int | None = None) -> dict:
        """Everything a report prints, as JSON-ready values.

        ``prefix_cache_hit_rate`` = hits / queries over every admission (a request admitted
        again after a preemption queries again), split into first admissions
        (``prefix_cache_first_*``) and re-admissions (``prefix_cache_readmission_*``: where
        eviction policies differ most); ``prefix_cache_hit_rate_ideal`` =
        ``ideal_hit_tokens`` / ``prompt_tokens_total``, comparable to the first admissions'
        rate. ``kv_cache_usage_perc_mean`` weighs each step by its
        duration (by count if no step took time). Durations run from the first arrival (or
        step) to the last finish (or step end). TTFT and e2e count from arrival; TPOT is
        (e2e − TTFT) / (outputs − 1) for requests with at least 2 outputs.
        """
        from enginekit import metric_keys as mk

        records = list(self._requests.values())
        ttft = [
            r.first_token_time - r.arrival_time for r in records if r.first_token_time is not None
        ]
        ttft_cold = [
            r.first_token_time - r.arrival_time
            for r in records
            if r.first_token_time is not None and r.num_cached_tokens == 0
        ]
        e2e: list[float] = []
        tpot: list[float] = []
        ends: list[float] = []
        generation_tokens = 0
        for r in records:
            if r.finish_time is None:
                continue
            ends.append(r.finish_time)
            e2e.append(r.finish_time - r.arrival_time)
            generation_tokens += r.num_output_tokens
            if r.first_token_time is not None and r.num_output_tokens >= 2:
                tpot.append((r.finish_time - r.first_token_time) / (r.num_output_tokens - 1))
        prompt_tokens = sum(r.num_prompt_tokens for r in records)

        starts = [r.arrival_time for r in records]
        if self.first_step_time is not None and self.last_step_end is not None:
            starts.append(self.first_step_time)
            ends.append(self.last_step_end)
        duration = max(ends) - min(starts) if starts and ends else 0.0

        steps = self.num_steps
        usage_mean: float | None
        if self.busy_time_s > 0:
            usage_mean = self._usage_time_sum / self.busy_time_s
        else:
            usage_mean = _ratio(self._usage_step_sum, steps)
        pool_bytes = self.num_total_blocks * kv_bytes_per_block
        first_queries = self.prefix_cache_queries - self.prefix_cache_readmission_queries
        first_hits = self.prefix_cache_hits - self.prefix_cache_readmission_hits
        output_tps = _ratio(generation_tokens, duration)
        total_tps = _ratio(prompt_tokens + generation_tokens, duration)
        summary: dict = {
            mk.NUM_REQUESTS.key: len(records),
            mk.NUM_REQUESTS_REJECTED.key: self.num_requests_rejected,
            mk.NUM_REQUESTS_FINISHED.key: len(e2e),
            mk.PROMPT_TOKENS_TOTAL.key: prompt_tokens,
            mk.GENERATION_TOKENS_TOTAL.key: generation_tokens,
            mk.NUM_STEPS.key: steps,
            mk.PREFILL_TOKENS_COMPUTED.key: self.num_prefill_tokens_computed,
            mk.DECODE_TOKENS_COMPUTED.key: self.num_decode_tokens_computed,
            mk.PREFIX_CACHE_QUERIES.key: self.prefix_cache_queries,
            mk.PREFIX_CACHE_HITS.key: self.prefix_cache_hits,
            mk.PREFIX_CACHE_HIT_RATE.key: _ratio(self.prefix_cache_hits, self.prefix_cache_queries),
            mk.PREFIX_CACHE_FIRST_QUERIES.key: first_queries,
            mk.PREFIX_CACHE_FIRST_HITS.key: first_hits,
            mk.PREFIX_CACHE_FIRST_HIT_RATE.key: _ratio(first_hits, first_queries),
            mk.PREFIX_CACHE_READMISSION_QUERIES.key: self.prefix_cache_readmission_queries,
            mk.PREFIX_CACHE_READMISSION_HITS.key: self.prefix_cache_readmission_hits,
            mk.PREFIX_CACHE_READMISSION_HIT_RATE.key: _ratio(
                self.prefix_cache_readmission_hits, self.prefix_cache_readmission_queries
            ),
            mk.PREFIX_CACHE_HITS_IDEAL.key: ideal_hit_tokens,
            mk.PREFIX_CACHE_HIT_RATE_IDEAL.key: (
                None if ideal_hit_tokens is None else _ratio(ideal_hit_tokens, prompt_tokens)
            ),
            mk.KV_CACHE_NUM_BLOCKS.key: self.num_total_blocks,
            mk.KV_CACHE_BLOCK_BYTES.key: kv_bytes_per_block,
            mk.KV_CACHE_POOL_GIB.key: pool_bytes / mk.BYTES_PER_GIB,
            mk.KV_CACHE_USAGE_PERC_MEAN.key: usage_mean,
            mk.KV_CACHE_USAGE_PERC_PEAK.key: self.kv_cache_usage_peak,
            mk.KV_CACHE_UNUSED_SLOTS_MEAN.key: _ratio(self._unused_slots_sum, steps),
            mk.KV_CACHE_UNUSED_SLOTS_PEAK.key: self.num_unused_slots_peak,
            # share of the slots running sequences hold that hold a token (paging: ~1)
            mk.KV_CACHE_SLOT_UTILIZATION.key: (
                None
                if not self._reserved_slots_sum
                else 1.0 - self._unused_slots_sum / self._reserved_slots_sum
            ),
            # share of the running sequences' blocks that sharing (prefix hits, forked
            # samples) saves: 1 - blocks used / blocks the tables list
            mk.KV_CACHE_SHARING_SAVING.key: (
                None
                if not self._table_blocks_sum
                else 1.0 - self._used_blocks_sum / self._table_blocks_sum
            ),
            mk.KV_CACHE_UNUSABLE_FREE_BLOCKS_MEAN.key: (
                None
                if not self._num_fragmentation_samples
                else self._unusable_free_blocks_sum / self._num_fragmentation_samples
            ),
            mk.NUM_RUNNING_MEAN.key: _ratio(self._running_sum, steps),
            mk.NUM_RUNNING_PEAK.key: self.num_running_peak,
            mk.NUM_WAITING_PEAK.key: self.num_waiting_peak,
            mk.NUM_PREEMPTIONS_TOTAL.key: sum(self.num_preemptions_by_kind.values()),
            mk.NUM_PREEMPTIONS_BY_KIND.key: dict(sorted(self.num_preemptions_by_kind.items())),
            mk.RECOMPUTED_TOKENS_TOTAL.key: self.recomputed_tokens_total,
            mk.SWAP_OUT_BYTES_TOTAL.key: self.num_swapped_out_blocks * kv_bytes_per_block,
            mk.SWAP_IN_BYTES_TOTAL.key: self.num_swapped_in_blocks * kv_bytes_per_block,
            mk.TIME_TO_FIRST_TOKEN_SECONDS.key: latency_stats(ttft),
            mk.TIME_TO_FIRST_TOKEN_SECONDS_COLD.key: latency_stats(ttft_cold),
            mk.TIME_PER_OUTPUT_TOKEN_SECONDS.key: latency_stats(tpot),
            mk.E2E_REQUEST_LATENCY_SECONDS.key: latency_stats(e2e),
            mk.DURATION_S.key: duration,
            mk.BUSY_TIME_S.key: self.busy_time_s,
            mk.OUTPUT_TOKENS_PER_S.key: output_tps,
            mk.TOTAL_TOKENS_PER_S.key: total_tps,
            mk.OUTPUT_TOKENS_PER_S_PER_KV_GIB.key: (
                None if output_tps is None else _ratio(output_tps, pool_bytes / mk.BYTES_PER_GIB)
            ),
        }
        served: dict[str, int] = {}
        for r in records:
            done = r.num_prompt_tokens + r.num_output_tokens if r.finish_time is not None else 0
            served[r.tenant] = served.get(r.tenant, 0) + done
        if len(served) > 1:  # metric_keys.ADDED_WITH_TENANTS
            summary[mk.TOKENS_SERVED_BY_TENANT.key] = dict(sorted(served.items()))
            least = min(served.values())
            summary[mk.TENANT_SERVICE_MAX_MIN_RATIO.key] = (
                max(served.values()) / least if least else None
            )
        return summary

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

from dataclasses import dataclass

import numpy as np

from enginekit.errors import EngineKitError

LATENCY_KEYS: tuple[str, ...] = (
    "time_to_first_token_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
)


@dataclass
class _RequestRecord:
    arrival_time: float
    num_prompt_tokens: int
    first_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0


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
        self._requests: dict[str, _RequestRecord] = {}
        # Every admission's prefix lookup, as vLLM counts them; the re-admissions of
        # preempted requests among them are also counted on their own.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prefix_cache_readmission_queries = 0
        self.prefix_cache_readmission_hits = 0
        self.num_preemptions_by_kind: dict[str, int] = {}
        self.recomputed_tokens_total = 0
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
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # ---- request lifecycle -------------------------------------------------------------

    def on_request_added(
        self, request_id: str, arrival_time: float, num_prompt_tokens: int
    ) -> None:
        """Starts a request's record. Raises EngineKitError for a duplicate id."""
        if request_id in self._requests:
            raise EngineKitError(f"metrics: request {request_id!r} was already added")
        self._requests[request_id] = _RequestRecord(arrival_time, num_prompt_tokens)

    def on_request_rejected(self) -> None:
        """A request was refused at admission to the engine (it could never be served)."""
        self.num_requests_rejected += 1

    def on_first_token(self, request_id: str, time: float) -> None:
        """Records the first output token's time; later calls (after a preemption) are ignored."""
        record = self._requests[request_id]
        if record.first_token_time is None:
            record.first_token_time = time

    def on_request_finished(self, request_id: str, time: float, num_output_tokens: int) -> None:
        record = self._requests[request_id]
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

    def on_fragmentation(self, num_unusable_free_blocks: int) -> None:
        """A sample of external fragmentation: free blocks no allocation can use."""
        self._unusable_free_blocks_sum += num_unusable_free_blocks
        self._num_fragmentation_samples += 1

    def on_swap(self, num_blocks_out: int, num_blocks_in: int) -> None:
        """Blocks copied to host memory (swap-out) or back to the device (swap-in)."""
        self.num_swapped_out_blocks += num_blocks_out
        self.num_swapped_in_blocks += num_blocks_in

    def on_step(
        self,
        time: float,
        step_time_s: float,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        num_running: int,
        num_waiting: int,
        num_used_blocks: int,
        num_total_blocks: int,
        num_unused_slots: int,
        num_reserved_slots: int = 0,
        num_table_blocks: int = 0,
    ) -> None:
        """One executed step that ended at ``time`` (the clock already advanced by
        ``step_time_s``). Block counts are the pool's state after the step;
        ``num_unused_slots`` is allocated but unused token slots in running sequences'
        blocks, of ``num_reserved_slots`` they hold in all; ``num_table_blocks`` counts the
        blocks of every table, a shared block once per table (so ``num_used_blocks`` /
        ``num_table_blocks`` is what sharing leaves of the memory)."""
        self.num_steps += 1
        if self.first_step_time is None:
            self.first_step_time = time - step_time_s
        self.last_step_end = time
        self.busy_time_s += step_time_s
        self.num_prefill_tokens_computed += num_prefill_tokens
        self.num_decode_tokens_computed += num_decode_tokens
        usage = num_used_blocks / num_total_blocks if num_total_blocks else 0.0
        self._usage_step_sum += usage
        self._usage_time_sum += usage * step_time_s
        if usage > self.kv_cache_usage_peak:
            self.kv_cache_usage_peak = usage
        self.num_total_blocks = num_total_blocks
        self._unused_slots_sum += num_unused_slots
        self._reserved_slots_sum += num_reserved_slots
        self._table_blocks_sum += num_table_blocks
        self._used_blocks_sum += num_used_blocks
        if num_unused_slots > self.num_unused_slots_peak:
            self.num_unused_slots_peak = num_unused_slots
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
        records = list(self._requests.values())
        ttft = [
            r.first_token_time - r.arrival_time for r in records if r.first_token_time is not None
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
            "num_requests": len(records),
            "num_requests_rejected": self.num_requests_rejected,
            "num_requests_finished": len(e2e),
            "prompt_tokens_total": prompt_tokens,
            "generation_tokens_total": generation_tokens,
            "num_steps": steps,
            "prefill_tokens_computed": self.num_prefill_tokens_computed,
            "decode_tokens_computed": self.num_decode_tokens_computed,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": _ratio(self.prefix_cache_hits, self.prefix_cache_queries),
            "prefix_cache_first_queries": first_queries,
            "prefix_cache_first_hits": first_hits,
            "prefix_cache_first_hit_rate": _ratio(first_hits, first_queries),
            "prefix_cache_readmission_queries": self.prefix_cache_readmission_queries,
            "prefix_cache_readmission_hits": self.prefix_cache_readmission_hits,
            "prefix_cache_readmission_hit_rate": _ratio(
                self.prefix_cache_readmission_hits, self.prefix_cache_readmission_queries
            ),
            "prefix_cache_hits_ideal": ideal_hit_tokens,
            "prefix_cache_hit_rate_ideal": (
                None if ideal_hit_tokens is None else _ratio(ideal_hit_tokens, prompt_tokens)
            ),
            "kv_cache_num_blocks": self.num_total_blocks,
            "kv_cache_block_bytes": kv_bytes_per_block,
            "kv_cache_pool_gb": pool_bytes / 1e9,
            "kv_cache_usage_perc_mean": usage_mean,
            "kv_cache_usage_perc_peak": self.kv_cache_usage_peak,
            "kv_cache_unused_slots_mean": _ratio(self._unused_slots_sum, steps),
            "kv_cache_unused_slots_peak": self.num_unused_slots_peak,
            # share of the slots running sequences hold that hold a token (paging: ~1)
            "kv_cache_slot_utilization": (
                None
                if not self._reserved_slots_sum
                else 1.0 - self._unused_slots_sum / self._reserved_slots_sum
            ),
            # share of the running sequences' blocks that sharing (prefix hits, forked
            # samples) saves: 1 - blocks used / blocks the tables list
            "kv_cache_sharing_saving": (
                None
                if not self._table_blocks_sum
                else 1.0 - self._used_blocks_sum / self._table_blocks_sum
            ),
            "kv_cache_unusable_free_blocks_mean": (
                None
                if not self._num_fragmentation_samples
                else self._unusable_free_blocks_sum / self._num_fragmentation_samples
            ),
            "num_running_mean": _ratio(self._running_sum, steps),
            "num_running_peak": self.num_running_peak,
            "num_waiting_peak": self.num_waiting_peak,
            "num_preemptions_total": sum(self.num_preemptions_by_kind.values()),
            "num_preemptions_by_kind": dict(sorted(self.num_preemptions_by_kind.items())),
            "recomputed_tokens_total": self.recomputed_tokens_total,
            "swap_out_bytes_total": self.num_swapped_out_blocks * kv_bytes_per_block,
            "swap_in_bytes_total": self.num_swapped_in_blocks * kv_bytes_per_block,
            "time_to_first_token_seconds": latency_stats(ttft),
            "time_per_output_token_seconds": latency_stats(tpot),
            "e2e_request_latency_seconds": latency_stats(e2e),
            "duration_s": duration,
            "busy_time_s": self.busy_time_s,
            "output_tokens_per_s": output_tps,
            "total_tokens_per_s": total_tps,
            "output_tokens_per_s_per_kv_gb": (
                None if output_tps is None else _ratio(output_tps, pool_bytes / 1e9)
            ),
        }
        return summary

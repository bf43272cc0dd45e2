"""Prometheus metrics of the server: vLLM's metrics under vLLM's names, enginekit's own
under its prefix, so that dashboards and scrapers written for vLLM read a server unchanged.

``GET /metrics`` renders one ``CollectorRegistry`` per server (so that servers in one
process never share series). Every series has the ``model_name`` label (the served model
name). Naming:

- a metric vLLM has is named as vLLM names it (``vllm:`` prefix), with vLLM's labels
  (``model_name`` and ``engine``, always ``"0"``: a server is one engine), vLLM's
  buckets and vLLM's meaning, and only under that name (no ``enginekit:`` twin);
- a metric vLLM does not have keeps the ``enginekit:`` prefix, with ``model_name`` and its
  own labels.

vLLM's, in the order of vLLM's logger:

- gauges, read from the engine loop's latest ``Snapshot``: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` (accepted, not running: queued or preempted),
  ``vllm:kv_cache_usage_perc`` (the fraction of the pool's blocks running requests hold;
  cached blocks nobody holds are free), and ``vllm:cache_config_info`` (1, with
  ``block_size``, ``num_gpu_blocks``, ``cache_dtype`` and ``enable_prefix_caching``);
- counters, from the same snapshot: ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total`` (tokens of every admission's lookup) and
  ``vllm:num_preemptions_total``, the engine's own counts (equal to its summary's);
  ``vllm:prompt_tokens_total`` (a request's whole prompt, prefix hits included, counted
  when its first token is released: vLLM counts it when the prefill's output comes
  back; once per request, whatever ``n``) and ``vllm:generation_tokens_total`` (every
  sample's tokens, counted as each step releases them), so both move while a request
  runs, and an aborted request's tokens count as far as they were produced; once every
  request has ended and none was aborted, they equal the summary's
  ``prompt_tokens_total`` and ``generation_tokens_total``;
  ``vllm:request_success_total{finished_reason}`` (``stop``, ``length``, ``abort``);
- histograms, observed by the engine loop in wall-clock seconds, at the times the loop
  releases tokens to the handlers (for the simulator: once the step's paced time has
  passed), from the moment the server received the request:
  ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` (between
  two releases that gave the request tokens) as tokens are released;
  ``vllm:iteration_tokens_total`` (the tokens each engine step computed: prefill chunks
  and decodes); and, for each request that finished (stop or length; aborted ones
  apart), ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``
  (arrival to first scheduled), ``vllm:request_prefill_time_seconds`` (first scheduled
  to first token), ``vllm:request_decode_time_seconds`` (first token to last token),
  ``vllm:request_inference_time_seconds`` (first scheduled to last token),
  ``vllm:request_time_per_output_token_seconds`` (decode time per token after the first,
  of requests with two or more), ``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens`` (all samples), ``vllm:request_max_num_generation_tokens``
  (the longest sample), ``vllm:request_params_n`` and ``vllm:request_params_max_tokens``.
  vLLM's older ``time_per_output_token_seconds`` is not emitted: vLLM hides it since
  0.12 and removed it in 0.13 (``inter_token_latency_seconds`` replaced it).

enginekit's own:

- gauges: ``kv_cache_num_blocks``, ``kv_cache_slot_utilization`` (of the slots running
  sequences hold, the share that hold a token; 0 when no slot is held, never NaN) and
  ``output_tokens_per_s_per_kv_gib`` (tokens released over the last 10 s, per second of
  the engine's time and GiB of KV pool);
- counters: ``preemptions_by_kind_total{kind}``, ``recomputed_tokens_total`` (and
  ``recomputed_tokens_by_kind_total{kind}``), ``swap_out_bytes_total``,
  ``swap_in_bytes_total`` (the engine's counts), and ``request_rejected_total{reason}``
  (``invalid`` bad input, ``unservable`` can never fit, ``queue_full`` answered 503);
- KV tiers below the pool, per level (``tier`` label, the level's name; no series without
  tiers): the counters ``kv_tier_hit_blocks_total`` (prompt blocks admission loaded from
  the level), ``kv_tier_loaded_bytes_total``, ``kv_tier_written_bytes_total``,
  ``kv_tier_evicted_blocks_total``, ``kv_tier_failures_total``,
  ``kv_tier_load_seconds_total`` (link time of the loads), the gauges ``kv_tier_blocks``
  and ``kv_tier_capacity_blocks``; and ``kv_tier_loads_avoided_blocks_total`` (tier hits
  computed again because that was cheaper than loading them; 0 without tiers);
- info: ``plugin_info{group, name, distribution, version}`` for each selected plugin,
  ``engine_info{model, executor, block_size, max_model_len, served_model_name}``.

Nothing here is ever NaN, idle or busy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from enginekit.interfaces.tier import TierLevelStats

VLLM = "vllm:"
PREFIX = "enginekit:"
MODEL_NAME = "model_name"
ENGINE_INDEX = "0"  # vLLM's ``engine`` label: a server runs one engine
VLLM_LABELS = (MODEL_NAME, "engine")
# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                           7680.0)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort")
REJECTION_REASONS = ("invalid", "unservable", "queue_full")


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_model_len`` (vLLM's rule)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(float(value))
        exponent += 1


@dataclass(frozen=True)
class Snapshot:
    """The engine's state after the latest released step, for ``/metrics``. Counts of
    requests are of requests (a request's n samples count once); prefix-cache,
    preemption, recompute and swap counters are the engine's own (``RunMetrics``); prompt
    and generation tokens are the loop's, counted as tokens are released (see the module
    docstring)."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_num_blocks: int = 0
    kv_num_used_blocks: int = 0
    kv_num_table_slots: int = 0
    kv_num_unused_slots: int = 0
    kv_pool_gib: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions_by_kind: dict[str, int] = field(default_factory=dict)
    recomputed_tokens: int = 0
    recomputed_tokens_by_kind: dict[str, int] = field(default_factory=dict)
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_finished_by_reason: dict[str, int] = field(default_factory=dict)
    output_tokens_per_s: float = 0.0  # over the last RATE_WINDOW_S, in the engine's time
    tier_stats: tuple[TierLevelStats, ...] = ()  # the KV tier levels', fastest first
    tier_loads_avoided_blocks: int = 0

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_num_used_blocks / self.kv_num_blocks if self.kv_num_blocks else 0.0

    @property
    def slot_utilization(self) -> float:
        """Share of the slots the running sequences hold that hold a token; 0 when none
        is held (an idle server uses none of what it holds)."""
        if not self.kv_num_table_slots:
            return 0.0
        return 1.0 - self.kv_num_unused_slots / self.kv_num_table_slots


class RejectionCounter:
    """``enginekit:request_rejected_total{model_name, reason}``: ``labels(reason)`` is the
    reason's series (thread-safe to increment). Every reason's series exists from the
    start."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self._counter = Counter(
            PREFIX + "request_rejected",
            "Requests refused: invalid input, can never fit, or the queue was full.",
            [MODEL_NAME, "reason"],
            registry=registry,
        )
        self._model_name = model_name
        for reason in REJECTION_REASONS:
            self.labels(reason)

    def labels(self, reason: str) -> Counter:
        return self._counter.labels(self._model_name, reason)


class ServeMetrics:
    """The registry of one server: the histograms the engine loop observes (each already
    bound to the server's ``model_name`` and ``engine`` labels), the rejection counter the
    handlers and the loop increment (both thread-safe), and a collector that reads the
    snapshot and the info labels at each scrape.

    ``engine_labels`` are ``enginekit:engine_info``'s; its ``served_model_name`` is the
    ``model_name`` of every series, and its ``block_size`` and the ``prefix`` and
    ``quantizer`` plugins of ``plugin_labels`` fill ``vllm:cache_config_info``."""

    def __init__(
        self,
        max_model_len: int,
        plugin_labels: dict[str, dict[str, str]],
        engine_labels: dict[str, str],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = engine_labels["served_model_name"]
        tokens = token_buckets(max_model_len)
        histogram = _histogram_factory(self.registry, self.model_name)
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Time from arrival to the first output token's release, in seconds.",
            TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds",
            "Time between two releases of a request's tokens, in seconds.",
            ITL_BUCKETS,
        )
        self.request_time_per_output_token = histogram(
            "request_time_per_output_token_seconds",
            "Decode time per output token after the first, per finished request, in seconds.",
            ITL_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds",
            "Time from arrival to finish of finished requests, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = histogram(
            "request_queue_time_seconds",
            "Time from arrival to first scheduled, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_inference_time = histogram(
            "request_inference_time_seconds",
            "Time from first scheduled to the last token, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prefill_time = histogram(
            "request_prefill_time_seconds",
            "Time from first scheduled to the first token, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_decode_time = histogram(
            "request_decode_time_seconds",
            "Time from the first token to the last token, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens of finished requests.", tokens
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Output tokens of finished requests (all samples).", tokens
        )
        self.request_max_num_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "Output tokens of the longest sample of finished requests.",
            tokens,
        )
        self.request_params_n = histogram(
            "request_params_n", "The n parameter of finished requests.", PARAMS_N_BUCKETS
        )
        self.request_params_max_tokens = histogram(
            "request_params_max_tokens", "The max_tokens parameter of finished requests.", tokens
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Tokens an engine step computed (prefill chunks and decodes).",
            ITERATION_TOKENS_BUCKETS,
        )
        self.request_rejected = RejectionCounter(self.registry, self.model_name)
        self._plugin_labels = plugin_labels
        self._engine_labels = engine_labels
        self._snapshot: Callable[[], Snapshot] = Snapshot

    def read_from(self, snapshot: Callable[[], Snapshot]) -> None:
        """Registers the collector of gauges, counters and info, reading ``snapshot()``."""
        self._snapshot = snapshot
        self.registry.register(_SnapshotCollector(self))


def _histogram_factory(registry: CollectorRegistry, model_name: str) -> Callable[..., Histogram]:
    """Makes vLLM's histograms, bound to this server's labels."""

    def make(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(
            VLLM + name, documentation, VLLM_LABELS, buckets=buckets, registry=registry
        )
        return family.labels(model_name, ENGINE_INDEX)

    return make


class _SnapshotCollector(Collector):
    def __init__(self, metrics: ServeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics._snapshot()
        yield from self._vllm_families(snap)
        yield from self._enginekit_families(snap)

    def _vllm_families(self, snap: Snapshot) -> Iterator[Metric]:
        label_values = [self._metrics.model_name, ENGINE_INDEX]
        gauges = {
            "num_requests_running": ("Requests running.", snap.num_requests_running),
            "num_requests_waiting": (
                "Requests accepted and not running (queued, or preempted).",
                snap.num_requests_waiting,
            ),
            "kv_cache_usage_perc": (
                "Share of KV blocks held by running requests (1 = full).",
                snap.kv_cache_usage,
            ),
        }
        for name, (documentation, value) in gauges.items():
            gauge = GaugeMetricFamily(VLLM + name, documentation, labels=VLLM_LABELS)
            gauge.add_metric(label_values, value)
            yield gauge
        yield self._cache_config_info(snap)
        counters = {
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.",
                                     snap.prefix_cache_queries),
            "prefix_cache_hits": ("Looked-up tokens found in the prefix cache.",
                                  snap.prefix_cache_hits),
            "num_preemptions": ("Preemptions of every kind.",
                                sum(snap.num_preemptions_by_kind.values())),
            "prompt_tokens": ("Prompt tokens of requests whose first token was released.",
                              snap.prompt_tokens),
            "generation_tokens": ("Output tokens released.", snap.generation_tokens),
        }  # fmt: skip
        for name, (documentation, value) in counters.items():
            counter = CounterMetricFamily(VLLM + name, documentation, labels=VLLM_LABELS)
            counter.add_metric(label_values, value)
            yield counter
        success = CounterMetricFamily(
            VLLM + "request_success",
            "Requests ended, by finish reason (stop, length, abort).",
            labels=[*VLLM_LABELS, "finished_reason"],
        )
        for reason in sorted({*FINISHED_REASONS, *snap.num_finished_by_reason}):
            count = snap.num_finished_by_reason.get(reason, 0)
            success.add_metric([*label_values, reason], count)
        yield success

    def _cache_config_info(self, snap: Snapshot) -> Metric:
        """vLLM's cache configuration as labels of a gauge of 1 (vLLM's way of an info)."""
        plugins = self._metrics._plugin_labels
        quantizer = plugins.get("quantizer", {}).get("name", "none")
        prefix = plugins.get("prefix", {}).get("name", "none")
        info = {
            "block_size": self._metrics._engine_labels.get("block_size", ""),
            "num_gpu_blocks": str(snap.kv_num_blocks),
            "cache_dtype": "auto" if quantizer == "none" else quantizer,
            "enable_prefix_caching": str(prefix != "none"),
        }
        gauge = GaugeMetricFamily(
            VLLM + "cache_config_info",
            "The KV cache's configuration (labels; the value is 1).",
            labels=[*VLLM_LABELS, *info],
        )
        gauge.add_metric([self._metrics.model_name, ENGINE_INDEX, *info.values()], 1)
        return gauge

    def _enginekit_families(self, snap: Snapshot) -> Iterator[Metric]:
        model_name = self._metrics.model_name
        gauges = {
            "kv_cache_num_blocks": ("Blocks of the KV pool.", snap.kv_num_blocks),
            "kv_cache_slot_utilization": (
                "Share of the token slots running sequences hold that hold a token "
                "(0 when none is held).",
                snap.slot_utilization,
            ),
            "output_tokens_per_s_per_kv_gib": (
                "Output tokens per second (engine time, last 10 s) per GiB of KV pool.",
                snap.output_tokens_per_s / snap.kv_pool_gib if snap.kv_pool_gib else 0.0,
            ),
        }
        for name, (documentation, value) in gauges.items():
            gauge = GaugeMetricFamily(PREFIX + name, documentation, labels=[MODEL_NAME])
            gauge.add_metric([model_name], value)
            yield gauge
        counters = {
            "recomputed_tokens": ("KV tokens preemptions threw away to compute again.",
                                  snap.recomputed_tokens),
            "swap_out_bytes": ("KV bytes copied to the host swap pool.", snap.swap_out_bytes),
            "swap_in_bytes": ("KV bytes copied back from the host swap pool.", snap.swap_in_bytes),
        }  # fmt: skip
        for name, (documentation, value) in counters.items():
            counter = CounterMetricFamily(PREFIX + name, documentation, labels=[MODEL_NAME])
            counter.add_metric([model_name], value)
            yield counter
        by_kind = CounterMetricFamily(
            PREFIX + "preemptions_by_kind", "Preemptions by kind.", labels=[MODEL_NAME, "kind"]
        )
        for kind, count in sorted(snap.num_preemptions_by_kind.items()):
            by_kind.add_metric([model_name, kind], count)
        yield by_kind
        recomputed = CounterMetricFamily(
            PREFIX + "recomputed_tokens_by_kind",
            "KV tokens preemptions threw away to compute again, by preemption kind.",
            labels=[MODEL_NAME, "kind"],
        )
        for kind, count in sorted(snap.recomputed_tokens_by_kind.items()):
            recomputed.add_metric([model_name, kind], count)
        yield recomputed
        yield from _tier_families(snap, model_name)
        plugins = InfoMetricFamily(
            PREFIX + "plugin", "The selected plugins.", labels=[MODEL_NAME, "group"]
        )
        for group, labels in self._metrics._plugin_labels.items():
            plugins.add_metric([model_name, group], labels)
        yield plugins
        engine = InfoMetricFamily(PREFIX + "engine", "The engine served.", labels=[MODEL_NAME])
        engine.add_metric([model_name], self._metrics._engine_labels)
        yield engine


_TIER_COUNTERS = (
    ("kv_tier_hit_blocks", "Prompt blocks admission loaded from the KV tier level.",
     "num_hit_blocks"),
    ("kv_tier_loaded_bytes", "KV bytes loaded from the tier level to the device.",
     "num_loaded_bytes"),
    ("kv_tier_written_bytes", "KV bytes written into the tier level.", "num_written_bytes"),
    ("kv_tier_evicted_blocks", "Blocks the tier level dropped to make room (to the next "
     "level down, if any).", "num_evicted_blocks"),
    ("kv_tier_failures", "Loads and writes of the tier level that failed (each a miss).",
     "num_failures"),
    ("kv_tier_load_seconds", "Link time of the tier level's loads (bytes / its speed).",
     "load_time_s"),
)  # fmt: skip
_TIER_GAUGES = (
    ("kv_tier_blocks", "Blocks the KV tier level holds.", "num_blocks"),
    ("kv_tier_capacity_blocks", "Blocks the KV tier level holds at most.", "capacity_blocks"),
)


def _tier_families(snap: Snapshot, model_name: str) -> Iterator[Metric]:
    """The KV tier levels' counters and gauges, one series per level (``tier``)."""
    labels = [MODEL_NAME, "tier"]
    for name, documentation, attribute in _TIER_COUNTERS:
        counter = CounterMetricFamily(PREFIX + name, documentation, labels=labels)
        for level in snap.tier_stats:
            counter.add_metric([model_name, level.name], getattr(level, attribute))
        yield counter
    for name, documentation, attribute in _TIER_GAUGES:
        gauge = GaugeMetricFamily(PREFIX + name, documentation, labels=labels)
        for level in snap.tier_stats:
            gauge.add_metric([model_name, level.name], getattr(level, attribute))
        yield gauge
    avoided = CounterMetricFamily(
        PREFIX + "kv_tier_loads_avoided_blocks",
        "KV tier hits computed again because that was cheaper than loading them.",
        labels=[MODEL_NAME],
    )
    avoided.add_metric([model_name], snap.tier_loads_avoided_blocks)
    yield avoided

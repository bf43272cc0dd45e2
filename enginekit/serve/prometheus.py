"""Prometheus metrics of the server, named as vLLM names them with the ``enginekit:`` prefix.

``GET /metrics`` renders one ``CollectorRegistry`` per server (so that servers in one
process never share series):

- gauges, read from the engine loop's latest ``Snapshot``: ``num_requests_running``,
  ``num_requests_waiting`` (accepted, not running), ``kv_cache_usage_perc`` (a fraction of
  the pool's blocks that running requests hold; cached blocks nobody holds are free),
  ``kv_cache_num_blocks``, ``kv_cache_slot_utilization`` (of the slots running sequences
  hold, the share that hold a token; NaN when none is held) and
  ``output_tokens_per_s_per_kv_gib`` (tokens generated over the last 10 s, per second of
  the engine's time and GiB of KV pool);
- counters, from the same snapshot, so that they equal the engine's summary:
  ``prefix_cache_queries_total`` and ``prefix_cache_hits_total`` (tokens),
  ``num_preemptions_total``, ``preemptions_by_kind_total{kind}``,
  ``recomputed_tokens_total`` (and ``recomputed_tokens_by_kind_total{kind}``),
  ``swap_out_bytes_total``, ``swap_in_bytes_total``,
  ``prompt_tokens_total`` and ``generation_tokens_total`` (of the requests that finished,
  aborted ones apart), ``request_success_total{finished_reason}`` (aborts included, as
  ``abort``), and ``request_rejected_total{reason}`` (``invalid`` bad input,
  ``unservable`` can never fit, ``queue_full`` answered 503);
- KV tiers below the pool, per level (``tier`` label, the level's name; no series without
  tiers), from the same snapshot: the counters ``kv_tier_hit_blocks_total`` (prompt
  blocks admission loaded from the level), ``kv_tier_loaded_bytes_total``,
  ``kv_tier_written_bytes_total``, ``kv_tier_evicted_blocks_total``,
  ``kv_tier_failures_total``, ``kv_tier_load_seconds_total`` (link time of the loads), and
  the gauges ``kv_tier_blocks`` and ``kv_tier_capacity_blocks``; and
  ``kv_tier_loads_avoided_blocks_total`` (tier hits computed again because that was
  cheaper than loading them; 0 without tiers);
- histograms, observed by the engine loop in wall-clock seconds from the moment the
  server received the request: ``time_to_first_token_seconds``,
  ``inter_token_latency_seconds`` (between two steps that gave a request tokens),
  ``e2e_request_latency_seconds``, ``request_prompt_tokens`` and
  ``request_generation_tokens`` (all samples), for the requests that finished;
- info: ``plugin_info{group, name, distribution, version}`` for each selected plugin,
  ``engine_info{model, executor, block_size, max_model_len, served_model_name}``.
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

PREFIX = "enginekit:"
# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
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
    """The engine's state after the latest step, for ``/metrics``. Counts of requests are
    of requests (a request's n samples count once); token and preemption counters are the
    engine's own (``RunMetrics``), prompt and generation tokens those of the requests that
    finished (aborted ones apart), as the engine's summary counts them."""

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
        """Share of the slots the running sequences hold that hold a token (NaN when
        none are held)."""
        if not self.kv_num_table_slots:
            return float("nan")
        return 1.0 - self.kv_num_unused_slots / self.kv_num_table_slots


class ServeMetrics:
    """The registry of one server: the histograms the engine loop observes, the rejection
    counter the handlers and the loop increment (both thread-safe), and a collector that
    reads the snapshot and the info labels at each scrape."""

    def __init__(
        self,
        max_model_len: int,
        plugin_labels: dict[str, dict[str, str]],
        engine_labels: dict[str, str],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        tokens = token_buckets(max_model_len)
        histogram = _histogram_factory(self.registry)
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Time to the first output token.", TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between two steps that gave tokens.", ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Time from arrival to finish.", E2E_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens of finished requests.", tokens
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Output tokens of finished requests.", tokens
        )
        self.request_rejected = Counter(
            PREFIX + "request_rejected",
            "Requests refused: invalid input, can never fit, or the queue was full.",
            ["reason"],
            registry=self.registry,
        )
        for reason in REJECTION_REASONS:
            self.request_rejected.labels(reason)  # every series exists from the start
        self._plugin_labels = plugin_labels
        self._engine_labels = engine_labels
        self._snapshot: Callable[[], Snapshot] = Snapshot

    def read_from(self, snapshot: Callable[[], Snapshot]) -> None:
        """Registers the collector of gauges, counters and info, reading ``snapshot()``."""
        self._snapshot = snapshot
        self.registry.register(_SnapshotCollector(self))


def _histogram_factory(registry: CollectorRegistry) -> Callable[..., Histogram]:
    def make(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(PREFIX + name, documentation, buckets=buckets, registry=registry)

    return make


class _SnapshotCollector(Collector):
    def __init__(self, metrics: ServeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics._snapshot()
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
            "kv_cache_num_blocks": ("Blocks of the KV pool.", snap.kv_num_blocks),
            "kv_cache_slot_utilization": (
                "Share of the token slots running sequences hold that hold a token.",
                snap.slot_utilization,
            ),
            "output_tokens_per_s_per_kv_gib": (
                "Output tokens per second (engine time, last 10 s) per GiB of KV pool.",
                snap.output_tokens_per_s / snap.kv_pool_gib if snap.kv_pool_gib else 0.0,
            ),
        }
        for name, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(PREFIX + name, documentation, value=value)
        counters = {
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.",
                                     snap.prefix_cache_queries),
            "prefix_cache_hits": ("Looked-up tokens found in the prefix cache.",
                                  snap.prefix_cache_hits),
            "num_preemptions": ("Preemptions of every kind.",
                                sum(snap.num_preemptions_by_kind.values())),
            "recomputed_tokens": ("KV tokens preemptions threw away to compute again.",
                                  snap.recomputed_tokens),
            "swap_out_bytes": ("KV bytes copied to the host swap pool.", snap.swap_out_bytes),
            "swap_in_bytes": ("KV bytes copied back from the host swap pool.", snap.swap_in_bytes),
            "prompt_tokens": ("Prompt tokens of finished requests.", snap.prompt_tokens),
            "generation_tokens": ("Output tokens of finished requests.", snap.generation_tokens),
        }  # fmt: skip
        for name, (documentation, value) in counters.items():
            yield CounterMetricFamily(PREFIX + name, documentation, value=value)
        by_kind = CounterMetricFamily(
            PREFIX + "preemptions_by_kind", "Preemptions by kind.", labels=["kind"]
        )
        for kind, count in sorted(snap.num_preemptions_by_kind.items()):
            by_kind.add_metric([kind], count)
        yield by_kind
        recomputed = CounterMetricFamily(
            PREFIX + "recomputed_tokens_by_kind",
            "KV tokens preemptions threw away to compute again, by preemption kind.",
            labels=["kind"],
        )
        for kind, count in sorted(snap.recomputed_tokens_by_kind.items()):
            recomputed.add_metric([kind], count)
        yield recomputed
        yield from _tier_families(snap)
        success = CounterMetricFamily(
            PREFIX + "request_success",
            "Requests ended, by finish reason (stop, length, abort).",
            labels=["finished_reason"],
        )
        for reason in sorted({"stop", "length", "abort", *snap.num_finished_by_reason}):
            success.add_metric([reason], snap.num_finished_by_reason.get(reason, 0))
        yield success
        plugins = InfoMetricFamily(PREFIX + "plugin", "The selected plugins.", labels=["group"])
        for group, labels in self._metrics._plugin_labels.items():
            plugins.add_metric([group], labels)
        yield plugins
        yield InfoMetricFamily(
            PREFIX + "engine", "The engine served.", value=self._metrics._engine_labels
        )


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


def _tier_families(snap: Snapshot) -> Iterator[Metric]:
    """The KV tier levels' counters and gauges, one series per level (``tier``)."""
    for name, documentation, attribute in _TIER_COUNTERS:
        counter = CounterMetricFamily(PREFIX + name, documentation, labels=["tier"])
        for level in snap.tier_stats:
            counter.add_metric([level.name], getattr(level, attribute))
        yield counter
    for name, documentation, attribute in _TIER_GAUGES:
        gauge = GaugeMetricFamily(PREFIX + name, documentation, labels=["tier"])
        for level in snap.tier_stats:
            gauge.add_metric([level.name], getattr(level, attribute))
        yield gauge
    yield CounterMetricFamily(
        PREFIX + "kv_tier_loads_avoided_blocks",
        "KV tier hits computed again because that was cheaper than loading them.",
        value=snap.tier_loads_avoided_blocks,
    )

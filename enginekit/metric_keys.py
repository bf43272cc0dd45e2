"""The keys of a run's summary, in one place: for each, its key, a short label, its unit and
what it means.

``RunMetrics.summary()`` writes these keys (the engine adds
``PREFIX_CACHE_IDEAL_GRANULARITY`` and, with KV tiers, ``ADDED_WITH_TIERS``, the workload
driver ``ADDED_BY_DRIVER`` and, with KV tiers, ``KV_TIER_HIT_RATE_PREDICTED``); the text
report, the sweep's table and plots and the claims read them from here, never from string
literals. Each constant is named as its key in
capitals. ``SUMMARY_KEYS`` lists every entry in the summary's order, ``BY_KEY`` finds one
by its key, ``LATENCY_KEYS`` are the three latency distributions.

The unit says how a value reads and prints: ``COUNT`` is a bare number whose label names
what is counted (a mapping of counts by name included), ``FRACTION`` a share in [0, 1]
shown as a percentage, ``LATENCY`` a ``latency_stats`` dict (count, mean, p50, p90, p99)
in seconds, ``UNIT_NAME`` the name of a unit ("token", "block"), ``TEXT`` a line of
text, ``CURVE`` a list of [cache blocks, hit rate] points; the others are quantities
printed with the unit's symbol (its value), a mapping of such quantities by name (the
KV tier levels') included. A value with no sample is None.

The ``kv_tier_*`` keys are written only for a run with KV tiers below the pool
(``+tier=...``): the engine's ``ADDED_WITH_TIERS`` and the driver's
``KV_TIER_HIT_RATE_PREDICTED``. A run without tiers has no level to name, so its report
and report.json stay as they were rather than carry empty mappings and a table of one
row.

Plain values only (layer 1): this module imports nothing from enginekit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

BYTES_PER_GIB = 1 << 30
"""Bytes in a GiB, the unit of every size in the summary (the KV pool, its per-GiB rates)."""


class Unit(Enum):
    """How a metric's value reads; a quantity's value is the symbol printed after it."""

    COUNT = "count"
    FRACTION = "fraction"
    LATENCY = "latency"
    UNIT_NAME = "unit name"
    TEXT = "text"  # a line of text, printed as it is
    CURVE = "curve"  # [[cache blocks, hit rate], ...], printed as its own table
    TOKENS = "tokens"
    BLOCKS = "blocks"
    BYTES = "bytes"
    GIB = "GiB"  # 2**30 bytes
    SECONDS = "s"
    TOKENS_PER_S = "tok/s"
    TOKENS_PER_S_PER_GIB = "tok/s/GiB"


@dataclass(frozen=True)
class MetricKey:
    """One summary key: ``key`` as the summary (and report.json) spells it, ``label`` as
    the text report shows it, ``unit`` (see ``Unit``) and ``meaning`` in one line."""

    key: str
    label: str
    unit: Unit
    meaning: str


# ---- tokens -------------------------------------------------------------------------------

NUM_REQUESTS = MetricKey(
    "num_requests", "requests", Unit.COUNT, "requests the engine accepted (rejected ones apart)"
)
NUM_REQUESTS_REJECTED = MetricKey(
    "num_requests_rejected",
    "requests rejected",
    Unit.COUNT,
    "requests refused at admission because they could never be served",
)
NUM_REQUESTS_FINISHED = MetricKey(
    "num_requests_finished", "requests finished", Unit.COUNT, "accepted requests that finished"
)
PROMPT_TOKENS_TOTAL = MetricKey(
    "prompt_tokens_total", "prompt tokens", Unit.COUNT, "prompt tokens of the accepted requests"
)
GENERATION_TOKENS_TOTAL = MetricKey(
    "generation_tokens_total",
    "generated tokens",
    Unit.COUNT,
    "output tokens of the finished requests",
)
NUM_STEPS = MetricKey("num_steps", "steps", Unit.COUNT, "engine steps executed")
PREFILL_TOKENS_COMPUTED = MetricKey(
    "prefill_tokens_computed",
    "prefill tokens computed",
    Unit.COUNT,
    "prompt tokens the executor computed (prefix hits skipped, recomputations included)",
)
DECODE_TOKENS_COMPUTED = MetricKey(
    "decode_tokens_computed",
    "decode tokens computed",
    Unit.COUNT,
    "tokens the executor decoded, one per running sequence per step",
)

# ---- prefix cache -------------------------------------------------------------------------

PREFIX_CACHE_QUERIES = MetricKey(
    "prefix_cache_queries",
    "queried",
    Unit.TOKENS,
    "prompt tokens looked up in the prefix cache, every admission counted",
)
PREFIX_CACHE_HITS = MetricKey(
    "prefix_cache_hits", "hit", Unit.TOKENS, "queried tokens found in the prefix cache"
)
PREFIX_CACHE_HIT_RATE = MetricKey(
    "prefix_cache_hit_rate", "hit rate", Unit.FRACTION, "hits / queries over every admission"
)
PREFIX_CACHE_FIRST_QUERIES = MetricKey(
    "prefix_cache_first_queries",
    "queried, first admissions",
    Unit.TOKENS,
    "tokens queried at requests' first admission",
)
PREFIX_CACHE_FIRST_HITS = MetricKey(
    "prefix_cache_first_hits",
    "hit, first admissions",
    Unit.TOKENS,
    "tokens hit at requests' first admission",
)
PREFIX_CACHE_FIRST_HIT_RATE = MetricKey(
    "prefix_cache_first_hit_rate",
    "hit rate, first admissions",
    Unit.FRACTION,
    "hits / queries at first admissions (comparable to the ideal rate)",
)
PREFIX_CACHE_READMISSION_QUERIES = MetricKey(
    "prefix_cache_readmission_queries",
    "queried again after preemption",
    Unit.TOKENS,
    "tokens queried when a preempted request is admitted again",
)
PREFIX_CACHE_READMISSION_HITS = MetricKey(
    "prefix_cache_readmission_hits",
    "hit again after preemption",
    Unit.TOKENS,
    "tokens hit when a preempted request is admitted again",
)
PREFIX_CACHE_READMISSION_HIT_RATE = MetricKey(
    "prefix_cache_readmission_hit_rate",
    "hit rate, re-admissions",
    Unit.FRACTION,
    "hits / queries at re-admissions, where eviction policies differ most",
)
PREFIX_CACHE_HITS_IDEAL = MetricKey(
    "prefix_cache_hits_ideal",
    "ideal hit",
    Unit.TOKENS,
    "tokens an unbounded prefix cache would hit on the workload (None when not computed)",
)
PREFIX_CACHE_HIT_RATE_IDEAL = MetricKey(
    "prefix_cache_hit_rate_ideal",
    "ideal hit rate (of prompt tokens)",
    Unit.FRACTION,
    "ideal hits / prompt tokens",
)
PREFIX_CACHE_IDEAL_GRANULARITY = MetricKey(
    "prefix_cache_ideal_granularity",
    "ideal counted in",
    Unit.UNIT_NAME,
    "whether the ideal counts matched tokens or whole blocks (set by the engine)",
)

PREFIX_CACHE_MISS_CAPACITY = MetricKey(
    "prefix_cache_miss_capacity",
    "missed: capacity",
    Unit.FRACTION,
    "share of first-admission prompt tokens missed that an unbounded cache of the same "
    "granularity and salt would hit (evicted, or not yet computed by a running request)",
)
PREFIX_CACHE_MISS_GRANULARITY = MetricKey(
    "prefix_cache_miss_granularity",
    "missed: granularity",
    Unit.FRACTION,
    "share of first-admission prompt tokens missed that were reusable to the token but "
    "not in whole blocks",
)
PREFIX_CACHE_MISS_OTHER_KEY = MetricKey(
    "prefix_cache_miss_other_key",
    "missed: other key",
    Unit.FRACTION,
    "share of first-admission prompt tokens missed that an earlier request computed "
    "under another extra key (salt)",
)
PREFIX_CACHE_MISS_COMPULSORY = MetricKey(
    "prefix_cache_miss_compulsory",
    "missed: compulsory",
    Unit.FRACTION,
    "share of first-admission prompt tokens no cache could hit: never computed before "
    "under any key, and each prompt's last token",
)
PREFIX_CACHE_HIT_RATE_PREDICTED = MetricKey(
    "prefix_cache_hit_rate_predicted",
    "hit rate at this pool, LRU stack prediction",
    Unit.FRACTION,
    "the hit-rate curve at the pool's size (None when not computed)",
)
PREFIX_CACHE_HIT_RATE_OPT = MetricKey(
    "prefix_cache_hit_rate_opt",
    "hit rate at this pool, OPT (Belady)",
    Unit.FRACTION,
    "the most any eviction policy could hit at the pool's size on the run's block accesses "
    "(enginekit.reuse.opt: furthest-next-lookup eviction, hits per block, the curve's "
    "pinned blocks and cap), in the curve's unit; None when not computed",
)
PREFIX_CACHE_HIT_RATE_OF_OPT = MetricKey(
    "prefix_cache_hit_rate_of_opt",
    "measured hit rate, share of OPT",
    Unit.FRACTION,
    "the first-admission hit rate over the OPT hit rate at the pool (None with KV tiers, "
    "whose hits are the pool's and the tiers')",
)
PREFIX_CACHE_HIT_RATE_CURVE = MetricKey(
    "prefix_cache_hit_rate_curve",
    "hit rate by cache size",
    Unit.CURVE,
    "[blocks, hit rate] of an LRU block_hash pool of that many blocks on the run's block "
    "accesses (LRU stack distances among unreferenced blocks, the run's referenced blocks "
    "taken out of the pool), up to the size that holds every reuse, with the run's pool, "
    "its multiples and the smallest pool that runs its schedule always among the points "
    "(at or beyond that size: the ideal); hit rate None where the pool would have queued "
    "or preempted (not predicted)",
)
PREFIX_CACHE_HIT_RATE_CURVE_OPT = MetricKey(
    "prefix_cache_hit_rate_curve_opt",
    "OPT hit rate by cache size",
    Unit.CURVE,
    "[blocks, hit rate] of OPT (as prefix_cache_hit_rate_opt) at the run's pool and those "
    "of its multiples on the curve that are predicted, printed beside the curve",
)
PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS = MetricKey(
    "prefix_cache_hit_rate_curve_min_blocks",
    "hit-rate curve predicted from",
    Unit.BLOCKS,
    "the smallest pool that runs this run's schedule: its peak of referenced blocks with "
    "the admission watermark to spare (below it the curve is not predicted)",
)
WORKLOAD_SOURCE = MetricKey(
    "workload_source",
    "workload",
    Unit.TEXT,
    "where the requests came from (a generator and seed, ShareGPT and its tokenizer, a trace file)",
)

# ---- KV cache -----------------------------------------------------------------------------

KV_CACHE_NUM_BLOCKS = MetricKey("kv_cache_num_blocks", "pool", Unit.BLOCKS, "blocks in the KV pool")
KV_CACHE_BLOCK_BYTES = MetricKey(
    "kv_cache_block_bytes", "block", Unit.BYTES, "bytes of one block, every layer's K and V"
)
KV_CACHE_POOL_GIB = MetricKey(
    "kv_cache_pool_gib", "pool size", Unit.GIB, "the KV pool's size: blocks × block bytes"
)
KV_CACHE_USAGE_PERC_MEAN = MetricKey(
    "kv_cache_usage_perc_mean",
    "usage mean (time-weighted)",
    Unit.FRACTION,
    "used / total blocks after each step, weighted by the step's duration",
)
KV_CACHE_USAGE_PERC_PEAK = MetricKey(
    "kv_cache_usage_perc_peak", "usage peak", Unit.FRACTION, "the highest used / total blocks"
)
KV_CACHE_UNUSED_SLOTS_MEAN = MetricKey(
    "kv_cache_unused_slots_mean",
    "unused slots mean",
    Unit.TOKENS,
    "token slots allocated to running sequences but holding no token, mean over steps",
)
KV_CACHE_UNUSED_SLOTS_PEAK = MetricKey(
    "kv_cache_unused_slots_peak",
    "unused slots peak",
    Unit.TOKENS,
    "the most allocated but unused token slots after a step",
)
KV_CACHE_SLOT_UTILIZATION = MetricKey(
    "kv_cache_slot_utilization",
    "slot utilization",
    Unit.FRACTION,
    "share of the slots running sequences hold that hold a token (paging: about 1)",
)
KV_CACHE_SHARING_SAVING = MetricKey(
    "kv_cache_sharing_saving",
    "saved by sharing",
    Unit.FRACTION,
    "1 - blocks used / blocks the tables list: what prefix hits and forks save",
)
KV_CACHE_UNUSABLE_FREE_BLOCKS_MEAN = MetricKey(
    "kv_cache_unusable_free_blocks_mean",
    "unusable free blocks mean",
    Unit.BLOCKS,
    "free blocks no allocation can use (external fragmentation), mean over samples",
)
NUM_RUNNING_MEAN = MetricKey(
    "num_running_mean", "running sequences mean", Unit.COUNT, "running sequences, mean over steps"
)
NUM_RUNNING_PEAK = MetricKey(
    "num_running_peak", "running sequences peak", Unit.COUNT, "the most running sequences"
)
NUM_WAITING_PEAK = MetricKey(
    "num_waiting_peak",
    "waiting requests peak",
    Unit.COUNT,
    "the most requests waiting at a step's end: arrived (by the step's start) and not "
    "running; requests whose arrival time is still ahead are not counted",
)

# ---- KV tiers (a run with levels below the pool only) -------------------------------------

KV_TIER_HITS_BY_SOURCE = MetricKey(
    "kv_tier_hits_by_source",
    "hit by source",
    Unit.TOKENS,
    "prefix_cache_hits by where the tokens came from: device (the pool's prefix cache) and "
    "each tier level by name (its blocks loaded at admission); they sum to prefix_cache_hits",
)
KV_TIER_LOADED_BYTES = MetricKey(
    "kv_tier_loaded_bytes", "loaded", Unit.BYTES, "KV bytes loaded to the device, by tier level"
)
KV_TIER_WRITTEN_BYTES = MetricKey(
    "kv_tier_written_bytes",
    "written",
    Unit.BYTES,
    "KV bytes written into each tier level (from the device, or handed down from the level above)",
)
KV_TIER_LOAD_TIME_S = MetricKey(
    "kv_tier_load_time_s",
    "load time",
    Unit.SECONDS,
    "link time of the loads by tier level: bytes / the level's bytes per second (the "
    "simulator overlaps it with compute, so a step takes less)",
)
KV_TIER_EVICTED_BLOCKS = MetricKey(
    "kv_tier_evicted_blocks",
    "evicted",
    Unit.BLOCKS,
    "blocks each tier level dropped to make room (handed to the next level down, if any)",
)
KV_TIER_FAILURES = MetricKey(
    "kv_tier_failures",
    "failures",
    Unit.COUNT,
    "loads and writes that failed, by tier level (each a miss, computed again)",
)
KV_TIER_LOADS_AVOIDED_BLOCKS = MetricKey(
    "kv_tier_loads_avoided_blocks",
    "loads avoided by recomputing",
    Unit.BLOCKS,
    "tier hits computed again because that was faster than moving their bytes "
    "(tier.load_or_recompute); not counted in the hits",
)
KV_TIER_BLOCKS = MetricKey(
    "kv_tier_blocks", "held", Unit.BLOCKS, "blocks each tier level holds at the run's end"
)
KV_TIER_CAPACITY_BLOCKS = MetricKey(
    "kv_tier_capacity_blocks", "capacity", Unit.BLOCKS, "blocks each tier level holds at most"
)
KV_TIER_HIT_RATE_PREDICTED = MetricKey(
    "kv_tier_hit_rate_predicted",
    "hit rate with tiers, LRU stack prediction",
    Unit.CURVE,
    "[tier blocks, hit rate]: the hit-rate curve at the run's pool plus that many blocks "
    "below it (enginekit.reuse.curve.tiered_pool_blocks: exclusive LRU levels written on "
    "eviction), for tiers of 0, 0.5, 1, 2, 4 and 8 times the pool and the run's own; hit "
    "rate None where not predicted (set by the driver)",
)

# ---- preemption ---------------------------------------------------------------------------

NUM_PREEMPTIONS_TOTAL = MetricKey(
    "num_preemptions_total", "preemptions", Unit.COUNT, "preemptions of every kind"
)
NUM_PREEMPTIONS_BY_KIND = MetricKey(
    "num_preemptions_by_kind",
    "by kind",
    Unit.COUNT,
    "preemptions by kind (recompute, swap), kinds in name order",
)
RECOMPUTED_TOKENS_TOTAL = MetricKey(
    "recomputed_tokens_total",
    "recomputed",
    Unit.TOKENS,
    "KV tokens preemptions threw away to compute again",
)
SWAP_OUT_BYTES_TOTAL = MetricKey(
    "swap_out_bytes_total", "swapped out", Unit.BYTES, "KV bytes copied to the host pool"
)
SWAP_IN_BYTES_TOTAL = MetricKey(
    "swap_in_bytes_total", "swapped in", Unit.BYTES, "KV bytes copied back from the host pool"
)

# ---- latency ------------------------------------------------------------------------------

TIME_TO_FIRST_TOKEN_SECONDS = MetricKey(
    "time_to_first_token_seconds", "TTFT", Unit.LATENCY, "first output token's time - arrival"
)
TIME_TO_FIRST_TOKEN_SECONDS_COLD = MetricKey(
    "time_to_first_token_seconds_cold",
    "cold",
    Unit.LATENCY,
    "TTFT of cold requests: those whose first admission hit no cached token (device or tier)",
)
TIME_PER_OUTPUT_TOKEN_SECONDS = MetricKey(
    "time_per_output_token_seconds",
    "TPOT",
    Unit.LATENCY,
    "(e2e - TTFT) / (outputs - 1), for requests with at least 2 outputs",
)
E2E_REQUEST_LATENCY_SECONDS = MetricKey(
    "e2e_request_latency_seconds", "e2e", Unit.LATENCY, "finish time - arrival"
)

# ---- throughput ---------------------------------------------------------------------------

DURATION_S = MetricKey(
    "duration_s",
    "duration",
    Unit.SECONDS,
    "from the first arrival (or step) to the last finish (or step end)",
)
BUSY_TIME_S = MetricKey(
    "busy_time_s", "busy (sum of step times)", Unit.SECONDS, "the sum of the steps' times"
)
OUTPUT_TOKENS_PER_S = MetricKey(
    "output_tokens_per_s", "output", Unit.TOKENS_PER_S, "generated tokens / duration"
)
TOTAL_TOKENS_PER_S = MetricKey(
    "total_tokens_per_s",
    "prompt + output",
    Unit.TOKENS_PER_S,
    "(prompt + generated tokens) / duration",
)
OUTPUT_TOKENS_PER_S_PER_KV_GIB = MetricKey(
    "output_tokens_per_s_per_kv_gib",
    "output per GiB of KV pool",
    Unit.TOKENS_PER_S_PER_GIB,
    "output tokens per second / the KV pool's GiB",
)

# ---- tenants (a run with more than one tenant only) --------------------------------------

TOKENS_SERVED_BY_TENANT = MetricKey(
    "tokens_served_by_tenant",
    "served by tenant",
    Unit.TOKENS,
    "prompt + output tokens of each tenant's finished requests (the tenant: a request's "
    "user, else its salt, else the shared one, named '')",
)
TENANT_SERVICE_MAX_MIN_RATIO = MetricKey(
    "tenant_service_max_min_ratio",
    "served, most / least served tenant",
    Unit.COUNT,
    "the most tokens served to one tenant / the fewest (None if a tenant got none)",
)

SUMMARY_KEYS: tuple[MetricKey, ...] = (
    NUM_REQUESTS,
    NUM_REQUESTS_REJECTED,
    NUM_REQUESTS_FINISHED,
    PROMPT_TOKENS_TOTAL,
    GENERATION_TOKENS_TOTAL,
    NUM_STEPS,
    PREFILL_TOKENS_COMPUTED,
    DECODE_TOKENS_COMPUTED,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_HIT_RATE,
    PREFIX_CACHE_FIRST_QUERIES,
    PREFIX_CACHE_FIRST_HITS,
    PREFIX_CACHE_FIRST_HIT_RATE,
    PREFIX_CACHE_READMISSION_QUERIES,
    PREFIX_CACHE_READMISSION_HITS,
    PREFIX_CACHE_READMISSION_HIT_RATE,
    PREFIX_CACHE_HITS_IDEAL,
    PREFIX_CACHE_HIT_RATE_IDEAL,
    PREFIX_CACHE_IDEAL_GRANULARITY,
    PREFIX_CACHE_MISS_CAPACITY,
    PREFIX_CACHE_MISS_GRANULARITY,
    PREFIX_CACHE_MISS_OTHER_KEY,
    PREFIX_CACHE_MISS_COMPULSORY,
    PREFIX_CACHE_HIT_RATE_PREDICTED,
    PREFIX_CACHE_HIT_RATE_OPT,
    PREFIX_CACHE_HIT_RATE_OF_OPT,
    PREFIX_CACHE_HIT_RATE_CURVE,
    PREFIX_CACHE_HIT_RATE_CURVE_OPT,
    PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS,
    WORKLOAD_SOURCE,
    KV_CACHE_NUM_BLOCKS,
    KV_CACHE_BLOCK_BYTES,
    KV_CACHE_POOL_GIB,
    KV_CACHE_USAGE_PERC_MEAN,
    KV_CACHE_USAGE_PERC_PEAK,
    KV_CACHE_UNUSED_SLOTS_MEAN,
    KV_CACHE_UNUSED_SLOTS_PEAK,
    KV_CACHE_SLOT_UTILIZATION,
    KV_CACHE_SHARING_SAVING,
    KV_CACHE_UNUSABLE_FREE_BLOCKS_MEAN,
    NUM_RUNNING_MEAN,
    NUM_RUNNING_PEAK,
    NUM_WAITING_PEAK,
    KV_TIER_HITS_BY_SOURCE,
    KV_TIER_LOADED_BYTES,
    KV_TIER_WRITTEN_BYTES,
    KV_TIER_LOAD_TIME_S,
    KV_TIER_EVICTED_BLOCKS,
    KV_TIER_FAILURES,
    KV_TIER_LOADS_AVOIDED_BLOCKS,
    KV_TIER_BLOCKS,
    KV_TIER_CAPACITY_BLOCKS,
    KV_TIER_HIT_RATE_PREDICTED,
    NUM_PREEMPTIONS_TOTAL,
    NUM_PREEMPTIONS_BY_KIND,
    RECOMPUTED_TOKENS_TOTAL,
    SWAP_OUT_BYTES_TOTAL,
    SWAP_IN_BYTES_TOTAL,
    TIME_TO_FIRST_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS_COLD,
    TIME_PER_OUTPUT_TOKEN_SECONDS,
    E2E_REQUEST_LATENCY_SECONDS,
    DURATION_S,
    BUSY_TIME_S,
    OUTPUT_TOKENS_PER_S,
    TOTAL_TOKENS_PER_S,
    OUTPUT_TOKENS_PER_S_PER_KV_GIB,
    TOKENS_SERVED_BY_TENANT,
    TENANT_SERVICE_MAX_MIN_RATIO,
)

LATENCY_KEYS: tuple[MetricKey, ...] = (
    TIME_TO_FIRST_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS_COLD,
    TIME_PER_OUTPUT_TOKEN_SECONDS,
    E2E_REQUEST_LATENCY_SECONDS,
)

ADDED_BY_DRIVER: tuple[MetricKey, ...] = (
    PREFIX_CACHE_MISS_CAPACITY,
    PREFIX_CACHE_MISS_GRANULARITY,
    PREFIX_CACHE_MISS_OTHER_KEY,
    PREFIX_CACHE_MISS_COMPULSORY,
    PREFIX_CACHE_HIT_RATE_PREDICTED,
    PREFIX_CACHE_HIT_RATE_OPT,
    PREFIX_CACHE_HIT_RATE_OF_OPT,
    PREFIX_CACHE_HIT_RATE_CURVE,
    PREFIX_CACHE_HIT_RATE_CURVE_OPT,
    PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS,
    WORKLOAD_SOURCE,
)
"""The keys ``enginekit.driver.WorkloadDriver`` adds to the engine's summary of a
workload run (from ``enginekit.reuse``), after the engine's own."""

ADDED_WITH_TIERS: tuple[MetricKey, ...] = (
    KV_TIER_HITS_BY_SOURCE,
    KV_TIER_LOADED_BYTES,
    KV_TIER_WRITTEN_BYTES,
    KV_TIER_LOAD_TIME_S,
    KV_TIER_EVICTED_BLOCKS,
    KV_TIER_FAILURES,
    KV_TIER_LOADS_AVOIDED_BLOCKS,
    KV_TIER_BLOCKS,
    KV_TIER_CAPACITY_BLOCKS,
)
"""The keys ``Engine.summary`` adds for a run with KV tiers (``KVCacheManager.tier_stats``),
each mapping by level name, fastest level first, but the avoided loads; a run without
tiers has none of them. ``KV_TIER_HIT_RATE_PREDICTED`` is the driver's, for such a run."""

ADDED_WITH_TENANTS: tuple[MetricKey, ...] = (
    TOKENS_SERVED_BY_TENANT,
    TENANT_SERVICE_MAX_MIN_RATIO,
)
"""The keys ``RunMetrics.summary`` adds for a run whose requests belong to more than one
tenant (``Request.tenant``); a run of one tenant has none of them."""

BY_KEY: Mapping[str, MetricKey] = MappingProxyType({m.key: m for m in SUMMARY_KEYS})

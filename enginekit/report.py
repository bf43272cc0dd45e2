"""Plain-text and JSON renderings of a run: ``header`` (where and how it ran) and
``summary`` (``RunMetrics.summary()``).

``render_report`` prints every summary key exactly once: the known ones in labelled
sections with units, anything else under "other", so a new metric is never silently lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from enginekit import metric_keys as mk

_Fmt = Callable[[Any], str]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_num(v)}" for k, v in value.items()) or "-"
    return str(value)


def _perc(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _unit(unit: str) -> _Fmt:
    def fmt(value: Any) -> str:
        if value is None:
            return _num(value)
        if isinstance(value, Mapping):  # by name (tier levels): each with the unit
            return ", ".join(f"{k}={_num(v)} {unit}" for k, v in value.items()) or "-"
        return f"{_num(value)} {unit}"

    return fmt


def _format(metric: mk.MetricKey) -> _Fmt:
    """How the report prints a metric of each unit (latencies have their own table)."""
    unit = metric.unit
    if unit is mk.Unit.COUNT:
        return _num
    if unit is mk.Unit.FRACTION:
        return _perc
    if unit is mk.Unit.UNIT_NAME:
        return lambda value: _num(value) + "s"
    if unit is mk.Unit.LATENCY:
        raise ValueError(f"{metric.key}: latencies are printed in their own table")
    if unit is mk.Unit.TEXT:
        return _num
    if unit is mk.Unit.CURVE:
        raise ValueError(f"{metric.key}: curves are printed in their own table")
    return _unit(unit.value)


def _fields(*metrics: mk.MetricKey) -> tuple[tuple[str, str, _Fmt], ...]:
    return tuple((metric.key, metric.label, _format(metric)) for metric in metrics)


# (title, ((key, label, format), ...)) in print order; the summary's other keys but the
# latencies go under "other".
_SECTIONS: tuple[tuple[str, tuple[tuple[str, str, _Fmt], ...]], ...] = (
    (
        "tokens",
        _fields(
            mk.WORKLOAD_SOURCE,
            mk.NUM_REQUESTS,
            mk.NUM_REQUESTS_REJECTED,
            mk.NUM_REQUESTS_FINISHED,
            mk.PROMPT_TOKENS_TOTAL,
            mk.GENERATION_TOKENS_TOTAL,
            mk.NUM_STEPS,
            mk.PREFILL_TOKENS_COMPUTED,
            mk.DECODE_TOKENS_COMPUTED,
        ),
    ),
    (
        "prefix cache",
        _fields(
            mk.PREFIX_CACHE_QUERIES,
            mk.PREFIX_CACHE_HITS,
            mk.PREFIX_CACHE_HIT_RATE,
            mk.PREFIX_CACHE_FIRST_HIT_RATE,
            mk.PREFIX_CACHE_READMISSION_QUERIES,
            mk.PREFIX_CACHE_READMISSION_HIT_RATE,
            mk.PREFIX_CACHE_IDEAL_GRANULARITY,
            mk.PREFIX_CACHE_HITS_IDEAL,
            mk.PREFIX_CACHE_HIT_RATE_IDEAL,
            mk.PREFIX_CACHE_MISS_CAPACITY,
            mk.PREFIX_CACHE_MISS_GRANULARITY,
            mk.PREFIX_CACHE_MISS_OTHER_KEY,
            mk.PREFIX_CACHE_MISS_COMPULSORY,
            mk.PREFIX_CACHE_HIT_RATE_PREDICTED,
            mk.PREFIX_CACHE_HIT_RATE_OPT,
            mk.PREFIX_CACHE_HIT_RATE_OF_OPT,
            mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS,
        ),
    ),
    (
        "KV cache",
        _fields(
            mk.KV_CACHE_NUM_BLOCKS,
            mk.KV_CACHE_BLOCK_BYTES,
            mk.KV_CACHE_POOL_GIB,
            mk.KV_CACHE_USAGE_PERC_MEAN,
            mk.KV_CACHE_USAGE_PERC_PEAK,
            mk.KV_CACHE_UNUSED_SLOTS_MEAN,
            mk.KV_CACHE_UNUSED_SLOTS_PEAK,
            mk.KV_CACHE_SLOT_UTILIZATION,
            mk.KV_CACHE_SHARING_SAVING,
            mk.KV_CACHE_UNUSABLE_FREE_BLOCKS_MEAN,
            mk.NUM_RUNNING_MEAN,
            mk.NUM_RUNNING_PEAK,
            mk.NUM_WAITING_PEAK,
        ),
    ),
    (
        "preemption",
        _fields(
            mk.NUM_PREEMPTIONS_TOTAL,
            mk.NUM_PREEMPTIONS_BY_KIND,
            mk.RECOMPUTED_TOKENS_TOTAL,
            mk.SWAP_OUT_BYTES_TOTAL,
            mk.SWAP_IN_BYTES_TOTAL,
        ),
    ),
    (
        "throughput",
        _fields(
            mk.DURATION_S,
            mk.BUSY_TIME_S,
            mk.OUTPUT_TOKENS_PER_S,
            mk.TOTAL_TOKENS_PER_S,
            mk.OUTPUT_TOKENS_PER_S_PER_KV_GIB,
            mk.TOKENS_SERVED_BY_TENANT,
            mk.TENANT_SERVICE_MAX_MIN_RATIO,
        ),
    ),
)

_LATENCY_KEYS = tuple(metric.key for metric in mk.LATENCY_KEYS)
_LATENCY_LABELS = {metric.key: metric.label for metric in mk.LATENCY_KEYS}
_LATENCY_COLUMNS = ("mean", "p50", "p90", "p99")


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(label) for label, _ in rows)
    return [f"== {title} =="] + [f"  {label:<{width}}  {text}" for label, text in rows] + [""]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def _latency_lines(summary: Mapping[str, Any]) -> list[str]:
    present = [key for key in _LATENCY_KEYS if key in summary]
    if not present:
        return []
    head = f"  {'':<6}{'n':>8}" + "".join(f"{col:>12}" for col in _LATENCY_COLUMNS)
    lines = ["== latency (ms) ==", head]
    for key in present:
        stats = summary[key] or {}
        cells = "".join(f"{_ms(stats.get(col)):>12}" for col in _LATENCY_COLUMNS)
        lines.append(f"  {_LATENCY_LABELS[key]:<6}{stats.get('count', 0):>8}{cells}")
    return lines + [""]


CURVE_TABLE_ROWS = 12  # the hit-rate curve's rows in the text report
CURVE_POOL_MULTIPLES = (0.25, 0.5, 2.0, 4.0)
"""Multiples of the run's pool that the driver puts on the curve, and the report shows."""


def curve_rows(curve: Any, pool_blocks: Any, rows: int = CURVE_TABLE_ROWS) -> list[list[Any]]:
    """About ``rows`` points of a hit-rate curve ([[blocks, hit rate], ...], sizes
    ascending), evenly spaced along it, with its last point and the points at
    ``pool_blocks`` and its ``CURVE_POOL_MULTIPLES`` when the curve has them (the driver
    puts them on every curve)."""
    points = [list(p) for p in curve or []]
    if len(points) <= rows:
        return points
    step = (len(points) - 1) / (rows - 1)
    chosen = {round(i * step) for i in range(rows)}
    marked = {pool_blocks} | {int(pool_blocks * m) for m in CURVE_POOL_MULTIPLES if pool_blocks}
    chosen |= {i for i, p in enumerate(points) if p[0] in marked}
    return [points[i] for i in sorted(chosen)]


def _curve_lines(summary: Mapping[str, Any]) -> list[str]:
    curve = summary.get(mk.PREFIX_CACHE_HIT_RATE_CURVE.key)
    if not curve:
        return []
    pool = summary.get(mk.KV_CACHE_NUM_BLOCKS.key)
    block_bytes = summary.get(mk.KV_CACHE_BLOCK_BYTES.key)
    measured = summary.get(mk.PREFIX_CACHE_FIRST_HIT_RATE.key)
    if mk.KV_TIER_HITS_BY_SOURCE.key in summary:
        measured = None  # the run's rate is the pool's and its tiers' (their own table)
    opt = {size: rate for size, rate in summary.get(mk.PREFIX_CACHE_HIT_RATE_CURVE_OPT.key) or []}
    lines = [
        "== hit rate by cache size (LRU stack distances of this run's block accesses, "
        "its referenced blocks taken out of the pool) ==",
        f"  {'blocks':>12}{'GiB':>10}  {'hit rate':>10}",
    ]
    if opt:  # OPT's column: Belady at the pool and its multiples (per block: an upper bound)
        lines[0] = lines[0][: -len(" ==")] + "; OPT: Belady's optimum, hits per block) =="
        lines[1] += f"{'OPT':>10}"
    for blocks, rate in curve_rows(curve, pool):
        gib = "-" if not block_bytes else f"{blocks * block_bytes / mk.BYTES_PER_GIB:,.2f}"
        mark = ""
        if blocks == pool:
            mark = "  <- this pool" + ("" if measured is None else f", measured {_perc(measured)}")
        for multiple in CURVE_POOL_MULTIPLES:
            if pool and blocks != pool and blocks == int(pool * multiple):
                mark = f"  <- {multiple:g}x this pool"
        text = NOT_PREDICTED if rate is None else f"{_perc(rate):>10}"
        if opt and rate is not None:
            text += f"{_perc(opt.get(blocks)):>10}"
        lines.append(f"  {blocks:>12,}{gib:>10}  {text}{mark}")
    return lines + [""]


TIER_POOL_MULTIPLES = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Tier sizes, as multiples of the run's pool, at which the driver predicts the hit rate
of a run with KV tiers (with the run's own tier size), and the report shows."""

_TIER_KEYS = frozenset(m.key for m in (*mk.ADDED_WITH_TIERS, mk.KV_TIER_HIT_RATE_PREDICTED))


def _gib(num_bytes: Any) -> str:
    return "-" if num_bytes is None else f"{num_bytes / mk.BYTES_PER_GIB:,.3f}"


def _tier_lines(summary: Mapping[str, Any]) -> list[str]:
    """The "KV tiers" section: a row per source of hits, the device first, then each
    level; the loads avoided; and the hit rate predicted with tiers of several sizes."""
    by_source = summary.get(mk.KV_TIER_HITS_BY_SOURCE.key)
    if by_source is None:
        return []
    queries = summary.get(mk.PREFIX_CACHE_QUERIES.key)

    def level(key: mk.MetricKey, name: str) -> Any:
        return (summary.get(key.key) or {}).get(name)

    head = (
        f"  {'':<10}{'hit rate':>10}{'hits':>14}{'loaded GiB':>12}{'written GiB':>13}"
        f"{'evicted':>10}{'failures':>10}{'load s':>10}{'held':>10}{'capacity':>10}"
    )
    lines = [
        "== KV tiers (hit rate: the source's hit tokens / queried tokens; the rows sum to "
        "the prefix cache's) ==",
        head,
    ]
    for name, hits in by_source.items():
        share = _perc(hits / queries) if queries else "-"
        if name == "device":
            cells = ["-"] * 5 + ["-", _num(summary.get(mk.KV_CACHE_NUM_BLOCKS.key))]
        else:
            load_s = level(mk.KV_TIER_LOAD_TIME_S, name)
            cells = [
                _gib(level(mk.KV_TIER_LOADED_BYTES, name)),
                _gib(level(mk.KV_TIER_WRITTEN_BYTES, name)),
                _num(level(mk.KV_TIER_EVICTED_BLOCKS, name)),
                _num(level(mk.KV_TIER_FAILURES, name)),
                "-" if load_s is None else f"{load_s:.4g}",
                _num(level(mk.KV_TIER_BLOCKS, name)),
                _num(level(mk.KV_TIER_CAPACITY_BLOCKS, name)),
            ]
        widths = (12, 13, 10, 10, 10, 10, 10)
        row = "".join(f"{cell:>{width}}" for cell, width in zip(cells, widths, strict=True))
        lines.append(f"  {name:<10}{share:>10}{_num(hits):>14}{row}")
    avoided = summary.get(mk.KV_TIER_LOADS_AVOIDED_BLOCKS.key)
    lines.append(f"  {mk.KV_TIER_LOADS_AVOIDED_BLOCKS.label}: {_num(avoided)} blocks")
    return lines + [""] + _tier_prediction_lines(summary)


def _tier_prediction_lines(summary: Mapping[str, Any]) -> list[str]:
    predicted = summary.get(mk.KV_TIER_HIT_RATE_PREDICTED.key)
    if not predicted:
        return []
    pool = summary.get(mk.KV_CACHE_NUM_BLOCKS.key)
    block_bytes = summary.get(mk.KV_CACHE_BLOCK_BYTES.key)
    own = sum((summary.get(mk.KV_TIER_CAPACITY_BLOCKS.key) or {}).values())
    measured = summary.get(mk.PREFIX_CACHE_FIRST_HIT_RATE.key)
    lines = [
        "== hit rate with tiers below this pool (LRU stack prediction at pool + tier blocks, "
        "first admissions; exclusive LRU levels written on eviction) ==",
        f"  {'tier blocks':>12}{'GiB':>10}  {'hit rate':>10}",
    ]
    for blocks, rate in predicted:
        gib = "-" if not block_bytes else f"{blocks * block_bytes / mk.BYTES_PER_GIB:,.2f}"
        mark = ""
        if blocks == own:
            mark = "  <- this run's tiers"
            mark += "" if measured is None else f", measured {_perc(measured)}"
        elif blocks == 0:
            mark = "  <- no tier"
        elif pool:
            for multiple in TIER_POOL_MULTIPLES:
                if blocks == int(pool * multiple):
                    mark = f"  <- {multiple:g}x this pool"
        text = "-" if rate is None else _perc(rate)
        lines.append(f"  {blocks:>12,}{gib:>10}  {text:>10}{mark}")
    return lines + [""]


_CURVE_KEYS = frozenset(
    m.key for m in (mk.PREFIX_CACHE_HIT_RATE_CURVE, mk.PREFIX_CACHE_HIT_RATE_CURVE_OPT)
)

NOT_PREDICTED = "would queue or preempt: not predicted"
"""The curve's text where a pool would not have run the run's schedule."""


def render_report(summary: Mapping[str, Any], header: Mapping[str, Any]) -> str:
    """The run as a plain-text report: a "run" section from ``header`` (plugins, model,
    hardware, executor, anything else it holds), then tokens, prefix cache (with the
    missed tokens by cause and the hit-rate curve's table, when the summary has them),
    KV cache, KV tiers (for a run with tiers: a row per source of hits, and the hit rate
    predicted with tiers of several sizes), preemption, latency (mean/p50/p90/p99 in ms)
    and throughput; keys it does not know go under "other". Pure."""
    lines = _rows("run", [(str(key), _num(value)) for key, value in header.items()])
    placed: set[str] = set(_LATENCY_KEYS) | _CURVE_KEYS | _TIER_KEYS
    for title, fields in _SECTIONS:
        rows = [(label, fmt(summary[key])) for key, label, fmt in fields if key in summary]
        placed.update(key for key, _, _ in fields)
        lines += _rows(title, rows)
        if title == "prefix cache":
            lines += _curve_lines(summary)
        if title == "KV cache":
            lines += _tier_lines(summary)
        if title == "preemption":
            lines += _latency_lines(summary)
    other = [(key, _num(value)) for key, value in summary.items() if key not in placed]
    lines += _rows("other", other)
    return "\n".join(lines).rstrip("\n") + "\n"


STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"


def write_json(
    summary: Mapping[str, Any],
    header: Mapping[str, Any],
    path: str | Path,
    *,
    status: str = STATUS_COMPLETED,
    error: str | None = None,
) -> None:
    """Writes ``{"status": status, "error": error, "header": header, "summary": summary}``
    as strict JSON (NaN refused) to ``path``, creating parent folders, and, when the
    summary has a hit-rate curve, ``hit_rate_curve.png`` beside it
    (``draw_hit_rate_curve``). A job that could
    not run writes ``status=STATUS_FAILED``, its error message and an empty summary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"status": status, "error": error, "header": header, "summary": summary}
    text = json.dumps(data, indent=2, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    if summary.get(mk.PREFIX_CACHE_HIT_RATE_CURVE.key):
        draw_hit_rate_curve(summary, path.parent / CURVE_PNG)


CURVE_PNG = "hit_rate_curve.png"


def draw_hit_rate_curve(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Draws the summary's hit-rate curve (hit rate against cache blocks, log scale) as
    a PNG at ``path``, with the run's pool marked: its size, the hit rate the curve
    predicts there, Belady's OPT at the pool and its multiples, and the one the run
    measured at first admissions (with KV tiers: at
    the pool plus the tiers' blocks, ``enginekit.reuse.curve.tiered_pool_blocks``), and
    the ideal; the
    sizes that would not have run the run's schedule are shaded (not predicted). Returns
    the path. Headless (matplotlib's Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = summary[mk.PREFIX_CACHE_HIT_RATE_CURVE.key]
    curve = [p for p in points if p[1] is not None]
    sizes = [p[0] for p in curve]
    rates = [100 * p[1] for p in curve]
    figure = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    marker = "." if len(curve) <= CURVE_TABLE_ROWS else None  # a few points: each shown
    axes.plot(sizes, rates, color="tab:blue", marker=marker, label="LRU block_hash, predicted")
    opt = summary.get(mk.PREFIX_CACHE_HIT_RATE_CURVE_OPT.key)
    if opt:  # Belady's optimum at the pool and its multiples: what no policy can beat
        axes.plot(
            [p[0] for p in opt],
            [100 * p[1] for p in opt],
            "^",
            color="tab:green",
            label="OPT (Belady, hits per block)",
        )
    smallest = summary.get(mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key)
    if smallest:
        axes.axvspan(
            min([p[0] for p in points] + [smallest]) / 2,
            smallest,
            color="gray",
            alpha=0.15,
            label=f"would queue or preempt: not predicted (< {smallest:,} blocks)",
        )
    ideal = summary.get(mk.PREFIX_CACHE_HIT_RATE_IDEAL.key)
    if ideal is not None:
        axes.axhline(100 * ideal, color="gray", linestyle=":", label="ideal (unbounded)")
    pool = summary.get(mk.KV_CACHE_NUM_BLOCKS.key)
    if pool:
        axes.axvline(pool, color="tab:red", linestyle="--", label=f"this pool: {pool:,} blocks")
        measured = summary.get(mk.PREFIX_CACHE_FIRST_HIT_RATE.key)
        # with tiers, the run measured the pool and its tiers: one pool of their sum
        tiers = sum((summary.get(mk.KV_TIER_CAPACITY_BLOCKS.key) or {}).values())
        if measured is not None:
            label = f"measured, with {tiers:,} tier blocks" if tiers else "measured"
            axes.plot([pool + tiers], [100 * measured], "o", color="tab:red", label=label)
    axes.set_xscale("log")
    axes.set_xlabel("cache size (blocks)")
    axes.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    axes.set_ylim(0, 100)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("What more memory would buy: hit rate by cache size")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    return path


def read_json(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(summary, header)`` as ``write_json`` stored them."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return data["summary"], data["header"]

"""PNG plots of a sweep's completed jobs, each written only when the sweep varies its key.

- ``kv_utilization.png``, when ``allocator`` varies: slot utilisation; KV usage mean (bar)
  and peak (tick); running sequences mean (bar) and peak (tick).
- ``prefix_hit_rate.png``, when ``prefix`` or ``workload.name`` varies: prefix hit rate
  (bar) and its ideal (tick).
- ``latency.png``, when anything varies (2+ completed jobs): TTFT and TPOT p50 / p90 / p99
  in ms on a log scale labelled at round values (``log_ticks``), coloured by the first
  swept key, with a legend for the markers and one for the colours.
- ``pool_size.png``, when ``cache.num_blocks`` or ``cache.memory_gib`` varies: preemptions
  per request and output tok/s against the pool size, one line per combination of the
  other swept keys.
- ``capacity.png``, when ``quantizer`` varies: pool tokens and KV bytes per token.

Bar plots have one horizontal bar per job, labelled with its swept choices, ordered and
coloured by the plot's key; counts are labelled at a few round values with thousands
separators. ``figures`` draws them (matplotlib's object API on the Agg canvas: no pyplot,
no display, no global state) and ``write_plots`` saves them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from enginekit import metric_keys as mk
from enginekit.sweep.jobs import JobResult, job_label, swept_keys
from enginekit.sweep.table import pool_tokens, preemptions_per_request

POOL_KEYS: tuple[str, ...] = ("cache.num_blocks", "cache.memory_gib")
_MARKERS = {"p50": "o", "p90": "s", "p99": "^"}


class Series(NamedTuple):
    """One value per job in a panel: drawn as a bar, or as a tick over the bar."""

    label: str
    read: Callable[[JobResult], Any]
    is_tick: bool = False


class Panel(NamedTuple):
    title: str
    series: tuple[Series, ...]
    is_fraction: bool = False


def _summary(metric: mk.MetricKey) -> Callable[[JobResult], Any]:
    return lambda job: job.summary.get(metric.key)


def _value(raw: Any) -> float:
    return math.nan if raw is None else float(raw)


def _ordered(jobs: Sequence[JobResult], focus: Sequence[str]) -> list[JobResult]:
    """Jobs grouped by their values of ``focus`` (first seen first), else in given order."""
    first_seen: dict[tuple[str | None, ...], int] = {}
    for job in jobs:
        first_seen.setdefault(tuple(job.overrides.get(k) for k in focus), len(first_seen))
    return sorted(jobs, key=lambda j: first_seen[tuple(j.overrides.get(k) for k in focus)])


def _colors(jobs: Sequence[JobResult], key: str | None) -> tuple[list[Any], dict[str, Any]]:
    """One colour per job by its value of ``key`` (tab10 cycle), and the legend's map."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    palette: dict[str, Any] = {}
    for job in jobs:
        value = "-" if key is None else str(job.overrides.get(key, "default"))
        palette.setdefault(value, cmap(len(palette) % 10))
    values = ["-" if key is None else str(j.overrides.get(key, "default")) for j in jobs]
    return [palette[v] for v in values], palette


def _label_rows(ax: Any, jobs: Sequence[JobResult], swept: Sequence[str]) -> None:
    """Y tick labels: ``key=value, ...`` for up to two swept keys; beyond, values only with
    the keys named once as the axis label."""
    if len(swept) > 2:
        labels = [", ".join(job.overrides.get(k, "-") for k in swept) for job in jobs]
        ax.set_ylabel(", ".join(swept))
    else:
        labels = [job_label(job, swept) for job in jobs]
    ax.set_yticks(range(len(jobs)), labels, fontsize="small")
    ax.invert_yaxis()


def _figure(num_panels: int, num_rows: int) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    height = 1.6 + 0.3 * num_rows
    fig = Figure(figsize=(4.0 + 4.0 * max(num_panels, 2), height), layout="constrained")
    axes = fig.subplots(1, num_panels, sharey=True, squeeze=False)[0]
    return fig, list(axes)


def _panel_title(panel: Panel) -> str:
    """``"KV cache usage (bar: mean, |: peak)"`` when a panel draws ticks."""
    ticks = [s.label for s in panel.series if s.is_tick]
    if not ticks:
        return panel.title
    bars = [s.label for s in panel.series if not s.is_tick]
    return f"{panel.title}\n(bar: {', '.join(bars)}; |: {', '.join(ticks)})"


def bar_figure(
    title: str,
    jobs: Sequence[JobResult],
    swept: Sequence[str],
    focus: Sequence[str],
    panels: Sequence[Panel],
) -> Any:
    """Horizontal bars, one row per job (ordered by ``focus``, coloured by its last key);
    counts labelled as plain numbers with thousands separators, at a few round values."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

    rows = _ordered(jobs, focus)
    colour_key = focus[-1] if focus else None
    colours, palette = _colors(rows, colour_key)
    fig, axes = _figure(len(panels), len(rows))
    ys = list(range(len(rows)))
    for ax, panel in zip(axes, panels, strict=True):
        for series in panel.series:
            values = [_value(series.read(job)) for job in rows]
            if series.is_tick:
                ax.scatter(values, ys, marker="|", s=300, color="black")
            else:
                ax.barh(ys, values, color=colours, height=0.7)
        ax.set_title(_panel_title(panel), fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
        if panel.is_fraction:
            ax.set_xlim(0, 1.05)
            ax.xaxis.set_major_formatter(PercentFormatter(xmax=1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
            ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    _label_rows(axes[0], rows, swept)
    if colour_key is not None and len(palette) > 1:
        handles = [Patch(color=c, label=v) for v, c in palette.items()]
        fig.legend(handles=handles, title=colour_key, loc="outside right upper", fontsize="small")
    fig.suptitle(title)
    return fig


def _latency_points_ms(job: JobResult, metric: mk.MetricKey) -> dict[str, float]:
    """The job's p50 / p90 / p99 of latency ``metric`` in ms (those it has)."""
    stats = job.summary.get(metric.key) or {}
    return {p: 1e3 * float(stats[p]) for p in _MARKERS if stats.get(p) is not None}


def _plain(value: float, _pos: Any = None) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


# Mantissas of labelled log ticks, sparsest first: the first set that puts MIN_LOG_TICKS
# inside the data's range is used.
_LOG_MANTISSAS: tuple[tuple[float, ...], ...] = (
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0),
)
MIN_LOG_TICKS = 4
_LOG_PAD = 1.15  # the axis reaches this factor beyond the smallest and largest value


def log_ticks(low: float, high: float) -> list[float]:
    """Labelled ticks for a log axis over [low, high] (0 < low <= high): round values
    (1, 2, 5, ... × a power of ten) from the sparsest set that gives at least
    ``MIN_LOG_TICKS`` of them in range; when even the densest set gives fewer (a range
    under about 1.5×), ``MIN_LOG_TICKS`` values evenly spaced in log, at 3 significant
    digits."""
    for mantissas in _LOG_MANTISSAS:
        ticks = [
            m * 10.0**exponent
            for exponent in range(math.floor(math.log10(low)), math.floor(math.log10(high)) + 1)
            for m in mantissas
        ]
        ticks = [t for t in ticks if low <= t * (1 + 1e-9) and t <= high * (1 + 1e-9)]
        if len(ticks) >= MIN_LOG_TICKS:
            return ticks
    if high <= low:
        return [float(f"{low:.3g}")]
    step = math.log(high / low) / (MIN_LOG_TICKS - 1)
    return list(
        dict.fromkeys(float(f"{low * math.exp(i * step):.3g}") for i in range(MIN_LOG_TICKS))
    )


def _log_axis(ax: Any, values: Sequence[float]) -> None:
    """A log x axis over ``values`` (padded) with plain-number labels at ``log_ticks``
    (unlabelled minor ticks stay as grid lines)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return
    low, high = min(positive) / _LOG_PAD, max(positive) * _LOG_PAD
    ticks = log_ticks(low, high)
    ax.set_xlim(low, high)
    ax.set_xticks(ticks, [_plain(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def latency_figure(jobs: Sequence[JobResult], swept: Sequence[str]) -> Any:
    """The figure of ``latency.png``: per job, p50 / p90 / p99 of TTFT and TPOT on a log
    scale, joined by a line; one colour per value of the first swept key, markers and
    colours explained in legends."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colour_key = swept[0] if swept else None
    colours, palette = _colors(jobs, colour_key)
    fig, axes = _figure(2, len(jobs))
    ys = list(range(len(jobs)))
    metrics = (
        (mk.TIME_TO_FIRST_TOKEN_SECONDS, "time to first token (ms)"),
        (mk.TIME_PER_OUTPUT_TOKEN_SECONDS, "time per output token (ms)"),
    )
    for ax, (metric, name) in zip(axes, metrics, strict=True):
        for y, job, colour in zip(ys, jobs, colours, strict=True):
            points = _latency_points_ms(job, metric)
            if not points:
                continue
            xs = list(points.values())
            ax.plot([min(xs), max(xs)], [y, y], color=colour, linewidth=2, alpha=0.6)
            for stat, value in points.items():
                ax.scatter([value], [y], marker=_MARKERS[stat], color=colour)
        _log_axis(ax, [x for job in jobs for x in _latency_points_ms(job, metric).values()])
        ax.set_title(name, fontsize="medium")
        ax.grid(axis="x", which="both", alpha=0.3)
    _label_rows(axes[0], jobs, swept)
    markers = [
        Line2D([], [], marker=m, color="black", linestyle="", label=stat)
        for stat, m in _MARKERS.items()
    ]
    fig.legend(handles=markers, title="percentile", loc="outside right upper", fontsize="small")
    if colour_key is not None and len(palette) > 1:
        handles = [Patch(color=c, label=v) for v, c in palette.items()]
        fig.legend(handles=handles, title=colour_key, loc="outside right lower", fontsize="small")
    fig.suptitle("Latency percentiles per job (log scale)")
    return fig


def _pool_figure(jobs: Sequence[JobResult], swept: Sequence[str]) -> Any:
    """Preemptions per request and output tok/s against the pool size (swept key's value,
    or the pool's GiB when both pool keys vary); a line per combination of the other keys.
    None when no job has a pool size."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    pool = [k for k in POOL_KEYS if k in swept]
    others = [k for k in swept if k not in POOL_KEYS]
    if len(pool) == 1:
        xlabel = pool[0]
        x_of: Callable[[JobResult], float] = lambda job: _value(job.overrides.get(pool[0]))  # noqa: E731
    else:
        xlabel = "KV pool (GiB)"
        x_of = lambda job: _value(job.summary.get(mk.KV_CACHE_POOL_GIB.key))  # noqa: E731
    try:
        points = [(x_of(job), job) for job in jobs]
    except ValueError:  # a pool value that is not a number (e.g. "null")
        xlabel = "KV pool (GiB)"
        points = [(_value(job.summary.get(mk.KV_CACHE_POOL_GIB.key)), job) for job in jobs]
    lines: dict[str, list[tuple[float, JobResult]]] = {}
    for x, job in points:
        if not math.isnan(x):
            lines.setdefault(job_label(job, others) if others else "", []).append((x, job))
    if not lines:
        return None
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    panels: tuple[tuple[str, Callable[[JobResult], Any]], ...] = (
        ("preemptions per request", preemptions_per_request),
        ("output tok/s", _summary(mk.OUTPUT_TOKENS_PER_S)),
    )
    xs_all = sorted({x for line in lines.values() for x, _ in line})
    for index, (ax, (title, read)) in enumerate(zip(axes, panels, strict=True)):
        for label, line in lines.items():
            line.sort(key=lambda point: point[0])
            ys = [_value(read(job)) for _, job in line]
            legend = label if index == 0 and label else None
            ax.plot([x for x, _ in line], ys, marker="o", label=legend)
        if xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 8:
            ax.set_xscale("log", base=2)
        if len(xs_all) <= 12:
            ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
    if others:
        fig.legend(loc="outside right upper", fontsize="small", title=", ".join(others))
    fig.suptitle("Preemption and throughput against the KV pool size")
    return fig


_KV_PANELS = (
    Panel(
        "slot utilisation",
        (Series("slot utilisation", _summary(mk.KV_CACHE_SLOT_UTILIZATION)),),
        True,
    ),
    Panel(
        "KV cache usage",
        (
            Series("mean", _summary(mk.KV_CACHE_USAGE_PERC_MEAN)),
            Series("peak", _summary(mk.KV_CACHE_USAGE_PERC_PEAK), True),
        ),
        True,
    ),
    Panel(
        "running sequences",
        (
            Series("mean", _summary(mk.NUM_RUNNING_MEAN)),
            Series("peak", _summary(mk.NUM_RUNNING_PEAK), True),
        ),
    ),
)
_HIT_PANELS = (
    Panel(
        "prefix cache hit rate",
        (
            Series("hit rate", _summary(mk.PREFIX_CACHE_HIT_RATE)),
            Series("ideal", _summary(mk.PREFIX_CACHE_HIT_RATE_IDEAL), True),
        ),
        True,
    ),
)
_CAPACITY_PANELS = (
    Panel("KV pool (tokens)", (Series("pool tokens", pool_tokens),)),
    Panel(
        "KV bytes per token", (Series("bytes", lambda job: job.header.get("kv_bytes_per_token")),)
    ),
)


def figures(jobs: Sequence[JobResult]) -> dict[str, Any]:
    """The figures (see the module docstring) that the sweep's varied keys call for, from
    its completed jobs, by file name (none without completed jobs). Raises ImportError
    without matplotlib."""
    import matplotlib  # noqa: F401  (fail early and clearly when it is missing)

    swept = swept_keys(jobs)
    done = [job for job in jobs if job.is_completed]
    if not done:
        return {}
    drawn: dict[str, Any] = {}
    if "allocator" in swept:
        title = "KV utilisation and concurrency by allocator"
        drawn["kv_utilization.png"] = bar_figure(title, done, swept, ["allocator"], _KV_PANELS)
    prefix_focus = [k for k in ("workload.name", "prefix") if k in swept]
    if prefix_focus:
        title = "Prefix cache hit rate by " + " and ".join(prefix_focus)
        drawn["prefix_hit_rate.png"] = bar_figure(title, done, swept, prefix_focus, _HIT_PANELS)
    if len(done) >= 2 and swept:
        drawn["latency.png"] = latency_figure(done, swept)
    if any(k in swept for k in POOL_KEYS):
        drawn["pool_size.png"] = _pool_figure(done, swept)
    if "quantizer" in swept:
        title = "KV capacity by quantizer"
        drawn["capacity.png"] = bar_figure(title, done, swept, ["quantizer"], _CAPACITY_PANELS)
    return {name: fig for name, fig in drawn.items() if fig is not None}


def write_plots(jobs: Sequence[JobResult], folder: str | Path) -> list[Path]:
    """Writes ``figures(jobs)`` into ``folder`` as PNG files; returns their paths. Raises
    ImportError without matplotlib."""
    paths = []
    for name, fig in figures(jobs).items():
        paths.append(Path(folder) / name)
        fig.savefig(paths[-1], dpi=100)
    return paths

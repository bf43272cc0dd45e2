"""One table of a sweep's jobs: markdown for people, CSV for programs.

Rows are jobs (in folder order); columns are ``job``, the swept override keys, ``status``,
then ``METRIC_COLUMNS`` (blank for a job that did not complete), and in the CSV every
override key (fixed ones too) and the full ``error``. The markdown shows fixed overrides
in a line above the table, failed jobs' errors below it, then the combinations a plugin
refused (not run, no row of their own; see ``enginekit.sweep.refusals``), each reason
once; the CSV has a ``refused`` row for each. The compact markdown, printed at the end of
a sweep, keeps the swept choices, status and ``COMPACT_METRICS``. Values are the summary's
(fractions stay fractions in the CSV, latencies are in ms); the markdown shows fractions
as percentages.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from enginekit import metric_keys as mk
from enginekit.sweep.jobs import JobResult, fixed_overrides, job_label, swept_keys


class Column(NamedTuple):
    """A metric column: its name, how to read it from a job (None: no value) and whether
    it is a fraction (shown as a percentage in markdown)."""

    name: str
    read: Callable[[JobResult], Any]
    is_fraction: bool = False


def _summary(metric: mk.MetricKey) -> Callable[[JobResult], Any]:
    return lambda job: job.summary.get(metric.key)


def _metric(name: str, metric: mk.MetricKey) -> Column:
    """The column ``name`` of the summary's ``metric``, a fraction when the metric is one."""
    return Column(name, _summary(metric), metric.unit is mk.Unit.FRACTION)


def _latency_ms(metric: mk.MetricKey, stat: str) -> Callable[[JobResult], Any]:
    def read(job: JobResult) -> Any:
        value = (job.summary.get(metric.key) or {}).get(stat)
        return None if value is None else 1e3 * value

    return read


def pool_tokens(job: JobResult) -> int | None:
    """Token slots of the KV pool: blocks × block size (None without both)."""
    blocks = job.summary.get(mk.KV_CACHE_NUM_BLOCKS.key)
    block_size = job.header.get("block_size")
    return None if blocks is None or block_size is None else int(blocks) * int(block_size)


def preemptions_per_request(job: JobResult) -> float | None:
    """Preemptions divided by requests (None without requests)."""
    num = job.summary.get(mk.NUM_PREEMPTIONS_TOTAL.key)
    requests = job.summary.get(mk.NUM_REQUESTS.key)
    return None if num is None or not requests else num / requests


_TTFT = mk.TIME_TO_FIRST_TOKEN_SECONDS
_TPOT = mk.TIME_PER_OUTPUT_TOKEN_SECONDS

METRIC_COLUMNS: tuple[Column, ...] = (
    _metric("requests_finished", mk.NUM_REQUESTS_FINISHED),
    _metric("hit_rate", mk.PREFIX_CACHE_HIT_RATE),
    _metric("hit_rate_ideal", mk.PREFIX_CACHE_HIT_RATE_IDEAL),
    _metric("slot_util", mk.KV_CACHE_SLOT_UTILIZATION),
    _metric("kv_usage_mean", mk.KV_CACHE_USAGE_PERC_MEAN),
    _metric("kv_usage_peak", mk.KV_CACHE_USAGE_PERC_PEAK),
    _metric("running_mean", mk.NUM_RUNNING_MEAN),
    _metric("running_peak", mk.NUM_RUNNING_PEAK),
    _metric("preemptions", mk.NUM_PREEMPTIONS_TOTAL),
    Column("ttft_p50_ms", _latency_ms(_TTFT, "p50")),
    Column("ttft_p90_ms", _latency_ms(_TTFT, "p90")),
    Column("ttft_p99_ms", _latency_ms(_TTFT, "p99")),
    Column("tpot_p50_ms", _latency_ms(_TPOT, "p50")),
    Column("tpot_p90_ms", _latency_ms(_TPOT, "p90")),
    Column("tpot_p99_ms", _latency_ms(_TPOT, "p99")),
    _metric("output_tok_s", mk.OUTPUT_TOKENS_PER_S),
    Column("kv_bytes_per_token", lambda job: job.header.get("kv_bytes_per_token")),
    _metric("pool_blocks", mk.KV_CACHE_NUM_BLOCKS),
    Column("pool_tokens", pool_tokens),
    _metric("pool_gib", mk.KV_CACHE_POOL_GIB),
)


def _cell(value: Any, is_fraction: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value).replace("|", "\\|").replace("\n", " ")
    if is_fraction:
        return f"{100 * value:.1f} %"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _row(job: JobResult, keys: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"job": job.name}
    row.update({key: job.overrides.get(key) for key in keys})
    row["status"] = job.status
    for column in METRIC_COLUMNS:
        row[column.name] = column.read(job) if job.is_completed else None
    return row


def table_rows(jobs: Sequence[JobResult]) -> list[dict[str, Any]]:
    """The markdown table's rows as dicts (job, swept keys, status, metric columns): one per
    job that ran (refused ones are listed apart)."""
    keys = swept_keys(jobs)
    return [_row(job, keys) for job in jobs if not job.is_refused]


def _words(keys: Sequence[str], values: Sequence[str | None]) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True) if v is not None)


def _combinations(jobs: Sequence[JobResult], keys: Sequence[str]) -> list[str]:
    """The jobs' values of ``keys`` as ``key=value`` words, as few as say them exactly: one
    line in sweep form (``quantizer=none,fp8``) when they are the whole grid of their
    values, else one line per job."""
    combos = list(dict.fromkeys(tuple(job.overrides.get(k) for k in keys) for job in jobs))
    axes = [list(dict.fromkeys(combo[i] for combo in combos)) for i in range(len(keys))]
    if math.prod(len(axis) for axis in axes) != len(combos):
        return [_words(keys, combo) for combo in combos]
    merged = [",".join(v for v in axis if v is not None) or None for axis in axes]
    return [_words(keys, merged)]


def refused_lines(jobs: Sequence[JobResult]) -> list[str]:
    """The refused jobs as a markdown list: each plugin's reason once, with the
    combinations of swept choices it refused and how many. [] when none was refused."""
    refused = [job for job in jobs if job.is_refused]
    if not refused:
        return []
    keys = swept_keys(jobs)
    by_reason: dict[str, list[JobResult]] = {}
    for job in refused:
        by_reason.setdefault(job.error or "no reason given", []).append(job)
    lines = [
        f"## Refused combinations ({len(refused)})",
        "",
        "A selected plugin's `check_compatible` refuses these: they stopped there, before "
        "anything was built.",
        "",
    ]
    for reason, group in by_reason.items():
        count = f"{len(group)} combination{'s' * (len(group) > 1)}"
        lines.append(f"- {count}: {_cell(reason, False)}")
        lines += [f"  - `{words}`" for words in _combinations(group, keys)]
    return lines


COMPACT_METRICS: tuple[str, ...] = (
    "hit_rate",
    "running_mean",
    "preemptions",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "output_tok_s",
)


def render_markdown(jobs: Sequence[JobResult], title: str = "Sweep", compact: bool = False) -> str:
    """The table as a markdown document: a title line, the counts, the fixed overrides,
    the table of the jobs that ran, the errors of those that did not complete, then the
    combinations refused without running. ``compact`` keeps only the ``COMPACT_METRICS``
    columns (the printed table; summary.md has them all)."""
    keys = swept_keys(jobs)
    ran = [job for job in jobs if not job.is_refused]
    num_refused = len(jobs) - len(ran)
    fractions = {c.name for c in METRIC_COLUMNS if c.is_fraction}
    num_done = sum(job.is_completed for job in ran)
    counts = f"{len(ran)} jobs: {num_done} completed, {len(ran) - num_done} not"
    if num_refused:
        plural = "s" * (num_refused > 1)
        counts += f"; {num_refused} combination{plural} refused by their plugins (listed below)"
    lines = [f"# {title}", "", counts + "."]
    fixed = fixed_overrides(jobs)
    if fixed:
        lines += ["", "Fixed: " + " ".join(f"`{k}={v}`" for k, v in fixed.items())]
    metrics = [c.name for c in METRIC_COLUMNS if not compact or c.name in COMPACT_METRICS]
    names = ["job", *keys, "status", *metrics]
    if ran:
        lines += ["", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for job in ran:
        row = _row(job, keys)
        lines.append("| " + " | ".join(_cell(row[n], n in fractions) for n in names) + " |")
    failed = [job for job in ran if not job.is_completed]
    if failed:
        lines += ["", "## Jobs that did not complete", ""]
        lines += [f"- job {j.name} ({job_label(j, keys)}), {j.status}: {j.error}" for j in failed]
    refused = refused_lines(jobs)
    if refused:
        lines += ["", *refused]
    return "\n".join(lines) + "\n"


def render_csv(jobs: Sequence[JobResult]) -> str:
    """The table as CSV: job, every override key, status, metric columns (raw values),
    error. Empty cells for missing values."""
    all_keys: dict[str, None] = {}
    for job in jobs:
        all_keys.update(dict.fromkeys(job.overrides))
    names = ["job", *all_keys, "status", *(c.name for c in METRIC_COLUMNS), "error"]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for job in jobs:
        row: Mapping[str, Any] = {**_row(job, list(all_keys)), "error": job.error}
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue()

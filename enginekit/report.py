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

from enginekit.metrics import LATENCY_KEYS

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
    return lambda value: _num(value) if value is None else f"{_num(value)} {unit}"


_SECTIONS: tuple[tuple[str, tuple[tuple[str, str, _Fmt], ...]], ...] = (
    (
        "tokens",
        (
            ("num_requests", "requests", _num),
            ("num_requests_rejected", "requests rejected", _num),
            ("num_requests_finished", "requests finished", _num),
            ("prompt_tokens_total", "prompt tokens", _num),
            ("generation_tokens_total", "generated tokens", _num),
            ("num_steps", "steps", _num),
            ("prefill_tokens_computed", "prefill tokens computed", _num),
            ("decode_tokens_computed", "decode tokens computed", _num),
        ),
    ),
    (
        "prefix cache",
        (
            ("prefix_cache_queries", "queried", _unit("tokens")),
            ("prefix_cache_hits", "hit", _unit("tokens")),
            ("prefix_cache_hit_rate", "hit rate", _perc),
            ("prefix_cache_first_hit_rate", "hit rate, first admissions", _perc),
            ("prefix_cache_readmission_queries", "queried again after preemption", _unit("tokens")),
            ("prefix_cache_readmission_hit_rate", "hit rate, re-admissions", _perc),
            ("prefix_cache_ideal_granularity", "ideal counted in", lambda v: _num(v) + "s"),
            ("prefix_cache_hits_ideal", "ideal hit", _unit("tokens")),
            ("prefix_cache_hit_rate_ideal", "ideal hit rate (of prompt tokens)", _perc),
        ),
    ),
    (
        "KV cache",
        (
            ("kv_cache_num_blocks", "pool", _unit("blocks")),
            ("kv_cache_block_bytes", "block", _unit("bytes")),
            ("kv_cache_pool_gb", "pool size", _unit("GB")),
            ("kv_cache_usage_perc_mean", "usage mean (time-weighted)", _perc),
            ("kv_cache_usage_perc_peak", "usage peak", _perc),
            ("kv_cache_unused_slots_mean", "unused slots mean", _unit("tokens")),
            ("kv_cache_unused_slots_peak", "unused slots peak", _unit("tokens")),
            ("kv_cache_slot_utilization", "slot utilization", _perc),
            ("kv_cache_sharing_saving", "saved by sharing", _perc),
            ("kv_cache_unusable_free_blocks_mean", "unusable free blocks mean", _unit("blocks")),
            ("num_running_mean", "running sequences mean", _num),
            ("num_running_peak", "running sequences peak", _num),
            ("num_waiting_peak", "waiting requests peak", _num),
        ),
    ),
    (
        "preemption",
        (
            ("num_preemptions_total", "preemptions", _num),
            ("num_preemptions_by_kind", "by kind", _num),
            ("recomputed_tokens_total", "recomputed", _unit("tokens")),
            ("swap_out_bytes_total", "swapped out", _unit("bytes")),
            ("swap_in_bytes_total", "swapped in", _unit("bytes")),
        ),
    ),
    (
        "throughput",
        (
            ("duration_s", "duration", _unit("s")),
            ("busy_time_s", "busy (sum of step times)", _unit("s")),
            ("output_tokens_per_s", "output", _unit("tok/s")),
            ("total_tokens_per_s", "prompt + output", _unit("tok/s")),
            ("output_tokens_per_s_per_kv_gb", "output per GB of KV pool", _unit("tok/s/GB")),
        ),
    ),
)

_LATENCY_LABELS = {
    "time_to_first_token_seconds": "TTFT",
    "time_per_output_token_seconds": "TPOT",
    "e2e_request_latency_seconds": "e2e",
}
_LATENCY_COLUMNS = ("mean", "p50", "p90", "p99")


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(label) for label, _ in rows)
    return [f"== {title} =="] + [f"  {label:<{width}}  {text}" for label, text in rows] + [""]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def _latency_lines(summary: Mapping[str, Any]) -> list[str]:
    present = [key for key in LATENCY_KEYS if key in summary]
    if not present:
        return []
    head = f"  {'':<6}{'n':>8}" + "".join(f"{col:>12}" for col in _LATENCY_COLUMNS)
    lines = ["== latency (ms) ==", head]
    for key in present:
        stats = summary[key] or {}
        cells = "".join(f"{_ms(stats.get(col)):>12}" for col in _LATENCY_COLUMNS)
        lines.append(f"  {_LATENCY_LABELS[key]:<6}{stats.get('count', 0):>8}{cells}")
    return lines + [""]


def render_report(summary: Mapping[str, Any], header: Mapping[str, Any]) -> str:
    """The run as a plain-text report: a "run" section from ``header`` (plugins, model,
    hardware, executor, anything else it holds), then tokens, prefix cache, KV cache,
    preemption, latency (mean/p50/p90/p99 in ms) and throughput; keys it does not know
    go under "other". Pure."""
    lines = _rows("run", [(str(key), _num(value)) for key, value in header.items()])
    placed: set[str] = set(LATENCY_KEYS)
    for title, fields in _SECTIONS:
        rows = [(label, fmt(summary[key])) for key, label, fmt in fields if key in summary]
        placed.update(key for key, _, _ in fields)
        lines += _rows(title, rows)
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
    as strict JSON (NaN refused) to ``path``, creating parent folders. A job that could
    not run writes ``status=STATUS_FAILED``, its error message and an empty summary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"status": status, "error": error, "header": header, "summary": summary}
    text = json.dumps(data, indent=2, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def read_json(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(summary, header)`` as ``write_json`` stored them."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return data["summary"], data["header"]

"""The text report shows every key; the JSON round-trips."""

from __future__ import annotations

import json
import math

import pytest

from enginekit.metrics import LATENCY_KEYS, RunMetrics
from enginekit.report import _SECTIONS, read_json, render_report, write_json
from enginekit.step import KVUsage

HEADER = {
    "plugins": {
        "allocator": "paged",
        "prefix": "radix",
        "quantizer": "none",
        "eviction": "lru",
        "preemption": "recompute",
    },
    "model": "llama-3-8b",
    "hardware": "h200",
    "executor": "sim",
}


def step_usage(used: int, total: int, unused: int) -> KVUsage:
    """The cache's usage after a step, as the engine reports it (no table blocks)."""
    return KVUsage(total, used, 0, total - used, 0, 0, unused)


def summary() -> dict:
    m = RunMetrics()
    m.on_request_added("a", 0.0, 100)
    m.on_request_added("b", 0.5, 50)
    m.on_prefix_query(150, 64)
    m.on_step(0.25, 0.25, 150, 0, 2, 0, step_usage(used=10, total=1000, unused=7))
    m.on_first_token("a", 0.25)
    m.on_first_token("b", 0.75)
    m.on_preemption("swap", 0)
    m.on_request_finished("a", 1.25, 5)
    m.on_request_finished("b", 2.0, 9)
    return m.summary(kv_bytes_per_block=2 * 1024 * 1024, ideal_hit_tokens=64)


def test_renders_every_key_with_sections_and_units():
    s = summary()
    s["custom_metric"] = 12.5
    text = render_report(s, HEADER)
    for title in (
        "run",
        "tokens",
        "prefix cache",
        "KV cache",
        "preemption",
        "latency (ms)",
        "throughput",
        "other",
    ):
        assert f"== {title} ==" in text
    labelled = {key: label for _, fields in _SECTIONS for key, label, _ in fields}
    for key in s:
        if key in LATENCY_KEYS:
            continue
        assert (labelled.get(key) or key) in text, key
    assert "custom_metric" in text and "12.5" in text
    for label in ("TTFT", "TPOT", "e2e"):
        assert label in text
    assert "prefix=radix" in text and "llama-3-8b" in text and "h200" in text
    assert "swap=1" in text
    assert "tok/s" in text and "%" in text and "GiB" in text
    assert " GB" not in text and "/GB" not in text  # the pool in one unit, GiB
    # TTFT of a and b: 250 ms each.
    ttft_line = next(line for line in text.splitlines() if line.strip().startswith("TTFT"))
    assert ttft_line.split()[1:] == ["2", "250.00", "250.00", "250.00", "250.00"]


def test_renders_an_empty_run():
    text = render_report(RunMetrics().summary(kv_bytes_per_block=1), {"executor": "sim"})
    assert "== latency (ms) ==" in text
    assert " - " in text or text.rstrip().endswith("-")


def test_json_round_trips(tmp_path):
    s = summary()
    path = tmp_path / "out" / "run.json"
    write_json(s, HEADER, path)
    assert read_json(path) == (s, HEADER)
    assert json.loads(path.read_text())["summary"]["prompt_tokens_total"] == 150


def test_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        write_json({"x": math.nan}, {}, tmp_path / "bad.json")

"""The vendored Mooncake conversation trace (``benchmarks/data/mooncake/``): its licence
and provenance beside it, every line valid, and its longest request served whole by
``model=llama-3.1-8b`` in the simulator (the whole trace is ``bench_tiers``'s to replay)."""

from __future__ import annotations

import json

from conftest import REPO_ROOT

from enginekit import metric_keys as mk
from enginekit.app import compose_config
from enginekit.config import WorkloadConfig
from enginekit.driver import WorkloadDriver
from enginekit.engine import Engine
from enginekit.spec.model import model_preset
from enginekit.workloads.trace import open_trace

DATA = REPO_ROOT / "benchmarks" / "data" / "mooncake"
TRACE = DATA / "conversation_trace.jsonl"


def test_the_trace_keeps_its_licence_and_says_where_it_comes_from():
    assert "Apache License" in (DATA / "LICENSE").read_text(encoding="utf-8")
    readme = " ".join((DATA / "README.md").read_text(encoding="utf-8").split())
    for fact in ("kvcache-ai/Mooncake", "FAST25-release/traces", "Apache-2.0", "`LICENSE`"):
        assert fact in readme


def test_every_line_is_a_mooncake_request_that_fits_a_128k_context():
    workload = open_trace(WorkloadConfig(name="trace", path=str(TRACE)), 128256, 131072)
    assert workload.num_requests == 12031
    assert workload.source == "trace conversation_trace.jsonl (mooncake, 12,031 requests)"
    lines = [json.loads(line) for line in TRACE.read_text(encoding="utf-8").splitlines()]
    longest = max(line["input_length"] + line["output_length"] for line in lines)
    assert max(line["input_length"] for line in lines) == 126195
    assert longest <= model_preset("llama-3.1-8b").max_model_len < longest * 2
    assert longest > model_preset("llama-3-8b").max_model_len


def test_its_longest_request_is_served_by_llama_3_1_8b(tmp_path):
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    longest = max(lines, key=lambda line: json.loads(line)["input_length"])
    one = tmp_path / "longest.jsonl"
    one.write_text(longest + "\n", encoding="utf-8")
    engine = Engine(
        compose_config(
            ["progress=false", "model=llama-3.1-8b", "hardware=h200", "workload=trace",
             f"workload.path={one}"]
        )
    )  # fmt: skip
    driver = WorkloadDriver(engine)
    driver.add_workload()
    summary = driver.run().summary
    assert summary[mk.NUM_REQUESTS_REJECTED.key] == 0
    assert summary[mk.NUM_REQUESTS_FINISHED.key] == 1
    assert summary[mk.PROMPT_TOKENS_TOTAL.key] == 126195

"""benchmarks/bench_cache_manager.py: its replay, at a tiny size with the manager's integrity
checked after every step, serves every request, counts what it generated and hit, and
counts the same with the Rust structures as with their Python twins."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import REPO_ROOT

from enginekit.config import WorkloadConfig

_spec = importlib.util.spec_from_file_location(
    "bench_cache_manager", REPO_ROOT / "benchmarks" / "bench_cache_manager.py"
)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up while the class is made
_spec.loader.exec_module(bench)

BIG_POOL = 2048  # holds every block of every trace below at once: nothing is ever evicted
SMALL_POOL = 24  # a few requests at a time: decodes preempt, preempted requests come back


def _traces() -> list:
    short = {"min_output_len": 4, "max_output_len": 24}
    return [
        bench.workload_trace(
            WorkloadConfig(
                name="multiturn",
                num_requests=36,
                shared_prefix_len=40,
                min_turns=2,
                max_turns=4,
                message_len=12,
                think_time_s=0.03,
                **short,
            )
        ),
        bench.workload_trace(
            WorkloadConfig(
                name="odd_lengths",
                num_requests=24,
                shared_prefix_len=90,
                num_documents=3,
                **short,
            )
        ),
    ]


TRACES = _traces()


def _full_lengths(trace) -> Iterator[int]:
    """Tokens of each request's whole sequence (a later turn: with the context in front)."""
    lengths: dict[str, int] = {}
    for turn in trace.turns:
        context = lengths[turn.follows] if turn.follows and turn.prepend_context else 0
        lengths[turn.request_id] = context + len(turn.prompt_token_ids) + len(turn.output_token_ids)
        yield lengths[turn.request_id]


def test_the_big_pool_holds_every_block_of_every_trace() -> None:
    for trace in TRACES:
        assert sum(math.ceil(n / bench.BLOCK_SIZE) for n in _full_lengths(trace)) < BIG_POOL
        assert max(_full_lengths(trace)) <= SMALL_POOL * bench.BLOCK_SIZE // 2


@pytest.mark.parametrize("trace", TRACES, ids=lambda t: t.name)
def test_replays_serve_every_request_and_both_backends_count_the_same(trace) -> None:
    results = {}
    for num_blocks in (BIG_POOL, SMALL_POOL):
        for prefix in bench.PREFIXES:
            rust = bench.replay(trace, num_blocks, prefix, native=True, check_every=1)
            python = bench.replay(trace, num_blocks, prefix, native=False, check_every=1)
            assert (rust.backend, python.backend) == ("rust", "python")
            assert rust.counts() == python.counts()  # the twins are the executable spec
            for result in (rust, python):
                assert result.num_finished == result.num_requests == len(trace.turns)
                assert result.num_generated_tokens == trace.num_scripted_tokens
                assert result.num_first_admissions == len(trace.turns)
                assert result.num_readmissions <= result.num_preemptions
                for rate in (result.first_hit_rate, result.readmit_hit_rate):
                    assert rate is None or 0.0 <= rate <= 1.0
                assert 0 < result.peak_used_blocks <= num_blocks
                assert result.manager_ns >= 0 and result.num_timed_batches > result.num_steps
            results[num_blocks, prefix] = rust
    big_hash, big_radix = results[BIG_POOL, "block_hash"], results[BIG_POOL, "radix"]
    for result in (big_hash, big_radix):
        assert result.num_preemptions == 0 and result.readmit_hit_rate is None
        assert result.num_first_hit_tokens > 0  # later turns and documents are shared
    assert big_radix.num_first_hit_tokens >= big_hash.num_first_hit_tokens
    for prefix in bench.PREFIXES:
        small = results[SMALL_POOL, prefix]
        assert small.num_preemptions > 0 and small.num_readmissions > 0
        assert small.peak_used_blocks <= SMALL_POOL


def test_the_first_prompt_tokens_are_every_request_prompt() -> None:
    trace = TRACES[0]
    result = bench.replay(trace, BIG_POOL, "block_hash", native=True)
    assert result.num_first_prompt_tokens == sum(
        full - len(turn.output_token_ids)
        for full, turn in zip(_full_lengths(trace), trace.turns, strict=True)
    )


def test_main_writes_a_row_per_backend_and_prints_a_table(tmp_path, capsys) -> None:
    path = tmp_path / "rows.json"
    bench.main(
        ["--workloads", "unique", "--requests", "6", "--pools", "256", "--check", "1"]
        + ["--json", str(path)]
    )
    printed = capsys.readouterr().out
    assert "| 256 | block_hash |" in printed and "| 256 | radix |" in printed
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert [(r["prefix"], r["backend"]) for r in rows] == [
        ("block_hash", "rust"),
        ("block_hash", "python"),
        ("radix", "rust"),
        ("radix", "python"),
    ]
    assert all(r["workload"] == "unique" and r["num_finished"] == 6 for r in rows)
    assert set(rows[0]["phase_ns"]) == set(bench.PHASES)
    assert data["meta"]["num_requests"] == 6


def test_the_instruction_count_toggles_callgrind_at_both_ends_of_every_batch(tmp_path) -> None:
    """Outside valgrind the toggle does nothing: the replay runs as it would under it, and
    the script checks that it toggled twice per timed batch."""
    lib = tmp_path / "toggle.so"
    source = REPO_ROOT / "tools" / "callgrind_toggle.c"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, source], check=True)
    script = REPO_ROOT / "tools" / "count_manager_instructions.py"

    def stderr_of(*args: str) -> str:
        run = [sys.executable, script, lib, *args]
        return subprocess.run(run, capture_output=True, text=True, check=True).stderr

    args = ["--workload", "unique", "--requests", "6", "--pool", "256", "--prefix", "radix"]
    assert re.fullmatch(
        r"unique at 256 blocks, radix: [1-9][\d,]* generated tokens, [\d,]+ steps, "
        r"[1-9][\d,]* batches\n",
        stderr_of(*args),
    )
    assert stderr_of("--empty", "5") == "5 empty batches\n"
    assert stderr_of("--scheduler-step", "radix") == "300 steps of schedule + update, radix\n"
    assert stderr_of("--engine-step", "block_hash") == "300 steps of engine step, block_hash\n"
    both = [sys.executable, script, lib, "--scheduler-step", "radix", "--engine-step", "radix"]
    refused = subprocess.run(both, capture_output=True, text=True)
    assert refused.returncode == 2 and "not allowed with argument" in refused.stderr

"""The command line: defaults, plugin selection, sweeps, help and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SMALL


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def test_plugins_selected_from_command_line_run_and_report(cli, tmp_path):
    result = cli("+allocator=paged", "+prefix=block_hash", *SMALL, "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr
    assert "prefix" in result.stdout.lower()
    report = _report(tmp_path / "run")
    assert report["summary"]["num_requests"] == 40
    assert report["header"]["prefix"].startswith("block_hash (enginekit-plugins")


def test_plain_group_syntax_is_accepted(cli, tmp_path):
    result = cli("prefix=none", "model=llama-2-7b", *SMALL, "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr
    report = _report(tmp_path / "run")
    assert report["header"]["prefix"].startswith("none ")
    assert report["header"]["model"] == "llama-2-7b"
    assert report["summary"]["prefix_cache_hits"] == 0


def test_multirun_sweeps_plugins(cli, tmp_path):
    result = cli("-m", "+prefix=none,block_hash", *SMALL, "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr
    reports = [_report(tmp_path / "sweep" / str(i)) for i in range(2)]
    assert {r["header"]["prefix"].split()[0] for r in reports} == {"none", "block_hash"}
    hits = {r["header"]["prefix"].split()[0]: r["summary"]["prefix_cache_hits"] for r in reports}
    assert hits["none"] == 0 < hits["block_hash"]


def test_multirun_with_joblib_launcher(cli, tmp_path):
    result = cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "+prefix=none,block_hash",
        *SMALL,
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "sweep" / "0" / "report.json").exists()
    assert (tmp_path / "sweep" / "1" / "report.json").exists()
    assert (tmp_path / "sweep" / "summary.md").exists()  # written once, by the main process


def test_help_lists_every_installed_plugin_as_typed(cli):
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "+allocator=contiguous | paged*" in out
    assert "+prefix=block_hash* | none | radix" in out
    assert "+eviction=lru*" in out
    assert "+preemption=recompute* | swap" in out
    assert "+quantizer=fp8 | int4 | none*" in out
    assert "model=" in out and "llama-3-8b*" in out
    assert "group=option" not in out  # Hydra's own wording would mislead
    ablations = next(line for line in out.splitlines() if line.startswith("  -m +ablation="))
    for name in ["all", "allocator", "eviction", "preemption", "prefix", "quantizer"]:
        assert name in ablations.split("=", 1)[1].split(" | ")
    assert "python -m enginekit.sweep <sweep folder>" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["+allocator=pagd"],
            [
                "unknown allocator plugin 'pagd'",
                "installed: contiguous, paged",
                "did you mean 'paged'",
            ],
        ),
        (
            ["+prefix=radixx"],
            ["unknown prefix plugin 'radixx'", "block_hash, none, radix", "'radix'"],
        ),
        (["cache.blok_size=8"], ["unknown key 'cache.blok_size'", "'cache.block_size'"]),
        (["sheduler.max_num_seqs=8"], ["unknown key 'sheduler.max_num_seqs'", "'scheduler'"]),
        (["++allocator=paged"], ["+allocator=paged"]),
        (["ablation=prefx"], ["unknown ablation 'prefx'", "allocator, eviction", "'prefix'"]),
        (["+experiment=tiny"], ["unknown experiment 'tiny'", "tiny_chat"]),
    ],
)
def test_bad_input_is_named_with_what_is_valid(cli, args, expected):
    result = cli(*args, *SMALL)
    assert result.returncode != 0
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_value_of_wrong_type_names_the_key(cli):
    result = cli("cache.block_size=big", *SMALL)
    assert result.returncode != 0
    assert "cache.block_size" in result.stderr
    assert "big" in result.stderr


def test_semantic_config_error_names_the_key(cli):
    result = cli("cache.block_size=0", *SMALL)
    assert result.returncode == 2
    assert "cache.block_size must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_refused_single_run_exits_2_and_writes_a_failed_report(cli, tmp_path):
    result = cli("+allocator=contiguous", "+prefix=radix", *SMALL, "hydra.run.dir=run")
    assert result.returncode == 2
    assert "error: +allocator=contiguous cannot be combined with +prefix=radix" in result.stderr
    assert "Traceback" not in result.stderr
    report = _report(tmp_path / "run")
    assert report["status"] == "failed" and "cannot be combined" in report["error"]
    assert report["header"]["allocator"] == "contiguous" and report["summary"] == {}


def test_plugins_command_lists_distribution_and_version(cli):
    result = cli(module="enginekit.plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["group", "name", "distribution", "version", "target"]
    rows = {tuple(line.split()[:3]) for line in lines[1:]}
    for group, name in [
        ("allocator", "paged"),
        ("allocator", "contiguous"),
        ("prefix", "radix"),
        ("preemption", "swap"),
        ("prefix", "none"),
        ("prefix", "block_hash"),
        ("quantizer", "none"),
        ("eviction", "lru"),
        ("preemption", "recompute"),
    ]:
        assert (group, name, "enginekit-plugins") in rows


def test_readme_main_job_runs_real_tokens_on_the_tiny_model(cli, tmp_path):
    result = cli("+experiment=tiny_chat", "progress=false", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr
    report = _report(tmp_path / "run")
    assert report["header"]["executor"] == "torch"
    assert report["header"]["model"] == "tiny"
    summary = report["summary"]
    assert summary["num_requests_finished"] == 64
    assert summary["prefix_cache_hits"] == summary["prefix_cache_hits_ideal"] > 0
    experiments = next(line for line in cli("--help").stdout.splitlines() if "+experiment=" in line)
    assert "tiny_chat" in experiments.split("=", 1)[1].split(" | ")

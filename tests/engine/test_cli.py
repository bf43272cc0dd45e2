"""The command line: defaults, plugin selection, sweeps, help and errors."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import SMALL
from omegaconf import OmegaConf


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
    assert "+eviction=chain_aware | lfu | lru* | sliding_window | slru" in out
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


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["cache.block_size=big"],
            "cache.block_size=big: cache.block_size takes an integer, not 'big'",
        ),
        (["-m", "cache.block_size=16,big"], "cache.block_size takes an integer, not 'big'"),
        (["cache.watermark=abc"], "cache.watermark=abc: cache.watermark takes a number, not 'abc'"),
        (["progress=maybe"], "progress takes true or false, not 'maybe'"),
        (["cache.block_size=null"], "cache.block_size takes an integer, not null"),
        (["+quantizer=int4", "quantizer.group_size=abc"], "quantizer.group_size takes an integer"),
        (
            ["quantizer.group_size=32"],
            "quantizer.group_size is a key of the quantizer plugin int4, not of the "
            "selected quantizer 'none': add +quantizer=int4 to set it",
        ),
        (
            ["+quantizer=fp8", "quantizer.group_size=32"],
            "not of the selected quantizer 'fp8': add +quantizer=int4 to set it",
        ),
        (
            ["quantizer.group_sise=32"],
            "unknown key 'quantizer.group_sise'; did you mean 'quantizer.group_size'? It is a "
            "key of int4, not of the selected quantizer 'none': add +quantizer=int4",
        ),
        (
            ["+quantizer=int4", "quantizer.group_sise=32"],
            "the selected quantizer 'int4' has name, group_size; did you mean "
            "'quantizer.group_size'?",
        ),
        (
            ["quantizer.grup=3"],
            "other quantizer plugins add quantizer.calibration_margin (+quantizer=fp8), "
            "quantizer.group_size (+quantizer=int4)",
        ),
    ],
)
def test_a_bad_value_or_a_key_of_a_plugin_not_selected_is_refused_by_name(args, expected):
    from enginekit.app import rewrite_overrides
    from enginekit.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        rewrite_overrides(args)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["cache.block_size=big"],
            "error: cache.block_size=big: cache.block_size takes an integer",
        ),
        (["quantizer.group_size=32"], "error: quantizer.group_size is a key of the quantizer"),
    ],
)
def test_a_refused_value_or_plugin_key_exits_2_with_one_line(cli, args, expected):
    result = cli(*args, *SMALL)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith(expected)


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


# ---- in-process runs of main() ---------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
TINY = ["workload.num_requests=8"]  # a workload of a few requests: a run takes well under 1 s


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """Calls ``enginekit.__main__.main(args)`` in ``tmp_path``; returns (exit code, stdout,
    stderr). Hydra's logging setup is undone afterwards."""
    import logging

    from hydra.core.global_hydra import GlobalHydra

    from enginekit.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["enginekit"])  # main() rewrites sys.argv

    def call(*args: str) -> tuple[int, str, str]:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            GlobalHydra.instance().clear()
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("+prefx=radix", ["unknown group 'prefx'", "did you mean '+prefix'?"]),
        ("+foo=bar", ["unknown group 'foo'", "allocator, prefix", "experiment, ablation"]),
        ("+_target_=os.system", ["unknown group '_target_'"]),
        ("+foo-bar/x=1", ["unknown group 'foo-bar/x'"]),
        ("+progress=false", ["progress is a key, not a group; write progress=false"]),
    ],
)
def test_plus_with_no_such_group_is_refused(run_main, arg, expected):
    code, out, err = run_main(arg, *TINY)
    assert code == 2
    for text in expected:
        assert text in err
    assert "== run ==" not in out  # nothing ran


def test_hydra_flags_take_their_value_as_the_next_argument(run_main):
    from enginekit.app import rewrite_overrides

    args = ["--cfg", "job", "--package", "cache", "--info", "config", "-cn", "x", "-m"]
    assert rewrite_overrides([*args, "prefix=radix"]) == [*args, "+prefix=radix"]
    # An optional value is taken only if it is one: "--info" then an override.
    assert rewrite_overrides(["--info", "prefix=radix"]) == ["--info", "+prefix=radix"]
    code, out, err = run_main("--cfg", "job", "+prefix=radix", "cache.block_size=32")
    assert code == 0, err
    assert "prefix:\n  name: radix" in out and "block_size: 32" in out
    code, out, err = run_main("--cfg", "job", "--package", "cache")
    assert code == 0, err
    assert out.startswith("# @package cache\nblock_size: 16")
    code, out, err = run_main("--cfg", "hydra")
    assert code == 0, err
    assert "run:\n    dir: outputs/" in out
    code, out, err = run_main("--info", "config")
    assert code == 0, err
    assert "Config search path" in out
    assert not list(Path().glob("outputs"))  # nothing ran


def test_help_lists_the_keys_of_every_plugin_with_defaults(run_main):
    from enginekit.plugins import config_keys, load_all_configs

    code, out, err = run_main("--help")
    assert code == 0, err
    configs, _ = load_all_configs()
    lines = out.splitlines()
    for group, options in configs.items():
        for name, config_cls in options.items():
            for key, value in config_keys(config_cls).items():
                line = next(line for line in lines if line.startswith(f"      {name}: "))
                shown = "null" if value is None else str(value).lower()
                assert f"{group}.{key}={shown}" in line.lower()
    assert "      int4: quantizer.group_size=64" in lines
    assert "eviction.window=null" in out and "preemption.swap_space_gib=4.0" in out
    assert "+group=plugin" in out and "group=option" not in out


def test_readme_presets_list_every_preset():
    from enginekit.app import preset_names

    readme = (REPO / "README.md").read_text()
    presets = readme[readme.index("Presets: `model=`") :].split("A misspelt", 1)[0]
    listed = re.sub(r"\([^()]*\)", "", presets)  # the names, without their descriptions
    for group, names in preset_names().items():
        part = re.split(r"`\w+=`", listed.split(f"`{group}=`", 1)[1])[0]
        assert {n.strip(" .;\n") for n in part.split(",")} == set(names), group


def test_a_run_that_serves_nothing_fails_with_the_reason(run_main, tmp_path):
    code, _, err = run_main("cache.num_blocks=4", *TINY, "hydra.run.dir=rejected")
    assert code == 2
    assert "all 8 requests were rejected, so nothing ran" in err
    assert re.search(r"the first: request .*needs \d+ KV blocks.* the whole cache has 4", err)
    report = _report(tmp_path / "rejected")
    assert report["status"] == "failed" and "all 8 requests were rejected" in report["error"]
    code, _, err = run_main("workload.num_requests=0", "hydra.run.dir=empty")
    assert code == 2
    assert "the workload has no requests (workload.num_requests=0)" in err
    assert _report(tmp_path / "empty")["status"] == "failed"


def test_a_run_where_some_requests_are_rejected_exits_0_and_says_how_many(run_main, tmp_path):
    # A pool that holds the shorter of the default workload's requests, not the longer.
    code, out, err = run_main("cache.num_blocks=150", "workload.num_requests=10", "hydra.run.dir=r")
    assert code == 0, err
    summary = _report(tmp_path / "r")["summary"]
    num_rejected = summary["num_requests_rejected"]
    assert 0 < num_rejected < 10 and summary["num_requests_finished"] == 10 - num_rejected
    assert f"warning: {num_rejected} of 10 requests rejected, the rest ran; the first: " in err
    assert re.search(rf"requests rejected +{num_rejected}\n", out)
    (log,) = (tmp_path / "r").glob("*.log")  # the log file holds what was logged
    assert f"{num_rejected} of 10 requests rejected" in log.read_text()


def test_a_kv_pool_larger_than_the_device_is_refused_or_warned_of(run_main):
    code, _, err = run_main("cache.memory_gib=100000", *TINY, "hydra.run.dir=r")
    assert code == 2
    assert (
        "cache.memory_gib=100000.0 does not fit on h200: its 140.4 GiB hold llama-3-8b's "
        "weights (15.0 GiB) and at most 125.4 GiB of KV pool"
    ) in err
    code, _, err = run_main("cache.memory_gib=125", *TINY, "hydra.run.dir=r")
    assert code == 0, err
    assert "warning" not in err
    # A pool given in blocks (tests use huge ones as unbounded) runs, and says it cannot fit.
    code, _, err = run_main("cache.num_blocks=100000", *TINY, "hydra.run.dir=r")
    assert code == 0, err
    assert (
        "warning: the KV pool (195.3 GiB) and the weights (15.0 GiB) exceed h200's 140.4 GiB; "
        "the simulator ran as if they fit"
    ) in err


def test_runs_get_folders_of_their_own_and_no_empty_log(run_main, tmp_path):
    for _ in range(2):
        code, _, err = run_main(*TINY)
        assert code == 0, err
    runs = sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/report.json"))
    assert len(runs) == 2  # each folder: outputs/<date>/<hh-mm-ss.microseconds>
    assert all(re.fullmatch(r"\d\d-\d\d-\d\d\.\d{6}", run.name) for run in runs)
    assert not list((tmp_path / "outputs").rglob("*.log"))  # nothing was logged


def test_progress_bar_only_on_a_terminal(run_main, monkeypatch):
    from enginekit.__main__ import show_progress
    from enginekit.config import EngineConfig

    assert EngineConfig().progress is None
    for is_tty in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(sys.stderr, "isatty", lambda is_tty=is_tty: is_tty)
            assert show_progress(None) is is_tty
            assert show_progress(True) and not show_progress(False)
    code, out, err = run_main(*TINY, "hydra.run.dir=r")  # stderr is captured: no terminal
    assert code == 0, err
    assert out.startswith("== run ==\n")
    assert "\r" not in err and "req/s" not in err


def _readme_commands(section: str) -> list[list[str]]:
    """The ``python3 -m enginekit`` commands of the code blocks of README's ``section``
    (a ``### `` heading), as argument lists without the command and trailing comments."""
    readme = (REPO / "README.md").read_text()
    body = readme.split(f"\n### {section}\n", 1)[1].split("\n### ", 1)[0]
    commands = []
    for block in re.findall(r"```\n(.*?)```", body, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            assert words[:3] == ["python3", "-m", "enginekit"], line
            commands.append(words[3:])
    return commands


def test_readme_override_and_sweep_commands_run_as_written(run_main, tmp_path):
    """Every command of README's Overrides and Sweeps, as written plus a small workload
    (and a folder of its own): single runs complete, sweeps write every job's report."""
    overrides, sweeps = _readme_commands("Overrides"), _readme_commands("Sweeps and ablations")
    assert len(overrides) >= 3 and len(sweeps) >= 2  # the blocks were found
    for i, args in enumerate(overrides):
        code, out, err = run_main(*args, *TINY, f"hydra.run.dir=run{i}")
        assert code == 0, (args, err)
        assert _report(tmp_path / f"run{i}")["status"] == "completed"
    for i, args in enumerate(sweeps):
        code, out, err = run_main(*args, *TINY, f"hydra.sweep.dir=sweep{i}")
        assert code == 0, (args, err)
        reports = [_report(p.parent) for p in (tmp_path / f"sweep{i}").glob("*/report.json")]
        num_jobs = 1
        for arg in args:
            if "," in arg:
                num_jobs *= len(arg.split("=", 1)[1].split(","))
            elif arg.startswith("+ablation="):  # a ready-made sweep: its own choices
                ablation = REPO / "enginekit" / "conf" / "ablation" / f"{arg.split('=')[1]}.yaml"
                params = OmegaConf.load(ablation).hydra.sweeper.params
                for choices in params.values():
                    num_jobs *= len(str(choices).split(","))
        assert len(reports) == num_jobs and all(r["status"] == "completed" for r in reports)

"""Sweeps: the summary table and plots, failed jobs, conf/ablation and conf/experiment files,
the rebuild command and the parallel launchers."""

from __future__ import annotations

import csv
import io
import itertools
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from enginekit.app import CONF_DIR, CONFIG_NAME, compose_config, register_configs
from enginekit.config import PLUGIN_GROUPS
from enginekit.report import STATUS_FAILED, write_json
from enginekit.sweep.jobs import (
    STATUS_MISSING,
    STATUS_REFUSED,
    load_jobs,
    parse_override,
    swept_keys,
)
from enginekit.sweep.refusals import refusal
from enginekit.sweep.summary import SUMMARY_CSV, SUMMARY_MD, summarize
from enginekit.sweep.table import COMPACT_METRICS, METRIC_COLUMNS, render_csv

ABLATIONS = sorted(f.stem for f in (CONF_DIR / "ablation").glob("*.yaml"))
EXPERIMENTS = sorted(f.stem for f in (CONF_DIR / "experiment").glob("*.yaml"))


# ---- synthetic sweep folders ------------------------------------------------------------


def _summary(scale: float) -> dict:
    latency = {"count": 10, "mean": 0.2 * scale, "p50": 0.1 * scale, "p90": 0.3 * scale}
    latency["p99"] = 0.5 * scale
    return {
        "num_requests": 10,
        "num_requests_finished": 10,
        "prefix_cache_hit_rate": 0.5 / scale,
        "prefix_cache_hit_rate_ideal": 0.6,
        "kv_cache_slot_utilization": 0.9 / scale,
        "kv_cache_usage_perc_mean": 0.4,
        "kv_cache_usage_perc_peak": 0.8,
        "num_running_mean": 3.5 * scale,
        "num_running_peak": 8,
        "num_preemptions_total": int(4 * scale),
        "time_to_first_token_seconds": latency,
        "time_per_output_token_seconds": latency,
        "output_tokens_per_s": 1000.0 * scale,
        "kv_cache_num_blocks": int(100 * scale),
        "kv_cache_pool_gib": 1.5 * scale,
    }


def _job(root: Path, name: str, overrides: list[str], scale: float | None) -> None:
    """A job folder as Hydra and ``python -m enginekit`` leave it: completed (scale), failed
    (scale None) or, when ``name`` ends with "-missing", without report.json."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    header = {"block_size": 16, "kv_bytes_per_token": int(1000 / (scale or 1))}
    if name.endswith("-missing"):
        return
    if scale is None:
        write_json({}, header, job / "report.json", status=STATUS_FAILED, error="refused | no")
    else:
        write_json(_summary(scale), header, job / "report.json")


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    common = ["progress=false", "workload.num_requests=10"]
    _job(root, "0", ["+allocator=paged", "+quantizer=none", *common], 1.0)
    _job(root, "1", ["+allocator=paged", "+quantizer=fp8", *common], 2.0)
    _job(root, "2", ["+allocator=contiguous", "+quantizer=none", *common], None)
    _job(root, "10", ["+allocator=contiguous", "+quantizer=fp8", *common], 3.0)
    _job(root, "11-missing", ["+allocator=contiguous", "+quantizer=int4", *common], 0)
    return root


def test_jobs_are_read_in_natural_order_with_their_status(sweep_dir):
    jobs = load_jobs(sweep_dir)
    assert [j.name for j in jobs] == ["0", "1", "2", "10", "11-missing"]
    assert [j.status for j in jobs] == ["completed", "completed", "failed", "completed"] + [
        STATUS_MISSING
    ]
    assert jobs[2].error == "refused | no"
    assert swept_keys(jobs) == ["allocator", "quantizer"]
    assert parse_override("+prefix=radix") == ("prefix", "radix")
    assert parse_override("~cache.num_blocks") == ("cache.num_blocks", "~")


def test_summary_table_has_a_row_per_job_with_swept_choices_and_metrics(sweep_dir):
    summary = summarize(sweep_dir, plots=False)
    text = (sweep_dir / SUMMARY_MD).read_text()
    assert text == summary.markdown
    assert "Fixed: `progress=false` `workload.num_requests=10`" in text
    header = next(line for line in text.splitlines() if line.startswith("| job |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    assert names[:4] == ["job", "allocator", "quantizer", "status"]
    assert names[4:] == [c.name for c in METRIC_COLUMNS]
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert "| paged | fp8 | completed |" in row and "25.0 %" in row  # hit rate 0.5 / 2
    assert "| 2 | contiguous | none | failed |" in text
    assert "- job 2 (allocator=contiguous, quantizer=none), failed: refused | no" in text
    assert "missing" in text

    rows = list(csv.DictReader(io.StringIO((sweep_dir / SUMMARY_CSV).read_text())))
    assert [r["job"] for r in rows] == ["0", "1", "2", "10", "11-missing"]
    assert rows[1]["quantizer"] == "fp8" and rows[1]["progress"] == "false"
    assert float(rows[1]["hit_rate"]) == 0.25
    assert float(rows[1]["ttft_p99_ms"]) == pytest.approx(1000.0)
    assert int(rows[1]["pool_tokens"]) == 200 * 16
    assert rows[2]["status"] == STATUS_FAILED and rows[2]["error"] == "refused | no"
    assert rows[2]["hit_rate"] == ""
    assert render_csv(load_jobs(sweep_dir)) == (sweep_dir / SUMMARY_CSV).read_text()


def _refused_job(root: Path, name: str, overrides: list[str], reason: str) -> None:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    write_json({}, {}, job / "report.json", status=STATUS_REFUSED, error=reason)


def test_refused_combinations_are_no_rows_but_listed_once_by_reason(tmp_path):
    root = tmp_path / "sweep"
    grid = itertools.product(["paged", "contiguous"], ["none", "radix"], ["none", "fp8"])
    for i, (allocator, prefix, quantizer) in enumerate(grid):
        overrides = [f"+allocator={allocator}", f"+prefix={prefix}", f"+quantizer={quantizer}"]
        if allocator == "contiguous" and prefix == "radix":
            _refused_job(root, str(i), overrides, "no radix | here")
        elif allocator == "contiguous" and quantizer == "fp8":
            _refused_job(root, str(i), overrides, "no fp8 here")
        else:
            _job(root, str(i), overrides, 1.0 + i)
    summary = summarize(root, plots=False)
    text = summary.markdown
    assert "5 jobs: 5 completed, 0 not; 3 combinations refused by their plugins" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in table[1:]] == ["| 0", "| 1", "| 2", "| 3", "| 4"]
    assert "refused" not in "\n".join(table)
    refused = text[text.index("## Refused combinations (3)") :]
    assert refused.count("no radix \\| here") == 1 and refused.count("no fp8 here") == 1
    # a whole grid of choices is one line in sweep form; the rest one line per job
    radix = "- 2 combinations: no radix \\| here\n  - `allocator=contiguous prefix=radix "
    assert radix + "quantizer=none,fp8`" in refused
    assert (
        "- 1 combination: no fp8 here\n  - `allocator=contiguous prefix=none quantizer=fp8`"
        in refused
    )
    assert "Jobs that did not complete" not in text
    assert refused in summary.compact  # printed too

    rows = list(csv.DictReader(io.StringIO((root / SUMMARY_CSV).read_text())))
    assert [r["status"] for r in rows].count(STATUS_REFUSED) == 3
    assert {r["error"] for r in rows if r["status"] == STATUS_REFUSED} == {
        "no radix | here",
        "no fp8 here",
    }


def test_printed_table_is_compact_and_summary_md_has_every_metric(sweep_dir):
    summary = summarize(sweep_dir, plots=False)

    def header(text: str) -> list[str]:
        line = next(line for line in text.splitlines() if line.startswith("| job |"))
        return [c.strip() for c in line.strip("|").split("|")]

    assert header(summary.compact) == ["job", "allocator", "quantizer", "status", *COMPACT_METRICS]
    assert len(header(summary.compact)) <= 12 < len(header(summary.markdown))
    assert header(summary.markdown)[4:] == [c.name for c in METRIC_COLUMNS]
    assert set(COMPACT_METRICS) < {c.name for c in METRIC_COLUMNS}


@pytest.mark.parametrize(
    ("low", "high"), [(174.0, 632.0), (3.9, 7.3), (200.0, 3000.0), (0.02, 900.0), (4.9, 5.1)]
)
def test_log_axis_ticks_are_enough_round_values_inside_the_range(low, high):
    from enginekit.sweep.plots import MIN_LOG_TICKS, log_ticks

    ticks = log_ticks(low, high)
    assert len(ticks) >= MIN_LOG_TICKS and ticks == sorted(set(ticks))
    assert all(low <= t <= high for t in ticks)
    assert all(float(f"{t:.3g}") == t for t in ticks)


def test_latency_plot_names_its_markers_and_colours_and_labels_its_log_axes(sweep_dir):
    from enginekit.sweep.plots import MIN_LOG_TICKS, latency_figure

    jobs = load_jobs(sweep_dir)
    done = [job for job in jobs if job.is_completed]
    fig = latency_figure(done, swept_keys(jobs))
    title = fig.get_suptitle()
    assert "latency" in title.lower() and not {"(o)", "(s)", "(^)"} & set(title.split())
    legends = {legend.get_title().get_text(): legend for legend in fig.legends}
    assert set(legends) == {"percentile", "allocator"}
    assert [t.get_text() for t in legends["percentile"].get_texts()] == ["p50", "p90", "p99"]
    assert [t.get_text() for t in legends["allocator"].get_texts()] == ["paged", "contiguous"]
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        low, high = ax.get_xlim()
        ticks, labels = ax.get_xticks(), ax.get_xticklabels()
        labelled = [t for t, label in zip(ticks, labels, strict=True) if label.get_text()]
        assert len(labelled) >= MIN_LOG_TICKS and all(low <= t <= high for t in labelled)


def _wide_sweep(root: Path) -> Path:
    """24 jobs over four swept keys with long values (long row labels, narrow panels)
    and the byte and token counts of a real quantizer sweep."""
    sizes = {"none": (131072, 2048), "fp8": (65536, 4096), "int4": (43008, 6241)}
    grid = itertools.product(
        ["paged", "contiguous"], sizes, ["lru", "sliding_window"], ["recompute", "swap"]
    )
    for i, (allocator, quantizer, eviction, preemption) in enumerate(grid):
        job = root / str(i)
        (job / ".hydra").mkdir(parents=True)
        overrides = [f"+allocator={allocator}", f"+quantizer={quantizer}"]
        overrides += [f"+eviction={eviction}", f"+preemption={preemption}"]
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        bytes_per_token, blocks = sizes[quantizer]
        summary = {**_summary(1.0 + i), "kv_cache_num_blocks": blocks}
        header = {"block_size": 16, "kv_bytes_per_token": bytes_per_token}
        write_json(summary, header, job / "report.json")
    return root


def test_no_plot_has_overlapping_axis_labels(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from enginekit.sweep.plots import figures

    drawn = figures(load_jobs(_wide_sweep(tmp_path / "wide")))
    assert {"kv_utilization.png", "latency.png", "capacity.png"} <= set(drawn)
    for name, fig in drawn.items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        for ax in fig.axes:
            low, high = sorted(ax.get_xlim())
            ticks, labels = ax.get_xticks(), ax.get_xticklabels()
            shown = [
                label.get_window_extent(renderer)
                for tick, label in zip(ticks, labels, strict=True)
                if label.get_text() and low <= tick <= high
            ]
            assert len(shown) >= 2, (name, ax.get_title())
            shown.sort(key=lambda box: box.x0)
            gaps = [right.x0 - left.x1 for left, right in itertools.pairwise(shown)]
            assert min(gaps) >= 4, (name, ax.get_title(), [t.get_text() for t in labels])


def test_plots_only_for_the_keys_the_sweep_varies(sweep_dir, tmp_path):
    summary = summarize(sweep_dir)
    written = sorted(p.name for p in summary.paths if p.suffix == ".png")
    assert written == ["capacity.png", "kv_utilization.png", "latency.png"]
    for name in written:
        assert (sweep_dir / name).read_bytes()[:4] == b"\x89PNG"

    pool = tmp_path / "pool"
    for i, (gib, method) in enumerate(itertools.product([1, 2, 4], ["recompute", "swap"])):
        _job(pool, str(i), [f"cache.memory_gib={gib}", f"+preemption={method}"], float(gib))
    names = sorted(p.name for p in summarize(pool).paths if p.suffix == ".png")
    assert names == ["latency.png", "pool_size.png"]


def test_rebuild_command_on_a_folder_without_jobs_says_so(cli, tmp_path):
    result = cli(str(tmp_path), module="enginekit.sweep")
    assert result.returncode == 2
    assert "no sweep jobs" in result.stderr


def test_an_unexpected_error_fails_only_its_job_in_a_sweep(monkeypatch, capsys):
    import enginekit.__main__ as entry

    def broken(cfg):
        raise RuntimeError("a bug")

    monkeypatch.setattr(entry, "run_job", broken)
    monkeypatch.setattr(entry, "_job_name", lambda: "job 7 (x=1)")
    monkeypatch.setattr(entry, "_is_multirun", lambda: True)
    cfg = OmegaConf.create({})
    assert entry.run_task(cfg) is None
    err = capsys.readouterr().err
    assert "error: job 7 (x=1) failed:" in err and "RuntimeError: a bug" in err
    monkeypatch.setattr(entry, "_is_multirun", lambda: False)
    with pytest.raises(RuntimeError, match="a bug"):  # a single run shows its traceback
        entry.run_task(cfg)


def test_a_refused_combination_in_a_sweep_is_recorded_without_running(
    monkeypatch, capsys, tmp_path
):
    import enginekit.__main__ as entry

    def must_not_run(cfg):
        raise AssertionError("a refused combination was built")

    monkeypatch.setattr(entry, "run_job", must_not_run)
    monkeypatch.setattr(entry, "_is_multirun", lambda: True)
    monkeypatch.setattr(entry, "_output_dir", lambda: tmp_path)
    cfg = OmegaConf.create({"allocator": {"name": "contiguous"}, "prefix": {"name": "block_hash"}})
    assert entry.run_task(cfg) is None
    assert capsys.readouterr().err == ""
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "refused"
    assert "contiguous" in report["error"]


def test_summary_callback_can_be_removed_or_set_from_the_command_line():
    from enginekit.app import rewrite_overrides

    args = ["~hydra.callbacks.sweep_summary", "hydra.callbacks.sweep_summary.plots=false"]
    assert rewrite_overrides(args) == args


# ---- conf/ablation and conf/experiment --------------------------------------------------


def _sweep_params(name: str) -> dict[str, str]:
    from hydra import compose, initialize

    with initialize(version_base=None, config_path=None):
        cfg = compose(CONFIG_NAME, [f"+ablation={name}"], return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"  # `-m` is optional
    return {str(k): str(v) for k, v in cfg.hydra.sweeper.params.items()}


def _grid(params: dict[str, str]) -> list[list[str]]:
    axes = [[f"{key}={v}" for v in value.split(",")] for key, value in params.items()]
    return [list(job) for job in itertools.product(*axes)]


def test_conf_files_are_listed():
    assert {"allocator", "prefix", "quantizer", "eviction", "preemption", "tier", "all"} <= set(
        ABLATIONS
    )
    assert {"tiny_chat", "memory_pressure", "long_context"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", [a for a in ABLATIONS if a != "all"])
def test_every_job_of_a_group_ablation_builds_an_engine(name):
    from hydra import compose, initialize

    from enginekit.engine import Engine

    register_configs()
    params = _sweep_params(name)
    group_keys = [k.lstrip("+") for k in params if k.lstrip("+") in PLUGIN_GROUPS]
    assert name in group_keys
    with initialize(version_base=None, config_path=None):
        for job in _grid(params):
            cfg = compose(CONFIG_NAME, [f"+ablation={name}", *job])
            Engine(cfg)  # raises for a refused combination or a bad value


def test_ablation_all_crosses_every_group_and_only_documented_refusals_fail():
    from hydra import compose, initialize

    register_configs()
    params = _sweep_params("all")
    assert {k.lstrip("+") for k in params} == set(PLUGIN_GROUPS)
    jobs = _grid(params)
    assert len(jobs) == 2 * 3 * 3 * 2 * 2 * 2
    with initialize(version_base=None, config_path=None):
        for job in (jobs[0], jobs[-1]):  # each value is also built by its group ablation
            cfg = compose(CONFIG_NAME, ["+ablation=all", *job])
            assert [f"+{g}={cfg[g].name}" for g in PLUGIN_GROUPS] == job
    refused = 0
    for job in jobs:
        selected = dict(parse_override(item) for item in job)
        allocator, prefix, eviction, tier = (
            selected[g] for g in ("allocator", "prefix", "eviction", "tier")
        )
        documented = (
            (allocator == "contiguous" and (prefix != "none" or eviction != "lru"))
            or (eviction == "sliding_window" and prefix == "radix")
            or (eviction == "sliding_window" and tier != "none")
        )
        assert (refusal(selected) is not None) == documented, job
        refused += documented
    assert 0 < refused < len(jobs)
    # the counts the README and the file's comment give
    readme = " ".join((CONF_DIR.parent.parent / "README.md").read_text(encoding="utf-8").split())
    assert f"{len(jobs)} combinations, {refused} of which a plugin refuses" in readme
    comment = " ".join((CONF_DIR / "ablation" / "all.yaml").read_text().replace("#", "").split())
    assert f"= {len(jobs)} combinations" in comment
    assert f"The {refused} combinations a plugin refuses" in comment


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    cfg = compose_config([f"+experiment={name}"])
    assert cfg.workload.num_requests > 0
    if cfg.executor == "sim":
        from enginekit.engine import Engine

        Engine(cfg)


def test_slurm_launcher_file_selects_submitit_slurm_with_our_defaults():
    from hydra import compose, initialize

    register_configs()
    with initialize(version_base=None, config_path=None):
        overrides = ["hydra/launcher=slurm", "+ablation=prefix", "hydra.launcher.partition=gpu"]
        cfg = compose(CONFIG_NAME, overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min) == ("gpu", 0, 60)


# ---- real sweeps through the command line -----------------------------------------------


def _pngs(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.png")}


def test_grid_sweep_runs_only_valid_combinations_in_parallel_and_rebuilds(cli, tmp_path):
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    args += ["+allocator=paged,contiguous", "+prefix=none,radix", "progress=false"]
    result = cli(*args, "workload.num_requests=12", "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr
    sweep = tmp_path / "sweep"
    compact = ["job", "allocator", "prefix", "status", *COMPACT_METRICS]
    assert "| " + " | ".join(compact) + " |" in result.stdout  # the printed table
    refused = json.loads((sweep / "3" / "report.json").read_text())
    assert refused["status"] == STATUS_REFUSED and "cannot be combined" in refused["error"]
    assert refused["header"]["allocator"] == "contiguous" and refused["summary"] == {}
    assert result.stdout.count(refused["error"]) == 1  # listed once, not as a row
    assert "## Refused combinations (1)" in result.stdout
    assert "`allocator=contiguous prefix=radix`" in result.stdout
    assert "did not complete" not in result.stdout + result.stderr
    rows = list(csv.DictReader(io.StringIO((sweep / SUMMARY_CSV).read_text())))
    assert [r["status"] for r in rows] == ["completed", "completed", "completed", "refused"]
    assert float(rows[1]["hit_rate"]) > 0 == float(rows[0]["hit_rate"])
    assert _pngs(sweep) == {"kv_utilization.png", "prefix_hit_rate.png", "latency.png"}

    table = (sweep / SUMMARY_MD).read_text()
    assert "| 3 |" not in table and table.count(refused["error"]) == 1
    for path in [sweep / SUMMARY_MD, sweep / SUMMARY_CSV, *sweep.glob("*.png")]:
        path.unlink()
    rebuilt = cli(str(sweep), module="enginekit.sweep")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (sweep / SUMMARY_MD).read_text() == table
    assert _pngs(sweep) == {"kv_utilization.png", "prefix_hit_rate.png", "latency.png"}


def test_only_a_job_that_failed_for_its_plugins_refusal_is_relabelled(tmp_path):
    from omegaconf import OmegaConf

    from enginekit.sweep.refusals import relabel_refusal

    def job(name: str, allocator: str, prefix: str, error: str | None) -> tuple:
        folder = tmp_path / name
        plugins = {"allocator": {"name": allocator}, "prefix": {"name": prefix}}
        config = OmegaConf.create({**plugins, "hydra": {"runtime": {"output_dir": str(folder)}}})
        if error is not None:
            write_json(
                {},
                {"allocator": allocator},
                folder / "report.json",
                status=STATUS_FAILED,
                error=error,
            )
        return config, folder / "report.json"

    reason = refusal({"allocator": "contiguous", "prefix": "radix"})
    assert reason is not None
    refused, path = job("a", "contiguous", "radix", reason)
    assert relabel_refusal(refused)
    report = json.loads(path.read_text())
    assert (report["status"], report["error"], report["header"]) == (
        STATUS_REFUSED,
        reason,
        {"allocator": "contiguous"},
    )
    other_error, other = job("b", "contiguous", "radix", "out of memory")
    assert not relabel_refusal(other_error) and json.loads(other.read_text())["status"] == "failed"
    accepted, accepted_path = job("c", "paged", "radix", "a bug")
    assert not relabel_refusal(accepted)
    assert json.loads(accepted_path.read_text())["status"] == STATUS_FAILED
    assert not relabel_refusal(job("d", "contiguous", "radix", None)[0])  # no report: running


def test_a_refused_combination_is_recorded_as_the_engine_refuses_it():
    from enginekit.engine import Engine
    from enginekit.errors import ConfigError

    overrides = ["+allocator=contiguous", "+prefix=radix", "+eviction=sliding_window"]
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError) as refused:
        Engine(cfg)
    selected = {g: str(cfg[g].name) for g in PLUGIN_GROUPS}
    assert refusal(selected) == str(refused.value)
    assert refusal({**selected, "allocator": "paged", "prefix": "none"}) is None
    assert refusal({**selected, "allocator": "no_such_plugin"}) is None  # the job reports it


def test_ablation_file_runs_its_sweep(cli, tmp_path):
    result = cli(
        "+ablation=preemption", "progress=false", "workload.num_requests=30", "hydra.sweep.dir=s"
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "s" / SUMMARY_CSV).read_text())))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"completed"}
    assert {(r["preemption"], r["cache.memory_gib"]) for r in rows} == set(
        itertools.product(["recompute", "swap"], ["1", "2", "4", "8"])
    )
    assert _pngs(tmp_path / "s") == {"latency.png", "pool_size.png"}


def test_submitit_local_launcher_runs_each_job_in_its_own_process(cli, tmp_path):
    result = cli(
        "-m",
        "hydra/launcher=submitit_local",
        "+quantizer=none,int4",
        "progress=false",
        "workload.num_requests=10",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep" / SUMMARY_CSV).read_text())))
    assert [(r["quantizer"], r["status"]) for r in rows] == [
        ("none", "completed"),
        ("int4", "completed"),
    ]
    assert int(rows[1]["pool_tokens"]) > int(rows[0]["pool_tokens"])
    assert "capacity.png" in _pngs(tmp_path / "sweep")

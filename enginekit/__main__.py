"""``python -m enginekit [+group=plugin ...] [key=value ...]``: run a workload, print the report.

Every job writes ``report.json`` into Hydra's run (or sweep job) folder: the summary of a
completed run, or ``status: failed`` with the error message when the job could not run.

Errors: a single run that fails on a configuration or engine error prints ``error: ...``
and exits with code 2 (any other exception shows its traceback). So does a run that
serves nothing: a workload without requests, or one whose every request is rejected
(too long for the model or the whole cache); a run where only some are rejected
completes, its report counts them and stderr says how many. So does a command that needs
an extra that is not installed (``executor=torch`` the torch extra, ``workload=sharegpt``
and the claims the data extra, ``hydra/launcher=joblib`` or ``slurm`` the launchers
extra), a sweep too: one line names every missing extra and the pip line that installs
them (a launcher's before any job starts). In a sweep (``-m``) a failing job is recorded
(its report.json says failed, stderr names the job and the error) and the sweep goes on;
the sweep exits 0 once every job ran or was recorded, and its summary table
(``enginekit.sweep.summary``) lists failed jobs with their errors.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from enginekit.app import CONFIG_NAME, register_configs, rewrite_overrides
from enginekit.errors import ConfigError, EngineKitError, RequestRejectedError
from enginekit.extras import (
    LAUNCHER_MODULES,
    MissingExtraError,
    launcher_of,
    missing_extra_error,
    require,
    require_config,
)

CLAIMS_JOB = "claims"  # hydra.job.name of the claims job (python -m enginekit +experiment=claims)


def _output_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def _config_header(cfg: Any) -> dict[str, Any]:
    """What a failed job was asked to run: plugin names, model and executor from ``cfg``."""
    from enginekit.config import PLUGIN_GROUPS

    header: dict[str, Any] = {}
    for group in PLUGIN_GROUPS:
        header[group] = str(cfg[group]["name"]) if group in cfg else None
    header["model"] = str(cfg.model.name) if "model" in cfg else None
    header["executor"] = str(cfg.executor) if "executor" in cfg else None
    return header


def run_job(cfg: Any) -> dict[str, Any]:
    """One run on a composed config: build the engine, run the workload, print the report
    and write it as ``report.json`` in the job's folder; returns the summary. Raises
    when the run served nothing (``_check_served``). On any exception writes a failed
    report.json (status, error, the config's plugins) and re-raises."""
    from enginekit.driver import WorkloadDriver
    from enginekit.engine import Engine
    from enginekit.report import STATUS_FAILED, render_report, write_json

    path = _output_dir() / "report.json"
    try:
        require_config(cfg)
        engine = Engine(cfg)
        with _Rejections() as rejections:
            driver = WorkloadDriver(engine)
            driver.add_workload()
            result = driver.run(progress=show_progress(engine.config.progress))
        summary, header = result.summary, engine.describe()
        _check_served(summary, rejections.first)
    except Exception as exc:
        error = str(exc) if isinstance(exc, EngineKitError) else f"{type(exc).__name__}: {exc}"
        write_json({}, _config_header(cfg), path, status=STATUS_FAILED, error=error)
        raise
    print(render_report(summary, header))
    write_json(summary, header, path)
    print(f"report: {path}")
    oversized = _oversized_pool(header)
    if oversized:
        print(f"warning: {oversized}", file=sys.stderr)
    num_rejected = summary.get("num_requests_rejected", 0)
    if num_rejected:
        total = num_rejected + summary.get("num_requests", 0)
        first = f"; the first: {rejections.first}" if rejections.first else ""
        print(
            f"warning: {num_rejected} of {total} requests rejected, the rest ran{first}",
            file=sys.stderr,
        )
    return summary


def _oversized_pool(header: dict[str, Any]) -> str | None:
    """What is wrong when a simulated KV pool and the weights exceed the simulated GPU's
    memory (a pool of ``cache.num_blocks`` blocks; a ``cache.memory_gib`` budget that large
    is refused): the run went ahead as if they fit. None when they fit or for torch."""
    from enginekit.spec.hardware import HARDWARE_PRESETS

    hardware = HARDWARE_PRESETS.get(str(header.get("hardware")))
    pool, weights = header.get("kv_pool_gib"), header.get("weight_gib")
    if header.get("executor") != "sim" or hardware is None or pool is None or weights is None:
        return None
    capacity = hardware.hbm_capacity / (1 << 30)
    if pool + weights <= capacity:
        return None
    return (
        f"the KV pool ({pool:,.1f} GiB) and the weights ({weights:,.1f} GiB) exceed "
        f"{hardware.name}'s {capacity:,.1f} GiB; the simulator ran as if they fit"
    )


def show_progress(setting: bool | None) -> bool:
    """Whether a run shows its progress bar: ``progress=true`` always, ``false`` never,
    ``null`` (the default) only when stderr is a terminal, so that redirected output
    holds the report and nothing of a bar."""
    if setting is None:
        return sys.stderr.isatty()
    return bool(setting)


class _Rejections(logging.Handler):
    """Records, while active, the first request rejection the engine logs (its reason)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # The engine logs "... rejected ...; the first: %s" or "rejected %s": the reason
        # is the last argument.
        if self.first is None and "rejected" in str(record.msg):
            args = record.args if isinstance(record.args, tuple) else ()
            self.first = str(args[-1]) if args else record.getMessage()

    def __enter__(self) -> _Rejections:
        logging.getLogger("enginekit").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("enginekit").removeHandler(self)


def _check_served(summary: dict[str, Any], first_rejection: str | None) -> None:
    """Raises when the run served nothing: a workload without requests (ConfigError), or
    one whose every request was rejected (RequestRejectedError, with the first reason)."""
    num_accepted = summary.get("num_requests", 0)
    num_rejected = summary.get("num_requests_rejected", 0)
    if num_accepted + num_rejected == 0:
        raise ConfigError("the workload has no requests (workload.num_requests=0): nothing ran")
    if num_accepted == 0:
        reason = f"; the first: {first_rejection}" if first_rejection else ""
        raise RequestRejectedError(
            f"all {num_rejected} requests were rejected, so nothing ran{reason}"
        )


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def _job_name() -> str:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    return f"job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)})"


def run_task(cfg: Any) -> dict[str, Any] | None:
    """The Hydra task: ``run_job``, with the error policy of the module docstring, or the
    claims job (``enginekit.claims.job``) when ``hydra.job.name`` is ``claims``. Returns the
    summary (the claims), or None for a job of a sweep that failed (and was recorded)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        # hydra.job.name is set by conf/experiment/claims.yaml
        if HydraConfig.initialized() and HydraConfig.get().job.name == CLAIMS_JOB:
            from enginekit.claims.job import CLAIMS_EXTRAS, run_claims_job

            require("the claims (+experiment=claims)", extras=CLAIMS_EXTRAS)
            return run_claims_job(_output_dir())
        if _is_multirun():
            from enginekit.report import write_json
            from enginekit.sweep.jobs import STATUS_REFUSED
            from enginekit.sweep.refusals import refusal, selected_plugins

            reason = refusal(selected_plugins(cfg))
            if reason is not None:  # listed once in the sweep's summary, not as an error
                path = _output_dir() / "report.json"
                write_json({}, _config_header(cfg), path, status=STATUS_REFUSED, error=reason)
                return None
        return run_job(cfg)
    except MissingExtraError as exc:  # no job of a sweep could run either
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except ModuleNotFoundError as exc:
        missing = missing_extra_error(exc, "this run")
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        raise SystemExit(2) from None
    except EngineKitError as exc:
        if _is_multirun():
            print(f"error: {_job_name()} failed: {exc}", file=sys.stderr)
            return None
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception:
        if not _is_multirun():
            raise
        print(f"error: {_job_name()} failed:", file=sys.stderr)
        traceback.print_exc()
        return None


def main(argv: list[str] | None = None) -> int:
    import hydra

    args = sys.argv[1:] if argv is None else argv
    try:
        problems = register_configs()
        rewritten = rewrite_overrides(args)
        launcher = launcher_of(rewritten)
        if launcher in LAUNCHER_MODULES:
            require(f"hydra/launcher={launcher}", modules=LAUNCHER_MODULES[launcher])
    except EngineKitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)

    @hydra.main(version_base=None, config_path=None, config_name=CONFIG_NAME)
    def task(cfg: object) -> dict[str, Any] | None:
        return run_task(cfg)

    sys.argv = [sys.argv[0], *rewritten]
    task()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One table and a few plots of a whole sweep, written into its folder.

``python -m enginekit -m ...`` ends every sweep with ``SweepSummaryCallback`` (registered
on the primary config's ``hydra.callbacks``), and ``python -m enginekit.sweep <folder>``
rebuilds the same files from any sweep folder, e.g. after a SLURM sweep or with jobs
added. Both read only what the jobs left on disk (``.hydra/overrides.yaml`` and
``report.json`` in each job folder, see ``enginekit.sweep.jobs``), so every launcher
(basic, joblib, submitit) gives the same result.

Written into the sweep folder:

- ``summary.md``: the markdown table (``enginekit.sweep.table``) with every metric, then
  the plugin combinations refused before anything was built (``enginekit.sweep.refusals``),
  each reason once;
- ``summary.csv``: the same rows with raw values, every override and the full errors (a
  ``refused`` row per refused combination);
- PNG plots for the keys the sweep varies (``enginekit.sweep.plots``).

What is printed is the compact table (swept choices, status and a few key metrics) and
the refused combinations, then the paths written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NamedTuple

from hydra.experimental.callback import Callback

from enginekit.sweep.jobs import JobResult, load_jobs
from enginekit.sweep.refusals import relabel_refusal
from enginekit.sweep.table import render_csv, render_markdown

SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"


class SweepSummary(NamedTuple):
    """What ``summarize`` wrote: the jobs it read, the markdown text (summary.md), the
    compact markdown that is printed, the files' paths and why plots are missing (None
    when they were drawn)."""

    jobs: list[JobResult]
    markdown: str
    compact: str
    paths: list[Path]
    plots_skipped: str | None


def summarize(folder: str | Path, plots: bool = True) -> SweepSummary:
    """Reads every job below ``folder`` and writes summary.md, summary.csv and (with
    ``plots``) the PNG plots into it, replacing earlier ones. Raises FileNotFoundError if
    ``folder`` holds no job. Without matplotlib the plots are skipped, not an error."""
    folder = Path(folder)
    jobs = load_jobs(folder)
    if not jobs:
        raise FileNotFoundError(f"{folder}: no sweep jobs (no */.hydra/overrides.yaml)")
    markdown = render_markdown(jobs, title=f"Sweep {folder.name}")
    compact = render_markdown(jobs, title=f"Sweep {folder.name}", compact=True)
    paths = [folder / SUMMARY_MD, folder / SUMMARY_CSV]
    paths[0].write_text(markdown, encoding="utf-8")
    paths[1].write_text(render_csv(jobs), encoding="utf-8")
    skipped: str | None = "not asked for"
    if plots:
        try:
            from enginekit.sweep.plots import write_plots

            paths += write_plots(jobs, folder)
            skipped = None
        except ImportError as exc:
            skipped = f"matplotlib is not installed ({exc})"
    return SweepSummary(jobs, markdown, compact, paths, skipped)


def _print_summary(summary: SweepSummary) -> None:
    print(summary.compact)
    for path in summary.paths:
        note = " (the table with every metric)" if path.name == SUMMARY_MD else ""
        print(f"wrote: {path}{note}")
    if summary.plots_skipped and summary.plots_skipped != "not asked for":
        print(f"plots skipped: {summary.plots_skipped}", file=sys.stderr)
    ran = [job for job in summary.jobs if not job.is_refused]
    num_failed = sum(not job.is_completed for job in ran)
    if num_failed:
        print(f"{num_failed} of {len(ran)} jobs did not complete", file=sys.stderr)


class SweepSummaryCallback(Callback):
    """Hydra callback: after each job of a multirun, record a plugin refusal as such; at
    the end, ``summarize`` its sweep folder (``hydra.sweep.dir``) and print the compact
    table. Never raises: a failure to summarize is printed with the command that rebuilds
    the summary."""

    def __init__(self, plots: bool = True) -> None:
        self.plots = plots

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """In the job's process, whatever the launcher: a sweep job that failed because its
        plugins refuse each other is recorded as refused (``enginekit.sweep.refusals``)."""
        if str(config.hydra.mode) != "RunMode.MULTIRUN":
            return
        try:
            relabel_refusal(config)
        except Exception as exc:  # the failed report stays: the summary still lists it
            print(f"warning: could not record a refusal ({exc})", file=sys.stderr)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        folder = Path(str(config.hydra.sweep.dir))
        try:
            summary = summarize(folder, plots=self.plots)
        except Exception as exc:  # the jobs' results are on disk: say how to retry
            print(
                f"warning: no sweep summary ({type(exc).__name__}: {exc}); "
                f"rebuild it with: python -m enginekit.sweep {folder}",
                file=sys.stderr,
            )
            return
        _print_summary(summary)


def main(argv: list[str] | None = None) -> int:
    """``python -m enginekit.sweep <folder> [--no-plots]``; exit 2 if no job is found."""
    parser = argparse.ArgumentParser(
        prog="python -m enginekit.sweep",
        description="Rebuild a sweep's summary.md, summary.csv and plots from its job folders.",
    )
    parser.add_argument("folder", type=Path, help="the sweep folder (hydra.sweep.dir)")
    parser.add_argument("--no-plots", action="store_true", help="write the table only")
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.folder, plots=not args.no_plots)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_summary(summary)
    return 0

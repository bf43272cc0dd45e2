"""The differential fuzzer of tests/fuzz/fuzz_native.py, bounded so that it runs in CI.

Two drivers over the same op decoder: hypothesis feeding it byte strings (always), and a short
coverage-guided atheris run in a subprocess (when atheris is installed). For a long run by
hand: ``python tests/fuzz/fuzz_native.py -max_total_time=600 -max_len=1024 corpus_dir``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZER = Path(__file__).resolve().parent / "fuzz" / "fuzz_native.py"


def load_fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_native", FUZZER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz_native = load_fuzzer()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=1500))
def test_fuzz_inputs_from_hypothesis(data: bytes) -> None:
    fuzz_native.run_one(data)


def test_fuzz_empty_and_tiny_inputs() -> None:
    for data in (b"", b"\x00", b"\xff" * 3, bytes(range(256)), bytes(range(255, -1, -1)) * 4):
        fuzz_native.run_one(data)


def test_atheris_bounded_run(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    proc = subprocess.run(
        [
            sys.executable,
            str(FUZZER),
            "-max_total_time=15",
            "-max_len=1024",
            "-len_control=0",
            "-seed=7",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-6000:] + proc.stdout[-2000:]
    assert "Done" in proc.stderr, proc.stderr[-2000:]

"""The differential fuzzer of tests/fuzz/fuzz_native.py, bounded so that it runs in CI.

Two drivers over the same op decoder: hypothesis feeding it byte strings (always), and a short
coverage-guided atheris run in a subprocess (when atheris is installed). For a long run by
hand: ``python tests/fuzz/fuzz_native.py -max_total_time=600 -max_len=1024 corpus_dir``.
The harness's own edges are tested too: the sizes it passes stay small or are refused before
anything is allocated, and its findings go to an ignored folder, not the working directory.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZER = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_native.py"


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


def test_append_holes_counts_stay_small_or_are_refused_up_front() -> None:
    """Every count the harness can pass to append_holes, on both worlds: accepted at a few
    holes, or refused (ValueError) before the twin builds a list; never a huge allocation."""
    fuzz = fuzz_native.Fuzz(b"")  # an exhausted input reads as zeros: 1 block, block size 1
    for world in (fuzz.native, fuzz.python):
        world.tables.add_sequence(0)
    outcomes = []
    tracemalloc.start()
    try:
        for choice in range(len(fuzz_native.HOLE_COUNTS)):
            # seq_id(): one_in(4) reads 0 (true), then the pick of sequence 0; then the count.
            fuzz.b = fuzz_native.Bytes(bytes([0, 0, choice]))
            before = fuzz.python.tables.num_blocks(0)
            fuzz.op_append_holes()
            fuzz.check()
            outcomes.append(fuzz.python.tables.num_blocks(0) - before)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"the harness allocated {peak} bytes"
    assert outcomes == [0, 0, 1, 2, 3, 0, 0]  # -1 and the two past MAX_TABLE_LEN are refused
    assert max(c for c in fuzz_native.HOLE_COUNTS if c <= fuzz_native._native.MAX_TABLE_LEN) < 8


def test_findings_go_to_an_ignored_folder_by_default() -> None:
    prefix = f"-artifact_prefix={fuzz_native.ARTIFACTS}/"
    assert fuzz_native.libfuzzer_argv(["fuzz", "-max_total_time=30"]) == [
        "fuzz",
        prefix,
        "-max_total_time=30",
    ]
    given = ["fuzz", "-artifact_prefix=elsewhere/", "corpus"]
    assert fuzz_native.libfuzzer_argv(given) == given
    root = FUZZER.parents[2]
    ignored = (root / ".gitignore").read_text().split()
    assert fuzz_native.ARTIFACTS.relative_to(root).as_posix() + "/" in ignored
    for pattern in ("crash-*", "oom-*", "leak-*", "timeout-*", "slow-unit-*"):
        assert pattern in ignored


def test_atheris_bounded_run(tmp_path: Path) -> None:
    """The README's command, shorter: it finishes cleanly and leaves nothing in the working
    directory (findings, had there been any, would go to tests/fuzz/artifacts/)."""
    pytest.importorskip("atheris")
    proc = subprocess.run(
        [
            sys.executable,
            str(FUZZER),
            "-max_total_time=15",
            "-max_len=1024",
            "-len_control=0",
            "-seed=7",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-6000:] + proc.stdout[-2000:]
    assert "Done" in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []

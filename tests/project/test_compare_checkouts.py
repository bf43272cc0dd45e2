"""tools/compare_checkouts.py: it measures both sides in fresh processes, alternating,
prints a row per pair and the ratios' summary, and refuses what is not a checkout or a
checkout whose code it would not be measuring, exiting non-zero."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "compare_checkouts.py"
ROW = re.compile(r"\| (\d+) \| (\d+\.\d{3}) \| (\d+\.\d{3}) \| (\d+\.\d{2})× \|")


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_replay_pairs_of_one_checkout_against_itself() -> None:
    done = _run(REPO_ROOT, "--pairs", "2", "--workload", "unique", "--requests", "6")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(
        "manager time in the replay of unique (6 requests) at 4,096 blocks, block_hash, "
        "µs per generated token\n"
    )
    rows = [m.groups() for m in ROW.finditer(out)]
    assert [r[0] for r in rows] == ["1", "2"]
    for _, new, base, ratio in rows:
        assert float(new) > 0 and float(base) > 0
        assert abs(float(ratio) - float(base) / float(new)) <= 0.01
    assert re.search(r"base ÷ new over 2 pairs: median \d+\.\d\d×, geometric mean", out)


def test_step_pair() -> None:
    done = _run(REPO_ROOT, "--pairs", "1", "--step", "radix", "--num-seqs", "4", "--steps", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("schedule + update at 4 decodes, radix, µs per step\n")
    assert len(ROW.findall(done.stdout)) == 1
    assert "base ÷ new over 1 pair: median" in done.stdout
    # 100 + 7 x 600 steps outlast the requests' 4,000 tokens: refused, not measured short.
    too_long = _run(
        REPO_ROOT, "--pairs", "1", "--step", "radix", "--num-seqs", "4", "--steps", "600"
    )
    assert too_long.returncode == 1
    assert "600 steps a round would finish the requests mid-measurement" in too_long.stderr


def test_refuses_a_directory_that_is_no_checkout(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 2
    assert f"{tmp_path} is not a checkout of the project" in done.stderr


def test_exits_nonzero_when_a_side_would_import_code_from_elsewhere(tmp_path: Path) -> None:
    # A package of its own but no plugins: they would come from the installed ones.
    (tmp_path / "enginekit").mkdir()
    (tmp_path / "enginekit" / "__init__.py").write_text("")
    done = _run(tmp_path, "--pairs", "1", "--requests", "6", "--workload", "unique")
    assert done.returncode == 1
    assert f"measuring {REPO_ROOT} failed" not in done.stderr
    assert f"measuring {tmp_path} failed" in done.stderr
    assert "enginekit_plugins was imported from" in done.stderr
    assert f"not from {tmp_path}" in done.stderr

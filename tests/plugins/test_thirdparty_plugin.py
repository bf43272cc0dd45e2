"""A plugin from another distribution is found, configured and run with no change to
enginekit; broken and conflicting registrations are reported clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SMALL

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "mru_eviction"
TIGHT_POOL = ["cache.num_blocks=400", "workload.num_requests=12"]


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    """The fixture package pip-installed into its own folder (put on PYTHONPATH to use)."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--target", str(target), str(FIXTURE)],
        check=True,
        cwd=build,
        capture_output=True,
    )  # fmt: skip
    return target


def _fake_distribution(root: Path, name: str, entry_points: str) -> Path:
    """An installed-looking distribution: just the metadata an entry-point scan reads."""
    dist_info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(entry_points)
    return root


def test_listed_with_its_distribution(cli, installed_plugin):
    result = cli(module="enginekit.plugins", extra_pythonpath=[installed_plugin])
    assert result.returncode == 0, result.stderr
    assert any(
        line.split()[:4] == ["eviction", "mru", "enginekit-mru-eviction", "0.3.1"]
        for line in result.stdout.splitlines()
    ), result.stdout


def test_selected_and_configured_from_the_command_line(cli, installed_plugin, tmp_path):
    result = cli(
        "+eviction=mru",
        "eviction.keep_oldest=2",
        *SMALL,
        *TIGHT_POOL,
        "hydra.run.dir=run",
        extra_pythonpath=[installed_plugin],
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["header"]["eviction"] == "mru (enginekit-mru-eviction 0.3.1)"
    assert report["summary"]["num_requests"] == 12
    help_text = cli("--help", extra_pythonpath=[installed_plugin]).stdout
    assert "+eviction=chain_aware | lfu | lru* | mru | sliding_window | slru" in help_text


def test_unknown_key_of_a_third_party_plugin_lists_its_keys(cli, installed_plugin):
    result = cli(
        "+eviction=mru", "eviction.keep_old=2", *SMALL, extra_pythonpath=[installed_plugin]
    )
    assert result.returncode != 0
    assert "'eviction.keep_oldest'" in result.stderr


def test_two_distributions_registering_one_name_is_an_error_naming_both(cli, tmp_path):
    root = _fake_distribution(
        tmp_path / "dup", "other-evictions", "[enginekit.eviction]\nlru = other_evictions:LRU\n"
    )
    result = cli(*SMALL, extra_pythonpath=[root])
    assert result.returncode != 0
    assert "registered twice" in result.stderr
    assert "enginekit-plugins" in result.stderr and "other-evictions" in result.stderr


def test_broken_plugin_is_reported_and_skipped_unless_selected(cli, tmp_path):
    root = _fake_distribution(
        tmp_path / "broken", "broken-plugin", "[enginekit.eviction]\nbroken = no_such_module:X\n"
    )
    ok = cli(*SMALL, "hydra.run.dir=run", extra_pythonpath=[root])
    assert ok.returncode == 0, ok.stderr
    assert "broken" in ok.stderr and "failed to import" in ok.stderr
    selected = cli("+eviction=broken", *SMALL, extra_pythonpath=[root])
    assert selected.returncode != 0
    assert "failed to import" in selected.stderr and "no_such_module" in selected.stderr

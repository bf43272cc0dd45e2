"""The README is true: every repository path it names exists, the Results section's
generator names only files that exist, and its code blocks run."""

from __future__ import annotations

import re
import sys

from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
RESULTS = REPO_ROOT / "benchmarks" / "results.py"
# Top-level entries of the repository a path in prose can start with.
_PATH_ROOTS = ("rust", "enginekit", "plugins", "conf", "tests", "benchmarks", ".ci")
_ROOTS_ALTERNATIVES = "|".join(re.escape(root) for root in _PATH_ROOTS)
_PATH = re.compile(rf"(?<![\w./-])(?:\./)?((?:{_ROOTS_ALTERNATIVES})/[\w./*-]*)")


def repository_paths(text: str) -> list[str]:
    """Every word of ``text`` that names a path below one of the repository's top-level
    folders (``benchmarks/x.py``, ``conf/ablation/``), trailing punctuation dropped, in
    order of first mention. Placeholders (``<name>``, ``...``) end the path before them."""
    return list(dict.fromkeys(m.group(1).rstrip(".,;:") for m in _PATH.finditer(text)))


def test_path_finder_finds_paths_in_prose_commands_and_code():
    text = (
        "see `benchmarks/a.py`, `conf/ablation/` and (`tests/fixtures/x`). "
        "run `python3 benchmarks/b.py --n 3`; not my_tests/c.py nor outputs/<date>/.\n"
        "```\npython3 -m pip install -e ./plugins/sub\n```"
    )
    assert repository_paths(text) == [
        "benchmarks/a.py",
        "conf/ablation/",
        "tests/fixtures/x",
        "benchmarks/b.py",
        "plugins/sub",
    ]


def test_every_repository_path_the_readme_names_exists():
    paths = repository_paths(README.read_text(encoding="utf-8"))
    assert "conf/ablation/" in paths and "benchmarks/results.py" in paths
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert missing == []


def test_results_generator_names_only_files_that_exist():
    paths = repository_paths(RESULTS.read_text(encoding="utf-8"))
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert missing == []
    scripts = re.findall(r"\b(bench_\w+\.py)\b", RESULTS.read_text(encoding="utf-8"))
    assert scripts and [s for s in scripts if not (RESULTS.parent / s).exists()] == []


def test_readme_kernels_paragraph_is_what_the_generator_writes(monkeypatch):
    monkeypatch.syspath_prepend(str(RESULTS.parent))
    sys.modules.pop("results", None)
    import results

    section = results.kernels_section()
    assert section in README.read_text(encoding="utf-8")
    assert "GPU" not in section  # no kernel figures: no benchmark, whatever the machine

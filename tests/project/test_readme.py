"""The README is true: every repository path it or docs/ names exists, the results
generator names only files that exist and wrote docs/results.md and the README's Results
table, and the README's code blocks run."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

from conftest import REPO_ROOT, run_cli

from enginekit.interfaces import KVContext, KVSpec
from enginekit.kv.backend import make_backend

README = REPO_ROOT / "README.md"
RESULTS = REPO_ROOT / "benchmarks" / "results.py"
RESULTS_MD = REPO_ROOT / "docs" / "results.md"
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
# Top-level entries of the repository a path in prose can start with.
_PATH_ROOTS = ("rust", "enginekit", "plugins", "tests", "benchmarks", "tools", "docs", ".ci")
_ROOTS_ALTERNATIVES = "|".join(re.escape(root) for root in _PATH_ROOTS)
_PATH = re.compile(rf"(?<![\w./-])(?:\./)?((?:{_ROOTS_ALTERNATIVES})/[\w./*-]*)")


def repository_paths(text: str) -> list[str]:
    """Every word of ``text`` that names a path below one of the repository's top-level
    folders (``benchmarks/x.py``, ``enginekit/conf/ablation/``), trailing punctuation dropped, in
    order of first mention. Placeholders (``<name>``, ``...``) end the path before them."""
    return list(dict.fromkeys(m.group(1).rstrip(".,;:") for m in _PATH.finditer(text)))


def test_path_finder_finds_paths_in_prose_commands_and_code():
    text = (
        "see `benchmarks/a.py`, `enginekit/conf/ablation/` and (`tests/fixtures/x`). "
        "run `python3 benchmarks/b.py --n 3`; not my_tests/c.py nor outputs/<date>/.\n"
        "```\npython3 -m pip install -e ./plugins/sub\n```"
    )
    assert repository_paths(text) == [
        "benchmarks/a.py",
        "enginekit/conf/ablation/",
        "tests/fixtures/x",
        "benchmarks/b.py",
        "plugins/sub",
    ]


def _ignored_paths() -> set[str]:
    """The paths ``.gitignore`` lists by name: what runs make (a fresh clone lacks them)."""
    lines = (REPO_ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_every_repository_path_the_readme_names_exists():
    """Paths git ignores are made by the commands that name them, so they need not exist."""
    paths = repository_paths(README.read_text(encoding="utf-8"))
    assert "enginekit/conf/ablation/" in paths and "benchmarks/results.py" in paths
    assert "docs/architecture.md" in paths and "docs/results.md" in paths
    ignored = _ignored_paths()
    assert "tests/fuzz/artifacts/" in ignored
    missing = [p for p in paths if p not in ignored and not (REPO_ROOT / p).exists()]
    assert missing == []


def test_every_repository_path_the_docs_name_exists():
    assert {d.name for d in DOCS} >= {"architecture.md", "results.md"}
    for doc in DOCS:
        paths = repository_paths(doc.read_text(encoding="utf-8"))
        missing = [p for p in paths if not (REPO_ROOT / p).exists()]
        assert missing == [], doc.name


def test_the_readme_stays_short():
    """Tour and set-up in the README; measurements in docs/results.md, design in
    docs/architecture.md."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 400


def test_results_generator_names_only_files_that_exist():
    paths = repository_paths(RESULTS.read_text(encoding="utf-8"))
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert missing == []
    scripts = re.findall(r"\b(bench_\w+\.py)\b", RESULTS.read_text(encoding="utf-8"))
    assert scripts and [s for s in scripts if not (RESULTS.parent / s).exists()] == []


def _results(monkeypatch):
    monkeypatch.syspath_prepend(str(RESULTS.parent))
    sys.modules.pop("results", None)
    import results

    return results


def test_the_results_kernels_section_is_what_the_generator_writes(monkeypatch):
    """Without a GPU report the kernel section is the generator's note (or, once measured,
    the figures it carried over), whatever the machine."""
    results = _results(monkeypatch)
    text = RESULTS_MD.read_text(encoding="utf-8")
    section = results.kernels_section(None, text)
    assert section in text
    assert section == results.kernels_section() or results.KERNELS_MEASURED in section
    assert results.kernels_section() == results.kernels_section(None, "no such section")


def test_the_offline_compile_section_tabulates_every_kernel_and_counts_spills(monkeypatch):
    results = _results(monkeypatch)  # puts tools/ on the path
    import kernel_proxies

    def stats(config, kernel, spilled, loop, tile):
        return kernel_proxies.KernelStats(
            config=config, kernel=kernel, registers=80, spill_store_bytes=spilled,
            spill_load_bytes=spilled, local_instructions=0, stack_bytes=0, shared_bytes=4096,
            num_warps=4, num_stages=2, sass_instructions=900, loop_instructions=loop,
            loop_global_loads=2, loop_matrix_instructions=8, num_innermost_loops=1,
            block_size=16, tile_tokens=tile, compile_s=1.0,
        )  # fmt: skip

    section = results.proxies_section(
        [stats("decode-a", "_decode_kernel", 0, 448, 64),
         stats("decode-a", "_merge_kernel", 0, 90, 0),
         stats("prefill-b", "_prefill_kernel", 8, 640, 64), "copy-c: the call failed: boom"]
    )  # fmt: skip
    assert section.startswith(results.PROXIES_HEADING + "\n")
    assert "3 kernels, 1 with spills, 1 failed to compile." in section
    assert "| decode-a | decode_kernel | 80 | 0 | 4,096 | 4 | 448 | 7 |" in section
    assert "| decode-a | merge_kernel | 80 | 0 | 4,096 | 4 | 90 | — |" in section
    assert "| prefill-b | prefill_kernel | 80 | 16 | 4,096 | 4 | 640 | 10 |" in section
    assert section.endswith("Failed: copy-c: the call failed: boom\n")


def _eviction_row(policy: str, num_blocks: int, hit: float, opt: float) -> dict:
    return {
        "policy": policy, "num_blocks": num_blocks, "requests": 10, "hit_rate": hit,
        "hit_rate_opt": opt, "share_of_opt": hit / opt, "hit_rate_lru_curve": hit,
        "hit_rate_unbounded": 0.5, "num_preemptions": 0, "ttft_mean_s": 1.0, "cpu_s": 3.0,
    }  # fmt: skip


def test_the_eviction_and_queue_sections_tabulate_their_reports(monkeypatch, tmp_path):
    results = _results(monkeypatch)
    trace = tmp_path / "trace.json"
    runs = (("lru", 100, 0.1), ("slru", 100, 0.2), ("lru", 200, 0.3), ("lfu", 200, 0.2))
    rows = [_eviction_row(policy, n, hit, 0.4) for policy, n, hit in runs]
    trace.write_text(json.dumps(rows))
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([_eviction_row("lru", 64, 0.5, 0.6)]))
    text, (headline,) = results.eviction_section(trace, chat)
    assert text.startswith(results.EVICTION_HEADING + "\n")
    assert "| 100 | slru | 20.0% | +10.00 pt | 40.0% | 50.0% |" in text
    assert "| 64 | lru | 50.0% | +0.00 pt | 60.0% | 83.3% |" in text
    assert (
        headline.figure
        == "share of OPT at 100 / 200 blocks: lru 25% / 75%; best slru 50% / lru 75%"
    )
    queue = tmp_path / "queue.json"
    prefix = {"experiment": "prefix", "requests": 1, "prefix_hit_rate": 0.5, "cold_requests": 1,
              "cold_ttft_p50_s": 1.0, "ttft_p99_s": 3.0}  # fmt: skip
    tenants = {
        "experiment": "tenants",
        "contended_s": 1.0,
        "served_tokens": {"light": 1, "flood": 2},
    }
    queue.write_text(json.dumps({"rows": [
        prefix | {"queue": "fcfs", "total_tokens_per_s": 100.0, "cold_ttft_p99_s": 4.0},
        prefix | {"queue": "lpm", "total_tokens_per_s": 150.0, "cold_ttft_p99_s": 2.0},
        tenants | {"queue": "fcfs", "flood_to_light": 9.0},
        tenants | {"queue": "fair", "flood_to_light": 1.1},
    ]}))  # fmt: skip
    text, (headline,) = results.queue_section(queue)
    assert text.startswith(results.QUEUE_HEADING + "\n") and "| lpm | 150 |" in text
    assert headline.figure == (
        "lpm 1.50× fcfs's throughput, cold p99 TTFT 0.50×; fair: flooding/light service 1.10 "
        "(fcfs 9.00)"
    )


def test_docs_results_is_the_generators_whole_document(monkeypatch):
    """docs/results.md says which command wrote it, lists its sections with working
    anchors, and holds only sections the generator writes (no hand-written ones)."""
    results = _results(monkeypatch)
    text = RESULTS_MD.read_text(encoding="utf-8")
    head = re.match(r"# Results\n\nGenerated on \d{4}-\d\d-\d\d by `(?P<command>[^`]+)`", text)
    assert head and head["command"].startswith("python3 benchmarks/results.py")
    headings = re.findall(r"^## .+$", text, re.M)
    generated = {
        value for name, value in vars(results).items()
        if name.endswith("_HEADING") and isinstance(value, str)
    }  # fmt: skip
    assert headings and set(headings) <= generated
    anchors = {results.anchor(h) for h in headings}
    for link in re.findall(r"^- \[[^\]]+\]\(#([\w-]+)\)$", text, re.M):
        assert link in anchors
    assert len(re.findall(r"^- \[", text, re.M)) == len(headings)


def test_the_readme_results_table_links_to_sections_of_docs_results(monkeypatch):
    """The README's Results are the generator's table: one row per headline figure, each
    linking to a section of docs/results.md that exists."""
    results = _results(monkeypatch)
    readme = README.read_text(encoding="utf-8")
    block = readme[readme.index(results.BEGIN) : readme.index(results.END)]
    assert block.count("\n| --- |") == 1  # one table
    links = re.findall(r"\]\(docs/results\.md#([\w-]+)\)", block)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    assert links and len(links) == len(rows) - 1  # every row but the header
    headings = re.findall(r"^## .+$", RESULTS_MD.read_text(encoding="utf-8"), re.M)
    assert set(links) <= {results.anchor(h) for h in headings}
    assert "### " not in readme[readme.index("## Results") : readme.index(results.BEGIN)]


def test_the_generator_finds_sections_at_either_level_and_makes_github_anchors(monkeypatch):
    results = _results(monkeypatch)
    text = "# R\n\n### A: b (c, d)\n\nbody\n\n| x |\n| --- |\n\n## Next\n"
    assert results.carried_section(text, "## A: b (c, d)") == (
        "## A: b (c, d)\n\nbody\n\n| x |\n| --- |\n"
    )
    assert results.carried_section(text, "## Missing") == ""
    assert results.anchor("## KV quantizers: quality (torch, 1,000 ×)") == (
        "kv-quantizers-quality-torch-1000-"
    )
    block = results.headline_block([results.Headline("what", "1 µs", "## A b")], "cmd")
    assert "| what | 1 µs | [A b](docs/results.md#a-b) |" in block
    assert block.startswith(results.BEGIN) and block.endswith(results.END + "\n")


def test_the_generator_carries_measured_quality_tables_when_the_model_is_missing(
    monkeypatch, tmp_path
):
    results = _results(monkeypatch)
    import train_stdlib_llama

    monkeypatch.setattr(train_stdlib_llama, "cache_dir", lambda: tmp_path)  # no model here
    section = results.quality_section(RESULTS_MD.read_text(encoding="utf-8"))
    assert section.startswith(results.QUALITY_HEADING) and "```text" in section
    assert section.count(results.QUALITY_CARRIED) == 1
    assert results.quality_section(section) == section  # carried again, marked once
    assert "Not run" in results.quality_section("")


# ---- code blocks ------------------------------------------------------------------------

TUTORIAL = "Writing a plugin package"
_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
_HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *$", re.M)
_FILE_LINE = re.compile(r"# (?P<name>[\w.-]+\.(?:py|toml))\n")


class Block(NamedTuple):
    """A fenced code block: its info string ("python", "toml", "" ...), its text, and
    the title of the heading it stands under."""

    info: str
    body: str
    section: str


def code_blocks(text: str) -> list[Block]:
    blocks = []
    for match in _FENCE.finditer(text):
        headings = [m for m in _HEADING.finditer(text, 0, match.start()) if not _in_fence(text, m)]
        section = headings[-1]["title"] if headings else ""
        blocks.append(Block(match["info"].strip(), match["body"], section))
    return blocks


def _in_fence(text: str, heading: re.Match[str]) -> bool:
    return text.count("\n```", 0, heading.start()) % 2 == 1


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block: one per line and per ``&&``, comments dropped,
    leading ``VAR=value`` environment settings dropped."""
    result = []
    for line in block.body.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            command, words = words[:cut], words[cut + 1 :]
            while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", command[0]):
                command = command[1:]
            if command:
                result.append(command)
    return result


def tutorial_files(blocks: list[Block]) -> dict[str, str]:
    """The tutorial's files: each of its blocks whose first line is ``# <file name>``."""
    files = {}
    for block in blocks:
        named = _FILE_LINE.match(block.body)
        if block.section == TUTORIAL and named:
            files[named["name"]] = block.body
    return files


BLOCKS = code_blocks(README.read_text(encoding="utf-8"))


def test_code_block_finder_reads_sections_commands_and_files():
    text = (
        "# Top\n\n## Set up\n\n```\nA=1 python3 -m x --y 'a b'  # note\ncmd1 && cmd2\n```\n"
        f"### {TUTORIAL}\n\n```toml\n# pyproject.toml\n[project]\n```\n"
        "```python\n# not a heading\nprint(1)\n```\n"
    )
    blocks = code_blocks(text)
    assert [(b.info, b.section) for b in blocks] == [
        ("", "Set up"),
        ("toml", TUTORIAL),
        ("python", TUTORIAL),
    ]
    assert commands(blocks[0]) == [["python3", "-m", "x", "--y", "a b"], ["cmd1"], ["cmd2"]]
    assert tutorial_files(blocks) == {"pyproject.toml": "# pyproject.toml\n[project]\n"}


def test_every_code_block_is_of_a_kind_these_tests_run():
    """Python and shell blocks run (below), the tutorial's files are installed, text
    blocks are printed output. A block of another kind needs a test first."""
    kinds = {(b.info, b.section == TUTORIAL and bool(_FILE_LINE.match(b.body))) for b in BLOCKS}
    assert kinds <= {
        ("", False),
        ("python", False),
        ("toml", True),
        ("python", True),
        ("text", False),
    }
    assert sum(b.info == "" for b in BLOCKS) >= 6 and any(b.info == "python" for b in BLOCKS)


def test_python_blocks_run():
    ran = 0
    for block in BLOCKS:
        if block.info == "python" and not _FILE_LINE.match(block.body):
            exec(compile(block.body, f"README.md ({block.section})", "exec"), {})
            ran += 1
    assert ran >= 1


def _split_sweeps(args: list[str]) -> list[list[str]]:
    """Each combination of a command line's comma sweeps (``a=x,y b=1,2``: four)."""
    axes = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and re.fullmatch(r"[\w.\-]+(,[\w.\-]+)+", value):
            axes.append([f"{key}={v}" for v in value.split(",")])
        else:
            axes.append([arg])
    return [list(combo) for combo in itertools.product(*axes)]


def test_shell_commands_outside_the_tutorial_name_what_exists_and_compose():
    """Outside the tutorial, the commands are sized for a user (seconds to minutes each;
    tests/engine/test_cli.py runs those of Overrides and Sweeps with a small workload, and
    tests/engine/test_sweep.py the ablations): here every ``python3 -m enginekit`` command is
    composed exactly as its command line would be, each sweep combination apart, and
    builds an engine where it runs the simulator; installs name extras and folders that
    exist."""
    from enginekit.app import compose_config
    from enginekit.engine import Engine

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    seen: set[str] = set()
    for block in BLOCKS:
        if block.info != "" or block.section == TUTORIAL:
            continue
        for command in commands(block):
            assert command[:2] == ["python3", "-m"], command
            module, args = command[2], command[3:]
            seen.add(module)
            if module == "pip":
                assert args[0] == "install"
                for arg in args[1:]:
                    if arg.startswith("-"):
                        continue
                    folder, _, extra = arg.partition("[")
                    assert (REPO_ROOT / folder).is_dir(), arg
                    assert set(extra.rstrip("]").split(",")) - {""} <= set(extras), arg
            elif module == "enginekit":
                for combo in _split_sweeps([a for a in args if a != "-m"]):
                    cfg = compose_config(combo)
                    if cfg.executor == "sim":
                        Engine(cfg)
            else:
                assert module == "pytest", command
    assert {"pip", "enginekit", "pytest"} <= seen


def test_plugin_tutorial_installs_runs_and_uses_its_key(tmp_path):
    """The tutorial's files, written as it says, pip-install (into a folder of their own,
    without dependencies: enginekit is the one under test) and run with its commands; its
    module is the tests' fixture allocator under its own names."""
    files = tutorial_files(BLOCKS)
    assert set(files) == {"pyproject.toml", "enginekit_first_fit_example.py"}
    tutorial = [b for b in BLOCKS if b.section == TUTORIAL and b.info == ""]
    steps = [command for block in tutorial for command in commands(block)]
    assert [step[:4] for step in steps] == [
        ["python3", "-m", "pip", "install"],
        ["python3", "-m", "enginekit", "+allocator=first_fit_example"],
    ]
    assert "+eviction=sliding_window" in steps[1]
    package = tmp_path / steps[0][4]
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    project = tomllib.loads(files["pyproject.toml"])
    entry_points = project["project"]["entry-points"]["enginekit.allocator"]

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--target", str(site), str(package)],
        check=True, cwd=tmp_path, capture_output=True,
    )  # fmt: skip
    run = run_cli(
        [*steps[1][3:], "progress=false", "hydra.run.dir=run"], tmp_path, extra_pythonpath=[site]
    )
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    name, version = project["project"]["name"], project["project"]["version"]
    assert report["header"]["allocator"] == f"first_fit_example ({name} {version})"
    assert report["header"]["eviction"].startswith("sliding_window ")
    assert report["summary"]["num_requests_finished"] == report["summary"]["num_requests"]

    # the key it declares is the one its policy reads: free blocks 0, 3, 4 and 6 (6 freed
    # last, which paged hands out first); runs of 1 take the lowest two, runs of 2 a pair
    sys.path.insert(0, str(site))
    try:
        module = __import__("enginekit_first_fit_example")
    finally:
        sys.path.remove(str(site))

    def grown(**config: int) -> list[int]:
        backend = make_backend(native=True)
        spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, bits_per_element=16, block_size=4)
        kv = KVContext(backend.new_block_pool(8), backend.new_block_tables(4), spec, 64, backend)
        kv.pool.free([b for b in kv.pool.allocate(8) if b in (0, 3, 4, 6)])
        allocator = module.FirstFitAllocator(module.FirstFitConfig(**config), kv)
        kv.tables.add_sequence(0)
        allocator.grow([0], [8])
        return kv.tables.block_ids(0)

    assert grown(max_run_blocks=1) == [0, 3] and grown(max_run_blocks=2) == [3, 4]
    listed = run_cli([], tmp_path, extra_pythonpath=[site], module="enginekit.plugins")
    assert any(
        line.split()[:4] == ["allocator", "first_fit_example", name, version]
        for line in listed.stdout.splitlines()
    ), listed.stdout

    # it is the tests' fixture allocator (module docstring and names aside)
    fixture = REPO_ROOT / "tests" / "fixtures" / "first_fit_allocator" / "enginekit_first_fit.py"
    code = files["enginekit_first_fit_example.py"].replace('"first_fit_example"', '"first_fit"')
    assert code.split('"""', 2)[2].lstrip() == fixture.read_text().split('"""', 2)[2].lstrip()

    # its names are its own: installing it leaves the tests' fixture plugins unambiguous
    for fixture in (REPO_ROOT / "tests" / "fixtures").glob("*/pyproject.toml"):
        other = tomllib.loads(fixture.read_text())["project"]
        assert other["name"] != name
        for group, names in other.get("entry-points", {}).items():
            if group == "enginekit.allocator":
                assert not set(names) & set(entry_points), fixture
        modules = set(tomllib.loads(fixture.read_text())["tool"]["setuptools"]["py-modules"])
        assert not modules & {Path(f).stem for f in files if f.endswith(".py")}


def test_set_up_says_what_a_new_machine_needs_before_its_commands():
    text = README.read_text(encoding="utf-8")
    setup = text[text.index("## Set up") :]
    before = setup[: setup.index("```")]  # what precedes the first command
    cargo = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["package"]["rust-version"]
    python = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert f"Rust toolchain ≥ {cargo}" in before and "`cargo`" in before
    assert f"Python ≥ {python['requires-python'].lstrip('>=')}" in before
    assert re.search(r"\d+(\.\d+)? GB", before) and re.search(r"\d+ minutes", before)
    assert "python3 -m pip install -e . -e ./plugins" in before  # the install without torch


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_main_jobs_figures_are_what_their_configs_run():
    """Set up's sentences on the two main jobs: the tiny chat's requests and system prompt,
    the default's model, hardware, requests and system prompt, as their configs hold them."""
    from enginekit.app import compose_config

    text = " ".join(README.read_text(encoding="utf-8").split())
    chat = re.search(r"serving ([\d,]+) chat requests that share a ([\d,]+)-token system", text)
    assert chat, "the tiny chat's sentence"
    cfg = compose_config(["+experiment=tiny_chat"])
    assert (cfg.executor, cfg.model.name) == ("torch", "tiny")
    assert cfg.workload.num_requests == _number(chat[1])
    assert cfg.workload.shared_prefix_len == _number(chat[2])
    default = re.search(
        r"runs the simulator's default: Llama-3-8B on an H200 serving ([\d,]+) such requests "
        r"with a ([\d,]+)-token system prompt",
        text,
    )
    assert default, "the default job's sentence"
    cfg = compose_config([])
    assert (cfg.executor, cfg.model.name, cfg.hardware.name) == ("sim", "llama-3-8b", "h200")
    assert cfg.workload.name == "shared_prefix"
    assert cfg.workload.num_requests == _number(default[1])
    assert cfg.workload.shared_prefix_len == _number(default[2])


def test_the_default_job_serves_the_requests_the_readme_says(tmp_path):
    """``python3 -m enginekit``, run as the README shows it, serves the number of requests
    the README gives. (Its time is a benchmark's to measure, not a test's.)"""
    text = " ".join(README.read_text(encoding="utf-8").split())
    result = run_cli([], tmp_path)
    assert result.returncode == 0, result.stderr
    (report,) = tmp_path.glob("outputs/*/*/report.json")
    summary = json.loads(report.read_text())["summary"]
    requests = re.search(r"serving ([\d,]+) such requests", text)
    assert requests and summary["num_requests_finished"] == _number(requests[1])


def test_the_readme_lists_every_preset_ablation_and_ci_step_as_they_are():
    from enginekit.app import conf_names, preset_names

    text = " ".join(README.read_text(encoding="utf-8").split())
    presets = re.search(r"Presets: `model=` (.+?); `hardware=` (.+?); `workload=` (.+?)\. ", text)
    assert presets
    listed = [
        [name.replace(" (default)", "").strip() for name in group.split(",")]
        for group in presets.groups()
    ]
    names = preset_names()
    for group, shown in zip(("model", "hardware", "workload"), listed, strict=True):
        assert sorted(shown) == names[group], group
    assert "llama-3-8b (default)" in presets[1]
    ablations = re.search(r"`\+ablation=` (.+?) \(every group crossed", text)
    assert ablations
    shown = re.findall(r"`(\w+)`", ablations[1])
    assert sorted(shown) == conf_names("ablation")
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    seconds = re.search(r"and the fuzz command below for (\d+) s", text)
    assert seconds and f"-max_total_time={seconds[1]}\n" in ci
    steps = ("cargo test", "ruff check .", "ruff format --check .", "lint-imports")
    assert all(step in text and step in ci for step in steps)
    assert "mypy enginekit\n" in ci and "mypy plugins/enginekit_plugins\n" in ci


def test_the_simulator_tables_are_what_their_commands_run(monkeypatch):
    """Each simulator table of docs/results.md is headed by the bench_simulator.py command
    that prints it: the workload the heading names (the benchmark's default is ShareGPT,
    so the default job's table names ``--workload shared_prefix``) and a row per count."""
    results = _results(monkeypatch)
    import bench_simulator

    document = RESULTS_MD.read_text(encoding="utf-8")
    for heading, workload in (
        (results.SIMULATOR_HEADING, "shared_prefix"),
        (results.SHAREGPT_HEADING, "sharegpt"),
    ):
        section = document.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        command = re.search(r"`python3 benchmarks/bench_simulator\.py([^`]*)`", section)
        assert command, heading
        args = command[1].split()
        options = dict(zip(args[::2], args[1::2], strict=True))
        assert options.get("--workload", bench_simulator.DEFAULT_WORKLOAD) == workload, heading
        counts = [int(c) for c in options["--counts"].split(",")]
        rows = [line for line in section.splitlines() if re.match(r"\| [\d,]+ \|", line)]
        assert [_number(row.split("|")[1]) for row in rows] == counts, heading

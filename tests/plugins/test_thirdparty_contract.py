"""Third-party packages of the allocator, prefix, preemption, quantizer and eviction groups, written
against the plugin contract alone (``tests/fixtures/*``), are found, configured and run with
no change to enginekit: each is listed with its distribution and version, runs from the
command line with a key of its own, and runs in an Engine with every cache invariant
checked after every step and nothing leaked at the end, its decisions following its rule.
Their modules import nothing of enginekit but the public contract.
"""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import REPO_ROOT, SMALL
from test_liveness import assert_finished_and_nothing_leaked

from enginekit import Engine, SamplingParams
from enginekit.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import KVQuant, PreemptionMode
from enginekit.kv.backend import make_backend
from enginekit.plugins import config_keys, load_plugin
from enginekit.request import Request

FIXTURES = REPO_ROOT / "tests" / "fixtures"
ALLOWED_ENGINEKIT_MODULES = (
    "enginekit.interfaces",
    "enginekit.config",
    "enginekit.errors",
    "enginekit.request",
)


class Package(NamedTuple):
    folder: str
    group: str
    name: str
    distribution: str
    version: str
    module: str


PACKAGES = [
    Package("first_fit_allocator", "allocator", "first_fit", "enginekit-first-fit", "1.2.0",
            "enginekit_first_fit"),
    Package("prompt_only_prefix", "prefix", "prompt_only", "enginekit-prompt-cache", "0.2.0",
            "enginekit_prompt_cache"),
    Package("largest_preemption", "preemption", "largest", "enginekit-largest-victim", "0.5.0",
            "enginekit_largest_victim"),
    Package("split_int4_quantizer", "quantizer", "split_int4", "enginekit-split-int4", "0.4.0",
            "enginekit_split_int4"),
    Package("clock_eviction", "eviction", "clock", "enginekit-clock-eviction", "0.2.0",
            "enginekit_clock_eviction"),
]  # fmt: skip
ALL_FIXTURES = sorted(p.parent for p in FIXTURES.glob("*/pyproject.toml"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fixture package pip-installed, in one call, into a folder of its own (put on
    PYTHONPATH to use)."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--target", str(target), *map(str, ALL_FIXTURES)],
        check=True,
        cwd=build,
        capture_output=True,
    )  # fmt: skip
    return target


@pytest.fixture(scope="module")
def importable(site: Path) -> Iterator[None]:
    """The installed packages on this process's sys.path for the module's tests, and off it
    (their modules forgotten) afterwards, so that other tests see the usual plugins."""
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        sys.path.remove(str(site))
        for package in PACKAGES:
            sys.modules.pop(package.module, None)


# ---- packaging and the command line ---------------------------------------------------


def test_the_packages_declare_what_these_tests_expect():
    """Each folder holds a pyproject.toml and one module, registered in its group."""
    for package in PACKAGES:
        folder = FIXTURES / package.folder
        project = tomllib.loads((folder / "pyproject.toml").read_text())
        assert project["project"]["name"] == package.distribution
        assert project["project"]["version"] == package.version
        assert project["tool"]["setuptools"]["py-modules"] == [package.module]
        entry_points = project["project"]["entry-points"]
        assert list(entry_points) == [f"enginekit.{package.group}"]
        (target,) = entry_points[f"enginekit.{package.group}"].items()
        assert target[0] == package.name and target[1].startswith(package.module + ":")
        assert sorted(p.name for p in folder.glob("*.py")) == [f"{package.module}.py"]


def test_each_package_is_listed_with_its_distribution_and_version(cli, site):
    result = cli(module="enginekit.plugins", extra_pythonpath=[site])
    assert result.returncode == 0, result.stderr
    rows = [line.split()[:4] for line in result.stdout.splitlines()]
    for package in PACKAGES:
        row = [package.group, package.name, package.distribution, package.version]
        assert row in rows, result.stdout


def test_each_config_has_a_key_of_its_own(importable):
    for package in PACKAGES:
        plugin_cls = load_plugin(package.group, package.name)
        assert config_keys(plugin_cls.Config), package.name


# A Llama-3-8B block of 16 tokens as split_int4 stores it with 8-token key groups and
# 32-channel value groups: 4-bit codes, plus a float16 scale and zero per group.
_LLAMA3_INT4_VALUES = 2 * 32 * 8 * 128 // 2  # bytes of codes per token
_LLAMA3_INT4_SCALES = 32 * 8 * (16 // 8 * 128 + 16 * (128 // 32)) * 2 * 2 // 16  # per token


def _check_first_fit(report: dict[str, Any]) -> None:
    assert report["header"]["eviction"] == "sliding_window (enginekit-plugins 0.1.0)"
    assert report["summary"]["num_preemptions_total"] > 0


def _check_prompt_only(report: dict[str, Any]) -> None:
    summary = report["summary"]
    # 40 blocks of 16 tokens at most per first admission; the workload shares more
    assert 0 < summary["prefix_cache_first_hits"] <= 40 * 16 * summary["num_requests"]
    assert summary["prefix_cache_first_hits"] < summary["prefix_cache_hits_ideal"]


def _check_largest(report: dict[str, Any]) -> None:
    assert set(report["summary"]["num_preemptions_by_kind"]) == {"swap", "recompute"}


def _check_split_int4(report: dict[str, Any]) -> None:
    assert report["header"]["kv_bytes_per_token"] == _LLAMA3_INT4_VALUES + _LLAMA3_INT4_SCALES


def _check_clock(report: dict[str, Any]) -> None:
    assert report["summary"]["prefix_cache_first_hits"] > 0


COMMAND_LINES = {
    "first_fit": (
        ["+allocator=first_fit", "allocator.max_run_blocks=4", "+eviction=sliding_window",
         "eviction.window=256", "cache.num_blocks=120"],
        _check_first_fit,
    ),
    "prompt_only": (
        ["+prefix=prompt_only", "prefix.max_blocks_per_prompt=40", "cache.num_blocks=400"],
        _check_prompt_only,
    ),
    "largest": (
        ["+preemption=largest", "preemption.min_swap_blocks=130",
         "preemption.swap_space_gib=2", "cache.num_blocks=400"],
        _check_largest,
    ),
    "split_int4": (
        ["+quantizer=split_int4", "quantizer.key_group_tokens=8",
         "quantizer.value_group_channels=32", "cache.num_blocks=400"],
        _check_split_int4,
    ),
    "clock": (["+eviction=clock", "eviction.max_chances=3", "cache.num_blocks=400"], _check_clock),
}  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_each_runs_from_the_command_line_with_its_own_keys(cli, site, tmp_path, package):
    """A tight pool over the simulated Llama-3-8B, so that the plugin's paths run:
    preemptions, windows, evictions."""
    args, check = COMMAND_LINES[package.name]
    result = cli(
        *args, *SMALL, "workload.num_requests=12", "hydra.run.dir=run", extra_pythonpath=[site]
    )
    assert result.returncode == 0, result.stderr
    assert "== preemption ==" in result.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "completed"
    assert report["header"][package.group] == (
        f"{package.name} ({package.distribution} {package.version})"
    )
    summary = report["summary"]
    assert summary["num_requests_finished"] == summary["num_requests"] == 12
    check(report)


# ---- in an Engine ----------------------------------------------------------------------


def _engine(num_blocks: int, native: bool = True, **plugins: dict[str, Any]) -> Engine:
    """The tiny model on the simulator, 4-token blocks, no watermark, on the Rust
    structures or (``native`` false) their Python twins; ``plugins`` maps a group to
    ``{"name": ..., key: value}``."""
    configs = {}
    for group, keys in plugins.items():
        keys = dict(keys)
        configs[group] = load_plugin(group, keys.pop("name")).Config(**keys)
    return Engine(
        EngineConfig(
            **configs,
            model=ModelConfig(name="tiny"),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks, watermark=0.0),
            scheduler=SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64),
            progress=False,
        ),
        make_backend(native),
    )


def _prompts(num: int, seed: int) -> list[tuple[list[int], int, int]]:
    """``num`` (prompt, max_tokens, n): ragged prompts, some sharing a 24-token head."""
    rng = random.Random(seed)
    head = rng.choices(range(3, 500), k=24)
    return [
        (
            head[: rng.choice((0, 8, 16, 24))] + rng.choices(range(3, 500), k=rng.randint(1, 40)),
            rng.choice((8, 16, 32)),
            rng.choice((1, 1, 2)),
        )
        for _ in range(num)
    ]


def _run(
    engine: Engine,
    requests: list[tuple[list[int], int, int]],
    after_step: Callable[[], None] = lambda: None,
) -> dict[str, int]:
    """Adds the requests (all arrive now), steps until all have finished with every
    invariant checked after every step, and checks that they finished and left nothing
    behind; returns each request's output length by id."""
    accepted = {}
    for prompt, max_tokens, n in requests:
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n, seed=1)
        accepted[engine.add_request(prompt, sampling)] = sampling
    for _ in range(3000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.check_integrity()
        after_step()
    assert not engine.has_unfinished_requests()
    assert_finished_and_nothing_leaked(engine, accepted)
    return {request_id: sampling.max_tokens for request_id, sampling in accepted.items()}


def _first_fit_runs(free: list[int], needs: list[int], max_run: int) -> list[int]:
    """What first_fit's rule hands out from the free blocks ``free`` for sequences needing
    ``needs`` blocks: while one needs n more, the lowest run of free blocks of the longest
    length up to min(n, max_run) there is."""
    free_set = set(free)
    taken = []
    for need in needs:
        run = min(need, max_run)
        while need:
            run = min(run, need)
            starts = (b for b in sorted(free_set) if all(b + i in free_set for i in range(run)))
            start = next(starts, None)
            if start is None:
                run -= 1
                continue
            free_set -= set(range(start, start + run))
            taken += range(start, start + run)
            need -= run
    return taken


@pytest.mark.parametrize("native", [True, False], ids=["native", "pyref"])
def test_first_fit_hands_out_first_fit_runs_and_leaves_holes_for_a_window(importable, native):
    """Every grow takes the blocks the rule names (not the pool's most recently freed
    ones, which paged takes), the window leaves holes in its tables, and each sequence
    stays within the window's bound between steps."""
    max_run = 3
    engine = _engine(
        20,
        native,
        allocator={"name": "first_fit", "max_run_blocks": max_run},
        eviction={"name": "sliding_window", "window": 12, "sink_tokens": 4},
    )
    cache, pool, tables = engine.cache, engine.cache.pool, engine.cache.tables
    allocator = cache.allocator
    grow = allocator.grow
    seen = {"grows": 0, "not_most_recently_freed": 0, "holes": 0}

    def checked_grow(seq_ids: list[int], num_tokens: list[int]) -> None:
        free_before = pool.free_block_ids()
        before = {s: len(tables.block_ids(s)) for s in seq_ids}
        grow(seq_ids, num_tokens)
        targets: dict[int, int] = {}
        for seq_id, num in zip(seq_ids, num_tokens, strict=True):
            targets[seq_id] = max(targets.get(seq_id, 0), -(-num // 4))
        new = []
        for seq_id, num_blocks in targets.items():
            entries = tables.block_ids(seq_id)
            assert len(entries) == max(before[seq_id], num_blocks)
            new.append(entries[before[seq_id] :])
        taken = [b for blocks in new for b in blocks]
        assert taken == _first_fit_runs(free_before, [len(b) for b in new], max_run)
        seen["grows"] += bool(taken)
        seen["not_most_recently_freed"] += taken != free_before[: len(taken)]

    allocator.grow = checked_grow
    bound = cache.eviction.max_blocks_per_sequence

    def after_step() -> None:
        seen["holes"] = max(seen["holes"], allocator.num_hole_blocks())
        for request in engine.scheduler.running:
            assert cache.num_held_blocks(request.seq_id) <= bound

    _run(engine, _prompts(12, seed=3), after_step)
    assert engine.summary()["num_preemptions_total"] > 0
    assert seen["grows"] > 20 and seen["not_most_recently_freed"] > 0 and seen["holes"] > 0


def test_first_fit_refuses_a_run_below_one(importable):
    with pytest.raises(ConfigError, match="allocator.max_run_blocks"):
        _engine(20, allocator={"name": "first_fit", "max_run_blocks": 0})


def _hits(engine: Engine, prompts: list[list[int]]) -> list[int]:
    """Runs ``prompts`` one after another (each once the one before has finished, 8 output
    tokens each); returns each one's prefix-cache hit, in tokens."""
    hits = []
    for prompt in prompts:
        (request_id,) = _run(engine, [(prompt, 8, 1)])
        hits.append(engine.output(request_id).num_cached_tokens)
    return hits


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ({"name": "prompt_only", "max_blocks_per_prompt": 3}, [0, 12, 12]),
        ({"name": "prompt_only", "max_blocks_per_prompt": 0}, [0, 20, 24]),
        ({"name": "block_hash"}, [0, 20, 28]),
    ],
    ids=["capped", "uncapped", "block_hash"],
)
def test_prompt_only_hits_only_published_prompt_blocks(importable, prefix, expected):
    """A 24-token prompt (6 blocks), then the same prompt (it may hit 5 blocks: its last
    token is computed again), then the first one's prompt and outputs extended. The
    second and third hit at most the cap; the third never hits the first one's output
    blocks, which block_hash publishes (the first request computed 31 tokens: 7 full
    blocks)."""
    engine = _engine(64, prefix=prefix)
    prompt = list(range(10, 34))
    (first,) = _run(engine, [(prompt, 8, 1)])
    extended = [*prompt, *engine.output(first).output_token_ids, 7]
    assert [0, *_hits(engine, [prompt, extended])] == expected


def test_prompt_only_follows_its_cap_under_memory_pressure(importable):
    """Shared heads in a tight pool (preemptions, evictions): every admission's hit stays
    within the cap and within the prompt."""
    engine = _engine(24, prefix={"name": "prompt_only", "max_blocks_per_prompt": 4})
    plugin = engine.cache.prefix
    match = plugin.match
    hits = []

    def checked_match(request: Request) -> Any:
        found = match(request)
        assert found.num_tokens <= 4 * 4 and found.num_tokens <= request.num_prompt_tokens
        hits.append(found.num_tokens)
        return found

    plugin.match = checked_match
    _run(engine, _prompts(12, seed=5))
    assert engine.summary()["num_preemptions_total"] > 0
    assert max(hits) == 16


@pytest.mark.parametrize("native", [True, False], ids=["native", "pyref"])
def test_largest_preempts_the_request_holding_the_most_blocks(importable, native):
    """Every victim holds the most blocks of the running requests (the lowest priority
    among equals), is swapped at the threshold or above and recomputed below it; some
    victims are not the lowest-priority request the default policy would take."""
    threshold = 14
    engine = _engine(
        20,
        native,
        preemption={"name": "largest", "min_swap_blocks": threshold, "swap_space_gib": 1.0},
    )
    cache, policy = engine.cache, engine.scheduler.preemption
    choose_victim, mode = policy.choose_victim, policy.mode
    seen = {"victims": 0, "not_last": 0, "modes": set()}

    def checked_choose_victim(running: list[Request]) -> Request:
        victim = choose_victim(running)
        held = [cache.num_held_blocks(r.seq_id) for r in running]
        index = running.index(victim)
        assert held[index] == max(held)
        assert index == max(i for i, h in enumerate(held) if h == max(held))
        seen["victims"] += 1
        seen["not_last"] += index != len(running) - 1
        return victim

    def checked_mode(request: Request) -> PreemptionMode:
        chosen = mode(request)
        is_large = cache.num_held_blocks(request.seq_id) >= threshold
        assert chosen == (PreemptionMode.SWAP if is_large else PreemptionMode.RECOMPUTE)
        seen["modes"].add(chosen)
        return chosen

    policy.choose_victim, policy.mode = checked_choose_victim, checked_mode
    _run(engine, _prompts(12, seed=7))
    assert seen["modes"] == {PreemptionMode.SWAP, PreemptionMode.RECOMPUTE}
    assert seen["not_last"] > 0
    assert sum(engine.summary()["num_preemptions_by_kind"].values()) == seen["victims"]
    assert engine.summary()["swap_out_bytes_total"] > 0


def test_largest_declares_its_swap_space(importable):
    def swap_blocks(gib: float) -> int:
        preemption = {"name": "largest", "swap_space_gib": gib}
        return _engine(28, preemption=preemption).cache.swap_space.num_blocks

    assert swap_blocks(0.0) == 0 and swap_blocks(1.0) == 28  # capped by the device pool
    with pytest.raises(ConfigError, match="preemption.swap_space_gib"):
        swap_blocks(-1.0)


def test_split_int4_stores_its_groups_and_sizes_the_pool_by_them(importable):
    """The tiny model (2 layers, 2 kv heads, head dim 16) in 4-token blocks: keys in groups
    of 2 tokens, values of 4 channels, against the whole block and head by default."""
    quantizer = {"name": "split_int4", "key_group_tokens": 2, "value_group_channels": 4}
    engine = _engine(24, quantizer=quantizer)
    assert engine.kv_spec.quant == KVQuant("int4", key_group_tokens=2, value_group_channels=4)
    codes = 2 * 2 * 2 * 16 * 4 // 2  # K and V, layers, kv heads, head dim, tokens; 2 a byte
    groups = 2 * 2 * (4 // 2 * 16 + 4 * (16 // 4))  # layers, kv heads, key and value groups
    assert engine.kv_spec.bytes_per_block == codes + groups * 2 * 2  # fp16 scale and zero
    _run(engine, _prompts(8, seed=11))
    default = _engine(24, quantizer={"name": "split_int4"}).kv_spec.quant
    assert (default.key_group_tokens, default.value_group_channels) == (4, 16)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"key_group_tokens": 3}, "quantizer.key_group_tokens=3 must divide the block"),
        ({"value_group_channels": 32}, "quantizer.value_group_channels=32 must divide the head"),
        ({"key_group_tokens": -1}, "quantizer.key_group_tokens must be >= 0"),
    ],
)
def test_split_int4_refuses_groups_that_do_not_divide(importable, keys, message):
    with pytest.raises(ConfigError, match=message):
        _engine(24, quantizer={"name": "split_int4", **keys})


@pytest.mark.parametrize("native", [True, False], ids=["native", "pyref"])
def test_clock_hears_the_accesses_and_spares_blocks_with_chances_left(importable, native):
    """Every eviction takes evictable blocks only, and only blocks with no chance left
    while one without exists; a block's chances are its hits since it was cached
    (capped), less the passes of the hand."""
    engine = _engine(24, native, eviction={"name": "clock", "max_chances": 2})
    policy, pool = engine.cache.eviction, engine.cache.pool
    assert type(policy).hears_accesses() and pool.is_recording_accesses
    evict = policy.evict
    seen = {"evictions": 0, "spared": 0}

    def checked_evict(num_blocks: int) -> list[int]:
        evictable = set(pool.evictable_block_ids())
        assert set(policy.ring) == evictable  # it heard everything before choosing
        chances = dict(policy.chances)
        victims = evict(num_blocks)
        assert len(victims) == num_blocks and set(victims) <= evictable
        seen["evictions"] += len(victims)
        seen["spared"] += sum(chances[b] > 0 for b in evictable - set(victims))
        return victims

    policy.evict = checked_evict
    _run(engine, _prompts(24, seed=5))
    assert seen["evictions"] > 0 and seen["spared"] > 0


def test_clock_refuses_negative_chances(importable):
    with pytest.raises(ConfigError, match="eviction.max_chances"):
        _engine(24, eviction={"name": "clock", "max_chances": -1})


# ---- the contract's imports --------------------------------------------------------------


def _refused_imports(code: str) -> set[str]:
    """The modules of enginekit, of its plugins or of other enginekit packages that
    ``code`` imports anywhere (functions and TYPE_CHECKING blocks included), except the
    public contract: ``enginekit.interfaces`` (and its modules), ``config``, ``errors`` and
    ``request``."""
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, ast.dump(node)  # no relative imports
            modules.add(node.module)
    return {
        m
        for m in modules
        if m.split(".")[0].startswith("enginekit")
        and not any(m == a or m.startswith(a + ".") for a in ALLOWED_ENGINEKIT_MODULES)
    }


@pytest.mark.parametrize("folder", ALL_FIXTURES, ids=[f.name for f in ALL_FIXTURES])
def test_each_fixture_imports_only_the_public_contract(folder):
    (module_file,) = folder.glob("*.py")
    code = module_file.read_text(encoding="utf-8")
    assert "from enginekit.interfaces import" in code
    assert _refused_imports(code) == set()


def test_the_import_check_refuses_internals_and_other_plugins():
    code = (
        "import enginekit.kv.manager\nfrom enginekit_plugins.allocator import paged\n"
        "import enginekit_mru_eviction\nfrom enginekit.interfaces.structures import RadixTree\n"
        "from enginekit.errors import ConfigError\nimport enginekit\n"
        "def f():\n    from enginekit._native import BlockPool\n"
    )
    assert _refused_imports(code) == {
        "enginekit",
        "enginekit.kv.manager",
        "enginekit_plugins.allocator",
        "enginekit_mru_eviction",
        "enginekit._native",
    }

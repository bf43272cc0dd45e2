"""The architecture as code: the import contracts of pyproject.toml's ``[tool.importlinter]``
(docs/architecture.md, "The layers") hold, they catch the imports they exist to refuse,
enginekit's modules import each other without cycles, the metric-key registry is the
summary's, and the Hydra config files travel inside the package.

Everything runs in-process on grimp's import graph (lazy, function-level and TYPE_CHECKING
imports included, as ``lint-imports`` counts them).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api
from importlinter.application import use_cases
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract

from enginekit import metric_keys as mk
from enginekit.metrics import RunMetrics

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
# The tests' third-party plugin packages: each a folder with a pyproject.toml and one module.
THIRD_PARTY_PLUGINS = sorted(
    p.parent for p in (ROOT / "tests" / "fixtures").glob("*/pyproject.toml")
)
CONTRACT_TYPES = {
    "layers": LayersContract,
    "forbidden": ForbiddenContract,
    "independence": IndependenceContract,
}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return api.read_configuration(str(PYPROJECT))


@pytest.fixture(scope="module")
def graph(config: dict[str, Any]) -> grimp.ImportGraph:
    return grimp.build_graph(*config["session_options"]["root_packages"], cache_dir=None)


def _contract(config: dict[str, Any], contract_id: str, **session: Any) -> Any:
    """The contract ``contract_id`` of pyproject.toml, as import-linter builds it."""
    options = next(o for o in config["contracts_options"] if o.get("id") == contract_id)
    return CONTRACT_TYPES[options["type"]](
        name=options["name"],
        session_options={**config["session_options"], **session},
        contract_options=options,
    )


def _links(metadata: Any) -> Iterator[tuple[str, str]]:
    """Every (importer, imported) pair a contract check's metadata names."""
    if isinstance(metadata, Mapping):
        importer, imported = metadata.get("importer"), metadata.get("imported")
        if isinstance(importer, str) and isinstance(imported, str):
            yield importer, imported
        for value in metadata.values():
            yield from _links(value)
    elif isinstance(metadata, list | tuple | set | frozenset):
        for item in metadata:
            yield from _links(item)


def _with_import(graph: grimp.ImportGraph, importer: str, imported: str) -> grimp.ImportGraph:
    mutated = copy.deepcopy(graph)
    mutated.add_import(
        importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}"
    )
    return mutated


# ---- the contracts ---------------------------------------------------------------------


def test_every_import_contract_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    """What ``lint-imports`` (.ci/run) reports: every contract kept, the broken ones'
    import chains (with line numbers) as the failure message."""
    passed = use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True)
    out = capsys.readouterr().out
    broken = out.find("Broken contracts")
    assert passed, out[broken:] if broken >= 0 else out


def test_lazy_and_type_checking_imports_count(
    config: dict[str, Any], graph: grimp.ImportGraph
) -> None:
    """The graph holds imports made inside a function (the claims' engine) and under
    TYPE_CHECKING (the prefix claim's Engine annotation)."""
    assert "exclude_type_checking_imports" not in config["session_options"]
    assert graph.direct_import_exists(
        importer="enginekit.claims.scenario", imported="enginekit.engine"
    )
    assert graph.direct_import_exists(
        importer="enginekit.claims.prefix", imported="enginekit.engine"
    )


REFUSED = [
    # (contract, importer, imported): an import each contract exists to refuse
    ("layers", "enginekit.kv", "enginekit.engine"),
    ("layers", "enginekit.executor", "enginekit.app"),
    ("layers", "enginekit.interfaces", "enginekit.kv"),
    ("layers", "enginekit.metrics", "enginekit.interfaces"),
    ("layers", "enginekit.config", "enginekit.request"),
    ("layers", "enginekit.errors", "enginekit.config"),
    ("layers", "enginekit.metric_keys", "enginekit.errors"),
    ("layers", "enginekit.engine", "enginekit.driver"),
    ("layers", "enginekit.reuse", "enginekit.kv"),
    ("layers", "enginekit.report", "enginekit.metrics"),
    ("layers", "enginekit.report", "enginekit.interfaces"),
    ("compute-column", "enginekit.kernels", "enginekit.models"),
    ("compute-column", "enginekit.models", "enginekit.executor"),
    ("policy-column", "enginekit.kv", "enginekit.scheduler"),
    ("policy-column", "enginekit.plugins", "enginekit.kv"),
    ("scheduler-through-the-door", "enginekit.scheduler.scheduler", "enginekit.kv.manager"),
    ("scheduler-through-the-door", "enginekit.scheduler.forks", "enginekit.kv.forks"),
    ("layers", "enginekit.scheduler", "enginekit.admission"),
    ("compute-not-policy", "enginekit.executor", "enginekit.kv"),
    ("compute-not-policy", "enginekit.kernels", "enginekit.kv"),
    ("compute-not-policy", "enginekit.models", "enginekit.scheduler"),
    ("policy-not-compute", "enginekit.kv", "enginekit.executor"),
    ("policy-not-compute", "enginekit.scheduler", "enginekit.executor"),
    ("policy-not-compute", "enginekit.scheduler", "enginekit.kernels"),
    ("plugins-public-api", "enginekit_plugins.prefix", "enginekit.kv"),
    ("plugins-public-api", "enginekit_plugins", "enginekit.spec"),
    ("plugins-not-root", "enginekit_plugins.prefix", "enginekit"),
    ("plugins-independent", "enginekit_plugins.eviction", "enginekit_plugins.prefix"),
]


@pytest.mark.parametrize(("contract_id", "importer", "imported"), REFUSED)
def test_a_contract_reports_the_import_it_refuses(
    config: dict[str, Any], graph: grimp.ImportGraph, contract_id: str, importer: str, imported: str
) -> None:
    check = _contract(config, contract_id).check(
        _with_import(graph, importer, imported), verbose=False
    )
    assert not check.kept
    assert (importer, imported) in set(_links(check.metadata))


ALLOWED = [
    ("plugins-public-api", "enginekit_plugins", "enginekit.config"),
    ("plugins-public-api", "enginekit_plugins.prefix", "enginekit.interfaces.base"),
    ("plugins-public-api", "enginekit_plugins.prefix", "enginekit.errors"),
    ("plugins-public-api", "enginekit_plugins.prefix", "enginekit.request"),
    ("layers", "enginekit.kv", "enginekit.interfaces"),
    ("layers", "enginekit.spec", "enginekit.config"),
    ("layers", "enginekit.driver", "enginekit.report"),
    ("layers", "enginekit.engine", "enginekit.reuse"),
    ("compute-column", "enginekit.executor", "enginekit.kernels"),
    ("policy-column", "enginekit.scheduler", "enginekit.plugins"),
    ("scheduler-through-the-door", "enginekit.scheduler.scheduler", "enginekit.interfaces"),
    ("layers", "enginekit.admission", "enginekit.kv"),
    ("compute-not-policy", "enginekit.executor", "enginekit.spec"),
    ("policy-not-compute", "enginekit.kv", "enginekit.interfaces"),
]


@pytest.mark.parametrize(("contract_id", "importer", "imported"), ALLOWED)
def test_a_contract_lets_an_allowed_import_through(
    config: dict[str, Any], graph: grimp.ImportGraph, contract_id: str, importer: str, imported: str
) -> None:
    check = _contract(config, contract_id).check(
        _with_import(graph, importer, imported), verbose=False
    )
    assert (importer, imported) not in set(_links(check.metadata))


COLUMNS = {
    "compute": ("enginekit.executor", "enginekit.models", "enginekit.kernels"),
    "policy": ("enginekit.scheduler", "enginekit.kv", "enginekit.plugins"),
}


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("enginekit.executor", "enginekit.kv"),
        ("enginekit.kv", "enginekit.executor"),
        ("enginekit.executor.torch.executor", "enginekit.kv.manager"),
        ("enginekit.kv.pyref.pool", "enginekit.kernels.ops"),
    ],
)
def test_the_columns_refuse_to_import_each_other(
    config: dict[str, Any], graph: grimp.ImportGraph, importer: str, imported: str
) -> None:
    """An import from one column into the other (a module of the compute column importing
    one of the policy column, or the reverse) breaks the contracts, and the contract that
    reports it names that import; the trunk ``layers`` contract alone, which keeps both
    columns in one layer, would let it through."""
    mutated = _with_import(graph, importer, imported)
    refused_by: dict[str, set[tuple[str, str]]] = {}
    for options in config["contracts_options"]:
        check = _contract(config, options["id"]).check(copy.deepcopy(mutated), verbose=False)
        if not check.kept:
            refused_by[options["id"]] = set(_links(check.metadata))
    from_compute = importer.startswith(COLUMNS["compute"])
    expected = "compute-not-policy" if from_compute else "policy-not-compute"
    assert set(refused_by) == {expected}, refused_by
    assert (importer, imported) in refused_by[expected]


def test_the_column_contracts_name_the_same_columns(config: dict[str, Any]) -> None:
    """The trunk's column layer holds exactly the two columns' packages; each column's
    layers contract orders its own packages, and the two forbidden contracts name them."""
    options = {o["id"]: o for o in config["contracts_options"]}

    def names(layers: list[str]) -> list[str]:
        return [n.strip() for layer in layers for n in layer.replace("|", ":").split(":")]

    trunk = {f"enginekit.{n}" for n in names(options["layers"]["layers"])}
    columns = [
        ("compute", "compute-column", "compute-not-policy"),
        ("policy", "policy-column", "policy-not-compute"),
    ]
    for column, order_id, apart_id in columns:
        packages = set(COLUMNS[column])
        assert packages <= trunk, column
        assert set(names(options[order_id]["layers"])) == packages, order_id
        assert set(options[apart_id]["source_modules"]) == packages, apart_id
        other = set(COLUMNS["policy" if column == "compute" else "compute"])
        assert set(options[apart_id]["forbidden_modules"]) == other, apart_id
    column_layer = next(
        layer for layer in options["layers"]["layers"] if "executor" in layer.split(" : ")
    )
    assert {f"enginekit.{n}" for n in names([column_layer])} == {
        *COLUMNS["compute"],
        *COLUMNS["policy"],
    }


def test_the_third_party_plugins_meet_the_plugin_rules(
    config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test fixture's plugin (one module) is checked by the contracts the built-in
    plugins meet, as the package grimp needs (its code as the ``__init__`` of a package
    named as the module), and none imports another."""
    packages = []
    for folder in THIRD_PARTY_PLUGINS:
        (module,) = folder.glob("*.py")
        (tmp_path / module.stem).mkdir()
        code = module.read_text(encoding="utf-8")
        (tmp_path / module.stem / "__init__.py").write_text(code, encoding="utf-8")
        packages.append(module.stem)
    assert len(packages) >= 5
    monkeypatch.syspath_prepend(str(tmp_path))
    roots = ["enginekit", *packages]
    plugin_graph = grimp.build_graph(*roots, cache_dir=None)
    refused = {"plugins-public-api": "enginekit.kv", "plugins-not-root": "enginekit"}
    for package in packages:
        imported = plugin_graph.find_modules_directly_imported_by(package)
        assert imported >= {"enginekit.interfaces"}, package
        for contract_id, forbidden in refused.items():
            options = next(o for o in config["contracts_options"] if o.get("id") == contract_id)
            for field in ("source_modules", "ignore_imports"):
                if field in options:
                    renamed = [e.replace("enginekit_plugins", package) for e in options[field]]
                    options = {**options, field: renamed}
            contract = CONTRACT_TYPES[options["type"]](
                name=options["name"],
                session_options={"root_packages": roots},
                contract_options=options,
            )
            check = contract.check(copy.deepcopy(plugin_graph), verbose=False)
            assert check.kept, (package, contract_id, sorted(set(_links(check.metadata))))
            broken = contract.check(_with_import(plugin_graph, package, forbidden), verbose=False)
            assert (package, forbidden) in set(_links(broken.metadata))
    independent = IndependenceContract(
        name="third-party plugins do not import each other",
        session_options={"root_packages": roots},
        contract_options={"modules": packages},
    )
    assert independent.check(copy.deepcopy(plugin_graph), verbose=False).kept
    crossing = _with_import(plugin_graph, packages[0], packages[1])
    assert (packages[0], packages[1]) in set(
        _links(independent.check(crossing, verbose=False).metadata)
    )


# ---- cycles ----------------------------------------------------------------------------


def _import_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """One shortest cycle through each group of ``package``'s modules that import each
    other in a circle (a strongly connected component of two or more), as the modules in
    import order, the first repeated at the end."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    # Tarjan's algorithm, iterative.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            child = next(successors, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    cycles = []
    for component in components:
        members, start = set(component), component[0]
        parent: dict[str, str] = {}
        frontier = [start]
        while start not in parent:  # breadth first, back to start, inside the component
            reached = []
            for node in frontier:
                for successor in edges[node]:
                    if successor in members and successor not in parent:
                        parent[successor] = node
                        reached.append(successor)
            frontier = reached
        path = [start]
        node = parent[start]
        while node != start:
            path.append(node)
            node = parent[node]
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def _describe(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    steps = []
    for importer, imported in zip(cycle, cycle[1:], strict=False):
        lines = [
            d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)
        ]
        steps.append(f"{importer} (l.{', '.join(map(str, lines))})")
    return " -> ".join([*steps, cycle[-1]])


def test_enginekit_modules_import_each_other_without_cycles(graph: grimp.ImportGraph) -> None:
    cycles = _import_cycles(graph, "enginekit")
    assert not cycles, "import cycles:\n" + "\n".join(_describe(graph, c) for c in cycles)


def test_a_new_import_cycle_is_found_and_described(graph: grimp.ImportGraph) -> None:
    mutated = _with_import(
        _with_import(graph, "enginekit.errors", "enginekit.metric_keys"),
        "enginekit.metric_keys",
        "enginekit.errors",
    )
    cycle = ["enginekit.errors", "enginekit.metric_keys", "enginekit.errors"]
    assert cycle not in _import_cycles(graph, "enginekit")
    assert cycle in _import_cycles(mutated, "enginekit")
    described = "enginekit.errors (l.1) -> enginekit.metric_keys (l.1) -> enginekit.errors"
    assert _describe(mutated, cycle) == described


# ---- the metric-key registry (layer 1) ---------------------------------------------------


def test_the_summary_writes_the_registry_keys_in_its_order() -> None:
    """Every key ``RunMetrics.summary()`` writes is in the registry, and every registry
    entry but those the engine and the driver add is written, in ``SUMMARY_KEYS`` order."""
    written = list(RunMetrics().summary(kv_bytes_per_block=1))
    by_engine = {mk.PREFIX_CACHE_IDEAL_GRANULARITY.key} | {m.key for m in mk.ADDED_BY_DRIVER}
    by_engine |= {m.key for m in (*mk.ADDED_WITH_TIERS, mk.KV_TIER_HIT_RATE_PREDICTED)}
    by_engine |= {m.key for m in mk.ADDED_WITH_TENANTS}  # a run of one tenant has none
    assert written == [m.key for m in mk.SUMMARY_KEYS if m.key not in by_engine]


def test_each_registry_entry_is_one_constant_named_as_its_key() -> None:
    constants = {n: v for n, v in vars(mk).items() if isinstance(v, mk.MetricKey)}
    assert all(name == metric.key.upper() for name, metric in constants.items())
    assert set(constants.values()) == set(mk.SUMMARY_KEYS)
    assert len(mk.BY_KEY) == len(mk.SUMMARY_KEYS) == len(constants)
    assert all(m.label and m.meaning for m in mk.SUMMARY_KEYS)
    assert {m.unit for m in mk.LATENCY_KEYS} == {mk.Unit.LATENCY}


# ---- Hydra's config files inside the package --------------------------------------------


def test_the_experiment_and_ablation_files_are_package_resources() -> None:
    """``pkg://enginekit.conf`` (Hydra's search path) finds them, so ``+experiment=`` and
    ``+ablation=`` work from an installed wheel as from the source tree."""
    conf = resources.files("enginekit.conf")
    for group in ("experiment", "ablation", "hydra/launcher"):
        folder = conf.joinpath(*group.split("/"))
        names = [f.name for f in folder.iterdir() if f.name.endswith(".yaml")]
        assert names, group
        assert all(folder.joinpath(n).read_text(encoding="utf-8").strip() for n in names)

"""The structure Protocols are the contract, and the stub, the Rust classes and their Python
twins follow it, member by member.

Each host structure has a Protocol (``enginekit/interfaces/structures.py``,
``enginekit/interfaces/hash_chains.py``), a class in the stub of the Rust module
(``enginekit/_native.pyi``), the Rust class itself (``enginekit._native``) and a
pure-Python twin (``enginekit.kv.pyref``). mypy checks that both implementations satisfy
the Protocols, which still lets a stub class carry members its Protocol lacks, or take a
default or a wider annotation the Protocol does not state. These tests read the
Protocols and the stub with ``ast`` and compare, for every public member: that it is in
both, a property in both or a method in both, with the same parameters (names, kinds,
annotations, defaults) and return annotation; that the stub has no public member its
Protocol lacks beyond the listed exceptions; and that the live Rust class and the twin
have every member, with the same parameter names, kinds and defaults (their signatures,
through ``inspect``), and nothing public the stub lacks. A failure names the structure
and the member.
"""

from __future__ import annotations

import ast
import copy
import inspect
import types
from pathlib import Path
from typing import NamedTuple

import pytest

import enginekit._native as native
from enginekit.kv import pyref

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "enginekit" / "_native.pyi"
PROTOCOL_MODULES = [
    ROOT / "enginekit" / "interfaces" / "structures.py",
    ROOT / "enginekit" / "interfaces" / "hash_chains.py",
]

# Each structure's Protocol, named as its class in the stub and in enginekit._native, and
# its Python twin.
TWINS: dict[str, type] = {
    "BlockPool": pyref.PyBlockPool,
    "BlockTables": pyref.PyBlockTables,
    "RadixTree": pyref.PyRadixTree,
    "HashChains": pyref.PyHashChains,
    "LruRoom": pyref.PyLruRoom,
}
STRUCTURES = sorted(TWINS)

# Protocols of those modules that describe no class of enginekit._native.
NOT_STRUCTURES = {
    # What a pool's owner hands an LruRoom (the cache manager's prefill promises): the
    # caller's object, read by the room at each call.
    "FreeBlockReserve",
}

# Public members a stub class has beyond its Protocol: the engine and the plugins never
# call them, so they stay out of the contract. The live class and the twin must have them
# all the same (checked below).
STUB_ONLY = {
    # Check-only: the tests and the fuzzer compare whole pool states with it (hash -> block
    # id of every cached block); the engine and the plugins ask lookup_prefix instead.
    ("BlockPool", "cached_blocks"),
}

# The Protocols' type variables, as the stub spells them: the stub's classes take their own
# implementation's pool and tables.
TYPE_VARS = {"PoolT": "BlockPool", "TablesT": "BlockTables"}

# Slots of a Rust class carry no text signature (pyo3 gives ``(self, /, *args, **kwargs)``):
# such a member is checked for presence and kind only.
_UNSIGNED = ("args", "kwargs")


class Param(NamedTuple):
    name: str
    kind: str  # an inspect.Parameter kind's name
    annotation: str | None
    default: str | None  # the default's source, None for none


class Member(NamedTuple):
    kind: str  # "property", "method" or "attribute"
    params: tuple[Param, ...]  # self left out
    returns: str | None


def _is_public(name: str) -> bool:
    """A member of the contract: no leading underscore, or a special method other than
    the constructor (``__call__``)."""
    if name.startswith("__") and name.endswith("__"):
        return name != "__init__"
    return not name.startswith("_")


class _TypeVars(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id=TYPE_VARS.get(node.id, node.id), ctx=node.ctx)


def _annotation(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        node = ast.parse(node.value, mode="eval").body
    return ast.unparse(_TypeVars().visit(copy.deepcopy(node)))


def _params(args: ast.arguments) -> tuple[Param, ...]:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    params = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append(Param(arg.arg, kind, _annotation(arg.annotation), _source(default)))
    if args.vararg is not None:
        params.append(
            Param(args.vararg.arg, "VAR_POSITIONAL", _annotation(args.vararg.annotation), None)
        )
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(
            Param(arg.arg, "KEYWORD_ONLY", _annotation(arg.annotation), _source(kw_default))
        )
    if args.kwarg is not None:
        params.append(
            Param(args.kwarg.arg, "VAR_KEYWORD", _annotation(args.kwarg.annotation), None)
        )
    return tuple(params[1:])  # self


def _source(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _members(cls: ast.ClassDef) -> dict[str, Member]:
    members = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            decorators = {ast.unparse(d) for d in node.decorator_list}
            kind = "property" if "property" in decorators else "method"
            returns = _annotation(node.returns)
            members[node.name] = Member(kind, _params(node.args), returns)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = Member("attribute", (), _annotation(node.annotation))
    return members


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(
        ast.unparse(base).split("[")[0] in {"Protocol", "typing.Protocol"} for base in cls.bases
    )


PROTOCOLS = {
    name: _members(cls)
    for path in PROTOCOL_MODULES
    for name, cls in _classes(path).items()
    if _is_protocol(cls)
}
STUB_CLASSES = _classes(STUB)
STUBS = {name: _members(cls) for name, cls in STUB_CLASSES.items()}


def _public(members: dict[str, Member]) -> dict[str, Member]:
    return {name: m for name, m in members.items() if _is_public(name)}


def _describe(params: tuple[Param, ...]) -> str:
    return (
        "("
        + ", ".join(
            f"{p.name}: {p.annotation} = {p.default}" if p.default else f"{p.name}: {p.annotation}"
            for p in params
        )
        + ")"
    )


# ---- the Protocols and the stub ---------------------------------------------------------


def test_every_protocol_is_a_stub_class_and_every_stub_class_a_protocol() -> None:
    named = set(STRUCTURES) | NOT_STRUCTURES
    assert set(PROTOCOLS) == named, (
        "a Protocol of the structure modules is neither a structure (TWINS) nor listed in "
        f"NOT_STRUCTURES, or a listed one is gone: {sorted(set(PROTOCOLS) ^ named)}"
    )
    assert set(STUBS) == set(STRUCTURES), (
        f"stub classes without a Protocol, or structures without a stub class: "
        f"{sorted(set(STUBS) ^ set(STRUCTURES))}"
    )
    live = {name for name, value in vars(native).items() if isinstance(value, type)}
    assert live == set(STRUCTURES), f"classes of enginekit._native: {sorted(live)}"


def test_the_stub_names_what_the_native_module_holds() -> None:
    """Module level: the stub's functions, constants and classes are the native module's."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    stubbed = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    live = {name for name in vars(native) if not (name.startswith("__") and name.endswith("__"))}
    assert stubbed == live, (
        f"in the stub only: {sorted(stubbed - live)}; in enginekit._native only: "
        f"{sorted(live - stubbed)}"
    )


def _protocol_problems(structure: str, stub: dict[str, Member]) -> list[str]:
    """How ``stub`` (a stub class's members) departs from the structure's Protocol."""
    protocol = _public(PROTOCOLS[structure])
    problems = []
    for name, wanted in protocol.items():
        where = f"{structure}.{name}"
        if name not in stub:
            problems.append(f"{where}: in the Protocol, missing from the stub")
            continue
        got = stub[name]
        if got.kind != wanted.kind:
            problems.append(f"{where}: a {wanted.kind} in the Protocol, a {got.kind} in the stub")
        if got.params != wanted.params:
            problems.append(
                f"{where}: parameters {_describe(wanted.params)} in the Protocol, "
                f"{_describe(got.params)} in the stub"
            )
        if got.returns != wanted.returns:
            problems.append(
                f"{where}: returns {wanted.returns} in the Protocol, {got.returns} in the stub"
            )
    listed = {name for s, name in STUB_ONLY if s == structure}
    for name in sorted(_public(stub).keys() - protocol.keys() - listed):
        problems.append(f"{structure}.{name}: in the stub, not in the Protocol (nor in STUB_ONLY)")
    for name in sorted(listed & protocol.keys()):
        problems.append(f"{structure}.{name}: in STUB_ONLY, yet in the Protocol")
    for name in sorted(listed - stub.keys()):
        problems.append(f"{structure}.{name}: in STUB_ONLY, not in the stub")
    return problems


@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_stub_class_has_exactly_the_protocol_members(structure: str) -> None:
    """Every public member of the Protocol is in the stub's class: a property or a method
    alike, with the same parameters (names, kinds, annotations, defaults; the Protocol's
    type variables read as the stub's own classes) and return annotation; and the stub's
    public members beyond the Protocol's are exactly the listed exceptions (STUB_ONLY).
    The constructor is the stub's own (checked against the live classes below)."""
    problems = _protocol_problems(structure, STUBS[structure])
    assert not problems, "\n".join(problems)


def test_a_drifted_stub_member_is_reported_by_name() -> None:
    """The comparison itself: a renamed parameter, a changed annotation and a member the
    Protocol lacks are each caught, and named."""
    source = STUB.read_text(encoding="utf-8")
    drifted = source
    for old, new in [
        ("def allocate(self, num_blocks: int)", "def allocate(self, count: int)"),
        ("def ref_count(self, block_id: int) -> int", "def ref_count(self, block_id: int) -> bool"),
        (
            "def check_integrity(self) -> None: ...\n",
            "def check_integrity(self) -> None: ...\n    def spare(self) -> int: ...\n",
        ),
    ]:
        assert drifted.count(old) >= 1, old
        drifted = drifted.replace(old, new, 1)
    assert drifted != source
    tree = ast.parse(drifted)
    pool = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BlockPool")
    problems = _protocol_problems("BlockPool", _members(pool))
    assert [p.split(":")[0] for p in problems] == [
        "BlockPool.allocate",
        "BlockPool.ref_count",
        "BlockPool.spare",
    ], problems


# ---- the live classes --------------------------------------------------------------------


def _live(cls: type, name: str) -> tuple[str, inspect.Signature | None]:
    """The member's kind and, for a method whose signature is known, its signature."""
    static = inspect.getattr_static(cls, name)
    if isinstance(static, property | types.GetSetDescriptorType | types.MemberDescriptorType):
        return "property", None
    signature = inspect.signature(getattr(cls, name))
    names = tuple(p.name for p in signature.parameters.values())
    if names[-2:] == _UNSIGNED:
        return "method", None
    return "method", signature


def _signature_params(signature: inspect.Signature) -> tuple[tuple[str, str, str | None], ...]:
    """(name, kind, default's source) of each parameter."""
    return tuple(
        (
            p.name,
            p.kind.name,
            None if p.default is p.empty else _source(ast.parse(repr(p.default), mode="eval").body),
        )
        for p in signature.parameters.values()
    )


def _stub_params(member: Member) -> tuple[tuple[str, str, str | None], ...]:
    return tuple((p.name, p.kind, p.default) for p in member.params)


def _check_live(structure: str, cls: type, label: str) -> list[str]:
    stub = STUBS[structure]
    wanted = {**_public(stub), **_public(PROTOCOLS[structure])}
    problems = []
    for name, member in wanted.items():
        where = f"{structure}.{name}"
        if not any(name in vars(k) for k in cls.__mro__ if k is not object):
            problems.append(f"{where}: missing from {label}")
            continue
        kind, signature = _live(cls, name)
        expected_kind = "property" if member.kind == "attribute" else member.kind
        if kind != expected_kind:
            problems.append(f"{where}: a {expected_kind} in the contract, a {kind} in {label}")
        elif signature is not None and _signature_params(signature)[1:] != _stub_params(member):
            problems.append(
                f"{where}: parameters {_describe(member.params)} in the contract, "
                f"{signature} in {label}"
            )
    return problems


def _constructor_problems(structure: str, signature: inspect.Signature, label: str) -> list[str]:
    """The stub's constructor parameters against a live class's (``signature`` without
    self)."""
    stub = STUBS[structure].get("__init__")
    if stub is None:
        return [f"{structure}.__init__: missing from the stub"]
    if _signature_params(signature) == _stub_params(stub):
        return []
    return [f"{structure}.__init__: {_describe(stub.params)} in the stub, {signature} in {label}"]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_native_class_has_every_member(structure: str) -> None:
    """The Rust class has every member of the Protocol and of the stub, of the same kind
    and with the same parameter names, kinds and defaults (pyo3's text signatures), takes
    the stub's constructor arguments, and has no public member the stub lacks."""
    cls = getattr(native, structure)
    label = f"enginekit._native.{structure}"
    problems = _check_live(structure, cls, label)
    problems += _constructor_problems(structure, inspect.signature(cls), label)
    for name in sorted(dir(cls)):
        if not name.startswith("_") and name not in STUBS[structure]:
            problems.append(f"{structure}.{name}: public in {label}, missing from the stub")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_twin_has_every_member(structure: str) -> None:
    """The Python twin has every member of the Protocol and of the stub, of the same kind
    and with the same parameter names, kinds and defaults, takes the stub's constructor
    arguments, and has no public member the stub lacks (the same API as the Rust class)."""
    cls = TWINS[structure]
    label = f"enginekit.kv.pyref.{cls.__name__}"
    problems = _check_live(structure, cls, label)
    init = inspect.signature(cls.__init__)
    problems += _constructor_problems(
        structure, init.replace(parameters=list(init.parameters.values())[1:]), label
    )
    for name in sorted(dir(cls)):
        if not name.startswith("_") and name not in STUBS[structure]:
            problems.append(f"{structure}.{name}: public in {label}, missing from the stub")
    assert not problems, "\n".join(problems)

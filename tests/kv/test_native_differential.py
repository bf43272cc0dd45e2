"""Every entry point of the Rust module refuses what its Python twin refuses, and accepts
what it accepts, generated from the stub.

The functions and methods are read from ``enginekit/_native.pyi`` (``ast``); each is called
on the Rust module and on its twin with valid arguments (``BASELINES``), then with each
parameter in turn replaced by the values of its annotation's hostile set (``HOSTILE``):
ints at the edges of every Rust integer type and past them, non-ints, containers that are
not lists, lists holding such ints, buffers of other types, objects of the wrong class. Both
must raise the same exception class, or both return equal results and leave equal states
(the structures' and the mutable arguments'). An entry point of the stub without a baseline,
or a parameter whose annotation has no hostile set, fails with a message saying what to add.
"""

from __future__ import annotations

import ast
import inspect
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from native_args import NOT_A_LIST, NOT_AN_EXTRA_KEY

import enginekit._native as native
from enginekit.kv import pyref
from enginekit.kv.pyref import hashing as pyhash
from enginekit.scheduler import decode_ops

STUB = Path(__file__).resolve().parents[2] / "enginekit" / "_native.pyi"

# Module-level names of the stub and their twins (constants compare equal).
FUNCTION_TWINS: dict[str, Any] = {
    "hash_block": pyhash.hash_block,
    "hash_blocks": pyhash.hash_blocks,
    "decode_context_lens": decode_ops.decode_context_lens,
    "append_decode_tokens": decode_ops.append_decode_tokens,
}
CONSTANT_TWINS: dict[str, Any] = {
    "ROOT_HASH": pyhash.ROOT_HASH,
    "MAX_BLOCKS": pyref.MAX_BLOCKS,
    "MAX_TABLE_LEN": pyref.MAX_TABLE_LEN,
}
CLASS_TWINS: dict[str, Any] = {
    "BlockPool": pyref.PyBlockPool,
    "LruRoom": pyref.PyLruRoom,
    "BlockTables": pyref.PyBlockTables,
    "HashChains": pyref.PyHashChains,
    "RadixTree": pyref.PyRadixTree,
}
# Entry points with no twin, and why.
NO_TWIN = {
    "_panic_for_test": "a test hook of the panic fence (tests/kv/test_native_smoke.py)",
}


# ---- the stub ------------------------------------------------------------------------------


class Param(NamedTuple):
    name: str
    annotation: str
    has_default: bool


class Entry(NamedTuple):
    """A function (``owner`` None), a class's constructor (``__init__``), method or property."""

    owner: str | None
    name: str
    params: tuple[Param, ...]
    is_property: bool

    @property
    def key(self) -> str:
        return self.name if self.owner is None else f"{self.owner}.{self.name}"


def _params(fn: ast.FunctionDef) -> tuple[Param, ...]:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = []
    for i, a in enumerate(positional):
        if a.arg in ("self", "cls"):
            continue
        annotation = ast.unparse(a.annotation) if a.annotation else ""
        params.append(Param(a.arg, annotation, i >= first_default))
    for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        annotation = ast.unparse(a.annotation) if a.annotation else ""
        params.append(Param(a.arg, annotation, default is not None))
    return tuple(params)


def stub_entries() -> tuple[list[Entry], list[str]]:
    """The stub's callables and properties, and its module-level constants."""
    tree = ast.parse(STUB.read_text())
    entries: list[Entry] = []
    constants: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            entries.append(Entry(None, node.name, _params(node), False))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            constants.append(node.target.id)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                is_property = any(
                    isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                )
                if item.name.startswith("_") and item.name not in ("__init__", "__call__"):
                    continue
                entries.append(Entry(node.name, item.name, _params(item), is_property))
    return entries, constants


ENTRIES, CONSTANTS = stub_entries()


# ---- one world per implementation ----------------------------------------------------------


@dataclass
class Reserve:
    """A FreeBlockReserve."""

    total: int


class World:
    """A pool of 8 blocks, block tables, hash chains and a radix tree of block size 2, of one
    implementation, in a state every baseline call acts on:

    - sequence 1: blocks [0, 1, 2], a chain of 2 names, both published (its next decode at 6
      tokens fills block 2);
    - sequence 2: blocks [3, 4], a chain of 2 names, none published;
    - block 5: evictable (cached as 99, no reference); blocks 6 and 7 free;
    - the tree: [1, 2, 3, 4, 5] in blocks [0, 1, 2] (node 1), locked once;
    - the pool logs accesses from the start (``state`` takes them, so both implementations
      must log the same ones).
    """

    def __init__(self, is_native: bool) -> None:
        self.is_native = is_native
        classes = [getattr(native, n) if is_native else CLASS_TWINS[n] for n in CLASS_TWINS]
        self.Pool, self.Room, self.Tables, self.Chains, self.Tree = classes
        pool = self.pool = self.Pool(8)
        pool.record_accesses(True)
        tables = self.tables = self.Tables(2)
        chains = self.chains = self.Chains(2)
        tables.add_sequence(1, pool.allocate(3))
        tables.add_sequence(2, pool.allocate(2))
        tables.add_sequence(3, pool.allocate(1))
        tables.cache_blocks(pool, 3, 0, [99])
        tables.free_sequence(pool, 3)
        chains.extend(1, [1, 2, 3, 4], 2)
        chains.publish(tables, pool, 1, 2)
        chains.extend(2, [5, 6, 7, 8], 2)
        tree = self.tree = self.Tree(2)
        node = tree.insert([1, 2, 3, 4, 5], [0, 1, 2]).node_id
        tree.lock(node)
        self.room = self.Room(pool, Reserve(0))

    def objects(self) -> dict[str, Any]:
        return {
            "BlockPool": self.pool,
            "BlockTables": self.tables,
            "HashChains": self.chains,
            "RadixTree": self.tree,
            "LruRoom": self.room,
        }

    def state(self) -> tuple[Any, ...]:
        pool, tables, chains = self.pool, self.tables, self.chains
        return (
            pool.free_block_ids(),
            pool.evictable_block_ids(),
            pool.ref_counts(),
            pool.cached_blocks(),
            [(s, tables.block_ids(s), tables.num_holes(s)) for s in tables.seq_ids()],
            [(s, chains.names(s), chains.num_published(s)) for s in chains.seq_ids()],
            [tuple(n) for n in self.tree.nodes()],
            pool.take_accesses(),
        )


# ---- valid arguments -----------------------------------------------------------------------

Args = dict[str, Any]


def _h0(w: World) -> int:
    return int(w.chains.names(1)[0])


def _decode_args(w: World) -> Args:
    return {
        "token_lists": [[1], [2, 3]],
        "token_ids": [5, 6],
        "num_tokens": np.array([1, 2], dtype=np.int64),
        "max_num_tokens": np.array([5, 3], dtype=np.int64),
        "stops_at_eos": np.array([1, 1], dtype=np.uint8),
        "eos": 5,
    }


BASELINES: dict[str, Callable[[World], Args]] = {
    # functions
    "hash_block": lambda w: {"parent_hash": 5, "token_ids": [1, 2], "extra_key": None},
    "hash_blocks": lambda w: {
        "token_ids": [1, 2, 3, 4, 5],
        "block_size": 2,
        "extra_key": b"k",
        "parent_hash": 5,
    },
    "decode_context_lens": lambda w: {
        "num_tokens": np.array([3, 4], dtype=np.int64),
        "block_size": 2,
        "ints": list(range(8)),
    },
    "append_decode_tokens": _decode_args,
    # BlockPool
    "BlockPool.__init__": lambda w: {"num_blocks": 4},
    "BlockPool.allocate": lambda w: {"num_blocks": 2},
    "BlockPool.allocate_run": lambda w: {"num_blocks": 2},
    "BlockPool.longest_free_run": lambda w: {},
    "BlockPool.incref": lambda w: {"block_id": 5},
    "BlockPool.incref_all": lambda w: {"block_ids": [0, 5]},
    "BlockPool.free": lambda w: {"block_ids": [0]},
    "BlockPool.lookup_prefix": lambda w: {"block_hashes": [_h0(w), 99]},
    "BlockPool.ref_count": lambda w: {"block_id": 0},
    "BlockPool.num_unreferenced": lambda w: {"block_ids": [0, 5, 6]},
    "BlockPool.evict": lambda w: {"block_id": 5},
    "BlockPool.evict_lru": lambda w: {"num_blocks": 1},
    "BlockPool.make_room_lru": lambda w: {"num_blocks": 2, "num_kept_free": 1},
    "BlockPool.free_block_ids": lambda w: {},
    "BlockPool.evictable_block_ids": lambda w: {},
    "BlockPool.ref_counts": lambda w: {},
    "BlockPool.cached_blocks": lambda w: {},
    "BlockPool.check_integrity": lambda w: {},
    "BlockPool.record_accesses": lambda w: {"on": False},
    "BlockPool.take_accesses": lambda w: {},
    # LruRoom
    "LruRoom.__init__": lambda w: {"pool": w.pool, "reserve": Reserve(1)},
    "LruRoom.__call__": lambda w: {"num_blocks": 2},
    # BlockTables
    "BlockTables.__init__": lambda w: {"block_size": 2},
    "BlockTables.add_sequence": lambda w: {"seq_id": 9, "block_ids": [6, 7]},
    "BlockTables.remove_sequence": lambda w: {"seq_id": 1},
    "BlockTables.free_sequence": lambda w: {"pool": w.pool, "seq_id": 1},
    "BlockTables.append_blocks": lambda w: {"seq_id": 1, "block_ids": [6]},
    "BlockTables.append_holes": lambda w: {"seq_id": 1, "num_holes": 2},
    "BlockTables.release_range": lambda w: {"seq_id": 1, "first": 0, "end": 2},
    "BlockTables.num_holes": lambda w: {"seq_id": 1},
    "BlockTables.fork": lambda w: {"parent_id": 1, "child_id": 9},
    "BlockTables.set_block": lambda w: {"seq_id": 1, "index": 1, "block_id": 6},
    "BlockTables.block_ids": lambda w: {"seq_id": 1},
    "BlockTables.block_id_at": lambda w: {"seq_id": 1, "index": 2},
    "BlockTables.num_blocks": lambda w: {"seq_id": 1},
    "BlockTables.num_blocks_to_grow": lambda w: {"seq_ids": [1, 2], "num_tokens": [7, 3]},
    "BlockTables.grow": lambda w: {"pool": w.pool, "seq_ids": [1, 2], "num_tokens": [7, 3]},
    "BlockTables.grow_with": lambda w: {
        "pool": w.pool,
        "seq_ids": [1, 2],
        "num_tokens": [7, 5],
        "make_room": lambda n: n < 3,
    },
    "BlockTables.cache_blocks": lambda w: {
        "pool": w.pool,
        "seq_id": 2,
        "first_index": 0,
        "block_hashes": [7, 8],
    },
    "BlockTables.cache_blocks_at": lambda w: {
        "pool": w.pool,
        "seq_ids": [2, 1],
        "block_indices": [1, 2],
        "block_hashes": [7, 8],
    },
    "BlockTables.max_num_blocks": lambda w: {"seq_ids": [1, 2]},
    "BlockTables.export_into": lambda w: {
        "seq_ids": [1, 2],
        "out": np.zeros((2, 4), dtype=np.int32),
        "width": 4,
        "pad": -7,
    },
    "BlockTables.seq_ids": lambda w: {},
    "BlockTables.check_integrity": lambda w: {"pool": w.pool},
    # HashChains
    "HashChains.__init__": lambda w: {"block_size": 2, "root_hash": 5},
    "HashChains.num_names": lambda w: {"seq_id": 1},
    "HashChains.num_published": lambda w: {"seq_id": 1},
    "HashChains.names": lambda w: {"seq_id": 2},
    "HashChains.extend": lambda w: {
        "seq_id": 2,
        "token_ids": [5, 6, 7, 8, 9, 10, 11],
        "num_blocks": 3,
        "extra_key": None,
    },
    "HashChains.lookup": lambda w: {"pool": w.pool, "seq_id": 1, "num_blocks": 2},
    "HashChains.is_cached": lambda w: {"pool": w.pool, "seq_id": 1, "index": 1},
    "HashChains.publish": lambda w: {"tables": w.tables, "pool": w.pool, "seq_id": 2, "end": 2},
    "HashChains.publish_filled": lambda w: {
        "tables": w.tables,
        "pool": w.pool,
        "seq_ids": [1, 2],
        "token_lists": [[1, 2, 3, 4, 5, 6], [5, 6, 7]],
        "num_tokens": [6, 3],
        "extra_keys": [None, b"k"],
    },
    "HashChains.remove": lambda w: {"seq_id": 2},
    "HashChains.seq_ids": lambda w: {},
    # RadixTree
    "RadixTree.__init__": lambda w: {"block_size": 2},
    "RadixTree.num_evictable_blocks": lambda w: {},
    "RadixTree.num_evictable_among": lambda w: {"block_ids": [0, 3]},
    "RadixTree.match_prefix": lambda w: {"token_ids": [1, 2, 3, 9], "max_tokens": 3},
    "RadixTree.insert": lambda w: {"token_ids": [1, 2, 3, 7], "block_ids": [0, 1, 6]},
    "RadixTree.lock": lambda w: {"node_id": 1},
    "RadixTree.unlock": lambda w: {"node_id": 1},
    "RadixTree.evict": lambda w: {"num_blocks": 1},
    "RadixTree.nodes": lambda w: {},
    "RadixTree.check_integrity": lambda w: {},
    "RadixTree.evictable_tails": lambda w: {},
    "RadixTree.evict_tail": lambda w: {"node_id": 1},
}


# ---- hostile values, by annotation ---------------------------------------------------------

Value = Callable[[World], Any]  # builds a fresh value (a generator is consumed once)

EDGE_INTS: dict[str, int] = {
    "-1": -1,
    "0": 0,
    "2**31-1": 2**31 - 1,
    "2**31": 2**31,
    "2**32": 2**32,
    "2**63-1": 2**63 - 1,
    "2**63": 2**63,
    "2**64-1": 2**64 - 1,
    "2**64": 2**64,
    "-2**63-1": -(2**63) - 1,
    "huge": 10**30,
}
NOT_INTS: dict[str, Value] = {
    "None": lambda w: None,
    "float": lambda w: 1.5,
    "str": lambda w: "1",
    "bytes": lambda w: b"1",
    "list": lambda w: [1],
}
INT_LIKE: dict[str, Value] = {
    "True": lambda w: True,
    "np.int64(1)": lambda w: np.int64(1),
    "np.uint64(2**64-1)": lambda w: np.uint64(2**64 - 1),
}


def _ints() -> dict[str, Value]:
    values: dict[str, Value] = {k: (lambda w, v=v: v) for k, v in EDGE_INTS.items()}
    return {**values, **NOT_INTS, **INT_LIKE}


def _int_lists() -> dict[str, Value]:
    """Containers that are not lists, and lists of one edge int or non-int each."""
    values: dict[str, Value] = {k: (lambda w, f=f: f()) for k, f in NOT_A_LIST.items()}
    for k, f in _ints().items():
        values[f"[{k}]"] = lambda w, f=f: [f(w)]
        values[f"tuple({k})"] = lambda w, f=f: (f(w),)
    values["[]"] = lambda w: []
    values["[0]*3"] = lambda w: [0, 0, 0]
    values["numpy int32"] = lambda w: np.array([0, 1], dtype=np.int32)
    values["numpy int64 2-D"] = lambda w: np.zeros((1, 2), dtype=np.int64)
    values["numpy int64 strided"] = lambda w: np.arange(4, dtype=np.int64)[::2]
    values["numpy int64 -1"] = lambda w: np.array([-1], dtype=np.int64)
    values["numpy int64 empty"] = lambda w: np.array([], dtype=np.int64)
    values["numpy uint64"] = lambda w: np.array([1, 2], dtype=np.uint64)
    values["array I"] = lambda w: array("I", [1, 2])
    values["array I empty"] = lambda w: array("I")
    values["array i"] = lambda w: array("i", [1, 2])
    values["array Q"] = lambda w: array("Q", [1, 2**64 - 1])
    values["array Q empty"] = lambda w: array("Q")
    values["array q"] = lambda w: array("q", [1, 2])
    values["memoryview I"] = lambda w: memoryview(array("I", [1, 2]))
    return values


def _extra_keys() -> dict[str, Value]:
    values: dict[str, Value] = {k: (lambda w, f=f: f()) for k, f in NOT_AN_EXTRA_KEY.items()}
    values["bytes"] = lambda w: b"k"
    values["empty bytes"] = lambda w: b""
    values["None"] = lambda w: None
    return values


def _outer(items: dict[str, Value]) -> dict[str, Value]:
    """Containers that are not lists, and lists of one hostile item each."""
    values: dict[str, Value] = {k: (lambda w, f=f: f()) for k, f in NOT_A_LIST.items()}
    for k, f in items.items():
        values[f"[{k}]"] = lambda w, f=f: [f(w)]
        values[f"[{k}, {k}]"] = lambda w, f=f: [f(w), f(w)]
    return values


def _pools() -> dict[str, Value]:
    return {
        "None": lambda w: None,
        "tables": lambda w: w.tables,
        "int": lambda w: 1,
        "fresh pool": lambda w: w.Pool(8),
    }


def _tables() -> dict[str, Value]:
    return {
        "None": lambda w: None,
        "pool": lambda w: w.pool,
        "fresh tables": lambda w: w.Tables(2),
        "other block size": lambda w: w.Tables(3),
    }


def _arrays(dtype: type[np.generic]) -> dict[str, Value]:
    """Arrays of the wrong kind or shape, and of ``dtype`` at the edges of its range."""
    info = np.iinfo(dtype)
    return {
        "list": lambda w: [1, 2],
        "None": lambda w: None,
        "int32": lambda w: np.array([1, 2], dtype=np.int32),
        "uint64": lambda w: np.array([1, 2], dtype=np.uint64),
        "float": lambda w: np.array([1, 2], dtype=np.float64),
        "2-D": lambda w: np.ones((1, 2), dtype=dtype),
        "strided": lambda w: np.ones(4, dtype=dtype)[::2],
        "read-only": lambda w: _read_only(np.array([1, 2], dtype=dtype)),
        "short": lambda w: np.array([1], dtype=dtype),
        "empty": lambda w: np.array([], dtype=dtype),
        "min": lambda w: np.array([info.min, 2], dtype=dtype),
        "max": lambda w: np.array([info.max, 2], dtype=dtype),
        "zeros": lambda w: np.zeros(2, dtype=dtype),
    }


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _outs() -> dict[str, Value]:
    return {
        "None": lambda w: None,
        "int64": lambda w: np.zeros((2, 4), dtype=np.int64),
        "uint32": lambda w: np.zeros((2, 4), dtype=np.uint32),
        "too small": lambda w: np.zeros(7, dtype=np.int32),
        "read-only": lambda w: _read_only(np.zeros(8, dtype=np.int32)),
        "strided": lambda w: np.zeros(16, dtype=np.int32)[::2],
        "bytearray": lambda w: bytearray(32),
        "array i": lambda w: array("i", [0] * 8),
        "empty": lambda w: np.zeros(0, dtype=np.int32),
        "list": lambda w: [0] * 8,
    }


HOSTILE: dict[str, Callable[[], dict[str, Value]]] = {
    "int": _ints,
    "bool": lambda: {"None": lambda w: None, "int 1": lambda w: 1, "str": lambda w: "yes"},
    "int | None": lambda: {**_ints(), "None": lambda w: None},
    "IntList": _int_lists,
    "IntBatch": _int_lists,
    "TokenBatch": _int_lists,
    "HashBatch": _int_lists,
    "Sequence[int]": _int_lists,
    "bytes | None": _extra_keys,
    "Sequence[TokenBatch]": lambda: _outer(_int_lists()),
    "Sequence[bytes | None]": lambda: _outer(_extra_keys()),
    "BlockPool": _pools,
    "BlockPool | None": lambda: {**_pools(), "None": lambda w: None},
    "BlockTables": _tables,
    "FreeBlockReserve": lambda: {
        "None": lambda w: None,
        "total -1": lambda w: Reserve(-1),
        "total 2**64": lambda w: Reserve(2**64),
        "total None": lambda w: Reserve(None),  # type: ignore[arg-type]
    },
    "Callable[[int], bool]": lambda: {
        "None": lambda w: None,
        "false": lambda w: lambda n: False,
        "raises": lambda w: lambda n: 1 // 0,
        "not bool": lambda w: lambda n: "yes",
    },
    "Any": _outs,
    "npt.NDArray[np.int64]": lambda: _arrays(np.int64),
    "npt.NDArray[np.uint8]": lambda: _arrays(np.uint8),
    "list[int]": lambda: {**_int_lists(), "short": lambda w: [1]},
    "list[list[int]]": lambda: {**_outer(_int_lists()), "short": lambda w: [[1]]},
}


# ---- running a call on both ----------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A comparable copy: tuples (NamedTuples) and arrays as lists, dicts and lists deep."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.tolist())
    if isinstance(value, array):
        return ("array", value.typecode, value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (int, str, bytes, bool, float)) or value is None:
        return value
    name = type(value).__name__  # a structure: its stub name, of either implementation
    return name.removeprefix("Py") if name.removeprefix("Py") in CLASS_TWINS else name


def _target(world: World, entry: Entry) -> Any:
    if entry.owner is None:
        return getattr(native, entry.name) if world.is_native else FUNCTION_TWINS[entry.name]
    cls = getattr(native, entry.owner) if world.is_native else CLASS_TWINS[entry.owner]
    if entry.name == "__init__":
        return cls
    return getattr(world.objects()[entry.owner], entry.name)


def run(entry: Entry, is_native: bool, replace: tuple[str, Value] | None) -> tuple[Any, ...]:
    """What the call does on one implementation: ("raised", class name) or ("returned",
    result), with the world's state and the arguments after it."""
    world = World(is_native)
    args = {} if entry.is_property else BASELINES[entry.key](world)
    if replace is not None:
        name, make = replace
        args[name] = make(world)
    target = _target(world, entry)
    try:
        if entry.is_property:
            result = ("returned", _plain(target))
        else:
            value = target(**args)
            result = ("returned", _plain(value) if entry.name != "__init__" else None)
    except Exception as exc:  # compared by class: both must raise the same
        result = ("raised", type(exc).__name__)
    return (*result, world.state(), _plain(list(args.values())))


def differences(entry: Entry) -> Iterator[str]:
    cases: list[tuple[str, tuple[str, Value] | None]] = [("baseline", None)]
    for param in entry.params:
        values = HOSTILE[param.annotation]()
        for label, make in values.items():
            cases.append((f"{param.name}={label}", (param.name, make)))
    for label, replace in cases:
        got = run(entry, True, replace)
        expected = run(entry, False, replace)
        if got[:2] != expected[:2]:
            yield f"{entry.key}({label}): native {got[:2]}, twin {expected[:2]}"
        elif got != expected:
            yield f"{entry.key}({label}): same outcome {got[:2]}, different state or arguments"


# ---- tests ---------------------------------------------------------------------------------

CALLABLES = [e for e in ENTRIES if e.key not in NO_TWIN]


def test_every_entry_point_has_a_baseline_and_every_annotation_a_hostile_set() -> None:
    twinless = sorted(
        {e.owner for e in ENTRIES if e.owner is not None} - set(CLASS_TWINS)
        | {e.name for e in ENTRIES if e.owner is None} - set(FUNCTION_TWINS) - set(NO_TWIN)
    )
    assert not twinless, f"add the twins of {twinless} to CLASS_TWINS or FUNCTION_TWINS"
    missing = [e.key for e in CALLABLES if e.key not in BASELINES and not e.is_property]
    assert not missing, f"add valid arguments for {missing} to BASELINES in this file"
    unknown = sorted(
        f"{p.annotation!r} ({e.key}: {p.name})"
        for e in CALLABLES
        for p in e.params
        if p.annotation not in HOSTILE
    )
    assert not unknown, f"add hostile values for the annotations {unknown} to HOSTILE"
    stale = sorted(set(BASELINES) - {e.key for e in CALLABLES})
    assert not stale, f"BASELINES names entry points the stub no longer has: {stale}"
    for e in CALLABLES:
        if e.is_property or e.name in ("__init__",):
            continue
        names = [p.name for p in e.params]
        assert sorted(BASELINES[e.key](World(False))) == sorted(names), e.key


def test_every_public_name_of_the_module_is_in_the_stub() -> None:
    stub_names = {e.name for e in ENTRIES if e.owner is None} | set(CONSTANTS)
    stub_names |= {e.owner for e in ENTRIES if e.owner is not None}
    public = {n for n in dir(native) if not n.startswith("__")}
    assert public - stub_names == set(), "add these to enginekit/_native.pyi"
    for name in CONSTANTS:
        assert getattr(native, name) == CONSTANT_TWINS[name], name
    for name, cls in CLASS_TWINS.items():
        members = {n for n, _ in inspect.getmembers(getattr(native, name)) if not n.startswith("_")}
        stub = {e.name for e in ENTRIES if e.owner == name}
        assert members - stub == set(), f"add these members of {name} to the stub"
        assert stub - {"__init__", "__call__"} <= set(dir(cls)), name


@pytest.mark.parametrize("entry", CALLABLES, ids=lambda e: e.key)
def test_native_refuses_what_its_twin_refuses(entry: Entry) -> None:
    found = list(differences(entry))
    assert not found, "\n".join(found)

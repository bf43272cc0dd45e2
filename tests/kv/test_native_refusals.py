"""Values no structure can mean are refused alike by the Rust bindings and their twins, and
counts past u64 are exact instead of wrapping or saturating.

Each test runs on both implementations: a size or block size of 2**64 or more, a sequence
id outside [0, 2**64) where one is looked up, a token list that is no token batch (even
where none of its tokens is read), a token count past u64, and a total of blocks to grow
past u64. The generated differential test (test_native_differential.py) checks that the
two agree on every parameter; these pin down what both do.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from enginekit import _native
from enginekit.kv import pyref
from enginekit.kv.pyref import hashing as pyhash

IMPLS: dict[str, dict[str, Any]] = {
    "native": {
        "pool": _native.BlockPool,
        "tables": _native.BlockTables,
        "chains": _native.HashChains,
        "tree": _native.RadixTree,
        "room": _native.LruRoom,
        "hash_blocks": _native.hash_blocks,
    },
    "python": {
        "pool": pyref.PyBlockPool,
        "tables": pyref.PyBlockTables,
        "chains": pyref.PyHashChains,
        "tree": pyref.PyRadixTree,
        "room": pyref.PyLruRoom,
        "hash_blocks": pyhash.hash_blocks,
    },
}
U64 = 2**64


@pytest.fixture(params=list(IMPLS))
def impl(request: pytest.FixtureRequest) -> dict[str, Any]:
    return IMPLS[request.param]


@pytest.mark.parametrize("block_size", [U64, 2**70, 0, -1])
def test_block_sizes_outside_u64_are_refused(impl: dict[str, Any], block_size: int) -> None:
    for make in (impl["chains"], impl["tables"], impl["tree"]):
        with pytest.raises(ValueError, match=r"block_size must be in \[1, 2\*\*64\)"):
            make(block_size)
    with pytest.raises(ValueError, match=r"block_size must be in \[1, 2\*\*64\)"):
        impl["hash_blocks"]([1, 2], block_size)
    # The largest block size is one: no full block of two tokens.
    assert impl["hash_blocks"]([1, 2], U64 - 1) == []
    assert impl["chains"](U64 - 1).block_size == U64 - 1


def tables_of(impl: dict[str, Any], block_size: int, num_blocks: int) -> Any:
    tables = impl["tables"](block_size)
    tables.add_sequence(1, list(range(num_blocks)))
    return tables


def test_blocks_to_grow_are_exact_past_u64(impl: dict[str, Any]) -> None:
    # ceil((2**64 - 1) / 4) = 2**62 blocks, 2 of which the table holds.
    assert tables_of(impl, 4, 2).num_blocks_to_grow([1], [U64 - 1]) == 2**62 - 2
    tables = tables_of(impl, 1, 0)
    assert tables.num_blocks_to_grow([1, 1], [U64 - 1, U64 - 1]) == 2 * (U64 - 1)
    pool = impl["pool"](4)
    asked: list[int] = []
    grown = tables.grow_with(pool, [1, 1], [U64 - 1] * 2, lambda n: asked.append(n) or False)
    assert (grown, asked) == (None, [2 * (U64 - 1)])
    room = impl["room"](pool, type("Reserve", (), {"total": 0})())
    assert tables.grow_with(pool, [1, 1], [U64 - 1] * 2, room) is None
    assert (pool.num_free_blocks, tables.block_ids(1)) == (4, [])


@pytest.mark.parametrize("num_tokens", [U64, 2**100])
def test_token_counts_past_u64_are_refused(impl: dict[str, Any], num_tokens: int) -> None:
    tables, pool = tables_of(impl, 1, 0), impl["pool"](4)
    with pytest.raises(ValueError, match=r"num_tokens \d+ is not in \[0, 2\*\*64\)"):
        tables.num_blocks_to_grow([1], [num_tokens])
    with pytest.raises(ValueError, match=r"num_tokens \d+ is not in \[0, 2\*\*64\)"):
        tables.grow(pool, [1], [num_tokens])
    with pytest.raises(ValueError, match=r"num_tokens \d+ is not in \[0, 2\*\*64\)"):
        tables.grow_with(pool, [1], [num_tokens], lambda n: True)
    with pytest.raises(ValueError, match="non-negative"):
        tables.num_blocks_to_grow([1], [-1])


@pytest.mark.parametrize("seq_id", [-1, U64, -(2**70)])
def test_chain_lookups_refuse_ids_no_sequence_has(impl: dict[str, Any], seq_id: int) -> None:
    chains, pool = impl["chains"](2), impl["pool"](4)
    calls = [
        lambda: chains.num_names(seq_id),
        lambda: chains.num_published(seq_id),
        lambda: chains.names(seq_id),
        lambda: chains.lookup(pool, seq_id, 1),
        lambda: chains.is_cached(pool, seq_id, 0),
        lambda: chains.remove(seq_id),
        lambda: chains.extend(seq_id, [1, 2], 1),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"sequence id -?\d+ is not in \[0, 2\*\*64\)"):
            call()
    # A sequence without a chain reads as no names.
    assert (chains.num_names(U64 - 1), chains.names(0), chains.lookup(pool, 7, 3)) == (0, [], [])


@pytest.mark.parametrize("index", [10**9, U64, 2**100])
def test_is_cached_past_the_names_is_false(impl: dict[str, Any], index: int) -> None:
    chains, pool, tables = impl["chains"](2), impl["pool"](4), impl["tables"](2)
    tables.add_sequence(1, pool.allocate(2))
    chains.extend(1, [1, 2, 3, 4], 2)
    chains.publish(tables, pool, 1, 2)
    assert chains.is_cached(pool, 1, 1)
    assert not chains.is_cached(pool, 1, index)
    assert not chains.is_cached(pool, 2, index)
    with pytest.raises(ValueError, match="non-negative"):
        chains.is_cached(pool, 1, -1)


NOT_TOKEN_BATCHES = ["ab", b"ab", {1: 2}, {1, 2}, None, 3, array("i", [1, 2])]


@pytest.mark.parametrize("tokens", NOT_TOKEN_BATCHES, ids=lambda t: type(t).__name__)
def test_token_batches_of_another_type_are_refused_read_or_not(
    impl: dict[str, Any], tokens: Any
) -> None:
    chains, pool, tables = impl["chains"](2), impl["pool"](4), impl["tables"](2)
    tables.add_sequence(1, [])
    # Sequence 1 has no chain, so its decode fills nothing and its tokens are never read.
    with pytest.raises(TypeError, match=r"token_lists\[1\] must be"):
        chains.publish_filled(tables, pool, [1, 1], [[5, 6], tokens], [2, 2], [None, None])
    # No block to name, so no token to read.
    with pytest.raises(TypeError, match="token_ids must be"):
        chains.extend(1, tokens, 0)
    assert chains.seq_ids() == []
    # The token batches both take.
    assert chains.publish_filled(tables, pool, [1], [array("I", [5, 6])], [2], [None]) == [0]
    assert chains.extend(1, (5, 6), 1) == 1


def test_insert_refuses_fewer_blocks_than_its_tokens_need(impl: dict[str, Any]) -> None:
    tree = impl["tree"](2)
    tree.insert([1, 2, 3, 4], [10, 11])
    before = tree.nodes()
    for tokens, blocks in [
        ([1, 2, 3], [10]),  # 3 tokens need 2 blocks
        ([1, 2, 3, 4, 5, 6], [10, 11]),  # the stored prefix counts too: 3 needed
        ([7], []),
        ([1, 2, 3, 4, 5], [10, 11, 2**31]),  # enough ids, one invalid
    ]:
        with pytest.raises(ValueError, match="block"):
            tree.insert(tokens, blocks)
    assert tree.nodes() == before
    assert tree.insert([1, 2, 3, 4, 5], [10, 11, 12, 99]).new_block_refs == [12]

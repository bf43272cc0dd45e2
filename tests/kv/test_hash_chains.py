"""HashChains, the names of sequences' leading full blocks (Rust and the Python twin): what
each call names, reads, publishes and refuses, and both implementations driven side by side
through random operations with whole states compared after each."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from enginekit import _native
from enginekit.errors import KVCacheError
from enginekit.kv.pyref import PyBlockPool, PyBlockTables, PyHashChains
from enginekit.kv.pyref import hashing as pyhash

IMPLS = {
    "native": (_native.BlockPool, _native.BlockTables, _native.HashChains, _native.hash_blocks),
    "python": (PyBlockPool, PyBlockTables, PyHashChains, pyhash.hash_blocks),
}


@pytest.fixture(params=list(IMPLS))
def impl(request: pytest.FixtureRequest) -> tuple[Any, ...]:
    return IMPLS[request.param]


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def setup(impl: tuple[Any, ...], num_tokens: int, seq_id: int = 1) -> tuple[Any, Any, Any]:
    """A pool of 16 blocks, a table of ``num_tokens`` tokens (blocks of 4) and no chains."""
    pool_cls, tables_cls, chains_cls, _ = impl
    pool, tables = pool_cls(16), tables_cls(4)
    tables.add_sequence(seq_id, [])
    tables.grow(pool, [seq_id], [num_tokens])
    return pool, tables, chains_cls(4)


def test_extend_names_only_the_blocks_not_named_yet(impl):
    _, _, chains = setup(impl, 0)
    hash_blocks = impl[3]
    assert chains.extend(1, tokens(10), 2) == 2
    assert chains.names(1) == hash_blocks(tokens(8), 4)
    # Tokens already named are not read again: invalid ones there raise nothing.
    later = [2**40] * 8 + tokens(8, 8)
    assert chains.extend(1, later, 4) == 4
    assert chains.names(1) == hash_blocks(tokens(16), 4)
    assert chains.extend(1, [], 3) == 4  # never fewer
    assert chains.extend(2, array("I", tokens(8)), 2, b"tenant") == 2
    assert chains.names(2) == hash_blocks(tokens(8), 4, b"tenant")
    assert (chains.num_names(3), chains.names(3), chains.num_published(3)) == (0, [], 0)
    for no_sequence in (-1, 2**64):  # no sequence has such an id: refused, not read as none
        with pytest.raises(ValueError, match="is not in"):
            chains.num_published(no_sequence)
    assert chains.seq_ids() == [1, 2]


def test_extend_refuses_missing_or_bad_tokens_and_changes_nothing(impl):
    _, _, chains = setup(impl, 0)
    with pytest.raises(ValueError, match="needs its tokens up to 12, it has 10"):
        chains.extend(1, tokens(10), 3)
    assert chains.seq_ids() == []
    with pytest.raises(ValueError, match="token id"):
        chains.extend(1, [0, 1, 2, -1], 1)
    with pytest.raises(TypeError):
        chains.extend(1, b"\x00\x01\x02\x03", 1)
    with pytest.raises(TypeError, match="extra_key"):
        chains.extend(1, tokens(4), 1, "tenant")
    with pytest.raises(ValueError, match="sequence id"):
        chains.extend(-1, tokens(4), 1)
    with pytest.raises(ValueError, match="num_blocks must be non-negative"):
        chains.extend(1, tokens(4), -1)
    assert chains.seq_ids() == []


def test_publish_records_names_through_the_table_skipping_holes(impl):
    pool, tables, chains = setup(impl, 16)
    chains.extend(1, tokens(16), 4)
    with pytest.raises(ValueError, match="it has 4 names"):
        chains.publish(tables, pool, 1, 5)
    assert chains.publish(tables, pool, 1, 2) == 2
    assert chains.lookup(pool, 1, 9) == [0, 1]
    tables.release_range(1, 2, 3)  # block 2 is a hole now
    pool.free([2])
    assert chains.publish(tables, pool, 1, 4) == 1
    assert chains.num_published(1) == 4
    assert chains.lookup(pool, 1, 4) == [0, 1]  # the run stops at the hole's name
    assert chains.is_cached(pool, 1, 3) and not chains.is_cached(pool, 1, 2)
    assert not chains.is_cached(pool, 1, 4) and not chains.is_cached(pool, 7, 0)
    assert chains.publish(tables, pool, 1, 3) == 0  # published already
    other = impl[2](4)
    other.extend(2, tokens(16), 4)
    with pytest.raises(KVCacheError, match="unknown sequence 2"):
        other.publish(tables, pool, 2, 1)
    with pytest.raises(KVCacheError, match="unknown sequence -1"):
        other.publish(tables, pool, -1, 1)


def test_publish_filled_names_each_decodes_next_block_in_one_call(impl):
    pool, tables, chains = setup(impl, 8, seq_id=1)
    tables.add_sequence(2, [])
    tables.grow(pool, [2], [4])
    one, two = tokens(8), tokens(4, 100)
    for seq_id, seq in ((1, one), (2, two)):
        chains.extend(seq_id, seq, len(seq) // 4)
        chains.publish(tables, pool, seq_id, len(seq) // 4)
    one += tokens(4, 50)
    two += tokens(3, 60)
    tables.grow(pool, [1, 2], [12, 7])
    # 1 fills block 2; 2 is mid-block; 3 has no chain.
    skipped = chains.publish_filled(
        tables, pool, [1, 2, 3], [one, two, tokens(4)], [12, 7, 4], [None, None, None]
    )
    assert skipped == [1, 2]
    assert chains.names(1) == impl[3](one, 4)
    assert chains.num_published(1) == 3
    assert chains.lookup(pool, 1, 3) == tables.block_ids(1)


def test_publish_filled_refuses_and_changes_nothing(impl):
    pool, tables, chains = setup(impl, 8)
    seq = tokens(4)
    chains.extend(1, seq, 1)
    chains.publish(tables, pool, 1, 1)
    before = (chains.names(1), chains.num_published(1), pool.cached_blocks())
    full = tokens(8)
    with pytest.raises(ValueError, match="once"):
        chains.publish_filled(tables, pool, [1, 1], [full, full], [8, 8], [None, None])
    with pytest.raises(ValueError, match="differ in length"):
        chains.publish_filled(tables, pool, [1], [full], [8, 8], [None])
    with pytest.raises(ValueError, match="fewer in its token list"):
        chains.publish_filled(tables, pool, [1], [seq], [8], [None])
    with pytest.raises(TypeError, match="extra_key"):
        chains.publish_filled(tables, pool, [1], [full], [8], ["tenant"])
    with pytest.raises(TypeError, match="token_lists"):
        chains.publish_filled(tables, pool, [1], {1: full}, [8], [None])
    assert (chains.names(1), chains.num_published(1), pool.cached_blocks()) == before
    assert chains.publish_filled(tables, pool, [1], [full], [8], [None]) == []
    after = (chains.names(1), chains.num_published(1), pool.cached_blocks())
    with pytest.raises(KVCacheError, match="out of range"):  # its table holds 2 blocks
        chains.publish_filled(tables, pool, [1], [tokens(12)], [12], [None])
    assert (chains.names(1), chains.num_published(1), pool.cached_blocks()) == after


# ---- the two implementations driven side by side ---------------------------------------------


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:
        return ("raised", (type(exc), str(exc)))


SEQS = [0, 1, 2]
TOKEN = st.integers(0, 3)  # a tiny alphabet: sequences share names


class ChainTwins(RuleBasedStateMachine):
    """The same operations on a Rust pool, tables and chains and on their Python twins,
    valid and invalid alike; outcomes (values, or exception type and message) and whole
    states must agree after every one. Every sequence starts with an empty table; tokens
    come a few at a time from a tiny alphabet, so sequences share names and the pool
    refuses to record a name twice."""

    @initialize(block_size=st.integers(1, 3))
    def make(self, block_size: int) -> None:
        self.bs = block_size
        self.sides = []
        for pool_cls, tables_cls, chains_cls, _ in IMPLS.values():
            pool, tables = pool_cls(200), tables_cls(block_size)
            for seq_id in SEQS:
                tables.add_sequence(seq_id, [])
            self.sides.append((pool, tables, chains_cls(block_size)))
        self.tokens: dict[int, list[int]] = {s: [] for s in SEQS}  # the driver's ledger

    def both(self, method: Callable[[tuple[Any, Any, Any]], Any]) -> tuple[str, Any]:
        native, python = (outcome(method, side) for side in self.sides)
        assert native == python, f"native {native}, python {python}"
        return python

    def has_table(self, seq_id: int) -> bool:
        return seq_id in self.sides[1][1].seq_ids()

    @rule(seq_id=st.sampled_from(SEQS), more=st.lists(TOKEN, min_size=2, max_size=8))
    def add_tokens(self, seq_id: int, more: list[int]) -> None:
        """The sequence gets more tokens; its table (if it has one) grows to hold them."""
        seq = self.tokens[seq_id]
        seq += more
        if self.has_table(seq_id):
            self.both(lambda s: s[1].grow(s[0], [seq_id], [len(seq)]))

    @rule(seq_id=st.sampled_from(SEQS), more=st.lists(TOKEN, min_size=2, max_size=8))
    def prefill(self, seq_id: int, more: list[int]) -> None:
        """The common path: more tokens, the table grown, every full block named and
        published."""
        self.add_tokens(seq_id, more)
        num_full = len(self.tokens[seq_id]) // self.bs
        self.both(lambda s: s[2].extend(seq_id, self.tokens[seq_id], num_full, None))
        self.both(lambda s: s[2].publish(s[1], s[0], seq_id, num_full))

    @rule(seq_id=st.sampled_from(SEQS))
    def replace_table(self, seq_id: int) -> None:
        """The sequence's table is released and a fresh one holds its tokens (its chain
        stays: a preempted request's, say)."""

        def replace(side: tuple[Any, Any, Any]) -> None:
            pool, tables, _ = side
            if seq_id in tables.seq_ids():
                pool.free([b for b in reversed(tables.remove_sequence(seq_id)) if b >= 0])
            tables.add_sequence(seq_id, [])
            tables.grow(pool, [seq_id], [len(self.tokens[seq_id])])

        self.both(replace)

    @rule(seq_id=st.sampled_from(SEQS), first=st.integers(0, 2), num=st.integers(1, 2))
    def release_range(self, seq_id: int, first: int, num: int) -> None:
        def release(side: tuple[Any, Any, Any]) -> None:
            pool, tables, _ = side
            pool.free(tables.release_range(seq_id, first, first + num))

        self.both(release)

    @rule(
        seq_id=st.sampled_from([*SEQS, -1]),
        more=st.sampled_from([0, 1, 1, 1, 2]),
        extra=st.sampled_from([None, None, b"k"]),
    )
    def extend(self, seq_id: int, more: int, extra: bytes | None) -> None:
        """Names up to its full blocks, give or take one (one past: refused)."""
        seq = self.tokens.get(seq_id, [])
        num_blocks = len(seq) // self.bs + more - 1
        self.both(lambda s: s[2].extend(seq_id, seq, num_blocks, extra))

    @rule(seq_id=st.sampled_from([*SEQS, -1]), more=st.sampled_from([-1, 0, 0, 0, 1]))
    def publish(self, seq_id: int, more: int) -> None:
        """Publishes up to its names, give or take."""
        end = (self.sides[1][2].num_names(seq_id) if seq_id >= 0 else 0) + more
        self.both(lambda s: s[2].publish(s[1], s[0], seq_id, end))

    @rule(
        picks=st.lists(
            st.tuples(st.sampled_from(SEQS), st.sampled_from([0, 0, 0, -1, 1])), max_size=4
        ),
        extra=st.sampled_from([None, None, b"k"]),
    )
    def publish_filled(self, picks: list[tuple[int, int]], extra: bytes | None) -> None:
        """Decodes at their token counts (or one off), their lists as they stand."""
        seq_ids = [s for s, _ in picks]
        lists = [self.tokens[s] for s in seq_ids]
        counts = [max(0, len(seq) + off) for seq, (_, off) in zip(lists, picks, strict=True)]
        keys = [extra] * len(seq_ids)
        self.both(lambda s: s[2].publish_filled(s[1], s[0], seq_ids, lists, counts, keys))

    @rule(seq_id=st.sampled_from(SEQS), num=st.integers(0, 6), index=st.integers(0, 6))
    def look_up(self, seq_id: int, num: int, index: int) -> None:
        self.both(lambda s: s[2].lookup(s[0], seq_id, num))
        self.both(lambda s: s[2].is_cached(s[0], seq_id, index))

    @rule(seq_id=st.sampled_from(SEQS))
    def remove(self, seq_id: int) -> None:
        self.both(lambda s: s[2].remove(seq_id))

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "sides"):
            return
        states = []
        for pool, tables, chains in self.sides:
            pool.check_integrity()
            tables.check_integrity(pool)
            chain_state = [(s, chains.names(s), chains.num_published(s)) for s in chains.seq_ids()]
            states.append((chain_state, pool.cached_blocks(), pool.ref_counts()))
        assert states[0] == states[1]


TestChainTwins = ChainTwins.TestCase
TestChainTwins.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

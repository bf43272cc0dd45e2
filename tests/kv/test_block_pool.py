"""BlockPool: the Rust core against its pure-Python twin, operation by operation.

The native module is required: if ``enginekit._native`` is not built, this file fails.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from native_args import NOT_A_LIST

from enginekit import _native
from enginekit.errors import KVCacheError, OutOfBlocksError
from enginekit.kv import pyref
from enginekit.kv.pyref import PyBlockPool, PyBlockTables


@pytest.fixture(params=[_native.BlockPool, PyBlockPool], ids=["native", "python"])
def Pool(request: pytest.FixtureRequest) -> type:
    return request.param


def cache_block(pool: Any, block_id: int, block_hash: int) -> bool:
    """Publishes one block under ``block_hash`` the way the engine does, through
    BlockTables.cache_blocks over a one-block table of the pool's own implementation; True
    if it was recorded. The table is dropped afterwards: it holds no references."""
    native = isinstance(pool, _native.BlockPool)
    tables = _native.BlockTables(1) if native else PyBlockTables(1)
    tables.add_sequence(0, [block_id])
    return bool(tables.cache_blocks(pool, 0, 0, [block_hash]))


def hash_of(pool: Any, block_id: int) -> int | None:
    """The hash block_id carries, read off the pool's hash map (None if uncached)."""
    return {b: h for h, b in pool.cached_blocks().items()}.get(block_id)


def state(pool: Any) -> dict[str, Any]:
    """Everything observable about a pool."""
    return {
        "num_blocks": pool.num_blocks,
        "num_free_blocks": pool.num_free_blocks,
        "num_evictable_blocks": pool.num_evictable_blocks,
        "num_used_blocks": pool.num_used_blocks,
        "free_block_ids": pool.free_block_ids(),
        "evictable_block_ids": pool.evictable_block_ids(),
        "ref_counts": pool.ref_counts(),
        "cached_blocks": pool.cached_blocks(),
        "longest_free_run": pool.longest_free_run(),
    }


def raises_unchanged(pool: Any, exc: type[Exception], fn: Callable[[], Any]) -> None:
    """fn() raises exactly ``exc`` and leaves the pool as it was."""
    before = state(pool)
    with pytest.raises(exc) as info:
        fn()
    assert type(info.value) is exc
    assert state(pool) == before
    pool.check_integrity()


def raises_unchanged_msg(pool: Any, exc: type[Exception], fn: Callable[[], Any]) -> Exception:
    """As raises_unchanged; returns the exception (for its message)."""
    before = state(pool)
    with pytest.raises(exc) as info:
        fn()
    assert type(info.value) is exc
    assert state(pool) == before
    pool.check_integrity()
    return info.value


# ---- exact behaviour, against both implementations ------------------------------------------


def test_new_pool(Pool) -> None:
    pool = Pool(4)
    assert (pool.num_blocks, pool.num_free_blocks, pool.num_evictable_blocks) == (4, 4, 0)
    assert pool.num_used_blocks == 0
    assert pool.free_block_ids() == [0, 1, 2, 3]
    assert pool.evictable_block_ids() == []
    assert pool.ref_counts() == [0, 0, 0, 0]
    assert pool.cached_blocks() == {}
    pool.check_integrity()


@pytest.mark.parametrize("n", [0, -1])
def test_bad_size(Pool, n: int) -> None:
    with pytest.raises(ValueError):
        Pool(n)


@pytest.mark.parametrize("n", [2**26 + 1, 2**31 - 1, 2**31, 2**64])
def test_sizes_past_the_limit_are_refused_up_front(Pool, n: int) -> None:
    with pytest.raises(ValueError, match=r"num_blocks must be in \[1, 2\*\*26\], got "):
        Pool(n)


def test_the_limit_is_the_same_in_both() -> None:
    assert _native.MAX_BLOCKS == pyref.MAX_BLOCKS == 2**26


def test_allocate_in_order(Pool) -> None:
    pool = Pool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.free_block_ids() == [2, 3]
    assert pool.ref_counts() == [1, 1, 0, 0]
    assert pool.num_used_blocks == 2
    assert pool.allocate(0) == []
    assert pool.allocate(2) == [2, 3]
    assert pool.num_free_blocks == 0
    pool.check_integrity()


def test_allocate_errors(Pool) -> None:
    pool = Pool(4)
    pool.allocate(1)
    raises_unchanged(pool, OutOfBlocksError, lambda: pool.allocate(4))
    raises_unchanged(pool, ValueError, lambda: pool.allocate(-1))


def test_allocate_run_first_fit(Pool) -> None:
    pool = Pool(6)
    assert pool.allocate(4) == [0, 1, 2, 3]
    cache_block(pool, 0, 100)
    cache_block(pool, 1, 101)
    pool.free([0, 1])  # 0, 1 evictable (not free); 2, 3 used; 4, 5 free
    assert pool.longest_free_run() == 2
    msg = str(raises_unchanged_msg(pool, OutOfBlocksError, lambda: pool.allocate_run(3)))
    assert msg == "cannot allocate 3 blocks: only 2 free"
    pool.evict(1)
    assert pool.free_block_ids() == [1, 4, 5]
    msg = str(raises_unchanged_msg(pool, OutOfBlocksError, lambda: pool.allocate_run(3)))
    assert msg == "no run of 3 consecutive free blocks (longest: 2)"
    raises_unchanged(pool, ValueError, lambda: pool.allocate_run(-1))
    assert pool.allocate_run(0) == []
    assert pool.allocate_run(2) == [4, 5]
    assert pool.free_block_ids() == [1]
    assert pool.ref_counts() == [0, 0, 1, 1, 1, 1]
    assert pool.allocate_run(1) == [1]
    assert pool.longest_free_run() == 0
    pool.check_integrity()


def test_allocate_run_keeps_the_free_stack_order(Pool) -> None:
    pool = Pool(8)
    pool.allocate(8)
    pool.free([6, 1, 2, 4, 5, 7])
    assert pool.free_block_ids() == [7, 5, 4, 2, 1, 6]
    assert pool.longest_free_run() == 4
    assert pool.allocate_run(2) == [1, 2]
    assert pool.free_block_ids() == [7, 5, 4, 6]
    assert pool.allocate_run(3) == [4, 5, 6]
    assert pool.free_block_ids() == [7]
    assert pool.allocate(1) == [7]
    pool.check_integrity()


def test_free_is_lifo(Pool) -> None:
    pool = Pool(4)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([0, 2])
    assert pool.free_block_ids() == [2, 0, 3]
    assert pool.allocate(2) == [2, 0]
    pool.free([1])
    assert pool.free_block_ids() == [1, 3]
    pool.check_integrity()


def test_free_counts_duplicates(Pool) -> None:
    pool = Pool(4)
    pool.allocate(2)
    pool.incref(0)
    assert pool.ref_count(0) == 2
    pool.free([0, 1, 0])
    assert pool.ref_counts() == [0, 0, 0, 0]
    assert pool.free_block_ids() == [0, 1, 2, 3]


def test_free_errors_change_nothing(Pool) -> None:
    pool = Pool(4)
    pool.allocate(2)
    raises_unchanged(pool, KVCacheError, lambda: pool.free([0, 1, 1]))  # double free
    raises_unchanged(pool, KVCacheError, lambda: pool.free([0, 2]))  # free block
    raises_unchanged(pool, KVCacheError, lambda: pool.free([0, 4]))  # unknown id
    raises_unchanged(pool, KVCacheError, lambda: pool.free([1, -1]))  # unknown id


def test_incref_all_is_checked_as_a_whole(Pool) -> None:
    pool = Pool(4)
    pool.allocate(2)
    cache_block(pool, 1, 7)
    pool.free([1])  # evictable
    raises_unchanged(pool, KVCacheError, lambda: pool.incref_all([0, 2]))  # 2 is free
    raises_unchanged(pool, KVCacheError, lambda: pool.incref_all([1, 4]))  # unknown id
    raises_unchanged(pool, KVCacheError, lambda: pool.incref_all([0, -1]))
    pool.incref_all([1, 0, 1])
    assert pool.ref_counts() == [2, 2, 0, 0]
    assert pool.evictable_block_ids() == []  # the hit took it out of the LRU order
    pool.incref_all([])
    pool.check_integrity()


def test_ref_errors(Pool) -> None:
    pool = Pool(3)
    pool.allocate(1)
    for bad in (3, 100, -1):
        raises_unchanged(pool, KVCacheError, lambda b=bad: pool.incref(b))
        raises_unchanged(pool, KVCacheError, lambda b=bad: pool.free([b]))
        raises_unchanged(pool, KVCacheError, lambda b=bad: pool.ref_count(b))
        raises_unchanged(pool, KVCacheError, lambda b=bad: pool.evict(b))
    raises_unchanged(pool, KVCacheError, lambda: pool.incref(1))  # free block
    raises_unchanged(pool, KVCacheError, lambda: pool.free([1]))  # ref_count already 0
    pool.free([0])
    raises_unchanged(pool, KVCacheError, lambda: pool.free([0]))


def test_cached_blocks_become_evictable_in_lru_order(Pool) -> None:
    pool = Pool(5)
    assert pool.allocate(4) == [0, 1, 2, 3]
    for b in range(3):
        assert cache_block(pool, b, 100 + b) is True
    pool.free([1])
    pool.free([0])
    pool.free([3])  # uncached: goes to the free stack
    pool.free([2])
    assert pool.evictable_block_ids() == [1, 0, 2]
    assert pool.free_block_ids() == [3, 4]
    assert (pool.num_used_blocks, pool.num_evictable_blocks, pool.num_free_blocks) == (0, 3, 2)
    assert pool.cached_blocks() == {100: 0, 101: 1, 102: 2}
    # A hit and its release move a block to the most recent end, wherever it was.
    pool.incref(1)
    pool.free([1])
    assert pool.evictable_block_ids() == [0, 2, 1]
    pool.incref(1)
    pool.free([1])
    assert pool.evictable_block_ids() == [0, 2, 1]
    # A prefix-cache hit takes the block off the LRU list; releasing it puts it at the end.
    pool.incref(0)
    assert pool.evictable_block_ids() == [2, 1]
    assert pool.ref_count(0) == 1
    pool.free([0])
    assert pool.evictable_block_ids() == [2, 1, 0]
    # allocate never evicts.
    raises_unchanged(pool, OutOfBlocksError, lambda: pool.allocate(3))
    pool.check_integrity()


def test_evict(Pool) -> None:
    pool = Pool(4)
    pool.allocate(3)
    for b in range(3):
        cache_block(pool, b, 10 * (b + 1))
    pool.free([2, 0, 1])
    assert pool.evictable_block_ids() == [2, 0, 1]
    assert pool.evict(0) == 10
    assert pool.lookup_prefix([10]) == []
    assert hash_of(pool, 0) is None
    assert pool.free_block_ids() == [0, 3]
    assert pool.evictable_block_ids() == [2, 1]
    raises_unchanged(pool, KVCacheError, lambda: pool.evict(0))
    raises_unchanged(pool, OutOfBlocksError, lambda: pool.evict_lru(3))
    assert pool.evict_lru(0) == []
    assert pool.evict_lru(2) == [2, 1]
    # Evicted oldest first, so the newest of them is allocated first.
    assert pool.free_block_ids() == [1, 2, 0, 3]
    assert pool.cached_blocks() == {}
    assert pool.allocate(4) == [1, 2, 0, 3]
    pool.check_integrity()


def test_evict_needs_evictable(Pool) -> None:
    pool = Pool(2)
    pool.allocate(1)
    cache_block(pool, 0, 5)
    raises_unchanged(pool, KVCacheError, lambda: pool.evict(0))  # used
    raises_unchanged(pool, KVCacheError, lambda: pool.evict(1))  # free


def test_cache_block(Pool) -> None:
    pool = Pool(4)
    pool.allocate(3)
    assert cache_block(pool, 0, 2**64 - 1) is True
    assert hash_of(pool, 0) == 2**64 - 1
    assert cache_block(pool, 0, 2**64 - 1) is False  # already carries it
    assert cache_block(pool, 1, 2**64 - 1) is False  # duplicate content
    assert hash_of(pool, 1) is None
    assert cache_block(pool, 1, 0) is True
    assert pool.cached_blocks() == {2**64 - 1: 0, 0: 1}
    raises_unchanged(pool, KVCacheError, lambda: cache_block(pool, 0, 3))  # different hash
    raises_unchanged(pool, KVCacheError, lambda: cache_block(pool, 3, 3))  # ref_count 0
    raises_unchanged(pool, KVCacheError, lambda: cache_block(pool, 4, 3))  # unknown
    raises_unchanged(pool, ValueError, lambda: cache_block(pool, 2, 2**64))
    raises_unchanged(pool, ValueError, lambda: cache_block(pool, 2, -1))
    # A block carrying a different hash raises even when the new hash names another block.
    raises_unchanged(pool, KVCacheError, lambda: cache_block(pool, 0, 0))
    # Caching a used block does not make it evictable; releasing does.
    assert pool.evictable_block_ids() == []
    pool.free([1])
    assert pool.evictable_block_ids() == [1]
    raises_unchanged(pool, KVCacheError, lambda: cache_block(pool, 1, 0))  # ref_count 0
    pool.check_integrity()


def test_lookup_prefix(Pool) -> None:
    pool = Pool(4)
    pool.allocate(3)
    cache_block(pool, 0, 11)
    cache_block(pool, 1, 12)
    cache_block(pool, 2, 14)
    pool.free([1])  # evictable blocks are still found
    before = state(pool)
    assert pool.lookup_prefix([11]) == [0]
    assert pool.lookup_prefix([12]) == [1]
    assert pool.lookup_prefix([13]) == []
    assert pool.lookup_prefix([]) == []
    assert pool.lookup_prefix([11, 12, 13, 14]) == [0, 1]
    assert pool.lookup_prefix([13, 11]) == []
    assert pool.lookup_prefix([14, 12, 11]) == [2, 1, 0]
    assert state(pool) == before


@pytest.mark.parametrize("block_hash", [-1, 2**64, 2**70])
def test_lookups_refuse_hashes_cache_block_refuses(Pool, block_hash: int) -> None:
    pool = Pool(4)
    pool.allocate(1)
    cache_block(pool, 0, 11)
    raises_unchanged(pool, ValueError, lambda: cache_block(pool, 0, block_hash))
    raises_unchanged(pool, ValueError, lambda: pool.lookup_prefix([block_hash]))
    # Every hash is checked, also those past the first miss.
    raises_unchanged(pool, ValueError, lambda: pool.lookup_prefix([11, 12, block_hash]))
    assert pool.lookup_prefix([11, 12]) == [0]


@pytest.mark.parametrize("kind", NOT_A_LIST)
def test_id_lists_are_lists_or_tuples(Pool, kind: str) -> None:
    pool = Pool(4)
    assert pool.allocate(2) == [0, 1]
    cache_block(pool, 0, 0)
    cache_block(pool, 1, 1)
    raises_unchanged(pool, TypeError, lambda: pool.free(NOT_A_LIST[kind]()))
    raises_unchanged(pool, TypeError, lambda: pool.lookup_prefix(NOT_A_LIST[kind]()))
    assert pool.ref_counts() == [1, 1, 0, 0]


def test_tuples_are_accepted_where_lists_are(Pool) -> None:
    pool = Pool(4)
    assert pool.allocate(2) == [0, 1]
    cache_block(pool, 0, 7)
    assert pool.lookup_prefix((7, 8)) == [0]
    pool.free((0, 1))
    assert pool.ref_counts() == [0, 0, 0, 0]
    with pytest.raises(TypeError):
        pool.free([0.0])  # items are ints (operator.index), not floats
    pool.check_integrity()


def test_check_integrity_passes_through_a_lifecycle(Pool) -> None:
    pool = Pool(6)
    ids = pool.allocate(4)
    for i, b in enumerate(ids):
        pool.check_integrity()
        cache_block(pool, b, i)
    pool.incref(ids[0])
    pool.free(ids)
    pool.check_integrity()
    pool.evict_lru(2)
    pool.check_integrity()
    pool.incref(pool.lookup_prefix([3])[0])
    pool.check_integrity()


# ---- the two implementations driven side by side ---------------------------------------------

# Few enough values that duplicate content and conflicts are common.
HASHES = st.integers(0, 12) | st.just(2**64 - 1)


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:
        return ("raised", type(exc))


class PoolTwins(RuleBasedStateMachine):
    """Same operations on the Rust pool and the Python twin, valid and invalid alike."""

    @initialize(num_blocks=st.integers(1, 10), data=st.data())
    def make(self, num_blocks: int, data: st.DataObject) -> None:
        self.n = num_blocks
        self.native = _native.BlockPool(num_blocks)
        self.python = PyBlockPool(num_blocks)
        # Start from a lived-in state: some blocks used, some cached, some evictable.
        _, block_ids = self.both("allocate", data.draw(st.integers(0, num_blocks)))
        for block_id in block_ids:
            fate = data.draw(st.sampled_from(["used", "cached", "evictable", "free"]))
            if fate in ("cached", "evictable"):
                self.both(cache_block, block_id, block_id)
            if fate in ("evictable", "free"):
                self.both("free", [block_id])

    def both(self, method: str | Callable[..., Any], *args: Any) -> tuple[str, Any]:
        """A pool method (by name), or a helper taking the pool first, on both pools."""

        def on(pool: Any) -> Callable[..., Any]:
            if callable(method):
                return lambda *a: method(pool, *a)
            return getattr(pool, method)

        before = state(self.python)
        expected = outcome(on(self.python), *args)
        if expected[0] == "raised":
            assert state(self.python) == before, f"python {method}{args} raised but changed"
        got = outcome(on(self.native), *args)
        assert got == expected, f"{method}{args}: native {got}, python {expected}"
        return expected

    def block_id(self, data: st.DataObject, among: list[int] | None = None) -> int:
        """Mostly one of ``among`` (the ids the operation is valid for); sometimes any id,
        unknown ones (-1, num_blocks, num_blocks + 1) included."""
        if among and data.draw(st.integers(0, 4)) > 0:
            return data.draw(st.sampled_from(among))
        return data.draw(st.integers(-1, self.n + 1))

    def used(self) -> list[int]:
        return [b for b, rc in enumerate(self.python.ref_counts()) if rc > 0]

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        free = self.python.num_free_blocks
        self.both("allocate", data.draw(st.integers(0, free) | st.integers(-1, self.n + 1)))

    @rule(data=st.data())
    def allocate_run(self, data: st.DataObject) -> None:
        run = self.python.longest_free_run()
        self.both("allocate_run", data.draw(st.integers(0, run) | st.integers(-1, self.n + 1)))

    @rule(data=st.data())
    def incref(self, data: st.DataObject) -> None:
        evictable = self.python.evictable_block_ids()
        self.both("incref", self.block_id(data, evictable + self.used()))

    @rule(data=st.data())
    def incref_all(self, data: st.DataObject) -> None:
        evictable = self.python.evictable_block_ids()
        num_ids = data.draw(st.integers(0, 4))
        ids = [self.block_id(data, evictable + self.used()) for _ in range(num_ids)]
        self.both("incref_all", ids)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        used = self.used()
        if used and data.draw(st.booleans()):
            ids = data.draw(st.lists(st.sampled_from(used), max_size=5))  # often valid
        else:
            ids = data.draw(st.lists(st.integers(-1, self.n + 1), max_size=5))
        self.both("free", ids)

    @rule(data=st.data(), block_hash=HASHES)
    def cache_block(self, data: st.DataObject, block_hash: int) -> None:
        self.both(cache_block, self.block_id(data, self.used()), block_hash)

    @rule(data=st.data(), block_hash=HASHES)
    def cache_and_release(self, data: st.DataObject, block_hash: int) -> None:
        # The prefix cache's common path: a used block gets a hash and is released at once.
        uncached = [b for b in self.used() if hash_of(self.python, b) is None]
        if uncached:
            block_id = data.draw(st.sampled_from(uncached))
            if self.both(cache_block, block_id, block_hash) == ("returned", True):
                self.both("free", [block_id] * self.python.ref_count(block_id))

    @rule(data=st.data(), block_hash=st.sampled_from([-1, 2**64, 2**70]))
    def cache_block_bad_hash(self, data: st.DataObject, block_hash: int) -> None:
        # Only on used uncached blocks, where ValueError is the one error the contract names.
        targets = [b for b in self.used() if hash_of(self.python, b) is None]
        if targets:
            self.both(cache_block, data.draw(st.sampled_from(targets)), block_hash)

    @rule(hashes=st.lists(HASHES, max_size=6), as_array=st.booleans())
    def lookup_prefix(self, hashes: list[int], as_array: bool) -> None:
        if as_array and all(0 <= h < 2**64 for h in hashes):  # block_hash's form
            self.both("lookup_prefix", array("Q", hashes))
        else:
            self.both("lookup_prefix", hashes)

    @rule(data=st.data())
    def queries(self, data: st.DataObject) -> None:
        block_id = self.block_id(data)
        self.both("ref_count", block_id)
        some = data.draw(st.lists(st.integers(-1, self.n + 1), max_size=6))
        self.both("num_unreferenced", some)

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        self.both("evict", self.block_id(data, self.python.evictable_block_ids()))

    @rule(data=st.data())
    def evict_lru(self, data: st.DataObject) -> None:
        self.both("evict_lru", data.draw(st.integers(0, self.python.num_evictable_blocks + 1)))

    @rule(data=st.data())
    def make_room_lru(self, data: st.DataObject) -> None:
        reclaimable = self.python.num_free_blocks + self.python.num_evictable_blocks
        num_blocks = data.draw(st.integers(0, reclaimable + 1) | st.integers(-1, 2**70))
        num_kept_free = data.draw(st.integers(0, reclaimable + 1) | st.just(-1))
        self.both("make_room_lru", num_blocks, num_kept_free)

    @invariant()
    def same_state_and_intact(self) -> None:
        if not hasattr(self, "native"):
            return
        assert state(self.native) == state(self.python)
        self.python.check_integrity()
        self.native.check_integrity()


TestPoolTwins = PoolTwins.TestCase
TestPoolTwins.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)

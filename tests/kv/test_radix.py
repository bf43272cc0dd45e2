"""RadixTree: the Rust core against its pure-Python twin, operation by operation.

The native module is required: if ``enginekit._native`` is not built, this file fails.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from native_args import NOT_A_LIST

from enginekit import Engine, SamplingParams, _native
from enginekit.errors import KVCacheError
from enginekit.interfaces import RadixNode
from enginekit.kv.backend import make_backend
from enginekit.kv.pyref import PyRadixTree


@pytest.fixture(params=[_native.RadixTree, PyRadixTree], ids=["native", "python"])
def Tree(request: pytest.FixtureRequest) -> type:
    return request.param


def num_nodes(tree: Any) -> int:
    """Nodes, the root included."""
    return len(tree.nodes())


def num_tokens(tree: Any) -> int:
    """Tokens stored over all edges."""
    return sum(len(n.token_ids) for n in tree.nodes())


def num_block_refs(tree: Any) -> int:
    """Tree references held by all nodes."""
    return sum(len(n.block_ids) for n in tree.nodes())


def evictable_block_refs(tree: Any) -> int:
    """References held by non-root nodes with lock_count 0: what evict could release."""
    return sum(
        len(n.block_ids) for n in tree.nodes() if n.parent_id is not None and not n.lock_count
    )


def has_node(tree: Any, node_id: int) -> bool:
    return any(n.node_id == node_id for n in tree.nodes())


def state(tree: Any) -> dict[str, Any]:
    """Everything observable about a tree (the counts are the nodes', summed)."""
    return {
        "block_size": tree.block_size,
        "num_nodes": num_nodes(tree),
        "num_tokens": num_tokens(tree),
        "num_block_refs": num_block_refs(tree),
        "evictable_block_refs": evictable_block_refs(tree),
        "num_evictable_blocks": tree.num_evictable_blocks(),
        "nodes": [tuple(n) for n in tree.nodes()],
    }


def unlocked_only_blocks(tree: Any) -> set[int]:
    """Blocks that non-root nodes with lock_count 0 reference and no locked node does."""
    unlocked, locked = set(), set()
    for n in tree.nodes():
        if n.parent_id is not None:
            (locked if n.lock_count else unlocked).update(n.block_ids)
    return unlocked - locked


def raises_unchanged(tree: Any, exc: type[Exception], fn: Callable[[], Any]) -> str:
    """fn() raises exactly ``exc`` and leaves the tree as it was; returns the message."""
    before = state(tree)
    with pytest.raises(exc) as info:
        fn()
    assert type(info.value) is exc
    assert state(tree) == before
    tree.check_integrity()
    return str(info.value)


A = list(range(10))
B = list(range(6)) + list(range(100, 106))  # shares 6 tokens with A, 12 long


def split_example(Tree: type) -> Any:
    """block_size 4: A with blocks [7, 8, 9], then B (diverging at 6) with [7, 20, 21]."""
    tree = Tree(4)
    assert tree.insert(A, [7, 8, 9]) == (10, [7, 8, 9], 1, [])
    # Split at position 6, inside block 1: the upper half [0, 6) becomes node 2; node 1 keeps
    # [6, 10) with blocks 8 and 9. The new leaf 3 holds [6, 12) with the caller's blocks 20
    # and 21; its 20 holds B's positions [4, 6) too, shared with A, so the upper half takes 20
    # for block 1 (rather than a second reference to A's 8): [7, 20].
    assert tree.insert(B, [7, 20, 21]) == (6, [20, 21, 20], 3, [])
    tree.check_integrity()
    return tree


# ---- exact behaviour, against both implementations ------------------------------------------


def test_new_tree(Tree) -> None:
    tree = Tree(4)
    assert state(tree) == {
        "block_size": 4,
        "num_nodes": 1,
        "num_tokens": 0,
        "num_block_refs": 0,
        "evictable_block_refs": 0,
        "num_evictable_blocks": 0,
        "nodes": [(0, None, [], [], 0, 0)],
    }
    assert tree.match_prefix([1, 2, 3]) == (0, [], 0)
    assert has_node(tree, 0) and not has_node(tree, 1) and not has_node(tree, -1)
    tree.check_integrity()
    for bad in (0, -1, 2**64):
        with pytest.raises(ValueError):
            Tree(bad)
    assert Tree(2**64 - 1).block_size == 2**64 - 1


def test_results_are_named_tuples(Tree) -> None:
    tree = Tree(4)
    r = tree.insert(A, [7, 8, 9])
    assert (r.num_new_tokens, r.new_block_refs, r.node_id) == (10, [7, 8, 9], 1)
    assert r.released_block_refs == []
    m = tree.match_prefix(A[:5])
    assert (m.num_tokens, m.block_ids, m.node_id) == (5, [7, 8], 1)
    root, leaf = tree.nodes()
    assert (leaf.node_id, leaf.parent_id, leaf.token_ids, leaf.block_ids) == (1, 0, A, [7, 8, 9])
    assert (leaf.lock_count, leaf.stamp, root.parent_id) == (0, 1, None)


def test_mid_block_split(Tree) -> None:
    tree = split_example(Tree)
    # Block 20 straddles the split: two references, one block.
    assert state(tree) == {
        "block_size": 4,
        "num_nodes": 4,
        "num_tokens": 16,
        "num_block_refs": 6,
        "evictable_block_refs": 6,
        "num_evictable_blocks": 5,
        "nodes": [
            (0, None, [], [], 0, 2),
            (1, 2, A[6:], [8, 9], 0, 1),
            (2, 0, A[:6], [7, 20], 0, 2),
            (3, 2, B[6:], [20, 21], 0, 2),
        ],
    }
    assert tree.match_prefix(A) == (10, [7, 8, 9], 1)
    assert tree.match_prefix(B) == (12, [7, 20, 21], 3)
    assert tree.match_prefix(A[:5]) == (5, [7, 20], 2)
    assert tree.match_prefix(A[:4]) == (4, [7], 2)
    assert tree.match_prefix(B[:7]) == (7, [7, 20], 3)
    assert tree.match_prefix(A + [1, 2]) == (10, [7, 8, 9], 1)
    assert tree.match_prefix([0, 1, 2, 99]) == (3, [7], 2)
    assert tree.match_prefix([]) == (0, [], 0)
    # Oldest leaf first: node 1 (stamp 1) loses its last block and keeps [6, 8).
    assert tree.evict(1) == [9]
    assert tree.match_prefix(A) == (8, [7, 8], 1)
    tree.check_integrity()
    # Then node 1's 8, leaf 3 tail first (its 20 frees no block: node 2 holds it too, so
    # eviction goes on), then its parent 2, which became an unlocked leaf.
    assert tree.evict(4) == [8, 21, 20, 20, 7]
    assert state(tree)["nodes"] == [(0, None, [], [], 0, 2)]
    tree.check_integrity()


def test_split_on_a_block_boundary_adds_no_reference(Tree) -> None:
    tree = Tree(4)
    tree.insert(list(range(12)), [1, 2, 3])
    assert tree.insert(list(range(8)) + [50], [1, 2, 4]) == (1, [4], 3, [])
    nodes = tree.nodes()
    assert (nodes[1].block_ids, nodes[2].block_ids, nodes[3].block_ids) == ([3], [1, 2], [4])
    assert num_block_refs(tree) == 4
    tree.check_integrity()


def test_insert_of_a_stored_prefix_only_stamps(Tree) -> None:
    tree = Tree(4)
    tree.insert(A, [7, 8, 9])
    assert tree.insert(A[:3], [40]) == (0, [], 1, [])  # ends inside node 1's edge: no split
    assert num_nodes(tree) == 2
    assert tree.nodes()[1].stamp == 2
    assert tree.insert([], []) == (0, [], 0, [])
    assert tree.nodes()[0].stamp == 3
    # Extending a leaf adds a child; the new range takes the caller's blocks. The child starts
    # inside block 2, whose copy 30 holds node 1's positions [8, 10) too: node 1 takes 30 and
    # releases 9.
    assert tree.insert(A + [10, 11, 12], [0, 0, 30, 31]) == (3, [30, 31, 30], 2, [9])
    assert tree.nodes()[1].block_ids == [7, 8, 30]
    assert tree.match_prefix(A + [10, 11, 12]) == (13, [7, 8, 30, 31], 2)
    tree.check_integrity()


def test_insert_errors_change_nothing(Tree) -> None:
    tree = split_example(Tree)
    msg = raises_unchanged(tree, ValueError, lambda: tree.insert([1, 2, 3, 4, 5], [1]))
    assert msg == "block_ids holds 1 blocks, fewer than the 2 that 5 tokens need"
    for bad in (-1, 2**31):
        msg = raises_unchanged(tree, ValueError, lambda b=bad: tree.insert([1], [b]))
        assert msg == f"block id {bad} is not in [0, 2**31)"
    for bad in (-1, 2**32):
        msg = raises_unchanged(tree, ValueError, lambda b=bad: tree.insert([1, b], [1]))
        assert msg == f"token id {bad} is not in [0, 2**32)"
        raises_unchanged(tree, ValueError, lambda b=bad: tree.match_prefix([0, b]))
    # Extra blocks are ignored.
    assert tree.insert([1], [5, 6]) == (1, [5], 4, [])
    tree.check_integrity()


def test_locks(Tree) -> None:
    tree = split_example(Tree)
    tree.lock(3)
    locks = {n.node_id: (n.lock_count, n.stamp) for n in tree.nodes()}
    assert locks == {0: (1, 3), 1: (0, 1), 2: (1, 3), 3: (1, 3)}
    assert evictable_block_refs(tree) == 2
    assert tree.num_evictable_blocks() == 2
    assert tree.evict(10) == [9, 8]  # only node 1 can go, tail first
    assert tree.evict(10) == []
    assert tree.match_prefix(A) == (6, [7, 20], 2)
    assert tree.match_prefix(B) == (12, [7, 20, 21], 3)
    msg = raises_unchanged(tree, KVCacheError, lambda: tree.unlock(2))  # locked only below
    assert msg == "node 2 is not locked: cannot unlock"
    for unknown in (1, 99, -1, 2**64):
        msg = raises_unchanged(tree, KVCacheError, lambda n=unknown: tree.lock(n))
        assert msg == f"unknown node {unknown}"
        raises_unchanged(tree, KVCacheError, lambda n=unknown: tree.unlock(n))
    tree.unlock(3)
    assert evictable_block_refs(tree) == 4
    raises_unchanged(tree, KVCacheError, lambda: tree.unlock(3))
    tree.lock(0)  # the root may be locked; it protects nothing
    assert evictable_block_refs(tree) == 4
    tree.unlock(0)
    tree.check_integrity()


def test_split_of_a_locked_node(Tree) -> None:
    tree = Tree(4)
    tree.insert(A, [7, 8, 9])
    tree.lock(1)
    tree.lock(1)
    # Diverge at 3: the new upper node 2 inherits lock_count 2; node 1 keeps its own locks.
    assert tree.insert([0, 1, 2, 77], [7]) == (1, [7, 7], 3, [])
    nodes = {n.node_id: n for n in tree.nodes()}
    assert (nodes[2].token_ids, nodes[2].lock_count, nodes[1].lock_count) == ([0, 1, 2], 2, 2)
    assert nodes[3].lock_count == 0
    assert evictable_block_refs(tree) == 1
    raises_unchanged(tree, KVCacheError, lambda: tree.unlock(2))
    # Leaf 3's only block, 7, is held by the locked node 2 too: evicting it frees nothing,
    # so it stays.
    assert tree.num_evictable_blocks() == 0
    assert tree.evict(5) == []
    tree.unlock(1)
    tree.unlock(1)
    assert evictable_block_refs(tree) == 5
    # Leaf 1 ends inside its last block, 9: that goes first. Then leaf 3 (stamp 4) is older
    # than leaf 1 (stamp 6): its reference to 7 goes, freeing nothing (nodes 1 and 2 hold 7),
    # then leaf 1's 8.
    assert tree.evict(1) == [9]
    assert tree.evict(1) == [7, 8]
    assert tree.evict(1) == [7, 7]  # leaf 1's 7 frees nothing; node 2's does
    assert num_nodes(tree) == 1
    tree.check_integrity()


def test_evict_order_stamp_then_id(Tree) -> None:
    tree = Tree(2)
    tree.insert([1, 1], [10])  # node 1, stamp 1
    tree.insert([2, 2], [20])  # node 2, stamp 2
    tree.insert([3, 3], [30])  # node 3, stamp 3
    tree.lock(1)
    tree.unlock(1)  # node 1 now the most recent
    assert tree.evict(2) == [20, 30]
    assert tree.evict(0) == []
    assert tree.evict(2**70) == [10]
    raises_unchanged(tree, ValueError, lambda: tree.evict(-1))
    tree.insert([5, 5, 1], [50, 51])  # node 4
    tree.insert([5, 5, 2], [50, 52])  # split: node 5 = [5, 5]; leaf 6 = [2]
    assert [n.stamp for n in tree.nodes()[1:]] == [6, 7, 7]
    tree.insert([5, 5, 3], [50, 53])  # leaf 7, stamp 8; leaf 6 keeps stamp 7
    tree.lock(4)
    tree.unlock(4)  # leaf 4 and its parent now stamp 10
    assert tree.evict(1) == [52]
    assert tree.evict(1) == [53]
    assert tree.evict(1) == [51]
    assert tree.evict(1) == [50]


def test_evict_trims_the_least_recent_leaf_tail_first(Tree) -> None:
    tree = Tree(4)
    tree.insert(A, [7, 8, 9])  # node 1: [0, 10), stamp 1
    tree.insert([50, 51, 52, 53], [30])  # node 2, stamp 2, one full block
    # One block asked, one block released: node 1's last, positions [8, 10).
    assert tree.evict(1) == [9]
    assert tree.nodes()[1].token_ids == A[:8]
    assert tree.match_prefix(A) == (8, [7, 8], 1)
    # Trimmed, node 1 keeps its stamp: it goes on first, tail first, before node 2.
    assert tree.evict(1) == [8]
    assert tree.match_prefix(A) == (4, [7], 1)
    assert tree.evict(2) == [7, 30]
    assert num_nodes(tree) == 1
    tree.check_integrity()


def test_evict_drops_a_straddling_reference_without_counting_it(Tree) -> None:
    tree = Tree(4)
    tree.insert(A[:6], [7, 8])  # node 1: [0, 6) in 7, 8
    tree.insert(A[:9], [7, 8, 9])  # node 2: [6, 9) in 8 (shared with node 1) and 9
    assert tree.num_evictable_blocks() == 3
    assert tree.evict(1) == [9]
    # Node 2's reference to 8 frees no block: node 2 goes, and the parent's 8 follows.
    assert tree.evict(1) == [8, 8]
    assert tree.match_prefix(A) == (4, [7], 1)
    assert tree.num_evictable_blocks() == 1
    tree.check_integrity()
    # With the parent locked only 9 is evictable; node 2 keeps [6, 8).
    tree = Tree(4)
    parent = tree.insert(A[:6], [7, 8]).node_id
    tree.insert(A[:9], [7, 8, 9])
    tree.lock(parent)
    assert tree.evict(5) == [9]
    assert tree.evict(5) == []
    assert tree.match_prefix(A) == (8, [7, 8], 2)
    tree.check_integrity()


def test_evict_takes_partly_filled_last_blocks_first(Tree) -> None:
    tree = Tree(4)
    tree.insert([1] * 8, [10, 11])  # node 1, stamp 1: ends on a block boundary
    tree.insert([2] * 6, [20, 21])  # node 2, stamp 2: ends inside block 21
    tree.insert([3] * 3, [30])  # node 3, stamp 3: ends inside block 30
    # Blocks a block-granular cache would not hold go first (least recent first), though
    # node 1 is older; then node 1, the least recent, before node 2's full block.
    assert tree.evict(1) == [21]
    assert tree.evict(1) == [30]
    assert tree.evict(2) == [11, 10]
    assert tree.evict(1) == [20]
    assert num_nodes(tree) == 1
    tree.check_integrity()


def test_a_leaf_starting_inside_a_block_lends_it_to_its_ancestors(Tree) -> None:
    tree = Tree(8)
    tree.insert([1, 2, 3], [10])  # node 1
    tree.insert([1, 2, 3, 4, 5], [10])  # node 2: the same sequence's next chunk, same block
    # Goes on at 5 with its own copy 11 of block 0 (copy-on-write of a partial match): both
    # ancestors take 11 and release 10.
    assert tree.insert([1, 2, 3, 4, 5, 6], [11]) == (1, [11, 11, 11], 3, [10, 10])
    assert [n.block_ids for n in tree.nodes()[1:]] == [[11], [11], [11]]
    assert tree.num_evictable_blocks() == 1
    tree.check_integrity()
    # A lock on the parent keeps its copy (its request holds it); a lock below a child with
    # another copy does not.
    tree = Tree(8)
    parent = tree.insert([1, 2, 3], [10]).node_id
    tree.lock(parent)
    assert tree.insert([1, 2, 3, 4], [11]) == (1, [11], 2, [])
    tree.unlock(parent)
    tree.lock(2)
    assert tree.insert([1, 2, 3, 5], [10]) == (1, [10], 3, [])
    assert tree.insert([1, 2, 3, 6], [12]) == (1, [12, 12], 4, [10])
    tree.check_integrity()


def test_deep_path(Tree) -> None:
    tree = Tree(3)
    base = list(range(40))
    total = 0
    for cut in range(1, 40, 3):
        seq = base[:cut] + [1000 + cut, 7]
        result = tree.insert(seq, [100 * cut + i for i in range(len(seq))])
        total += len(result.new_block_refs)
        assert tree.match_prefix(seq).num_tokens == len(seq)
        tree.check_integrity()
    result = tree.insert(base, list(range(14)))
    total += len(result.new_block_refs)
    assert num_block_refs(tree) == total
    assert tree.match_prefix(base).num_tokens == 40
    assert len(tree.match_prefix(base).block_ids) == 14
    assert len(tree.evict(10**9)) == total
    assert num_nodes(tree) == 1


def test_evictable_blocks_count_a_shared_block_once(Tree) -> None:
    tree = Tree(4)
    # A 7-token prompt in blocks 10, 11, then the same sequence one token longer: the new
    # leaf starts inside block 11, which both nodes reference.
    first = tree.insert([1, 2, 3, 4, 5, 6, 7], [10, 11])
    tree.lock(first.node_id)
    assert tree.num_evictable_blocks() == 0
    assert tree.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 11]).new_block_refs == [11]
    assert tree.num_evictable_blocks() == 0  # 11 is also referenced by a locked node
    tree.unlock(first.node_id)
    assert (evictable_block_refs(tree), tree.num_evictable_blocks()) == (3, 2)
    # Leaving the first edge inside block 11 splits it there; the new leaf holds its own
    # copy of block 1, 12, which the upper part takes instead of 11 (11 stays below).
    second = tree.insert([1, 2, 3, 4, 5, 9, 9, 9], [10, 12])
    assert second.new_block_refs == [12, 12]
    assert (evictable_block_refs(tree), tree.num_evictable_blocks()) == (5, 3)
    tree.lock(second.node_id)
    # Locked: the upper part (10, 12) and the leaf (12); the unlocked lower nodes hold block
    # 11, which no locked node needs.
    assert (evictable_block_refs(tree), tree.num_evictable_blocks()) == (2, 1)
    tree.unlock(second.node_id)
    assert tree.num_evictable_blocks() == len(unlocked_only_blocks(tree)) == 3
    assert sorted(tree.evict(100)) == [10, 11, 11, 12, 12]
    assert tree.num_evictable_blocks() == 0
    tree.check_integrity()


def test_twin_integrity_covers_its_reference_counts() -> None:
    tree = split_example(PyRadixTree)
    tree._refs[7] += 1
    with pytest.raises(KVCacheError, match="references per block"):
        tree.check_integrity()


@pytest.mark.parametrize("kind", NOT_A_LIST)
def test_token_and_block_lists_are_lists_or_tuples(Tree, kind: str) -> None:
    tree = split_example(Tree)
    bad = NOT_A_LIST[kind]
    raises_unchanged(tree, TypeError, lambda: tree.insert(bad(), [1, 2]))
    raises_unchanged(tree, TypeError, lambda: tree.insert([0, 1], bad()))
    raises_unchanged(tree, TypeError, lambda: tree.match_prefix(bad()))
    assert tree.match_prefix(tuple(A)) == tree.match_prefix(A)
    assert tree.insert(tuple(B), (7, 20, 21)) == (0, [], 3, [])


def run_radix_engine(native: bool) -> list[tuple[int, int, int, int]]:
    """Prompts [1..7], then [1, 2, 3, 4, 5, 9, 9, 9] at block size 4 (the second matches 5
    tokens, inside block 1, and splits the first's edge there); the usage after every step."""
    engine = Engine.from_overrides(
        [
            "progress=false",
            "+prefix=radix",
            "cache.block_size=4",
            "cache.num_blocks=16",
            "cache.watermark=0",
        ],
        make_backend(native),
    )
    usages = []
    for prompt in ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 9, 9, 9]):
        engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
            engine.check_integrity()
            usage = engine.kv_usage()
            assert usage.num_used_blocks + usage.num_evictable_blocks + usage.num_free_blocks == (
                usage.num_total_blocks
            ), usage
            assert engine.cache.num_reclaimable_blocks() <= usage.num_total_blocks
            usages.append(tuple(usage)[:4])  # total, used, evictable, free
    # Once both have finished, the tree alone holds the blocks it references: all of them are
    # evictable, each counted once.
    assert engine.cache.pool.num_used_blocks == len(set(engine.cache.prefix.held_block_ids()))
    assert usage.num_evictable_blocks == engine.cache.pool.num_used_blocks
    return usages


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_radix_usage_counts_each_block_once(native: bool) -> None:
    usages = run_radix_engine(native)
    # The first request's 9 computed tokens (7 prompt, 2 outputs) end in the tree in blocks
    # 0, 1, 2, block 1 in both the prompt's node and the outputs' leaf. The second shares
    # block 0, copies block 1 and adds two more. Five blocks, referenced 7 times.
    assert usages[-1] == (16, 0, 5, 11)
    assert usages == run_radix_engine(not native)


def test_native_is_fast_on_long_shared_prefixes() -> None:
    tree = _native.RadixTree(16)
    base = list(range(4000))
    blocks = list(range(250))
    for i in range(400):
        seq = list(base)
        seq[(i * 7919) % 4000] = 10_000 + i
        tree.insert(seq, blocks)
        assert tree.match_prefix(seq).num_tokens == 4000
    tree.check_integrity()


# ---- the two implementations driven side by side ---------------------------------------------


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        result = fn(*args)
    except Exception as exc:
        return ("raised", (type(exc), str(exc)))
    if isinstance(result, tuple):  # the named tuples compare as tuples
        result = tuple(result)
    return ("returned", result)


TOKENS = st.integers(0, 4)


class RadixTwins(RuleBasedStateMachine):
    """Same operations on the Rust tree and the Python twin, valid and invalid alike.

    Sequences are drawn from a few shared bases over a tiny alphabet, so prefixes are shared,
    edges split (inside blocks and on their boundaries) and paths grow deep. The driver keeps
    the caller's ledger of tree references: + new_block_refs, - evicted ids.
    """

    @initialize(
        block_size=st.integers(1, 4),
        bases=st.lists(st.lists(TOKENS, min_size=1, max_size=20), min_size=1, max_size=3),
    )
    def make(self, block_size: int, bases: list[list[int]]) -> None:
        self.bs = block_size
        self.bases = bases
        self.native = _native.RadixTree(block_size)
        self.python = PyRadixTree(block_size)
        self.refs: Counter[int] = Counter()
        self.seen_nodes = [0]  # node ids returned by calls (some may be evicted since)
        self.next_block = 0

    def both(self, method: str, *args: Any) -> tuple[str, Any]:
        before = state(self.python)
        expected = outcome(getattr(self.python, method), *args)
        if expected[0] == "raised":
            assert state(self.python) == before, f"python {method}{args} raised but changed"
        got = outcome(getattr(self.native, method), *args)
        assert got == expected, f"{method}{args}: native {got}, python {expected}"
        return expected

    def sequence(self, data: st.DataObject) -> list[int]:
        base = data.draw(st.sampled_from(self.bases))
        cut = data.draw(st.integers(0, len(base)))
        tail = data.draw(st.lists(TOKENS, max_size=6))
        return base[:cut] + tail

    def node_id(self, data: st.DataObject) -> int:
        if data.draw(st.integers(0, 5)) > 0:
            return data.draw(st.sampled_from(self.seen_nodes))
        return data.draw(st.sampled_from([-1, 2**64, num_nodes(self.python) + 50]))

    @rule(data=st.data())
    def insert(self, data: st.DataObject) -> None:
        seq = self.sequence(data)
        need = -(-len(seq) // self.bs)
        # Fresh ids, or the ids of the matching path, with or without a copy of a partially
        # matched last block (the usual caller copies it).
        blocks = list(range(self.next_block, self.next_block + need))
        self.next_block += need
        how = data.draw(st.sampled_from(["fresh", "matched", "copy_on_write"]))
        if how != "fresh":
            found = self.python.match_prefix(seq)
            matched = found.block_ids
            if how == "copy_on_write" and found.num_tokens % self.bs:
                matched = matched[:-1]  # the partially matched block is copied: a fresh id
            blocks[: len(matched)] = matched
        blocks += data.draw(st.lists(st.integers(0, 3), max_size=2))  # extra ids are ignored
        kind = data.draw(st.sampled_from(["ok"] * 6 + ["short", "bad_block", "bad_token"]))
        if kind == "short" and blocks:
            blocks = blocks[: data.draw(st.integers(0, need - 1))] if need else blocks
        elif kind == "bad_block":
            blocks.insert(
                data.draw(st.integers(0, len(blocks))), data.draw(st.sampled_from([-1, 2**31]))
            )
        elif kind == "bad_token":
            bad = data.draw(st.sampled_from([-1, 2**32]))
            seq.insert(data.draw(st.integers(0, len(seq))), bad)
        result = self.both("insert", seq, blocks)
        if result[0] == "returned":
            num_new, refs, node_id, released = result[1]
            self.refs.update(refs)
            self.refs.subtract(released)
            self.seen_nodes.append(node_id)

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        seq = self.sequence(data)
        if data.draw(st.integers(0, 9)) == 0:
            seq.append(-1)
        tokens: Any = seq
        if all(0 <= t < 2**32 for t in seq) and data.draw(st.booleans()):
            tokens = array("I", seq)  # the radix cache's form for a request that waits
        args: tuple[Any, ...] = (tokens,)
        if data.draw(st.booleans()):
            max_tokens = data.draw(st.one_of(st.none(), st.integers(-1, len(seq) + 3)))
            args = (tokens, max_tokens)
            if max_tokens is not None and max_tokens >= 0:
                # As matching a copy of the prefix: the ids after it are not read (nor a bad
                # one among them).
                got = outcome(self.python.match_prefix, *args)
                assert got == outcome(self.python.match_prefix, seq[:max_tokens])
        result = self.both("match_prefix", *args)
        if result[0] == "returned":
            self.seen_nodes.append(result[1][2])

    @rule(data=st.data())
    def evictable_among(self, data: st.DataObject) -> None:
        held = [b for n in self.python.nodes() for b in n.block_ids]
        ids = data.draw(st.lists(st.sampled_from(held + [0, 1, 2**31 - 1]), max_size=6))
        if data.draw(st.integers(0, 9)) == 0:
            ids.append(data.draw(st.sampled_from([-1, 2**31])))
        result = self.both("num_evictable_among", ids)
        if result[0] == "returned":
            assert result[1] == len(set(ids) & unlocked_only_blocks(self.python))

    @rule(data=st.data())
    def lock(self, data: st.DataObject) -> None:
        self.both("lock", self.node_id(data))

    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        self.both("unlock", self.node_id(data))

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        num_blocks = data.draw(st.integers(-1, 8))
        num_before = self.python.num_evictable_blocks()
        refs_before = num_block_refs(self.python)
        result = self.both("evict", num_blocks)
        if result[0] == "returned":
            self.refs.subtract(result[1])
            # Exactly what was asked, where there is that much; one reference per trimmed
            # block.
            assert self.python.num_evictable_blocks() == num_before - min(num_blocks, num_before)
            assert num_block_refs(self.python) == refs_before - len(result[1])

    @rule(data=st.data())
    def evict_a_chosen_tail(self, data: st.DataObject) -> None:
        """A policy's victim: any candidate ``evictable_tails`` lists, trimmed as one round
        of ``evict`` would; or a node that is no candidate, refused."""
        tails = self.both("evictable_tails")[1]
        assert [block for _, block in tails] == [
            n.block_ids[-1] for n in candidates_in_order(self.python)
        ]
        if tails and data.draw(st.integers(0, 4)):
            node_id = data.draw(st.sampled_from(tails))[0]
        else:
            node_id = self.node_id(data)
        result = self.both("evict_tail", node_id)
        if result[0] == "returned":
            self.refs.subtract([result[1]])

    @invariant()
    def same_state_and_intact(self) -> None:
        if not hasattr(self, "native"):
            return
        assert state(self.native) == state(self.python)
        self.native.check_integrity()
        self.python.check_integrity()
        # The caller's ledger matches the references the nodes hold.
        held = Counter(b for n in self.python.nodes() for b in n.block_ids)
        assert +self.refs == held
        assert self.native.num_evictable_blocks() == len(unlocked_only_blocks(self.python))


def candidates_in_order(tree: PyRadixTree) -> list[RadixNode]:
    """The unlocked leaves, in ``evict``'s order: those ending inside a block first, then
    least recent stamp, then lower id."""
    nodes = tree.nodes()
    parents = {n.parent_id for n in nodes}
    leaves = [n for n in nodes if n.parent_id is not None and n.node_id not in parents]
    unlocked = [n for n in leaves if n.lock_count == 0]
    ends = {n.node_id: _end(nodes, n) for n in unlocked}
    return sorted(
        unlocked,
        key=lambda n: (ends[n.node_id] % tree.block_size == 0, n.stamp, n.node_id),
    )


def _end(nodes: list[RadixNode], node: RadixNode) -> int:
    """The absolute position after the node's last token."""
    by_id = {n.node_id: n for n in nodes}
    end, current = 0, node
    while current.parent_id is not None:
        end += len(current.token_ids)
        current = by_id[current.parent_id]
    return end


TestRadixTwins = RadixTwins.TestCase
TestRadixTwins.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)

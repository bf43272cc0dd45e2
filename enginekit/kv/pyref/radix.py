"""Pure-Python twin of ``enginekit._native.RadixTree`` (rust/radix/).

A token-granular prefix tree whose nodes reference paged KV blocks. Node 0 is the root and
holds no tokens; every other node holds a non-empty edge of tokens covering the absolute
positions [start, end) of the sequences through it and references the blocks
floor(start / bs) ..= floor((end - 1) / bs). A block straddling a node boundary is referenced by
both nodes: each reference is one tree reference, mirrored by the caller as one pool reference.
Results are the NamedTuples of ``enginekit.interfaces.structures``, which the Rust tree returns
too.

Written for reading: the set of evictable blocks and the eviction candidates are recomputed
from the nodes on demand (the set once after each change), where the Rust core maintains them
incrementally; only the references per block are counted as nodes gain and drop them, which
check_integrity re-derives.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence

from enginekit.errors import KVCacheError
from enginekit.interfaces.structures import InsertResult, RadixMatch, RadixNode
from enginekit.kv.pyref.args import int_list
from enginekit.kv.pyref.radix_check import check_nodes
from enginekit.kv.pyref.radix_node import ROOT, check_block_id, token_list
from enginekit.kv.pyref.radix_node import Node as _Node

__all__ = ["PyRadixTree"]

_MAX_U64 = (1 << 64) - 1


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


class PyRadixTree:
    """Token-granular prefix tree over paged blocks (see the module docstring).

    Locks: a node's lock_count counts the locks on it or on any descendant; locked nodes are
    never evicted. Recency: a logical clock ticks once per insert, lock and unlock, which stamp
    every node from the root to the node concerned. Eviction trims blocks off the ends of
    unlocked leaves, partly filled last blocks first, then least recent first (see evict). A
    call that raises changes nothing.
    """

    def __init__(self, block_size: int) -> None:
        """Raises ValueError if block_size is not in [1, 2**64)."""
        block_size = operator.index(block_size)
        if not 1 <= block_size <= _MAX_U64:
            raise ValueError(f"block_size must be in [1, 2**64), got {block_size}")
        self._block_size = block_size
        self._nodes: dict[int, _Node] = {ROOT: _Node(ROOT, 0, [], [])}
        self._next_id = 1
        self._clock = 0
        self._refs: Counter[int] = Counter()  # block -> references from all nodes
        self._evictable: frozenset[int] | None = None  # _unlocked_only() since the last change

    # ---- counters -------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self._block_size

    def num_evictable_blocks(self) -> int:
        """Distinct blocks that nodes with lock_count 0 reference and no other node does:
        those evicting every unlocked node would take all the tree's references off. A block
        straddling two nodes counts once."""
        return len(self._unlocked_only())

    def _unlocked_only(self) -> frozenset[int]:
        if self._evictable is None:
            unlocked: set[int] = set()
            locked: set[int] = set()
            for node_id, node in self._nodes.items():
                if node_id != ROOT:
                    (locked if node.lock_count else unlocked).update(node.blocks)
            self._evictable = frozenset(unlocked - locked)
        return self._evictable

    def num_evictable_among(self, block_ids: Sequence[int]) -> int:
        """How many distinct ids of block_ids num_evictable_blocks counts (a sequence that
        shares them takes them out of what eviction can free). Pure. Raises ValueError for a
        block id not in [0, 2**31)."""
        blocks = set(int_list(block_ids, "block_ids", check_block_id))
        return len(blocks & self._unlocked_only())

    # ---- helpers --------------------------------------------------------------------------

    def _span(self, start: int, end: int) -> range:
        """Indices of the blocks covering positions [start, end), end > start."""
        return range(start // self._block_size, (end - 1) // self._block_size + 1)

    def _path_to_root(self, node_id: int) -> list[int]:
        path = [node_id]
        while path[-1] != ROOT:
            path.append(self._nodes[path[-1]].parent)
        return path

    def _stamp(self, path: list[int]) -> None:
        """Ticks the clock and stamps the path: the end of every insert, lock and unlock."""
        self._evictable = None
        self._clock += 1
        for node_id in path:
            self._nodes[node_id].stamp = self._clock

    def _known(self, node_id: int) -> int:
        node_id = operator.index(node_id)
        if node_id not in self._nodes:
            raise KVCacheError(f"unknown node {node_id}")
        return node_id

    # ---- match and insert -----------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int | None = None) -> RadixMatch:
        """The longest prefix of token_ids[:max_tokens] (all of them if None) stored in the
        tree, at token granularity; the ids after the first max_tokens are not read.

        Pure: changes no stamp. Raises ValueError for a token id not in [0, 2**32) among
        those read, or a negative max_tokens.
        """
        if max_tokens is not None:
            max_tokens = operator.index(max_tokens)
            if max_tokens < 0:
                raise ValueError(f"max_tokens must be non-negative, got {max_tokens}")
        tokens = token_list(token_ids, max_tokens)
        node_id, pos = ROOT, 0
        block_ids: list[int] = []
        while pos < len(tokens):
            child = self._nodes[node_id].children.get(tokens[pos])
            if child is None:
                break
            node = self._nodes[child]
            k = _common_prefix(node.tokens, tokens[pos:])
            # A block straddling the boundary: the deeper node's block holds the positions of
            # both nodes for this sequence, so it wins.
            for index, block_id in zip(
                self._span(node.start, node.start + k), node.blocks, strict=False
            ):
                if index < len(block_ids):
                    block_ids[index] = block_id
                else:
                    block_ids.append(block_id)
            pos += k
            node_id = child
            if k < len(node.tokens):
                break
        return RadixMatch(pos, block_ids, node_id)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> InsertResult:
        """Stores token_ids; the token at position p lives in block_ids[p // block_size].

        Nodes already on the path keep their own blocks; a node whose edge the sequence leaves
        midway is split (the upper part becomes a new node, the original id keeps the lower
        part); the new leaf references the caller's blocks for its range. A new leaf starting
        inside a block lends its first block to the ancestors that reference another copy of
        that block (its parent, and up while each starts inside that block and holds that
        same other id), unless a lock needs their copy (one on the ancestor itself, or below a
        child that starts with that copy): they release theirs (released_block_refs). A
        reference released to one the call itself created is left out of both lists. Stamps
        the path.
        Raises ValueError for a token id not in [0, 2**32), a block id not in [0, 2**31), or
        fewer than ceil(len(token_ids) / block_size) block ids (extra ones are ignored).
        """
        tokens = token_list(token_ids)
        blocks = int_list(block_ids, "block_ids", check_block_id)
        need = -(-len(tokens) // self._block_size)
        if len(blocks) < need:
            raise ValueError(
                f"block_ids holds {len(blocks)} blocks, fewer than the {need} that "
                f"{len(tokens)} tokens need"
            )
        refs: list[int] = []
        released: list[int] = []
        num_new = 0
        path = [ROOT]
        node_id, pos = ROOT, 0
        while pos < len(tokens):
            child = self._nodes[node_id].children.get(tokens[pos])
            if child is None:
                node_id = self._add_leaf(node_id, pos, tokens[pos:], blocks, refs)
                self._lend_first_block(node_id, refs, released)
                num_new = len(tokens) - pos
                path.append(node_id)
                break
            edge = self._nodes[child].tokens
            k = _common_prefix(edge, tokens[pos:])
            pos += k
            if k == len(edge) or pos == len(tokens):
                node_id = child  # whole edge matched, or the sequence ends inside it
            else:
                node_id = self._split(child, k, refs)
            path.append(node_id)
        kept = []
        for block_id in released:
            if block_id in refs:  # created and released by this call: no change
                del refs[len(refs) - 1 - refs[::-1].index(block_id)]
            else:
                kept.append(block_id)
        self._refs.update(refs)
        for block_id in kept:
            self._drop_ref(block_id)
        self._stamp(path)
        return InsertResult(num_new, refs, node_id, kept)

    def _add_leaf(
        self, parent: int, start: int, tokens: list[int], blocks: list[int], refs: list[int]
    ) -> int:
        own = [blocks[i] for i in self._span(start, start + len(tokens))]
        refs.extend(own)
        node_id = self._next_id
        self._next_id += 1
        self._nodes[node_id] = _Node(parent, start, tokens, own, stamp=self._clock)
        self._nodes[parent].children[tokens[0]] = node_id
        return node_id

    def _lend_first_block(self, node_id: int, refs: list[int], released: list[int]) -> None:
        node = self._nodes[node_id]
        if node.start % self._block_size == 0:
            return
        first_pos = node.start // self._block_size * self._block_size
        new, old = node.blocks[0], self._nodes[node.parent].blocks[-1]
        if new == old:
            return
        ancestor = self._nodes[node.parent]
        while self._can_lend(ancestor, old):
            ancestor.blocks[-1] = new
            refs.append(new)
            released.append(old)
            if ancestor.start <= first_pos or ancestor.parent == ROOT:
                break
            ancestor = self._nodes[ancestor.parent]

    def _can_lend(self, node: _Node, old: int) -> bool:
        """Whether the node ends in block ``old`` and no lock needs it there: none on the node
        itself, none below a child whose first block is ``old``."""
        return (
            node.blocks[-1] == old
            and node.own_locks == 0
            and not any(
                self._nodes[c].lock_count and self._nodes[c].blocks[0] == old
                for c in node.children.values()
            )
        )

    def _split(self, node_id: int, k: int, refs: list[int]) -> int:
        node = self._nodes[node_id]
        mid = node.start + k
        upper_blocks = node.blocks[: len(self._span(node.start, mid))]
        lower_skip = mid // self._block_size - node.start // self._block_size
        if mid % self._block_size:
            refs.append(upper_blocks[-1])  # the straddling block gains a reference
        upper_id = self._next_id
        self._next_id += 1
        upper = _Node(
            node.parent,
            node.start,
            node.tokens[:k],
            upper_blocks,
            {node.tokens[k]: node_id},
            lock_count=node.lock_count,
            stamp=node.stamp,
        )
        self._nodes[upper_id] = upper
        self._nodes[node.parent].children[node.tokens[0]] = upper_id
        node.parent = upper_id
        node.start = mid
        node.tokens = node.tokens[k:]
        node.blocks = node.blocks[lower_skip:]
        return upper_id

    # ---- locks and eviction ---------------------------------------------------------------

    def lock(self, node_id: int) -> None:
        """+1 lock on the node, +1 lock_count on it and every ancestor; stamps the path.

        Raises KVCacheError for an unknown node.
        """
        node_id = self._known(node_id)
        path = self._path_to_root(node_id)
        for i in path:
            self._nodes[i].lock_count += 1
        self._nodes[node_id].own_locks += 1
        self._stamp(path)

    def unlock(self, node_id: int) -> None:
        """Undoes one lock(node_id) on that same node; stamps the path.

        Raises KVCacheError for an unknown node or one without locks of its own.
        """
        node_id = self._known(node_id)
        if self._nodes[node_id].own_locks == 0:
            raise KVCacheError(f"node {node_id} is not locked: cannot unlock")
        path = self._path_to_root(node_id)
        for i in path:
            self._nodes[i].lock_count -= 1
        self._nodes[node_id].own_locks -= 1
        self._stamp(path)

    def evict(self, num_blocks: int) -> list[int]:
        """Releases tree references at block granularity until num_blocks distinct blocks have
        lost their last tree reference (num_evictable_blocks() falls by exactly
        min(num_blocks, num_evictable_blocks())) or nothing unlocked is left.

        Each round trims the last block off the first unlocked leaf in eviction order: leaves
        whose edge ends inside a block first (a partly filled last block, which a
        block-granular cache would not hold at all, goes before any full block), then least
        recent stamp first, ties to the lower id. The edge is cut back to the start of that
        block (or to the node's start) and the block's reference released; a block another
        node also references (the parent's straddling block) drops a reference without
        freeing a distinct block. A node left without tokens is removed; its parent may become
        an unlocked leaf, at its own stamp. A trimmed leaf keeps its stamp, so it stays in its
        place in the order until it is gone. Returns every released reference in release
        order (the caller frees each once).

        Raises ValueError if num_blocks is negative.
        """
        num_blocks = operator.index(num_blocks)
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be non-negative, got {num_blocks}")
        num_to_free = min(num_blocks, self.num_evictable_blocks())
        released: list[int] = []
        while num_to_free > 0:
            candidates = [
                self._evict_key(i)
                for i, n in self._nodes.items()
                if i != ROOT and n.lock_count == 0 and not n.children
            ]
            if not candidates:
                break
            first = min(candidates)
            node_id = first[2]
            # Nothing else changes while it is trimmed: it stays first while its key does.
            while num_to_free > 0 and node_id in self._nodes and self._evict_key(node_id) == first:
                block_id = self._trim_last_block(node_id)
                released.append(block_id)
                # Its last reference gone, a block is freed (locks do not change here and only
                # unlocked nodes are trimmed, so it was one num_evictable_blocks counted).
                if self._drop_ref(block_id):
                    num_to_free -= 1
        if released:
            self._evictable = None
        return released

    def evictable_tails(self) -> list[tuple[int, int]]:
        """Every eviction candidate (an unlocked leaf) with the block ``evict`` would trim
        off it next (its last), in eviction order: what a policy choosing its own victims
        chooses among."""
        candidates = sorted(
            self._evict_key(i)
            for i, n in self._nodes.items()
            if i != ROOT and n.lock_count == 0 and not n.children
        )
        return [(node_id, self._nodes[node_id].blocks[-1]) for _, _, node_id in candidates]

    def evict_tail(self, node_id: int) -> int:
        """One round of ``evict`` on the candidate a caller chose: trims the last block off
        the unlocked leaf ``node_id`` and returns the released reference (the caller frees
        it once). Raises KVCacheError, changing nothing, for an unknown node or one that is
        not a candidate (the root, a locked node, a node with children)."""
        node_id = self._known(node_id)
        node = self._nodes[node_id]
        if node_id == ROOT or node.lock_count or node.children:
            raise KVCacheError(f"node {node_id} is not an unlocked leaf: cannot evict its tail")
        block_id = self._trim_last_block(node_id)
        self._drop_ref(block_id)
        self._evictable = None
        return block_id

    def _drop_ref(self, block_id: int) -> bool:
        """One reference to the block fewer; whether it was the last."""
        self._refs[block_id] -= 1
        if self._refs[block_id]:
            return False
        del self._refs[block_id]
        return True

    def _evict_key(self, node_id: int) -> tuple[bool, int, int]:
        """Eviction order of a candidate leaf: one whose edge ends inside a block first,
        then least recent stamp, then lower id."""
        node = self._nodes[node_id]
        return (node.end % self._block_size == 0, node.stamp, node_id)

    def _trim_last_block(self, node_id: int) -> int:
        """Cuts the leaf's edge back to the start of its last block and returns that block's
        reference; removes the node if no token is left."""
        node = self._nodes[node_id]
        first_token = node.tokens[0]
        block_id = node.blocks.pop()
        cut = max(node.start, (node.end - 1) // self._block_size * self._block_size)
        del node.tokens[cut - node.start :]
        if not node.tokens:
            del self._nodes[node_id]
            del self._nodes[node.parent].children[first_token]
        return block_id

    # ---- whole-state views ----------------------------------------------------------------

    def nodes(self) -> list[RadixNode]:
        """Every node, sorted by id."""
        return [
            RadixNode(
                i,
                None if i == ROOT else n.parent,
                list(n.tokens),
                list(n.blocks),
                n.lock_count,
                n.stamp,
            )
            for i, n in sorted(self._nodes.items())
        ]

    def check_integrity(self) -> None:
        """Raises KVCacheError naming the first broken invariant: parent and child links
        agree, children are keyed by their first token, every node is reachable from the root,
        every non-root node holds tokens, starts at its parent's end and holds exactly the
        blocks its positions span, lock_count = own locks + the children's lock_counts, no
        stamp is newer than the parent's or the clock, and the references counted per block
        are the nodes'."""
        check_nodes(self._nodes, self._next_id, self._clock, self._block_size)
        counted = Counter(b for i, n in self._nodes.items() if i != ROOT for b in n.blocks)
        if counted != self._refs:
            raise KVCacheError("RadixTree integrity: the references per block disagree")

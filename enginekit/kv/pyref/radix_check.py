"""``PyRadixTree.check_integrity``: every invariant of the twin radix tree re-derived from its
nodes (the twin of rust/radix/check.rs)."""

from __future__ import annotations

from collections.abc import Mapping

from enginekit.errors import KVCacheError
from enginekit.kv.pyref.radix_node import MAX_BLOCK_ID, ROOT, Node


def check_nodes(nodes: Mapping[int, Node], next_id: int, clock: int, block_size: int) -> None:
    """Raises KVCacheError naming the first broken invariant of a tree of ``nodes`` (ids handed
    out below ``next_id``, stamps from a clock at ``clock``): see
    ``PyRadixTree.check_integrity``."""

    def broken(what: str) -> KVCacheError:
        return KVCacheError(f"RadixTree integrity: {what}")

    root = nodes.get(ROOT)
    if root is None or root.tokens or root.blocks or root.start != 0:
        raise broken("missing root, or a root holding tokens or blocks")
    seen: set[int] = set()
    stack = [ROOT]
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            raise broken(f"node {node_id} is reached twice")
        seen.add(node_id)
        node = nodes[node_id]
        if node_id != ROOT:
            if not 0 < node_id < next_id:
                raise broken(f"node {node_id} has an id not yet handed out")
            if not node.tokens:
                raise broken(f"node {node_id} holds no tokens")
            num_spanned = (node.end - 1) // block_size - node.start // block_size + 1
            if len(node.blocks) != num_spanned:
                raise broken(f"node {node_id} holds {len(node.blocks)} blocks")
            if any(not 0 <= b <= MAX_BLOCK_ID for b in node.blocks):
                raise broken(f"node {node_id} holds an invalid block id")
            if node.stamp > nodes[node.parent].stamp:
                raise broken(f"node {node_id} is more recent than its parent")
        if node.stamp > clock:
            raise broken(f"node {node_id} has a stamp from the future")
        child_locks = 0
        for first, child_id in node.children.items():
            child = nodes.get(child_id)
            if child is None or child_id == ROOT or child.parent != node_id:
                raise broken(f"child {child_id} of node {node_id} is not linked back")
            if not child.tokens or child.tokens[0] != first:
                raise broken(f"child {child_id} of node {node_id} is keyed by {first}")
            if child.start != node.end:
                raise broken(f"child {child_id} does not start at its parent's end")
            child_locks += child.lock_count
            stack.append(child_id)
        if node.own_locks < 0 or node.lock_count != node.own_locks + child_locks:
            raise broken(f"node {node_id} has lock_count {node.lock_count}")
    if len(seen) != len(nodes):
        raise broken(f"{len(nodes) - len(seen)} nodes are not reachable")

"""``radix``: SGLang-style token-granular prefix caching over paged blocks, with
copy-on-write reuse of a partially matched last block."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from enginekit.config import PrefixConfig
from enginekit.errors import KVCacheError
from enginekit.interfaces import NO_MATCH, Access, AccessKind, KVContext, PrefixCache, PrefixMatch
from enginekit.interfaces.kv_events import RemovedBlocks, StoredBlocks
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit.interfaces import InsertResult, RadixNode, RadixTree


@dataclass
class RadixConfig(PrefixConfig):
    name: str = "radix"


class RadixPrefixCache(PrefixCache):
    """A radix tree per extra key (tenant salt) indexes computed token sequences; its nodes
    hold pool references to the blocks they cover, so cached blocks stay resident after
    their requests end, until the tree evicts them, block by block from the tails of
    unlocked leaves: partly filled last blocks first (a block-granular cache would not hold
    them at all), then the least recently used leaf's, so a released sequence loses its
    tail before its prefix and a request for one block costs one, as in a block LRU list
    (an eviction policy that chooses its own victims, ``Eviction.choose_victim``, picks
    each among the tails of the unlocked leaves instead, having heard the tree's
    insertions, hits and evictions).

    A prompt matches at token granularity, up to its last token. When the match ends
    inside a block, the manager copies that block into one of the request's own
    (copy-on-write), so only the unmatched tail is prefilled: a 103-token prompt sharing
    100 tokens reuses 100, where block hashing at block size 16 reuses 96. The copy holds
    the matched positions too, so once the request's tokens enter the tree the matched node
    takes the copy in place of the block copied (which leaves the pool once nothing else
    holds it): one block, not two, for those positions.

    A prompt's tokens enter the tree when scheduled, like block_hash's blocks (a request's
    outputs enter when it leaves, finished or preempted): a request admitted later in the
    same step shares whole blocks that step computes (every token's KV is
    written before any attention reads it). A partially matched block is copied before the
    step computes, though, so a match may not end inside a block whose matched part the
    step is still computing: it is cut back to the block edge and the cut tokens are
    reported as deferred (the scheduler waits a step for them rather than prefill them
    twice, as SGLang's in-batch prefix check does). A request holds a lock on its deepest
    node while it runs, so the tree never evicts its path; a request with outputs (a
    forked sample, a preempted request admitted again) takes its lock at its first
    computed chunk or filled block.
    """

    Config = RadixConfig
    token_granular = True
    supports_table_holes = False  # its tree indexes whole sequences from the first token

    def __init__(self, config: RadixConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self._new_tree = lambda: kv.backend.new_radix_tree(kv.spec.block_size)
        self._trees: dict[bytes | None, RadixTree] = {}
        self._num_inserted: dict[int, int] = {}  # seq_id -> tokens in the tree
        # block -> first slot the step being scheduled writes (its KV is not there yet)
        self._first_slot_in_flight: dict[int, int] = {}
        self._locked_node: dict[int, int] = {}  # seq_id -> node it locks
        # seq_id -> tokens of a request matched while it waits (None: matched once so far)
        self._waiting_tokens: dict[int, array[int] | None] = {}
        # Counts what can lengthen a match: tree insertions, and in-flight blocks whose
        # KV has become computed. seq_id -> (the count at its last match, tokens matched).
        self._num_gains = 0
        self._last_match: dict[int, tuple[int, int]] = {}
        # The accesses to the tree's blocks since the last take_accesses, for an eviction
        # policy that hears them; None while not recording.
        self._accesses: list[Access] | None = None
        # While KV events are logged: the block events since the last take_block_events,
        # and each block whose every position a tree holds -> its content's chain hash.
        self._block_events: list[StoredBlocks | RemovedBlocks] | None = None
        self._full_blocks: dict[int, int] = {}

    def match(self, request: Request) -> PrefixMatch:
        tree = self._trees.get(request.extra_key)
        if tree is None or request.num_tokens < 2:
            self._last_match[request.seq_id] = (self._num_gains, 0)
            return NO_MATCH
        found = tree.match_prefix(self._tokens_to_match(request), request.num_tokens - 1)
        block_ids, num_tokens = list(found.block_ids), found.num_tokens
        num_partial = num_tokens % self.kv.spec.block_size
        num_deferred = 0
        if num_partial and self._first_slot_in_flight.get(block_ids[-1], num_partial) < num_partial:
            block_ids.pop()  # its matched part is still being computed: deferred
            num_tokens -= num_partial
            num_deferred = num_partial
        self._last_match[request.seq_id] = (self._num_gains, num_tokens)
        return PrefixMatch(block_ids, num_tokens, num_deferred)

    def may_match_more(self, request: Request, match: PrefixMatch) -> bool:
        """False if the request's last match was no longer than ``match`` and the tree has
        gained nothing since (no insertion, no in-flight block computed)."""
        last = self._last_match.get(request.seq_id)
        return last is None or last[0] != self._num_gains or last[1] > match.num_tokens

    def _tokens_to_match(self, request: Request) -> list[int] | array[int]:
        """The request's tokens as ``match`` hands them to the tree: its list, or from its
        second match on (a request waiting for room is matched at every step), an
        ``array("I")`` copy that the tree reads without a Python call per token, kept
        until the request is admitted or leaves."""
        seq_id = request.seq_id
        tokens = self._waiting_tokens.get(seq_id)
        if tokens is not None and len(tokens) == request.num_tokens:
            return tokens
        if seq_id in self._waiting_tokens:
            tokens = array("I", request.token_ids)
            self._waiting_tokens[seq_id] = tokens
            return tokens
        self._waiting_tokens[seq_id] = None  # matched once
        return request.token_ids

    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        seq_id = request.seq_id
        self._waiting_tokens.pop(seq_id, None)
        self._last_match.pop(seq_id, None)
        if request.num_output_tokens and seq_id in self._locked_node:
            # Decoding (or prefilling prompt and outputs again after a preemption): its
            # outputs enter the tree when it leaves (on_released). Inserting the whole
            # sequence at every filled block would cost more than sharing a running
            # request's outputs is worth. Its first call (a forked sample's first filled
            # block, a re-admission's first chunk) does insert, so that it locks the path
            # whose blocks it holds: unlocked, that path could be evicted from the tree
            # while its blocks stay in use, losing the cache for nothing.
            return
        block_size = self.kv.spec.block_size
        start = self._num_inserted.get(seq_id, 0)
        if num_computed_tokens <= start:
            return
        block_ids = self._insert(request, num_computed_tokens)
        if not block_ids:
            return
        # The step writes the first block from its slot start % block_size on, the others
        # whole (their first slot in flight is 0, the least there is).
        in_flight = self._first_slot_in_flight
        first = start // block_size
        slot = start % block_size
        in_flight[block_ids[first]] = min(slot, in_flight.get(block_ids[first], slot))
        in_flight.update(dict.fromkeys(block_ids[first + 1 :], 0))

    def on_decodes_computed(
        self, requests: Sequence[Request], num_computed_tokens: Sequence[int]
    ) -> None:
        # Decodes have outputs: only those that lock no path yet insert (see on_computed).
        locked = self._locked_node
        for request, num_computed in zip(requests, num_computed_tokens, strict=True):
            if request.seq_id not in locked:
                self.on_computed(request, num_computed)

    def on_step_executed(self) -> None:
        if self._first_slot_in_flight:
            self._num_gains += 1  # their KV is computed: matches may end inside them now
            self._first_slot_in_flight.clear()

    def on_released(self, request: Request) -> None:
        # Decodes report only the blocks they fill: the computed tail goes in now, while
        # the request still holds its blocks (it leaves after a step has run, or before
        # its next one is scheduled, so every computed token is computed).
        self._insert(request, request.num_computed_tokens)
        seq_id = request.seq_id
        self._waiting_tokens.pop(seq_id, None)
        self._last_match.pop(seq_id, None)
        node_id = self._locked_node.pop(seq_id, None)
        if node_id is not None:
            self._trees[request.extra_key].unlock(node_id)
        self._num_inserted.pop(seq_id, None)

    def _insert(self, request: Request, num_tokens: int) -> list[int]:
        """Puts the request's first ``num_tokens`` tokens (with its blocks) in the tree,
        takes a pool reference for every tree reference created, and moves the request's
        lock to the node of its last token. Returns the blocks covering those tokens (none
        if they were in already)."""
        seq_id = request.seq_id
        if num_tokens <= self._num_inserted.get(seq_id, 0):
            return []
        tree = self._trees.get(request.extra_key)
        if tree is None:
            tree = self._trees[request.extra_key] = self._new_tree()
        num_blocks = -(-num_tokens // self.kv.spec.block_size)
        block_ids = self.kv.tables.block_ids(seq_id)[:num_blocks]
        tokens = request.token_ids
        if num_tokens < len(tokens):
            tokens = tokens[:num_tokens]
        result = tree.insert(tokens, block_ids)
        self._num_gains += 1
        if self._accesses is not None:
            is_first = seq_id not in self._num_inserted  # counted at the end of this call
            self._log_insert(block_ids, num_tokens - result.num_new_tokens, is_first, result)
        if self._block_events is not None:
            self._log_stored(request, num_tokens - result.num_new_tokens, num_tokens, block_ids)
        pool = self.kv.pool
        pool.incref_all(result.new_block_refs)
        if result.released_block_refs:
            # The new leaf's copy of a block replaced the ancestors' (after the increfs, so
            # a block in both lists is never freed on the way).
            pool.free(result.released_block_refs)
        tree.lock(result.node_id)
        previous_node = self._locked_node.get(seq_id)
        if previous_node is not None:
            tree.unlock(previous_node)
        self._locked_node[seq_id] = result.node_id
        self._num_inserted[seq_id] = num_tokens
        return block_ids

    def _log_insert(
        self, block_ids: list[int], num_stored: int, is_first: bool, result: InsertResult
    ) -> None:
        """Logs an insertion: at a request's first, the whole blocks of the prefix the tree
        held already as hits (its match: the tree's own blocks, shared); then every block
        the tree took a new reference on as cached (its id is its content)."""
        log = self._accesses
        assert log is not None
        if is_first:
            for block_id in block_ids[: num_stored // self.kv.spec.block_size]:
                log.append((AccessKind.HIT, block_id, block_id, None))
        for block_id in dict.fromkeys(result.new_block_refs):
            log.append((AccessKind.INSERT, block_id, block_id, None))

    def _log_stored(
        self, request: Request, num_stored: int, num_tokens: int, block_ids: list[int]
    ) -> None:
        """Logs the full blocks an insertion of the request's first ``num_tokens`` tokens
        completed in the tree, which held ``num_stored`` of them before: blocks
        ``num_stored // block_size`` up to ``num_tokens // block_size``. Their positions
        past ``num_stored`` are a new leaf's, which references the request's own blocks
        (``block_ids``), so those blocks hold the contents."""
        block_size = self.kv.spec.block_size
        first, end = num_stored // block_size, num_tokens // block_size
        if first >= end:
            return
        assert self._block_events is not None
        tokens = request.token_ids[: end * block_size]
        names = self.kv.backend.hash_blocks(tokens, block_size, request.extra_key)
        self._full_blocks.update(zip(block_ids[first:end], names[first:end], strict=True))
        parent = names[first - 1] if first else None
        stored = StoredBlocks(names[first:end], parent, tokens[first * block_size :])
        self._block_events.append(stored)

    def _log_removed(self, released: list[int]) -> None:
        """Logs the full blocks whose contents an eviction took out of the tree: a trimmed
        block the tree held whole. Only a leaf is trimmed, and a leaf holds a full block's
        last position with that block, so the block's first released reference is the one
        that takes its content; a reference released later (an ancestor's, which holds the
        block's first positions only) takes none."""
        assert self._block_events is not None
        full = self._full_blocks
        names = [full.pop(b) for b in released if b in full]
        if names:
            self._block_events.append(RemovedBlocks(names))

    def record_block_events(self, on: bool) -> None:
        """See ``PrefixCache.record_block_events``; the trees must hold nothing when it
        starts (KVCacheError otherwise)."""
        if on and self._block_events is None and self.held_block_ids():
            raise KVCacheError("KV events must start on an empty radix tree")
        if not on:
            self._block_events = None
            self._full_blocks = {}
        elif self._block_events is None:
            self._block_events = []

    def take_block_events(self) -> list[StoredBlocks | RemovedBlocks]:
        if not self._block_events:
            return []
        taken, self._block_events = self._block_events, []
        return taken

    def full_blocks(self) -> dict[int, int]:
        """Every block whose positions the trees all hold (a full block's content), read
        off the trees' nodes: block id -> the chain hash of its content. For checks; slow."""
        block_size = self.kv.spec.block_size
        full: dict[int, int] = {}
        for extra_key, tree in self._trees.items():
            nodes = {node.node_id: node for node in tree.nodes()}
            for node in nodes.values():
                if node.parent_id is None:
                    continue
                edges = []  # the node's path from the root, edge by edge, last first
                ancestor: RadixNode | None = node
                while ancestor is not None:
                    edges.append(ancestor.token_ids)
                    parent_id = ancestor.parent_id
                    ancestor = nodes[parent_id] if parent_id is not None else None
                path = [token for edge in reversed(edges) for token in edge]
                start = len(path) - len(node.token_ids)
                names = self.kv.backend.hash_blocks(path, block_size, extra_key)
                # The blocks whose last position lies on this node's edge.
                for index in range(start // block_size, len(path) // block_size):
                    full[node.block_ids[index - start // block_size]] = names[index]
        return full

    def record_accesses(self, on: bool) -> None:
        self._accesses = [] if on else None

    def take_accesses(self) -> list[Access]:
        if not self._accesses:
            return []
        taken, self._accesses = self._accesses, []
        return taken

    def num_evictable_blocks(self) -> int:
        # Distinct blocks, not tree references: a block two nodes share (a chunk inserted
        # after one that ended inside it, or a split inside it) is one block of the pool.
        # Each block lies in one tree (a request's blocks are its own, matched in its own
        # tree or forked from a parent with the same key), so the trees' counts add up.
        trees = self._trees
        if len(trees) == 1:  # the common case, no salts: asked several times per step
            (tree,) = trees.values()
            return tree.num_evictable_blocks()
        return sum([tree.num_evictable_blocks() for tree in trees.values()])

    def num_evictable_among(self, block_ids: Sequence[int]) -> int:
        # Each block lies in one tree (see num_evictable_blocks).
        ids = list(block_ids)
        return sum([tree.num_evictable_among(ids) for tree in self._trees.values()])

    def evict(
        self, num_blocks: int, choose: Callable[[Sequence[int]], int] | None = None
    ) -> list[int]:
        if choose is not None:
            released = self._evict_chosen(num_blocks, choose)
        else:
            released = []
            num_left = num_blocks
            for tree in self._trees.values():
                if num_left <= 0:
                    break
                # A tree's evict(n) frees exactly min(n, its evictable blocks) distinct
                # blocks (it may release more references: a block two nodes share is one).
                num_freed = min(num_left, tree.num_evictable_blocks())
                released += tree.evict(num_left)
                num_left -= num_freed
        if self._accesses is not None:
            self._accesses += [(AccessKind.EVICT, b, b, None) for b in released]
        if self._block_events is not None:
            self._log_removed(released)
        return released

    def _evict_chosen(self, num_blocks: int, choose: Callable[[Sequence[int]], int]) -> list[int]:
        """``evict``, each block the one ``choose`` picks among every tree's candidates
        (the trees' orders one after another). One listing per block: a trimmed leaf's
        next block joins the candidates."""
        released: list[int] = []
        trees = list(self._trees.values())
        target = max(0, self.num_evictable_blocks() - num_blocks)
        while self.num_evictable_blocks() > target:
            candidates = [
                (tree, node, block) for tree in trees for node, block in tree.evictable_tails()
            ]
            if not candidates:
                break
            tree, node, _ = candidates[choose([block for _, _, block in candidates])]
            released.append(tree.evict_tail(node))
        return released

    def held_block_ids(self) -> list[int]:
        return [b for tree in self._trees.values() for node in tree.nodes() for b in node.block_ids]

    def check_integrity(self) -> None:
        """The trees' own invariants; while KV events are logged, also that the blocks
        logged as stored and not removed are exactly the trees' full blocks."""
        for tree in self._trees.values():
            tree.check_integrity()
        if self._block_events is not None and self._full_blocks != self.full_blocks():
            raise KVCacheError(
                "the radix cache's KV events disagree with its trees: logged "
                f"{sorted(self._full_blocks.items())}, held {sorted(self.full_blocks().items())}"
            )

"""``block_hash``: vLLM-style prefix caching by chained hashes of full blocks."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.config import PrefixConfig
from enginekit.interfaces import KVContext, PrefixCache, PrefixMatch
from enginekit.request import Request


@dataclass
class BlockHashConfig(PrefixConfig):
    name: str = "block_hash"


class BlockHashPrefixCache(PrefixCache):
    """Full block i of a sequence is named by hash(name of block i-1, its tokens, the
    request's extra key); the pool maps names to blocks. A prompt hits its longest run of
    leading full blocks whose names are in the pool, never its last token (which must be
    computed to yield logits). Partial blocks are never shared.

    Per sequence it keeps the names computed so far (prompt blocks at the first match,
    output blocks as they fill) and how many of its blocks it has published.
    """

    Config = BlockHashConfig

    def __init__(self, config: BlockHashConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self._root_hash = kv.backend.root_hash
        self._hash_block = kv.backend.hash_block
        self._hash_blocks = kv.backend.hash_blocks
        # seq_id -> names of its first full blocks; an array("Q"), which the pool's
        # lookup_prefix reads in one pass
        self._block_hashes: dict[int, array[int]] = {}
        self._num_published: dict[int, int] = {}

    def _hashes(self, request: Request, num_blocks: int) -> array[int]:
        """The names of the request's first ``num_blocks`` full blocks (memoized)."""
        block_size = self.kv.spec.block_size
        hashes = self._block_hashes.get(request.seq_id)
        if hashes is None:
            tokens = request.token_ids
            if len(tokens) >= (num_blocks + 1) * block_size:  # hash_blocks hashes full blocks
                tokens = tokens[: num_blocks * block_size]
            hashes = array("Q", self._hash_blocks(tokens, block_size, request.extra_key))
            self._block_hashes[request.seq_id] = hashes
        while len(hashes) < num_blocks:
            start = len(hashes) * block_size
            parent = hashes[-1] if hashes else self._root_hash
            block_tokens = request.token_ids[start : start + block_size]
            hashes.append(self._hash_block(parent, block_tokens, request.extra_key))
        return hashes

    def match(self, request: Request) -> PrefixMatch:
        max_blocks = (request.num_tokens - 1) // self.kv.spec.block_size
        if max_blocks <= 0:
            return PrefixMatch([], 0)
        hashes = self._hashes(request, max_blocks)
        if len(hashes) > max_blocks:
            hashes = hashes[:max_blocks]
        block_ids = self.kv.pool.lookup_prefix(hashes)
        return PrefixMatch(block_ids, len(block_ids) * self.kv.spec.block_size)

    def may_match_more(self, request: Request, match: PrefixMatch) -> bool:
        """A match runs until the first name not in the pool: it can be longer than
        ``match`` only if the name of the block right after it is there now."""
        num_matched = len(match.block_ids)
        if num_matched >= (request.num_tokens - 1) // self.kv.spec.block_size:
            return False  # every full block but the one holding the last token
        hashes = self._block_hashes.get(request.seq_id)
        if hashes is None or len(hashes) <= num_matched:
            return True
        return bool(self.kv.pool.lookup_prefix(hashes[num_matched : num_matched + 1]))

    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        """Publishes the request's full blocks not published yet. Holes (blocks a sliding
        window released) are skipped: a released block was published before its release
        or is a matched one, and a hole is never published."""
        num_full = num_computed_tokens // self.kv.spec.block_size
        num_published = self._num_published.get(request.seq_id, 0)
        if num_full <= num_published:
            return
        hashes = self._hashes(request, num_full)
        tables, pool, seq_id = self.kv.tables, self.kv.pool, request.seq_id
        first = num_published  # the first block of the run of blocks being collected
        if tables.num_holes(seq_id):
            for index in range(num_published, num_full):
                if tables.block_id_at(seq_id, index) < 0:
                    if first < index:
                        tables.cache_blocks(pool, seq_id, first, hashes[first:index].tolist())
                    first = index + 1
        if first < num_full:
            tables.cache_blocks(pool, seq_id, first, hashes[first:num_full].tolist())
        self._num_published[seq_id] = num_full

    def on_decodes_computed(
        self, requests: Sequence[Request], num_computed_tokens: Sequence[int]
    ) -> None:
        """Each request's new full block is named from its parent's memoized name, and all
        are published in one call. That block is the one the request writes into, so never
        a hole; a request whose earlier blocks are not all named and published takes
        ``on_computed``."""
        block_size = self.kv.spec.block_size
        block_hashes, num_published = self._block_hashes, self._num_published
        hash_block, root_hash = self._hash_block, self._root_hash
        seq_ids: list[int] = []
        indices: list[int] = []
        new_hashes: list[int] = []
        for request, num_computed in zip(requests, num_computed_tokens, strict=True):
            seq_id = request.seq_id
            index = num_computed // block_size - 1  # the block the step fills
            hashes = block_hashes.get(seq_id)
            if hashes is None or len(hashes) != index or num_published.get(seq_id, 0) != index:
                self.on_computed(request, num_computed)
                continue
            start = index * block_size
            parent = hashes[-1] if hashes else root_hash
            block_hash = hash_block(
                parent, request.token_ids[start : start + block_size], request.extra_key
            )
            hashes.append(block_hash)
            num_published[seq_id] = index + 1
            seq_ids.append(seq_id)
            indices.append(index)
            new_hashes.append(block_hash)
        if seq_ids:
            self.kv.tables.cache_blocks_at(self.kv.pool, seq_ids, indices, new_hashes)

    def on_released(self, request: Request) -> None:
        self._block_hashes.pop(request.seq_id, None)
        self._num_published.pop(request.seq_id, None)

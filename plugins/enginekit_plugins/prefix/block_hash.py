"""``block_hash``: vLLM-style prefix caching by chained hashes of full blocks."""

from __future__ import annotations

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

    The names live in the backend's hash chains, one per sequence: a prompt is named at its
    first match (a waiting request may be matched again at later admission attempts), and its
    blocks are published as they are computed; a step's decodes that fill a block are
    named and published in one call.
    """

    Config = BlockHashConfig

    def __init__(self, config: BlockHashConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self._block_size = kv.spec.block_size
        self._chains = kv.backend.new_hash_chains(self._block_size)

    def match(self, request: Request) -> PrefixMatch:
        block_size = self._block_size
        max_blocks = (request.num_tokens - 1) // block_size
        if max_blocks <= 0:
            return PrefixMatch([], 0)
        chains, seq_id = self._chains, request.seq_id
        chains.extend(seq_id, request.token_ids, max_blocks, request.extra_key)
        block_ids = chains.lookup(self.kv.pool, seq_id, max_blocks)
        return PrefixMatch(block_ids, len(block_ids) * block_size)

    def may_match_more(self, request: Request, match: PrefixMatch) -> bool:
        """A match runs until the first name not in the pool: it can be longer than
        ``match`` only if the name of the block right after it is there now."""
        num_matched = len(match.block_ids)
        if num_matched >= (request.num_tokens - 1) // self._block_size:
            return False  # every full block but the one holding the last token
        if self._chains.num_names(request.seq_id) <= num_matched:
            return True
        return self._chains.is_cached(self.kv.pool, request.seq_id, num_matched)

    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        """Names and publishes the request's full blocks not published yet. Holes (blocks a
        sliding window released) are skipped: a released block was published before its
        release or is a matched one, and a hole is never published."""
        num_full = num_computed_tokens // self._block_size
        chains, seq_id = self._chains, request.seq_id
        if num_full <= chains.num_published(seq_id):
            return
        chains.extend(seq_id, request.token_ids, num_full, request.extra_key)
        chains.publish(self.kv.tables, self.kv.pool, seq_id, num_full)

    def on_decodes_computed(
        self, requests: Sequence[Request], num_computed_tokens: Sequence[int]
    ) -> None:
        """The requests whose names and publications are up to the block the step fills
        have it named and published in one call; the others take ``on_computed``."""
        # One loop, not three comprehensions: a step fills a block of few decodes.
        seq_ids: list[int] = []
        token_lists: list[list[int]] = []
        extra_keys: list[bytes | None] = []
        for request in requests:
            seq_ids.append(request.seq_id)
            token_lists.append(request.token_ids)
            extra_keys.append(request.extra_key)
        kv = self.kv
        skipped = self._chains.publish_filled(
            kv.tables, kv.pool, seq_ids, token_lists, num_computed_tokens, extra_keys
        )
        for i in skipped:
            self.on_computed(requests[i], num_computed_tokens[i])

    def on_released(self, request: Request) -> None:
        self._chains.remove(request.seq_id)

"""PrefixCache: finds cached KV for a prompt's prefix and publishes newly computed blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

from enginekit.config import PrefixConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.context import KVContext
from enginekit.interfaces.kv_events import RemovedBlocks, StoredBlocks
from enginekit.interfaces.structures import Access
from enginekit.request import Request


class PrefixMatch(NamedTuple):
    """The leading blocks of a request whose KV is already cached.

    ``num_tokens`` tokens of the request are covered by ``block_ids`` (in logical order);
    if ``num_tokens`` is not a multiple of the block size, the last block is matched only in
    part (the manager copies it: copy-on-write). It is always less than the request's token
    count: the last token is computed again to produce logits. ``num_deferred_tokens`` more
    would match once the step being scheduled has run (their KV is computed by it); the
    scheduler may wait a step for them.
    """

    block_ids: list[int]
    num_tokens: int
    num_deferred_tokens: int = 0


NO_MATCH = PrefixMatch([], 0)


class PrefixCache(Plugin, ABC):
    """A prefix cache over the pool's blocks.

    Cached blocks are referenced while a sequence uses them and become evictable when none
    does; eviction (a separate plugin) reclaims them and tells this plugin through
    ``on_evicted``.
    """

    Config: ClassVar[type[PrefixConfig]] = PrefixConfig
    # Declared capabilities, read by other plugins' ``check_compatible``:
    # matches end anywhere, not only on block edges
    token_granular: ClassVar[bool] = False
    # hands out cached blocks for admission to share (False: a cache that never hits)
    shares_blocks: ClassVar[bool] = True
    # works when running sequences give blocks back from the middle of their tables
    # (a windowed eviction policy's holes)
    supports_table_holes: ClassVar[bool] = True

    def __init__(self, config: PrefixConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @abstractmethod
    def match(self, request: Request) -> PrefixMatch:
        """The longest cached prefix of ``request.token_ids``. Pure: takes no references
        (the allocator's ``admit`` does) and does not reorder the LRU list."""

    def may_match_more(self, request: Request, match: PrefixMatch) -> bool:
        """False only if no ``match(request)`` now can be longer than ``match``, an earlier
        result of ``match(request)`` (the cache gained nothing along its path since: what
        it lost since only shortens a match). The manager then keeps refusing a request
        that did not fit, without matching it again. The default, True, always has it
        matched again. Pure."""
        return True

    @abstractmethod
    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` tokens of ``request`` have been scheduled into
        its blocks (the step computing them writes every token's KV before any attention
        reads, so requests scheduled later in the same step may share them). Publishes the
        blocks this completes. Mutates the cache's index."""

    def on_decodes_computed(
        self, requests: Sequence[Request], num_computed_tokens: Sequence[int]
    ) -> None:
        """``on_computed`` for the decoding requests whose last block the step being
        scheduled fills: ``requests[i]``'s first ``num_computed_tokens[i]`` tokens (a
        multiple of the block size) are scheduled, one more than at the call before. The
        default calls ``on_computed`` for each in order; a cache may do them in one pass.
        Mutates the cache's index."""
        for request, num_computed in zip(requests, num_computed_tokens, strict=True):
            self.on_computed(request, num_computed)

    def on_step_executed(self) -> None:  # noqa: B027 - optional hook
        """The step last scheduled has run: every token scheduled so far is computed.
        Called before that step's finished requests are released."""

    def on_released(self, request: Request) -> None:  # noqa: B027 - optional hook
        """The request no longer holds blocks (finished or preempted): drop per-request
        state. Must not touch the pool."""

    def on_evicted(self, block_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """These blocks were evicted from the pool (their hashes already dropped there)."""

    # A prefix cache that holds pool references of its own (radix) reclaims through these;
    # one that publishes blocks in the pool's hash map (block_hash) leaves them alone.

    def held_block_ids(self) -> list[int]:
        """One entry per pool reference the cache itself holds (none for a cache that
        publishes through the pool's hash map). For integrity checks; may be slow."""
        return []

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises KVCacheError if the cache's own index is inconsistent."""

    def num_evictable_blocks(self) -> int:
        """Pool blocks that ``evict`` could free (an upper bound). Pure."""
        return 0

    def num_evictable_among(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` (distinct: a match's) ``num_evictable_blocks`` counts:
        a request that shares them takes them out of what ``evict`` can free. Pure."""
        return 0

    def evict(
        self, num_blocks: int, choose: Callable[[Sequence[int]], int] | None = None
    ) -> list[int]:
        """Drops cache entries, least recently used first, until the references it gives
        up cover ``num_blocks`` blocks or nothing is left; returns those references (the
        caller decrefs each once). With ``choose`` (an eviction policy's
        ``choose_victim``), each block dropped is the one ``choose`` picks among the
        blocks the cache could drop next, listed in its own order. Mutates the cache's
        index."""
        return []

    def record_accesses(self, on: bool) -> None:  # noqa: B027 - optional hook
        """Starts (``on``) or stops logging the accesses to the blocks the cache holds
        itself (``take_accesses``): an eviction policy hears them. Default: nothing to
        log (the pool logs the blocks cached in its hash map)."""

    def take_accesses(self) -> list[Access]:
        """The accesses to the blocks the cache holds itself since the last call, oldest
        first, as ``BlockPool.take_accesses`` gives the pool's: insertions, hits and
        evictions (a cache that chooses among its own candidates reports no releases).
        Default: none."""
        return []

    def record_block_events(self, on: bool) -> None:  # noqa: B027 - optional hook
        """Starts (``on``, on an empty cache) or stops logging which full blocks' contents
        the blocks the cache holds itself gain and lose (``take_block_events``), for KV
        events. Default: nothing to log (the manager reads the blocks cached in the pool's
        hash map from the pool's accesses)."""

    def take_block_events(self) -> list[StoredBlocks | RemovedBlocks]:
        """The events logged since the last call, oldest first: a block's content is
        stored when its last position enters the cache and removed when it leaves, each
        chain hash (``enginekit.interfaces.kv_events``) once until it is removed. Default:
        none."""
        return []

"""PrefixCache: finds cached KV for a prompt's prefix and publishes newly computed blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from enginekit.config import PrefixConfig
from enginekit.kv.context import KVContext
from enginekit.request import Request


class PrefixMatch(NamedTuple):
    """The leading blocks of a request whose KV is already cached.

    ``num_tokens`` tokens of the request are covered by ``block_ids`` (in logical order).
    It is always less than the request's token count: the last token is computed again to
    produce logits.
    """

    block_ids: list[int]
    num_tokens: int


NO_MATCH = PrefixMatch([], 0)


class PrefixCache(ABC):
    """A prefix cache over the pool's blocks.

    Cached blocks are referenced while a sequence uses them and become evictable when none
    does; eviction (a separate plugin) reclaims them and tells this plugin through
    ``on_evicted``.
    """

    Config: ClassVar[type[PrefixConfig]] = PrefixConfig

    def __init__(self, config: PrefixConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @abstractmethod
    def match(self, request: Request) -> PrefixMatch:
        """The longest cached prefix of ``request.token_ids``. Pure: takes no references
        (the allocator's ``admit`` does) and does not reorder the LRU list."""

    @abstractmethod
    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` tokens of ``request`` have been scheduled into
        its blocks (the step computing them writes every token's KV before any attention
        reads, so requests scheduled later in the same step may share them). Publishes the
        blocks this completes. Mutates the cache's index."""

    def on_released(self, request: Request) -> None:  # noqa: B027 - optional hook
        """The request no longer holds blocks (finished or preempted): drop per-request
        state. Must not touch the pool."""

    def on_evicted(self, block_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """These blocks were evicted from the pool (their hashes already dropped there)."""

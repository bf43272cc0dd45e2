"""Preemption: which running sequence gives up its blocks when the cache runs dry, and how."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar

from enginekit.config import PreemptionConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.cache_view import CacheView
from enginekit.request import Request
from enginekit.spec.restore_cost import RestoreCost


class PreemptionMode(enum.Enum):
    """How a victim gives up its blocks."""

    RECOMPUTE = "recompute"  # its blocks are released; it prefills everything again
    SWAP = "swap"  # its blocks are copied to host memory and back when it resumes


class Preemption(Plugin):
    """Decides which running request is preempted and how; the scheduler and the cache
    manager carry the decision out. A victim returns to the front of the waiting queue:
    swapped out (its KV is brought back as it was, into fresh blocks) or, if recomputed or
    if the host swap space has no room for it, admitted again like a new request.

    A plugin only reads requests and the cache (``CacheView``); it never changes them.
    """

    Config: ClassVar[type[PreemptionConfig]] = PreemptionConfig

    def __init__(self, config: PreemptionConfig, costs: RestoreCost, cache: CacheView) -> None:
        self.config = config
        self.costs = costs
        self.cache = cache

    @classmethod
    def swap_space_gib(cls, config: PreemptionConfig) -> float:
        """Host memory, in GiB, this policy swaps into (the cache manager's swap space and
        the torch executor's host tensors are both sized from it). Default: 0, no
        swapping. Raises ConfigError for a size it refuses. Pure."""
        return 0.0

    def choose_victim(self, running: Sequence[Request]) -> Request:
        """The request to preempt, from ``running`` in priority order (first = highest).
        Default: the lowest priority, i.e. the most recently admitted. Pure."""
        return running[-1]

    def mode(self, request: Request) -> PreemptionMode:
        """How to preempt ``request`` (chosen by ``choose_victim``). SWAP falls back to
        RECOMPUTE when the swap space cannot hold the request's blocks. Default:
        RECOMPUTE. Pure."""
        return PreemptionMode.RECOMPUTE

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises KVCacheError if the plugin's own structures are inconsistent."""

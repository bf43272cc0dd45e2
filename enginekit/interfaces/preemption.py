"""Preemption: which running sequence gives up its blocks when the cache runs dry, and how."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from enginekit.config import PreemptionConfig
from enginekit.interfaces.base import Plugin
from enginekit.request import Request
from enginekit.spec.restore_cost import RestoreCost

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


class PreemptionResult(NamedTuple):
    kind: str  # "recompute", "swap", or "recompute_fallback" (swap wanted, no host room)
    num_blocks_freed: int
    num_tokens_to_recompute: int
    num_blocks_swapped: int = 0


class Preemption(Plugin, ABC):
    """Takes blocks from a running request and, for swapped requests, gives them back.

    A preempted request returns to the front of the waiting queue. If ``is_swapped`` says
    so, the scheduler restores it with ``restore`` (its KV comes back as it was);
    otherwise it is admitted like a new request and prefills its tokens again.
    """

    Config: ClassVar[type[PreemptionConfig]] = PreemptionConfig

    def __init__(self, config: PreemptionConfig, costs: RestoreCost, kv: KVCacheManager) -> None:
        self.config = config
        self.costs = costs
        self.kv = kv

    def choose_victim(self, running: Sequence[Request]) -> Request:
        """The request to preempt, from ``running`` in priority order (first = highest).
        Default: the lowest priority, i.e. the most recently admitted. Pure."""
        return running[-1]

    @abstractmethod
    def preempt(self, request: Request) -> PreemptionResult:
        """Takes the request's blocks away (through ``self.kv``) and rewinds its state so
        that it can be restored later. Mutates the request and the cache; the scheduler
        requeues it."""

    def is_swapped(self, request: Request) -> bool:
        """True if the request's KV waits in host memory for ``restore``. Pure."""
        return False

    def restore(self, request: Request) -> int:
        """Brings a swapped request's KV back into fresh device blocks (the manager makes
        room first); returns the number of blocks. Mutates cache and plugin state."""
        raise NotImplementedError(f"{type(self).__name__} swaps nothing out")

    def on_step_end(self) -> None:  # noqa: B027 - optional hook
        """Called once after each step's operations have been handed to the executor."""

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises KVCacheError if the plugin's own structures are inconsistent."""

"""Preemption: which running sequence gives up its blocks when the cache runs dry, and how."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from enginekit.config import PreemptionConfig
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


class PreemptionResult(NamedTuple):
    kind: str  # "recompute" or "swap"
    num_blocks_freed: int
    num_tokens_to_recompute: int


class Preemption(ABC):
    Config: ClassVar[type[PreemptionConfig]] = PreemptionConfig

    def __init__(self, config: PreemptionConfig) -> None:
        self.config = config

    def choose_victim(self, running: Sequence[Request]) -> Request:
        """The request to preempt, from ``running`` in priority order (first = highest).
        Default: the lowest priority, i.e. the most recently admitted. Pure."""
        return running[-1]

    @abstractmethod
    def preempt(self, request: Request, kv: KVCacheManager) -> PreemptionResult:
        """Takes the request's blocks away (through ``kv``) and rewinds its state so that it
        can be restored later. Mutates the request and the cache; the scheduler requeues it."""

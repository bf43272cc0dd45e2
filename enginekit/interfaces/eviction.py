"""Eviction: which cached, unreferenced blocks to reclaim when the free list is short."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from enginekit.config import EvictionConfig
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.context import KVContext
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


class Eviction(Plugin, ABC):
    Config: ClassVar[type[EvictionConfig]] = EvictionConfig

    def __init__(self, config: EvictionConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @classmethod
    def attention_window(cls, config: EvictionConfig, model_window: int | None) -> int | None:
        """The window attention must be limited to for this policy to be exact, given the
        model's own (None: unlimited). Default: the model's. Pure."""
        return model_window

    def release_out_of_window(self, running: Sequence[Request], kv: KVCacheManager) -> int:
        """Called after every step: gives back (``kv.release_range``, leaving holes) blocks
        of running sequences that no future query can attend to; returns how many.
        Default: none."""
        return 0

    @abstractmethod
    def evict(self, num_blocks: int) -> list[int]:
        """Turns ``num_blocks`` evictable blocks into free ones and returns their ids.

        The caller ensures ``num_blocks <= pool.num_evictable_blocks``. Mutates the pool
        (drops the blocks' hashes); the manager then tells the prefix cache.
        """

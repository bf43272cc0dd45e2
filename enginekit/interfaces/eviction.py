"""Eviction: which cached, unreferenced blocks to reclaim when the free list is short."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from enginekit.config import EvictionConfig
from enginekit.interfaces.base import Plugin
from enginekit.kv.context import KVContext


class Eviction(Plugin, ABC):
    Config: ClassVar[type[EvictionConfig]] = EvictionConfig

    def __init__(self, config: EvictionConfig, kv: KVContext) -> None:
        self.config = config
        self.kv = kv

    @abstractmethod
    def evict(self, num_blocks: int) -> list[int]:
        """Turns ``num_blocks`` evictable blocks into free ones and returns their ids.

        The caller ensures ``num_blocks <= pool.num_evictable_blocks``. Mutates the pool
        (drops the blocks' hashes); the manager then tells the prefix cache.
        """

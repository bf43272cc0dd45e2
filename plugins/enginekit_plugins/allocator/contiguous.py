"""``contiguous``: the baseline paging replaced: a max-length reservation per request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from enginekit.config import AllocatorConfig
from enginekit.errors import ConfigError, KVCacheError
from enginekit.interfaces import (
    Allocator,
    IntBatch,
    IntList,
    KVContext,
    Plugin,
    PrefixCache,
    plugin_name,
)
from enginekit.request import Request


@dataclass
class ContiguousConfig(AllocatorConfig):
    name: str = "contiguous"


class ContiguousAllocator(Allocator):
    """At admission a request reserves ceil(max_model_len / block_size) consecutive blocks
    (first fit over the pool) and holds them until it ends, as engines before paging
    reserved a max-length slab per request. Block tables still describe the slab, so the
    same kernels read it. Growing never allocates.

    Its waste is what paging removes: internal fragmentation (reserved slots no token fills;
    ``num_unused_slots``) and external fragmentation (free blocks no reservation can use,
    because no run of free blocks is long enough; ``num_unusable_free_blocks``). A request
    can be refused room for want of a long enough run even when enough blocks are free.

    With a prefix cache: refused at config time. A reservation is private and contiguous,
    so cached blocks could only be copied into it, saving compute but none of the memory
    the comparison is about; run it with ``+prefix=none``.
    """

    Config = ContiguousConfig

    def __init__(self, config: ContiguousConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        self.num_blocks_per_reservation = kv.spec.num_blocks_for(kv.max_model_len)
        self._num_reserved_blocks = 0

    @classmethod
    def check_compatible(cls, selected: Mapping[str, type[Plugin]]) -> None:
        prefix = selected.get("prefix")
        if prefix is not None and issubclass(prefix, PrefixCache) and prefix.shares_blocks:
            raise ConfigError(
                f"+allocator=contiguous cannot be combined with +prefix={plugin_name(prefix)}: "
                "a max-length reservation is private and contiguous, so cached blocks cannot "
                "be shared into it; use +prefix=none"
            )

    def num_blocks_for_longest(self, num_tokens: int) -> int:
        return self.num_blocks_per_reservation

    def num_blocks_to_admit(self, request: Request, num_cached_blocks: int) -> int:
        return self.num_blocks_per_reservation

    def admit(self, request: Request, cached_block_ids: IntList) -> None:
        if cached_block_ids:
            raise KVCacheError("the contiguous allocator takes no cached blocks")
        block_ids = self.kv.pool.allocate_run(self.num_blocks_per_reservation)
        self.kv.tables.add_sequence(request.seq_id, block_ids)
        self._num_reserved_blocks += len(block_ids)

    def num_blocks_to_grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> int:
        return 0

    def grow(self, seq_ids: IntBatch, num_tokens: IntBatch) -> None:
        slots = self.num_blocks_per_reservation * self.kv.spec.block_size
        if len(num_tokens) and max(num_tokens) > slots:
            raise KVCacheError(f"a sequence outgrew its reservation of {slots} tokens")

    def release(self, seq_id: int) -> None:
        block_ids = self.kv.tables.remove_sequence(seq_id)
        self._num_reserved_blocks -= len(block_ids)
        self.kv.pool.free(block_ids)

    def num_reserved_blocks(self) -> int:
        return self._num_reserved_blocks

    def num_unusable_free_blocks(self) -> int:
        """Free blocks in runs too short for a reservation (external fragmentation)."""
        free = sorted(self.kv.pool.free_block_ids())
        unusable = 0
        run = 0
        for i, block_id in enumerate(free):
            run = run + 1 if i and block_id == free[i - 1] + 1 else 1
            if i + 1 == len(free) or free[i + 1] != block_id + 1:
                unusable += run % self.num_blocks_per_reservation
        return unusable

"""TritonOps: the PagedOps of the Triton kernels (imports Triton)."""

from __future__ import annotations

import torch

from enginekit.kernels import triton_attention, triton_cache
from enginekit.kernels.layout import KVPool
from enginekit.kernels.ops import PagedOps


class TritonOps(PagedOps):
    name = "triton"

    def write_kv(
        self,
        pool: KVPool,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        triton_cache.write_kv(pool, layer, key, value, slots)

    def decode_attention(
        self,
        query: torch.Tensor,
        pool: KVPool,
        layer: int,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        window: int | None,
        sinks: int = 0,
    ) -> torch.Tensor:
        return triton_attention.decode_attention(
            query, pool, layer, block_tables, context_lens, scale, window, sinks
        )

    def prefill_attention(
        self,
        query: torch.Tensor,
        pool: KVPool,
        layer: int,
        block_tables: torch.Tensor,
        query_starts: torch.Tensor,
        context_starts: torch.Tensor,
        max_query_len: int,
        scale: float,
        window: int | None,
        sinks: int = 0,
    ) -> torch.Tensor:
        return triton_attention.prefill_attention(
            query, pool, layer, block_tables, query_starts, context_starts, max_query_len,
            scale, window, sinks,
        )  # fmt: skip

    def copy_blocks(
        self, pool: KVPool, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
    ) -> None:
        triton_cache.copy_blocks(pool, src_block_ids, dst_block_ids)

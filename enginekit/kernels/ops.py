"""PagedOps: the paged-KV operations the forward calls, with two implementations.

``ReferenceOps`` runs the pure-torch references (any device; what CPU uses).
``TritonOps`` runs the Triton kernels (CUDA, or anywhere under ``TRITON_INTERPRET=1``).
Both take the same arguments; tensors named ``*_starts``/``*_lens``/``block_tables``
live on the pool's device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from enginekit.kernels import reference


class PagedOps(ABC):
    name: str = ""

    @abstractmethod
    def write_kv(
        self,
        pool: torch.Tensor,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Stores K/V [N, kvh, d] at ``slots`` (int64 [N], negative = skip). Mutates pool."""

    @abstractmethod
    def decode_attention(
        self,
        query: torch.Tensor,
        pool: torch.Tensor,
        layer: int,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """See ``reference.decode_attention``. Pure."""

    @abstractmethod
    def prefill_attention(
        self,
        query: torch.Tensor,
        pool: torch.Tensor,
        layer: int,
        block_tables: torch.Tensor,
        query_starts: torch.Tensor,
        context_starts: torch.Tensor,
        max_query_len: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """See ``reference.prefill_attention``; ``query_starts`` int32 [S + 1] and
        ``context_starts`` int32 [S]; ``max_query_len`` bounds every chunk. Pure."""

    @abstractmethod
    def copy_blocks(
        self, pool: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
    ) -> None:
        """``pool[dst[i]] = pool[src[i]]``. Mutates pool."""


class ReferenceOps(PagedOps):
    name = "reference"

    def write_kv(
        self,
        pool: torch.Tensor,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        reference.write_kv(pool, layer, key, value, slots)

    def decode_attention(
        self,
        query: torch.Tensor,
        pool: torch.Tensor,
        layer: int,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        return reference.decode_attention(
            query, pool, layer, block_tables, context_lens, scale, window
        )

    def prefill_attention(
        self,
        query: torch.Tensor,
        pool: torch.Tensor,
        layer: int,
        block_tables: torch.Tensor,
        query_starts: torch.Tensor,
        context_starts: torch.Tensor,
        max_query_len: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        return reference.prefill_attention(
            query,
            pool,
            layer,
            block_tables,
            query_starts.tolist(),
            context_starts.tolist(),
            scale,
            window,
        )

    def copy_blocks(
        self, pool: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
    ) -> None:
        reference.copy_blocks(pool, src_block_ids, dst_block_ids)


def make_ops(kind: str) -> PagedOps:
    """``reference`` or ``triton`` (imports Triton)."""
    if kind == "reference":
        return ReferenceOps()
    if kind == "triton":
        from enginekit.kernels.triton_ops import TritonOps

        return TritonOps()
    raise ValueError(f"unknown paged ops {kind!r}; choose reference or triton")

"""PagedOps: the paged-KV operations the forward calls, with two implementations.

``ReferenceOps`` runs the pure-torch references (any device; what CPU uses).
``TritonOps`` runs the Triton kernels (CUDA, or anywhere under ``TRITON_INTERPRET=1``).
Both take the same arguments and store the same format; tensors named
``*_starts``/``*_lens``/``block_tables`` live on the pool's device. Every operation takes
a ``KVPool`` of any storage kind (none, fp8, int4): writes quantize, attention
dequantizes inside the kernel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from enginekit.kernels import reference
from enginekit.kernels.layout import KVPool


class PagedOps(ABC):
    name: str = ""

    @abstractmethod
    def write_kv(
        self,
        pool: KVPool,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Stores K/V [N, kvh, d] at ``slots`` (int64 [N], negative = skip), quantized to
        the pool's kind. See ``reference.write_kv``. Mutates pool; raises ValueError for
        unset (NaN) fp8 scales."""

    @abstractmethod
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
        """See ``reference.decode_attention``. Pure."""

    @abstractmethod
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
        """See ``reference.prefill_attention``; ``query_starts`` int32 [S + 1] and
        ``context_starts`` int32 [S]; ``max_query_len`` bounds every chunk. Pure."""

    @abstractmethod
    def copy_blocks(
        self, pool: KVPool, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
    ) -> None:
        """``t[dst[i]] = t[src[i]]`` for every block tensor ``t``. Mutates pool."""


class ReferenceOps(PagedOps):
    name = "reference"

    def write_kv(
        self,
        pool: KVPool,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        reference.write_kv(pool, layer, key, value, slots)

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
        return reference.decode_attention(
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
        return reference.prefill_attention(
            query,
            pool,
            layer,
            block_tables,
            query_starts.tolist(),
            context_starts.tolist(),
            scale,
            window,
            sinks,
        )

    def copy_blocks(
        self, pool: KVPool, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
    ) -> None:
        reference.copy_blocks(pool, src_block_ids, dst_block_ids)


def make_ops(kind: str) -> PagedOps:
    """``reference`` or ``triton`` (imports Triton). Raises ValueError for another kind."""
    if kind == "reference":
        return ReferenceOps()
    if kind == "triton":
        from enginekit.kernels.triton_ops import TritonOps

        return TritonOps()
    raise ValueError(f"unknown paged ops {kind!r}; choose reference or triton")

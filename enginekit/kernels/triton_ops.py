"""TRITON_OPS: the PagedOps of the Triton kernels (imports Triton)."""

from __future__ import annotations

from enginekit.kernels import triton_attention, triton_cache
from enginekit.kernels.ops import PagedOps

TRITON_OPS = PagedOps(
    name="triton",
    write_kv=triton_cache.write_kv,
    decode_attention=triton_attention.decode_attention,
    prefill_attention=triton_attention.prefill_attention,
    copy_blocks=triton_cache.copy_blocks,
)

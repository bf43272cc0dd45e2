"""TRITON_OPS: the PagedOps of the Triton kernels (imports Triton)."""

from __future__ import annotations

from enginekit.kernels.ops import PagedOps
from enginekit.kernels.triton import attention, cache

TRITON_OPS = PagedOps(
    name="triton",
    write_kv=cache.write_kv,
    decode_attention=attention.decode_attention,
    prefill_attention=attention.prefill_attention,
    copy_blocks=cache.copy_blocks,
)

"""PagedOps: the paged-KV operations the forward calls, with two implementations.

``REFERENCE_OPS`` runs the pure-torch references (any device; what CPU uses);
``triton.ops.TRITON_OPS`` runs the Triton kernels (CUDA, or anywhere under
``TRITON_INTERPRET=1``). Both take the same arguments and store the same format; tensors
named ``*_starts``/``*_lens``/``block_tables`` live on the pool's device. Every operation
takes a ``KVTensors`` of any storage kind (none, fp8, int4): writes quantize, attention
dequantizes inside the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from enginekit.kernels import reference
from enginekit.kernels.layout import KVTensors


@dataclass(frozen=True)
class PagedOps:
    """One implementation of each operation. Contracts (what is read, mutated, raised):
    the ``reference`` functions of the same names, except that ``prefill_attention``
    takes ``query_starts`` int32 [S + 1] and ``context_starts`` int32 [S] as tensors
    and ``max_query_len`` (bounding every chunk) before ``scale``, as the Triton kernel
    does::

        write_kv(pool, layer, key, value, slots) -> None
        decode_attention(query, pool, layer, block_tables, context_lens, scale, window,
                         sinks=0) -> Tensor
        prefill_attention(query, pool, layer, block_tables, query_starts,
                          context_starts, max_query_len, scale, window, sinks=0) -> Tensor
        copy_blocks(pool, src_block_ids, dst_block_ids) -> None
    """

    name: str
    write_kv: Callable[..., None]
    decode_attention: Callable[..., torch.Tensor]
    prefill_attention: Callable[..., torch.Tensor]
    copy_blocks: Callable[..., None]


def _reference_prefill_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    context_starts: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int | None,
    sinks: int = 0,
) -> torch.Tensor:
    """``reference.prefill_attention`` with the kernel's arguments (the reference loops
    over sequences, so it takes the offsets as lists and needs no chunk bound)."""
    return reference.prefill_attention(
        query, pool, layer, block_tables, query_starts.tolist(), context_starts.tolist(),
        scale, window, sinks,
    )  # fmt: skip


REFERENCE_OPS = PagedOps(
    name="reference",
    write_kv=reference.write_kv,
    decode_attention=reference.decode_attention,
    prefill_attention=_reference_prefill_attention,
    copy_blocks=reference.copy_blocks,
)

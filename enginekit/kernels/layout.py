"""The physical layout of the paged KV pool, shared by the references and the kernels.

One tensor holds the whole pool::

    pool[num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim]   (contiguous)

Why this order:

- A block is one contiguous run of ``KVSpec.bytes_per_block`` bytes (every layer, K and V),
  so copy-on-write and swapping move a block with one contiguous copy, and a block id is
  all the host-side bookkeeping needs.
- For one (block, layer, K|V, kv head) the ``block_size × head_dim`` tile is contiguous:
  the decode kernel, which walks a sequence's blocks per kv head, loads each tile with
  fully coalesced reads and shares it among the query heads of its GQA group.
"""

from __future__ import annotations

import torch

from enginekit.kv.spec import KVSpec

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def pool_shape(spec: KVSpec, num_blocks: int) -> tuple[int, int, int, int, int, int]:
    return (num_blocks, spec.num_layers, 2, spec.num_kv_heads, spec.block_size, spec.head_dim)


def allocate_pool(
    spec: KVSpec,
    num_blocks: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    pin_memory: bool = False,
) -> torch.Tensor:
    """A zeroed pool of ``num_blocks`` blocks. ``pin_memory`` only for host pools and only
    where CUDA exists (pinning needs a CUDA context)."""
    return torch.zeros(
        pool_shape(spec, num_blocks), dtype=dtype, device=device, pin_memory=pin_memory
    )


def pool_bytes_per_block(spec: KVSpec, dtype: torch.dtype) -> int:
    """Bytes of one block of this layout (equal to ``spec.bytes_per_block`` when the
    spec's bits per element match ``dtype``)."""
    return spec.num_elements_per_token * spec.block_size * torch.finfo(dtype).bits // 8

"""Triton kernels that move KV: writing new tokens into their slots, and copying whole
blocks (copy-on-write). Twins of ``reference.write_kv`` and ``reference.copy_blocks``.
Swaps cross devices and stay torch copies (``reference.swap_blocks``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginekit.kernels.checks import check_heads, check_index, check_pool


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, slots_ptr, pool_ptr, layer,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    NUM_KV_HEADS: tl.constexpr, H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Program i stores token i's K and V (every kv head) at slot slots[i] (< 0: skip)."""
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    slot_2d = tl.zeros([H_PAD, D_PAD], tl.int64) + slot
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM) & (slot_2d >= 0)
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    k = tl.load(k_ptr + i * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + i * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = (pool_ptr + block_id * stride_pb + layer * stride_pl + h[:, None] * stride_ph
           + offset * stride_pt + d[None, :])  # fmt: skip
    tl.store(dst, k, mask=mask)
    tl.store(dst + stride_pkv, v, mask=mask)


@triton.jit
def _copy_blocks_kernel(pool_ptr, src_ptr, dst_ptr, BLOCK_NUMEL: tl.constexpr,
                        CHUNK: tl.constexpr):  # fmt: skip
    """Program (pair, chunk) copies CHUNK elements of block src[pair] to dst[pair]."""
    pair = tl.program_id(0)
    offsets = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < BLOCK_NUMEL
    src = tl.load(src_ptr + pair)
    dst = tl.load(dst_ptr + pair)
    x = tl.load(pool_ptr + src * BLOCK_NUMEL + offsets, mask=mask)
    tl.store(pool_ptr + dst * BLOCK_NUMEL + offsets, x, mask=mask)


def write_kv(
    pool: torch.Tensor, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """See ``reference.write_kv``. Raises ValueError on a bad shape, dtype, device or
    stride."""
    check_pool(pool, layer)
    num_kv_heads, block_size, head_dim = pool.shape[3], pool.shape[4], pool.shape[5]
    check_heads(key, pool, "key", num_kv_heads)
    check_heads(value, pool, "value", num_kv_heads)
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError("key and value must have the same number of tokens")
    check_index(slots, "slots", torch.int64, (num_tokens,), pool.device)
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, slots, pool, layer,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), pool.stride(4),
        NUM_KV_HEADS=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
    )  # fmt: skip


def copy_blocks(
    pool: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
) -> None:
    """See ``reference.copy_blocks``; ids int64 [n] on the pool's device."""
    check_pool(pool, 0)
    num_pairs = src_block_ids.shape[0]
    check_index(src_block_ids, "src_block_ids", torch.int64, (num_pairs,), pool.device)
    check_index(dst_block_ids, "dst_block_ids", torch.int64, (num_pairs,), pool.device)
    if num_pairs == 0:
        return
    block_numel = pool[0].numel()
    chunk = min(4096, triton.next_power_of_2(block_numel))
    grid = (num_pairs, triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](pool, src_block_ids, dst_block_ids, BLOCK_NUMEL=block_numel,
                              CHUNK=chunk)  # fmt: skip

"""Argument checks the Triton launchers run before launching: a kernel reading a wrongly
shaped or strided tensor fails silently, so every launcher validates first."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_pool(pool: torch.Tensor, layer: int) -> None:
    """The pool is 6-D [blocks, layers, 2, kv_heads, block_size, head_dim] and contiguous;
    ``layer`` is one of its layers."""
    if pool.dim() != 6 or pool.shape[2] != 2:
        raise ValueError(
            f"pool must be [blocks, layers, 2, kv_heads, block_size, head_dim], "
            f"got {tuple(pool.shape)}"
        )
    if not pool.is_contiguous():
        raise ValueError("pool must be contiguous")
    if not 0 <= layer < pool.shape[1]:
        raise ValueError(f"layer {layer} out of range [0, {pool.shape[1]})")


def check_heads(x: torch.Tensor, pool: torch.Tensor, what: str, num_heads: int | None) -> None:
    """``x`` is [N, heads, head_dim] with unit stride on head_dim, in the pool's dtype and
    device; ``num_heads`` if given."""
    if x.dim() != 3 or x.shape[2] != pool.shape[5]:
        raise ValueError(f"{what} must be [N, heads, {pool.shape[5]}], got {tuple(x.shape)}")
    if num_heads is not None and x.shape[1] != num_heads:
        raise ValueError(f"{what} must have {num_heads} heads, got {x.shape[1]}")
    if x.stride(2) != 1:
        raise ValueError(f"{what} must have unit stride on head_dim")
    if x.dtype != pool.dtype or x.device != pool.device:
        raise ValueError(
            f"{what} must be {pool.dtype} on {pool.device}, got {x.dtype} on {x.device}"
        )


def check_index(
    x: torch.Tensor, what: str, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    if x.dtype != dtype or tuple(x.shape) != shape or x.device != device:
        raise ValueError(
            f"{what} must be {dtype} {list(shape)} on {device}, got "
            f"{x.dtype} {list(x.shape)} on {x.device}"
        )
    if x.dim() and x.stride(-1) != 1:
        raise ValueError(f"{what} must have unit stride on its last axis")


def check_attention_args(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    num_seqs: int,
    per_seq: Sequence[torch.Tensor],
) -> None:
    """Query [T, H, d] with H a multiple of the pool's kv heads; block tables int32
    [num_seqs, W]; each ``per_seq`` tensor int32 [num_seqs]."""
    check_pool(pool, layer)
    check_heads(query, pool, "query", None)
    if query.shape[1] % pool.shape[3]:
        raise ValueError(
            f"{query.shape[1]} query heads are not a multiple of {pool.shape[3]} kv heads"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, W], got {tuple(block_tables.shape)}")
    check_index(block_tables, "block_tables", torch.int32, tuple(block_tables.shape), pool.device)
    for tensor in per_seq:
        check_index(tensor, "per-sequence lengths", torch.int32, (num_seqs,), pool.device)

"""Argument checks the Triton launchers run before launching: a kernel reading a wrongly
shaped or strided tensor fails silently, so every launcher validates first. Every check
raises ValueError naming the bad argument and returns nothing."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from enginekit.kernels.layout import KVTensors

MODEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STORED_DTYPES = {"fp8": torch.float8_e4m3fn, "int4": torch.uint8}


def _check_tensor(
    x: torch.Tensor | None,
    what: str,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    data: torch.Tensor,
) -> None:
    if x is None:
        raise ValueError(f"the pool has no {what}")
    if x.dtype != dtype or tuple(x.shape) != shape or x.device != data.device:
        raise ValueError(
            f"{what} must be {dtype} {list(shape)} on {data.device}, got "
            f"{x.dtype} {list(x.shape)} on {x.device}"
        )
    if not x.is_contiguous():
        raise ValueError(f"{what} must be contiguous")


def check_pool(pool: KVTensors, layer: int) -> None:
    """``pool.data`` is 6-D [blocks, layers, 2, kv_heads, block_size, stored_dim] and
    contiguous in its kind's dtype; int4 pools have contiguous float16 scale/zero tensors
    of the layout's shapes, fp8 pools float32 scales [layers, 2, kv_heads]; ``layer`` is
    one of the pool's layers."""
    data = pool.data
    if data.dim() != 6 or data.shape[2] != 2:
        raise ValueError(
            f"pool data must be [blocks, layers, 2, kv_heads, block_size, stored_dim], "
            f"got {tuple(data.shape)}"
        )
    if not data.is_contiguous():
        raise ValueError("pool data must be contiguous")
    kind = pool.quant.kind
    want = STORED_DTYPES.get(kind)
    if (want is None and data.dtype not in MODEL_DTYPES) or (want and data.dtype != want):
        raise ValueError(f"a {kind} pool cannot store {data.dtype}")
    if not 0 <= layer < data.shape[1]:
        raise ValueError(f"layer {layer} out of range [0, {data.shape[1]})")
    num_blocks, num_layers, _, num_kv_heads, block_size, _ = data.shape
    head_dim = pool.head_dim
    if kind == "int4":
        key_group, value_group = pool.quant.key_group_tokens, pool.quant.value_group_channels
        if block_size % key_group or head_dim % value_group:
            raise ValueError("int4 groups must divide the block size (keys) and head dim")
        prefix = (num_blocks, num_layers, num_kv_heads)
        key_shape = (*prefix, block_size // key_group, 2, head_dim)
        value_shape = (*prefix, block_size, 2, head_dim // value_group)
        _check_tensor(pool.key_meta, "key_meta", torch.float16, key_shape, data)
        _check_tensor(pool.value_meta, "value_meta", torch.float16, value_shape, data)
    if kind == "fp8":
        shape = (num_layers, 2, num_kv_heads)
        _check_tensor(pool.fp8_scales, "fp8_scales", torch.float32, shape, data)


def check_heads(
    x: torch.Tensor, pool: KVTensors, what: str, num_heads: int | None, dtype: torch.dtype | None
) -> None:
    """``x`` is [N, heads, head_dim] with unit stride on head_dim, on the pool's device, in
    ``dtype`` if given (else any model dtype); ``num_heads`` if given."""
    head_dim = pool.head_dim
    if x.dim() != 3 or x.shape[2] != head_dim:
        raise ValueError(f"{what} must be [N, heads, {head_dim}], got {tuple(x.shape)}")
    if num_heads is not None and x.shape[1] != num_heads:
        raise ValueError(f"{what} must have {num_heads} heads, got {x.shape[1]}")
    if x.stride(2) != 1:
        raise ValueError(f"{what} must have unit stride on head_dim")
    ok_dtype = x.dtype == dtype if dtype is not None else x.dtype in MODEL_DTYPES
    if not ok_dtype or x.device != pool.data.device:
        raise ValueError(
            f"{what} must be {dtype or 'a float dtype'} on {pool.data.device}, got "
            f"{x.dtype} on {x.device}"
        )


def model_dtype(pool: KVTensors) -> torch.dtype | None:
    """The dtype K/V/queries must have for this pool: the stored one for ``none``; None
    (any model dtype) for quantized pools."""
    return pool.data.dtype if pool.quant.kind == "none" else None


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
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    num_seqs: int,
    per_seq: Sequence[torch.Tensor],
    sinks: int,
) -> None:
    """Query [T, H, d] with H a multiple of the pool's kv heads (in the pool's dtype for
    ``none``); block tables int32 [num_seqs, W]; each ``per_seq`` tensor int32
    [num_seqs]; ``sinks`` >= 0."""
    check_pool(pool, layer)
    check_heads(query, pool, "query", None, model_dtype(pool))
    if query.shape[1] % pool.num_kv_heads:
        raise ValueError(
            f"{query.shape[1]} query heads are not a multiple of {pool.num_kv_heads} kv heads"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, W], got {tuple(block_tables.shape)}")
    device = pool.data.device
    check_index(block_tables, "block_tables", torch.int32, tuple(block_tables.shape), device)
    for tensor in per_seq:
        check_index(tensor, "per-sequence lengths", torch.int32, (num_seqs,), device)
    if sinks < 0:
        raise ValueError(f"sinks must be >= 0, got {sinks}")

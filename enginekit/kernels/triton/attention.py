"""Triton paged attention: decode (one query per sequence) and prefill (a ragged batch of
chunks over cached prefixes). Twins of ``reference.decode_attention`` and
``reference.prefill_attention``, same arguments and semantics (window and sinks).

Both read keys in tiles of ``BLOCK_N`` attended positions gathered across pages
(``tiles.load_kv_tile``), so the tile shape does not depend on the page size, and run an
online softmax in float32 (base 2) with ``tl.dot`` for both products. A program owns one
kv head and every query head of its group, so each K/V tile is loaded once per group.
Tile sizes, warps, pipeline stages and decode splits come from ``launch``.

- **Decode** (a memory-bound step) splits each sequence's attended keys across
  ``num_splits`` programs, so that a small batch still fills the GPU: grid (sequence,
  kv head, split), each split at least ``MIN_SPLIT_TOKENS`` keys. The group's query
  heads are the rows of one ``tl.dot`` tile, padded to 16. With more than one split each
  program writes its normalised partial output and log-sum-exp, and ``_merge_kernel``
  combines them.
- **Prefill**: grid (query tile, kv head, sequence), query tiles of ``BLOCK_M`` tokens ×
  the group's heads, the last (longest) tiles of a chunk first. A tile reads only the keys
  its rows attend (the sinks and its window, or the whole causal prefix), and a tile past
  its chunk's end reads nothing.

Quantized pools are dequantized per tile in registers, never copied to full precision:
fp8 is converted by the hardware on a GPU (from its bits under the interpreter), and its
(layer, head) scales are folded into the softmax scale (keys) and the output (values);
int4 is dequantized with its group scales. Dots run in IEEE float32 for float32 models;
on an fp8 cache in float16, which holds every e4m3 value exactly and is one hardware
conversion away from it (a bfloat16 query is clamped to float16's range first); otherwise
natively on the model's half type (int4 tiles cast to it). Under the interpreter, whose
``tl.dot`` on bfloat16 operands is wrong, bfloat16 dots run in float32 instead. Per-call
integers (layer, window, sinks, table width, splits) are not specialised on, so a
configuration compiles once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from enginekit.kernels.checks import check_attention_args
from enginekit.kernels.layout import KVTensors
from enginekit.kernels.triton.launch import (
    decode_config,
    device_num_sms,
    num_decode_splits,
    prefill_config,
    prefill_query_tile,
)
from enginekit.kernels.triton.quant import KIND_IDS
from enginekit.kernels.triton.runtime import is_interpreter
from enginekit.kernels.triton.tiles import (
    attended_positions,
    attended_span,
    fp8_scales,
    load_kv_tile,
    query_operand,
    scores,
    softmax_step,
)

LOG2E = 1.4426950408889634
PER_CALL_INTS = ["layer", "window", "sinks", "stride_btb", "num_splits"]


@triton.jit(do_not_specialize=PER_CALL_INTS)
def _decode_kernel(
    q_ptr, out_ptr, part_out_ptr, part_lse_ptr, data_ptr, kmeta_ptr, vmeta_ptr, fp8_ptr,
    bt_ptr, ctx_ptr, layer, qk_scale, window, sinks, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    stride_fl, stride_fkv, stride_fh, stride_btb,
    GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
    IS_SPLIT: tl.constexpr, KIND: tl.constexpr, KEY_GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr, HW_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Program (seq, kv head, split): the query of ``seq`` sits at position
    ``ctx[seq] - 1``; its attended keys (sinks, then window; or all) are numbered
    0..n-1 and this split reads its share, whole tiles of BLOCK_N, in order. Rows are
    the group's query heads (padded to ROWS). Writes ``out`` (one split) or the split's
    normalised output and base-2 log-sum-exp (-inf when it read nothing)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, ROWS)
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    row_ok = g < GROUP
    head = kv_head * GROUP + g
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q = query_operand(q, DOT_DTYPE)
    ctx = tl.load(ctx_ptr + seq)
    lo, sink_end, num_keys = attended_span(ctx - 1, ctx, window, sinks, HAS_WINDOW)
    per_split = tl.cdiv(tl.cdiv(num_keys, num_splits), BLOCK_N) * BLOCK_N
    begin = split * per_split
    end = tl.minimum(begin + per_split, num_keys)
    k_scale, v_scale = fp8_scales(fp8_ptr, layer, kv_head, stride_fl, stride_fkv, stride_fh, KIND)
    tile_scale = qk_scale * k_scale
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D_PAD], tl.float32)
    bt_row_ptr = bt_ptr + seq.to(tl.int64) * stride_btb
    n = tl.arange(0, BLOCK_N)
    for first in range(begin, end, BLOCK_N):
        index = first + n
        key_ok = index < end
        pos = attended_positions(index, sink_end, lo)
        k, v = load_kv_tile(
            data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, pos, key_ok, d, d_ok,
            stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
            stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
            stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
            BLOCK_SIZE, KIND, KEY_GROUP, VALUE_GROUP, HW_FP8, DOT_DTYPE,
        )  # fmt: skip
        s = tl.where(key_ok[None, :], scores(q, k, tile_scale, DOT_DTYPE), float("-inf"))
        m, l_sum, acc = softmax_step(s, v, m, l_sum, acc, DOT_DTYPE)
    has_keys = l_sum > 0.0
    out = acc * (v_scale / tl.where(has_keys, l_sum, 1.0))[:, None]
    mask = row_ok[:, None] & d_ok[None, :]
    if IS_SPLIT:
        part = (seq * num_splits + split).to(tl.int64) * (GROUP * tl.num_programs(1))
        part_rows = part + head
        tl.store(part_out_ptr + part_rows[:, None] * D_PAD + d[None, :], out, mask=mask)
        lse = tl.where(has_keys, m + tl.log2(tl.where(has_keys, l_sum, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part_rows, lse, mask=row_ok)
    else:
        tl.store(
            out_ptr + seq.to(tl.int64) * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask,
        )


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
):  # fmt: skip
    """Program (seq, head): out = Σ_s 2^(lse_s - LSE) · out_s over the splits, where
    LSE = log2 Σ_s 2^lse_s; splits that read nothing (lse -inf) weigh 0."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    best = float("-inf")
    weight = 0.0
    acc = tl.zeros([D_PAD], tl.float32)
    for split in range(0, num_splits):
        row = (seq * num_splits + split).to(tl.int64) * num_heads + head
        lse = tl.load(part_lse_ptr + row)
        part = tl.load(part_out_ptr + row * D_PAD + d, mask=d_ok, other=0.0)
        new_best = tl.maximum(best, lse)
        safe = tl.where(new_best == float("-inf"), 0.0, new_best)
        old_factor = tl.exp2(best - safe)
        factor = tl.exp2(lse - safe)
        acc = acc * old_factor + part * factor
        weight = weight * old_factor + factor
        best = new_best
    out = acc / tl.where(weight > 0.0, weight, 1.0)
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )


@triton.jit(do_not_specialize=PER_CALL_INTS[:-1])
def _prefill_kernel(
    q_ptr, out_ptr, data_ptr, kmeta_ptr, vmeta_ptr, fp8_ptr, bt_ptr, q_starts_ptr,
    ctx_starts_ptr, tile_counts_ptr, layer, qk_scale, window, sinks,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    stride_fl, stride_fkv, stride_fh, stride_btb,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, KIND: tl.constexpr,
    KEY_GROUP: tl.constexpr, VALUE_GROUP: tl.constexpr, HW_FP8: tl.constexpr,
    DOT_DTYPE: tl.constexpr, COUNT_TILES: tl.constexpr,
):  # fmt: skip
    """Program (tile from the end, kv head, seq). Rows r = (token r // GROUP_PAD, head
    r % GROUP_PAD) of query tile ``tile`` of seq's chunk (rows q_starts[s]..q_starts[s+1],
    the first at position ctx_starts[s]). The tile's rows attend keys in [lo, hi) after
    the sinks [0, sink_end) that lie before it; those keys are numbered 0..n-1 and read in
    tiles of BLOCK_N, each row applying its own causal/window/sink mask. A tile with no
    rows reads nothing. With COUNT_TILES, the number of key tiles read is stored at
    ``tile_counts[program]``."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    q_begin = tl.load(q_starts_ptr + seq)
    q_len = tl.load(q_starts_ptr + seq + 1) - q_begin
    first_pos = tl.load(ctx_starts_ptr + seq)
    rows = tl.arange(0, BLOCK_M * GROUP_PAD)
    tok = tile * BLOCK_M + rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (tok < q_len) & (g < GROUP)
    q_pos = first_pos + tok
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    head = kv_head * GROUP + g
    q_rows = (q_begin + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q = query_operand(q, DOT_DTYPE)
    # hi = lo = sink_end = 0 for a tile with no rows: it reads no keys.
    tile_first = first_pos + tile * BLOCK_M
    hi = tl.maximum(first_pos + tl.minimum(tile * BLOCK_M + BLOCK_M, q_len), 0)
    hi = tl.where(tile * BLOCK_M < q_len, hi, 0)
    lo, sink_end, num_keys = attended_span(tile_first, hi, window, sinks, HAS_WINDOW)
    k_scale, v_scale = fp8_scales(fp8_ptr, layer, kv_head, stride_fl, stride_fkv, stride_fh, KIND)
    tile_scale = qk_scale * k_scale
    m = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, D_PAD], tl.float32)
    bt_row_ptr = bt_ptr + seq.to(tl.int64) * stride_btb
    n = tl.arange(0, BLOCK_N)
    for first in range(0, num_keys, BLOCK_N):
        index = first + n
        key_ok = index < num_keys
        pos = attended_positions(index, sink_end, lo)
        k, v = load_kv_tile(
            data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, pos, key_ok, d, d_ok,
            stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
            stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
            stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
            BLOCK_SIZE, KIND, KEY_GROUP, VALUE_GROUP, HW_FP8, DOT_DTYPE,
        )  # fmt: skip
        allowed = row_ok[:, None] & key_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            allowed = allowed & ((pos[None, :] > q_pos[:, None] - window) | (pos[None, :] < sinks))
        s = tl.where(allowed, scores(q, k, tile_scale, DOT_DTYPE), float("-inf"))
        m, l_sum, acc = softmax_step(s, v, m, l_sum, acc, DOT_DTYPE)
    out = acc * (v_scale / tl.where(l_sum == 0.0, 1.0, l_sum))[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    if COUNT_TILES:
        program = (seq * tl.num_programs(1) + kv_head) * tl.num_programs(0) + tl.program_id(0)
        tl.store(tile_counts_ptr + program, tl.cdiv(num_keys, BLOCK_N))


class _PoolArgs(NamedTuple):
    """A pool as the kernels take it: pointers (data, key meta, value meta, fp8 scales),
    their strides in the kernels' order, and the constexprs the pool and query decide."""

    pointers: list[torch.Tensor]
    strides: list[int]
    constexprs: dict[str, Any]


def _pool_args(pool: KVTensors, query: torch.Tensor) -> _PoolArgs:
    """The pool's kernel arguments. Absent tensors are never read (KIND dispatch): the
    data tensor with zero strides stands in."""
    kind = pool.quant.kind
    data = pool.data.view(torch.uint8) if kind == "fp8" else pool.data
    key_meta = pool.key_meta if pool.key_meta is not None else data
    value_meta = pool.value_meta if pool.value_meta is not None else data
    fp8_scales = pool.fp8_scales if pool.fp8_scales is not None else data
    interpreted = is_interpreter()
    upcast = query.dtype == torch.float32 or (query.dtype == torch.bfloat16 and interpreted)
    dot_dtype = tl.float32 if upcast else tl.float16 if kind == "fp8" else _TL_DTYPES[query.dtype]
    pointers = [data, key_meta, value_meta, fp8_scales]
    strides = [
        *data.stride()[:5],
        *(key_meta.stride()[:5] if pool.key_meta is not None else (0,) * 5),
        *(value_meta.stride()[:5] if pool.value_meta is not None else (0,) * 5),
        *(fp8_scales.stride() if pool.fp8_scales is not None else (0,) * 3),
    ]
    constexprs = {
        "HEAD_DIM": query.shape[2],
        "D_PAD": max(triton.next_power_of_2(query.shape[2]), 16),
        "BLOCK_SIZE": pool.block_size,
        "KIND": KIND_IDS[kind],
        "KEY_GROUP": max(pool.quant.key_group_tokens, 1),
        "VALUE_GROUP": max(pool.quant.value_group_channels, 1),
        "HW_FP8": not interpreted,
        "DOT_DTYPE": dot_dtype,
    }
    return _PoolArgs(pointers, strides, constexprs)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def decode_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: int = 0,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """See ``reference.decode_attention``. ``num_splits`` (default: ``num_decode_splits``
    for the table's width, the window and the device) splits each sequence's keys across
    that many programs. Raises ValueError on a bad shape, dtype, device or stride, or
    ``num_splits`` < 1. Pure."""
    num_seqs = query.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_lens,), sinks)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = pool.num_kv_heads
    group = num_heads // num_kv_heads
    if num_splits is None:
        max_keys = block_tables.shape[1] * pool.block_size
        if window is not None:
            max_keys = min(max_keys, window + sinks)
        num_splits = num_decode_splits(
            num_seqs, num_kv_heads, max_keys, device_num_sms(query.device)
        )
    pointers, strides, constexprs = _pool_args(pool, query)
    d_pad = constexprs["D_PAD"]
    config = decode_config(query.dtype, head_dim, pool.quant.kind)
    if num_splits > 1:
        part_out = torch.empty(
            (num_seqs * num_splits * num_heads, d_pad), dtype=torch.float32, device=query.device
        )
        part_lse = torch.empty(part_out.shape[0], dtype=torch.float32, device=query.device)
    else:
        part_out = part_lse = out  # not read
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, out, part_out, part_lse, *pointers, block_tables, context_lens,
        layer, scale * LOG2E, window or 0, sinks, num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *strides, block_tables.stride(0),
        GROUP=group, ROWS=max(triton.next_power_of_2(group), config.rows),
        BLOCK_N=config.block_n, HAS_WINDOW=window is not None, IS_SPLIT=num_splits > 1,
        **constexprs, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if num_splits > 1:
        _merge_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, D_PAD=d_pad,
        )  # fmt: skip
    return out


def prefill_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    context_starts: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int | None = None,
    sinks: int = 0,
    *,
    tile_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """See ``reference.prefill_attention``; ``query_starts`` int32 [S + 1],
    ``context_starts`` int32 [S], every chunk at most ``max_query_len`` rows. With
    ``tile_counts`` (int32, one entry per program of the grid (query tiles of the
    longest chunk, kv heads, sequences)), each program stores how many key tiles it
    read. Raises ValueError on a bad shape, dtype, device or stride. Pure (but for
    ``tile_counts``)."""
    num_seqs = context_starts.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_starts,), sinks)
    if query_starts.shape != (num_seqs + 1,) or query_starts.dtype != torch.int32:
        raise ValueError("query_starts must be int32 [num_seqs + 1]")
    out = torch.empty_like(query)
    if num_seqs == 0 or max_query_len == 0:
        return out
    num_heads = query.shape[1]
    num_kv_heads = pool.num_kv_heads
    group = num_heads // num_kv_heads
    config = prefill_config(query.dtype, query.shape[2], pool.quant.kind)
    block_m = prefill_query_tile(config, num_heads, num_kv_heads)
    grid = (triton.cdiv(max_query_len, block_m), num_kv_heads, num_seqs)
    num_programs = grid[0] * grid[1] * grid[2]
    if tile_counts is not None and tile_counts.shape != (num_programs,):
        raise ValueError(f"tile_counts must have {num_programs} entries")
    pointers, strides, constexprs = _pool_args(pool, query)
    _prefill_kernel[grid](
        query, out, *pointers, block_tables, query_starts, context_starts,
        tile_counts if tile_counts is not None else context_starts,
        layer, scale * LOG2E, window or 0, sinks,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *strides, block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_M=block_m,
        BLOCK_N=config.block_n, HAS_WINDOW=window is not None,
        COUNT_TILES=tile_counts is not None, **constexprs,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out

"""Triton paged attention: decode (one query per sequence) and prefill (a ragged batch of
chunks over cached prefixes). Twins of ``reference.decode_attention`` and
``reference.prefill_attention``, same arguments and semantics.

Both walk a sequence's block table one KV block at a time with an online softmax in
float32, and are GQA-aware: a program owns one kv head and every query head of its group,
so each K/V tile is loaded once per group. Prefill tiles use ``tl.dot`` when every tile
side is at least 16 (in IEEE float32 for float32 models; natively for half types, except
bfloat16 under ``TRITON_INTERPRET=1``, whose ``tl.dot`` on bfloat16 operands is wrong in
Triton 3.9's interpreter: there the operands are upcast). Every load is masked
(block-size and head-dim padding, positions past the context or outside the window), and
only blocks holding an attended position are read, so ``-1`` table padding is never
dereferenced.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from enginekit.kernels.checks import check_attention_args


@triton.jit
def _online_update(s, v, m, l_sum, acc, USE_DOT: tl.constexpr, IS_FP32: tl.constexpr):
    """One softmax step: scores s [R, T] (-inf where masked) and values v [T, D]."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, axis=1)
    if USE_DOT:
        if IS_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    acc = acc * alpha[:, None] + pv
    return m_new, l_sum, acc


@triton.jit
def _scores(q, k, scale, USE_DOT: tl.constexpr, IS_FP32: tl.constexpr):
    if USE_DOT:
        if IS_FP32:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
    else:
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    return s * scale


@triton.jit
def _paged_attention_kernel(
    q_ptr, out_ptr, pool_ptr, bt_ptr, q_starts_ptr, ctx_starts_ptr,
    layer, scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_btb,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, T_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IS_DECODE: tl.constexpr,
    USE_DOT: tl.constexpr, IS_FP32: tl.constexpr,
):  # fmt: skip
    """Program (seq, kv head, query tile). Rows r = (token r // GROUP_PAD, head r % GROUP_PAD).
    Decode: seq s has query row s at position ctx_starts[s] - 1 (ctx_starts = context
    lens). Prefill: rows q_starts[s]..q_starts[s+1], first at position ctx_starts[s]."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    if IS_DECODE:
        q_begin = seq
        q_len = 1
        first_pos = tl.load(ctx_starts_ptr + seq) - 1
    else:
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
    # Keys this tile can attend: [lo, hi).
    tile_first = first_pos + tile * BLOCK_M
    hi = first_pos + tl.minimum(tile * BLOCK_M + BLOCK_M, q_len)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(tile_first - window + 1, 0)
    m = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, D_PAD], tl.float32)
    t = tl.arange(0, T_PAD)
    t_ok = t < BLOCK_SIZE
    head_base = pool_ptr + layer * stride_pl + kv_head * stride_ph
    for j in range(lo // BLOCK_SIZE, (hi + BLOCK_SIZE - 1) // BLOCK_SIZE):
        block_id = tl.load(bt_ptr + seq * stride_btb + j).to(tl.int64)
        k_pos = j * BLOCK_SIZE + t
        k_ok = t_ok & (k_pos < hi) & (k_pos >= lo)
        offsets = t[:, None] * stride_pt + d[None, :]
        kv_mask = k_ok[:, None] & d_ok[None, :]
        base = head_base + block_id * stride_pb
        k = tl.load(base + offsets, mask=kv_mask, other=0.0)
        v = tl.load(base + stride_pkv + offsets, mask=kv_mask, other=0.0)
        s = _scores(q, k, scale, USE_DOT, IS_FP32)
        allowed = row_ok[:, None] & k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
        m, l_sum, acc = _online_update(s, v, m, l_sum, acc, USE_DOT, IS_FP32)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def _launch(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    q_starts: torch.Tensor,
    ctx_starts: torch.Tensor,
    num_seqs: int,
    max_query_len: int,
    scale: float,
    window: int | None,
    is_decode: bool,
) -> torch.Tensor:
    out = torch.empty_like(query)
    if num_seqs == 0 or max_query_len == 0:
        return out
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = pool.shape[3], pool.shape[4]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = 1 if is_decode else max(1, min(16, 64 // group_pad))
    d_pad = max(triton.next_power_of_2(head_dim), 16)
    t_pad = triton.next_power_of_2(block_size)
    upcast = query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    use_dot = block_m * group_pad >= 16 and t_pad >= 16 and d_pad >= 16 and not is_decode
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_m))
    _paged_attention_kernel[grid](
        query, out, pool, block_tables, q_starts, ctx_starts,
        layer, scale, window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), pool.stride(4),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m,
        HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size, T_PAD=t_pad,
        HAS_WINDOW=window is not None, IS_DECODE=is_decode,
        USE_DOT=use_dot, IS_FP32=query.dtype == torch.float32 or upcast,
    )  # fmt: skip
    return out


def decode_attention(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """See ``reference.decode_attention``. Raises ValueError on a bad shape, dtype,
    device or stride."""
    num_seqs = query.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_lens,))
    return _launch(
        query, pool, layer, block_tables, context_lens, context_lens,
        num_seqs, 1, scale, window, is_decode=True,
    )  # fmt: skip


def prefill_attention(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    context_starts: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """See ``reference.prefill_attention``; ``query_starts`` int32 [S + 1],
    ``context_starts`` int32 [S], every chunk at most ``max_query_len`` rows."""
    num_seqs = context_starts.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_starts,))
    if query_starts.shape != (num_seqs + 1,) or query_starts.dtype != torch.int32:
        raise ValueError("query_starts must be int32 [num_seqs + 1]")
    return _launch(
        query, pool, layer, block_tables, query_starts, context_starts,
        num_seqs, max_query_len, scale, window, is_decode=False,
    )  # fmt: skip

"""Triton paged attention: decode (one query per sequence) and prefill (a ragged batch of
chunks over cached prefixes). Twins of ``reference.decode_attention`` and
``reference.prefill_attention``, same arguments and semantics (window and sinks).

Both walk a sequence's block table one KV block at a time with an online softmax in
float32, and are GQA-aware: a program owns one kv head and every query head of its group,
so each K/V tile is loaded once per group. Quantized pools are dequantized tile by tile
in registers as they are loaded (fp8 decoded from its bits times the (layer, head)
scale; int4 nibbles times their group's float16 scale plus zero): the cache is never
copied to full precision. Prefill tiles use ``tl.dot`` when every tile side is at least
16 (in IEEE float32 for float32 models; natively for half types, dequantized tiles cast
to the model's dtype first, except bfloat16 under ``TRITON_INTERPRET=1``, whose
``tl.dot`` on bfloat16 operands is wrong in Triton 3.9's interpreter: there the operands
are upcast). Every load is masked (block-size and head-dim padding, positions past the
context or outside the attended ranges), and only blocks holding an attended position
are read: with a window, the sink blocks and then the window's blocks, so ``-1`` table
padding and holes (released blocks between the sinks and the window) are never
dereferenced.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from enginekit.kernels.checks import check_attention_args
from enginekit.kernels.layout import KVTensors
from enginekit.kernels.triton.quant import KIND_IDS, e4m3_to_float32, int4_dequantize


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
def _load_kv(
    data_ptr, kmeta_ptr, vmeta_ptr, block_id, layer, kv_head, t, d, mask, k_scale, v_scale,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    KIND: tl.constexpr, KEY_GROUP: tl.constexpr, VALUE_GROUP: tl.constexpr,
):  # fmt: skip
    """K and V tiles [T_PAD, D_PAD] of one (block, layer, kv head), dequantized to float32
    (stored dtype for none); 0 where ``mask`` is false. Reads only masked-in elements."""
    base = data_ptr + block_id * stride_pb + layer * stride_pl + kv_head * stride_ph
    if KIND == 2:
        offsets = t[:, None] * stride_pt + (d // 2)[None, :]
        shift = ((d % 2) * 4)[None, :]
        k_codes = (tl.load(base + offsets, mask=mask, other=0).to(tl.int32) >> shift) & 15
        v_codes = (tl.load(base + stride_pkv + offsets, mask=mask, other=0).to(tl.int32)
                   >> shift) & 15  # fmt: skip
        k_meta = (kmeta_ptr + block_id * stride_kmb + layer * stride_kml + kv_head * stride_kmh
                  + (t // KEY_GROUP)[:, None] * stride_kmg + d[None, :])  # fmt: skip
        v_meta = (vmeta_ptr + block_id * stride_vmb + layer * stride_vml + kv_head * stride_vmh
                  + t[:, None] * stride_vmt + (d // VALUE_GROUP)[None, :])  # fmt: skip
        k = int4_dequantize(
            k_codes,
            tl.load(k_meta, mask=mask, other=0.0),
            tl.load(k_meta + stride_kms, mask=mask, other=0.0),
        )
        v = int4_dequantize(
            v_codes,
            tl.load(v_meta, mask=mask, other=0.0),
            tl.load(v_meta + stride_vms, mask=mask, other=0.0),
        )
    else:
        offsets = t[:, None] * stride_pt + d[None, :]
        k = tl.load(base + offsets, mask=mask, other=0)
        v = tl.load(base + stride_pkv + offsets, mask=mask, other=0)
        if KIND == 1:
            k = e4m3_to_float32(k) * k_scale
            v = e4m3_to_float32(v) * v_scale
    return k, v


@triton.jit
def _attend_blocks(
    q, q_pos, row_ok, m, l_sum, acc, key_lo, key_hi, window, sinks,
    data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, scale, k_scale, v_scale,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    T_PAD: tl.constexpr, HAS_WINDOW: tl.constexpr, USE_DOT: tl.constexpr,
    IS_FP32: tl.constexpr, KIND: tl.constexpr, KEY_GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr,
):  # fmt: skip
    """Online softmax over the keys at positions [key_lo, key_hi), reading only the blocks
    they fall in; each row also applies its own causal/window/sink mask."""
    t = tl.arange(0, T_PAD)
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    for j in range(key_lo // BLOCK_SIZE, (key_hi + BLOCK_SIZE - 1) // BLOCK_SIZE):
        block_id = tl.load(bt_row_ptr + j).to(tl.int64)
        k_pos = j * BLOCK_SIZE + t
        k_ok = (t < BLOCK_SIZE) & (k_pos < key_hi) & (k_pos >= key_lo)
        k, v = _load_kv(
            data_ptr, kmeta_ptr, vmeta_ptr, block_id, layer, kv_head, t, d,
            k_ok[:, None] & d_ok[None, :], k_scale, v_scale,
            stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
            stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
            stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
            KIND, KEY_GROUP, VALUE_GROUP,
        )  # fmt: skip
        if KIND != 0 and USE_DOT and not IS_FP32:
            # Tensor-core dots on the model's half type, as the unquantized cache stores.
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = _scores(q, k, scale, USE_DOT, IS_FP32)
        allowed = row_ok[:, None] & k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            allowed = allowed & (
                (k_pos[None, :] > q_pos[:, None] - window) | (k_pos[None, :] < sinks)
            )
        s = tl.where(allowed, s, float("-inf"))
        m, l_sum, acc = _online_update(s, v, m, l_sum, acc, USE_DOT, IS_FP32)
    return m, l_sum, acc


@triton.jit
def _paged_attention_kernel(
    q_ptr, out_ptr, data_ptr, kmeta_ptr, vmeta_ptr, fp8_ptr, bt_ptr, q_starts_ptr,
    ctx_starts_ptr, layer, scale, window, sinks,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    stride_fl, stride_fkv, stride_fh,
    stride_btb,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, T_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IS_DECODE: tl.constexpr,
    USE_DOT: tl.constexpr, IS_FP32: tl.constexpr,
    KIND: tl.constexpr, KEY_GROUP: tl.constexpr, VALUE_GROUP: tl.constexpr,
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
    k_scale = 1.0
    v_scale = 1.0
    if KIND == 1:
        scale_ptr = fp8_ptr + layer * stride_fl + kv_head * stride_fh
        k_scale = tl.load(scale_ptr)
        v_scale = tl.load(scale_ptr + stride_fkv)
    # Keys the tile's rows can attend: the window's [lo, hi), after the sinks [0, sink_end)
    # that lie before it; the two ranges are disjoint and their blocks hold attended keys.
    tile_first = first_pos + tile * BLOCK_M
    hi = first_pos + tl.minimum(tile * BLOCK_M + BLOCK_M, q_len)
    lo = 0
    m = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, D_PAD], tl.float32)
    bt_row_ptr = bt_ptr + seq * stride_btb
    if HAS_WINDOW:
        lo = tl.maximum(tile_first - window + 1, 0)
        sink_end = tl.minimum(tl.minimum(lo, sinks), hi)
        m, l_sum, acc = _attend_blocks(
            q, q_pos, row_ok, m, l_sum, acc, 0, sink_end, window, sinks,
            data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, scale, k_scale, v_scale,
            stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
            stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
            stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
            HEAD_DIM, D_PAD, BLOCK_SIZE, T_PAD, HAS_WINDOW, USE_DOT, IS_FP32,
            KIND, KEY_GROUP, VALUE_GROUP,
        )  # fmt: skip
    m, l_sum, acc = _attend_blocks(
        q, q_pos, row_ok, m, l_sum, acc, lo, hi, window, sinks,
        data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, scale, k_scale, v_scale,
        stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
        stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
        stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
        HEAD_DIM, D_PAD, BLOCK_SIZE, T_PAD, HAS_WINDOW, USE_DOT, IS_FP32,
        KIND, KEY_GROUP, VALUE_GROUP,
    )  # fmt: skip
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def _launch(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    q_starts: torch.Tensor,
    ctx_starts: torch.Tensor,
    num_seqs: int,
    max_query_len: int,
    scale: float,
    window: int | None,
    sinks: int,
    is_decode: bool,
) -> torch.Tensor:
    out = torch.empty_like(query)
    if num_seqs == 0 or max_query_len == 0:
        return out
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = pool.num_kv_heads, pool.block_size
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = 1 if is_decode else max(1, min(16, 64 // group_pad))
    d_pad = max(triton.next_power_of_2(head_dim), 16)
    t_pad = triton.next_power_of_2(block_size)
    upcast = query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    use_dot = block_m * group_pad >= 16 and t_pad >= 16 and d_pad >= 16 and not is_decode
    kind = pool.quant.kind
    data = pool.data.view(torch.uint8) if kind == "fp8" else pool.data
    # Absent tensors are never read (KIND dispatch): any pointer with zero strides stands in.
    key_meta = pool.key_meta if pool.key_meta is not None else data
    value_meta = pool.value_meta if pool.value_meta is not None else data
    fp8_scales = pool.fp8_scales if pool.fp8_scales is not None else data
    key_meta_strides = key_meta.stride()[:5] if pool.key_meta is not None else (0,) * 5
    value_meta_strides = value_meta.stride()[:5] if pool.value_meta is not None else (0,) * 5
    fp8_strides = fp8_scales.stride() if pool.fp8_scales is not None else (0,) * 3
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_m))
    _paged_attention_kernel[grid](
        query, out, data, key_meta, value_meta, fp8_scales, block_tables, q_starts, ctx_starts,
        layer, scale, window or 0, sinks,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *data.stride()[:5], *key_meta_strides, *value_meta_strides, *fp8_strides,
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m,
        HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size, T_PAD=t_pad,
        HAS_WINDOW=window is not None, IS_DECODE=is_decode,
        USE_DOT=use_dot, IS_FP32=query.dtype == torch.float32 or upcast,
        KIND=KIND_IDS[kind], KEY_GROUP=max(pool.quant.key_group_tokens, 1),
        VALUE_GROUP=max(pool.quant.value_group_channels, 1),
    )  # fmt: skip
    return out


def decode_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: int = 0,
) -> torch.Tensor:
    """See ``reference.decode_attention``. Raises ValueError on a bad shape, dtype,
    device or stride. Pure."""
    num_seqs = query.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_lens,), sinks)
    return _launch(
        query, pool, layer, block_tables, context_lens, context_lens,
        num_seqs, 1, scale, window, sinks, is_decode=True,
    )  # fmt: skip


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
) -> torch.Tensor:
    """See ``reference.prefill_attention``; ``query_starts`` int32 [S + 1],
    ``context_starts`` int32 [S], every chunk at most ``max_query_len`` rows. Raises
    ValueError on a bad shape, dtype, device or stride. Pure."""
    num_seqs = context_starts.shape[0]
    check_attention_args(query, pool, layer, block_tables, num_seqs, (context_starts,), sinks)
    if query_starts.shape != (num_seqs + 1,) or query_starts.dtype != torch.int32:
        raise ValueError("query_starts must be int32 [num_seqs + 1]")
    return _launch(
        query, pool, layer, block_tables, query_starts, context_starts,
        num_seqs, max_query_len, scale, window, sinks, is_decode=False,
    )  # fmt: skip

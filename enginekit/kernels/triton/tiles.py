"""Triton device functions the attention kernels share: where a key tile's positions lie,
gathering a K/V tile of any number of tokens across pages through the block table, and
one step of the online softmax.

Key tiles are ``BLOCK_N`` consecutive *attended* positions, independent of the page
size: a tile may span several pages (each token finds its page through the block table)
and, with a window, the seam between the sinks and the window. Only attended positions
are ever addressed, so ``-1`` table padding and holes (released blocks between the sinks
and the window) are never dereferenced; every load is masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from enginekit.kernels.triton.quant import e4m3_to_float32, int4_dequantize


@triton.jit
def attended_span(first_pos, hi, window, sinks, HAS_WINDOW: tl.constexpr):
    """The keys queries at positions [first_pos, hi) attend, as (lo, sink_end, n): the
    sinks [0, sink_end) that lie before the window [lo, hi) of the first query, n keys
    in all (without a window, everything before hi). ``hi`` = 0 gives no keys."""
    lo = 0
    sink_end = 0
    if HAS_WINDOW:
        lo = tl.minimum(tl.maximum(first_pos - window + 1, 0), hi)
        sink_end = tl.minimum(lo, sinks)
    return lo, sink_end, sink_end + hi - lo


@triton.jit
def fp8_scales(fp8_ptr, layer, kv_head, stride_fl, stride_fkv, stride_fh, KIND: tl.constexpr):
    """(key scale, value scale) of one (layer, kv head) of an fp8 pool; (1, 1) for other
    kinds, whose pointer is not read."""
    k_scale = 1.0
    v_scale = 1.0
    if KIND == 1:
        scale_ptr = fp8_ptr + layer * stride_fl + kv_head * stride_fh
        k_scale = tl.load(scale_ptr)
        v_scale = tl.load(scale_ptr + stride_fkv)
    return k_scale, v_scale


@triton.jit
def attended_positions(index, sink_end, lo):
    """Positions of the attended keys numbered ``index``: the sinks ``[0, sink_end)``
    first, then the window ``[lo, ...)``. Without a window ``sink_end = lo = 0``."""
    return tl.where(index < sink_end, index, index - sink_end + lo)


@triton.jit
def load_kv_tile(
    data_ptr, kmeta_ptr, vmeta_ptr, bt_row_ptr, layer, kv_head, pos, pos_ok, d, d_ok,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    BLOCK_SIZE: tl.constexpr, KIND: tl.constexpr, KEY_GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr, HW_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """K and V tiles [N, D_PAD] in ``DOT_DTYPE`` of the keys at positions ``pos`` [N] of
    one (layer, kv head); 0 where ``pos_ok`` or ``d_ok`` is false, which are not read.

    fp8 tiles are the stored values *without* their (layer, head) scale, which the caller
    folds into the softmax scale (keys) and the output (values): decoded by the hardware
    when ``HW_FP8``, else from their bits. int4 tiles are dequantized in float32 with
    their group's float16 scale and zero point."""
    page = pos // BLOCK_SIZE
    slot = pos % BLOCK_SIZE
    block_id = tl.load(bt_row_ptr + page, mask=pos_ok, other=0).to(tl.int64)
    mask = pos_ok[:, None] & d_ok[None, :]
    head_base = block_id * stride_pb + layer * stride_pl + kv_head * stride_ph
    rows = data_ptr + head_base + slot * stride_pt
    if KIND == 2:
        byte = (d // 2)[None, :]
        shift = ((d % 2) * 4)[None, :]
        k_codes = (tl.load(rows[:, None] + byte, mask=mask, other=0).to(tl.int32) >> shift) & 15
        v_codes = (
            tl.load(rows[:, None] + stride_pkv + byte, mask=mask, other=0).to(tl.int32) >> shift
        ) & 15
        k_meta = (kmeta_ptr + block_id * stride_kmb + layer * stride_kml + kv_head * stride_kmh
                  + (slot // KEY_GROUP) * stride_kmg)[:, None] + d[None, :]  # fmt: skip
        v_meta = (vmeta_ptr + block_id * stride_vmb + layer * stride_vml + kv_head * stride_vmh
                  + slot * stride_vmt)[:, None] + (d // VALUE_GROUP)[None, :]  # fmt: skip
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
        k = tl.load(rows[:, None] + d[None, :], mask=mask, other=0)
        v = tl.load(rows[:, None] + stride_pkv + d[None, :], mask=mask, other=0)
        if KIND == 1:
            if HW_FP8:
                k = k.to(tl.float8e4nv, bitcast=True)
                v = v.to(tl.float8e4nv, bitcast=True)
            else:
                k = e4m3_to_float32(k)
                v = e4m3_to_float32(v)
    return k.to(DOT_DTYPE), v.to(DOT_DTYPE)


@triton.jit
def query_operand(q, DOT_DTYPE: tl.constexpr):
    """The query tile as a dot operand in ``DOT_DTYPE``; into float16 (an fp8 cache's
    dots) clamped to its finite range, so a bfloat16 query never becomes infinite."""
    if DOT_DTYPE == tl.float16:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0)
    return q.to(DOT_DTYPE)


@triton.jit
def scores(q, k, qk_scale, DOT_DTYPE: tl.constexpr):
    """q [R, D] · k [N, D]ᵀ × ``qk_scale`` in float32 (IEEE products for float32)."""
    if DOT_DTYPE == tl.float32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s * qk_scale


@triton.jit
def softmax_step(s, v, m, l_sum, acc, DOT_DTYPE: tl.constexpr):
    """One online-softmax step in base 2: scores ``s`` [R, N] already in log2 units
    (-inf where masked), values ``v`` [N, D]; returns the new running max ``m``, sum
    ``l_sum`` and unnormalised output ``acc`` [R, D]. A row with every score -inf so far
    keeps m = -inf, l_sum = 0, acc = 0."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_sum = l_sum * alpha + tl.sum(p, axis=1)
    if DOT_DTYPE == tl.float32:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(DOT_DTYPE), v)
    return m_new, l_sum, acc * alpha[:, None] + pv

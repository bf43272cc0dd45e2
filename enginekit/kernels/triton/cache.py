"""Triton kernels that move KV: writing new tokens into their slots (quantizing them), and
copying whole blocks (copy-on-write). Twins of ``reference.write_kv`` and
``reference.copy_blocks``; under the interpreter they match the references bit for bit.
Swaps cross devices and stay torch copies (``reference.swap_blocks``).

Writes by kind, one Triton launch each: ``none`` stores the tokens as they are; ``fp8``
divides each element by its (layer, K|V, kv head) scale and encodes it to e4m3 bits in
the same kernel (``float32_to_e4m3``: integer rounding, identical under the interpreter
and on every GPU, so the hardware float8 cast is not used; the write is memory-bound);
``int4`` quantizes each token's values and re-quantizes every key group the new tokens
fall in (``_write_int4_kernel``), after one torch sort of the slots, which makes each
group's new tokens one run without a host sync (it finds its run's ends itself).

Floating-point fusion: every kernel here launches with ``enable_fp_fusion=False``
(a launch option of Triton 3.6 and 3.9; the interpreter ignores it). Only the int4 write
depends on it: re-quantizing a key group dequantizes its earlier tokens as
``zero + code × scale``, which fused into an FMA rounds once where torch rounds twice,
and an ulp there can move a code. Pinned, results do not depend on Triton's default
(fusion on through 3.9) or ``TRITON_DEFAULT_FP_FUSION``.

Specialisation: Triton compiles a variant per value class of each integer argument (1,
divisible by 16, other). The layer index and the token count change from call to call, so
they are ``do_not_specialize``: one variant per pool configuration, not three per layer
class. The pool's strides are fixed per pool and the inputs' strides per model (views of
one projection), so they stay specialized: their divisibility lets loads vectorize.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginekit.kernels.checks import check_heads, check_index, check_pool, model_dtype
from enginekit.kernels.layout import KVTensors
from enginekit.kernels.quantize import check_fp8_scales
from enginekit.kernels.triton.quant import (
    KIND_IDS,
    float32_to_e4m3,
    int4_codes,
    int4_dequantize,
    int4_scale_zero,
)


@triton.jit(do_not_specialize=["layer"])
def _write_kv_kernel(
    k_ptr, v_ptr, slots_ptr, pool_ptr, fp8_scales_ptr, layer,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    KIND: tl.constexpr, NUM_KV_HEADS: tl.constexpr, H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Program i stores token i's K and V (every kv head) at slot slots[i] (< 0: skip):
    as they are (KIND none, ``pool_ptr`` in the model dtype) or, for fp8, divided by the
    layer's scales (``fp8_scales_ptr``: contiguous float32 [layers, 2, kv heads]) and
    encoded to e4m3 bytes (``pool_ptr`` viewed as uint8)."""
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
    if KIND == 1:  # fp8
        h_ok = h < NUM_KV_HEADS
        scales = fp8_scales_ptr + layer * (2 * NUM_KV_HEADS) + h
        k_scale = tl.load(scales, mask=h_ok, other=1.0)
        v_scale = tl.load(scales + NUM_KV_HEADS, mask=h_ok, other=1.0)
        k_code = float32_to_e4m3(tl.math.div_rn(k.to(tl.float32), k_scale[:, None]))
        v_code = float32_to_e4m3(tl.math.div_rn(v.to(tl.float32), v_scale[:, None]))
        tl.store(dst, k_code.to(tl.uint8), mask=mask)
        tl.store(dst + stride_pkv, v_code.to(tl.uint8), mask=mask)
    else:
        tl.store(dst, k, mask=mask)
        tl.store(dst + stride_pkv, v, mask=mask)


@triton.jit
def _group_stats(x_full, c, c_ok, channels, GROUP: tl.constexpr):
    """float32 min/max, for each of ``channels``, over the channels of its group of
    ``GROUP`` consecutive channels in the row ``x_full`` (channels ``c``, valid ``c_ok``)."""
    member = (c[None, :] // GROUP == (channels // GROUP)[:, None]) & c_ok[None, :]
    lo = tl.min(tl.where(member, x_full[None, :], float("inf")), axis=1)
    hi = tl.max(tl.where(member, x_full[None, :], float("-inf")), axis=1)
    return lo, hi


@triton.jit(do_not_specialize=["layer", "num_tokens"])
def _write_int4_kernel(
    k_ptr, v_ptr, sorted_slots_ptr, order_ptr,
    data_ptr, kmeta_ptr, vmeta_ptr, layer, num_tokens,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_pb, stride_pl, stride_pkv, stride_ph, stride_pt,
    stride_kmb, stride_kml, stride_kmh, stride_kmg, stride_kms,
    stride_vmb, stride_vml, stride_vmh, stride_vmt, stride_vms,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, KEY_GROUP: tl.constexpr, KG_PAD: tl.constexpr,
    VALUE_GROUP: tl.constexpr,
):  # fmt: skip
    """Program (i, kv head h) over the ``num_tokens`` new tokens sorted by slot (token
    ``order[i]`` at slot ``sorted_slots[i]``, skipped when negative). It quantizes that
    token's values per group of channels, and, when it is the last new token of its key
    group (the next sorted slot, if any, lies past the group), re-quantizes the group per
    channel over the tokens before the group's new ones (dequantized from the pool) and
    the new ones; codes after them are 0. The new tokens of a group have consecutive
    slots, so they are the sorted run ending at i whose slots step by one, found by
    reading the at most KEY_GROUP - 1 sorted slots before i. Codes are handled as
    even/odd channel halves, the two nibbles of a byte."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(sorted_slots_ptr + i)
    row = tl.load(order_ptr + i)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    j = tl.arange(0, HALF_PAD)
    j_ok = j < HALF
    even = 2 * j
    odd = 2 * j + 1
    c = tl.arange(0, D_PAD)
    c_ok = c < HEAD_DIM
    # Scalar conditions enter masks as vectors (the interpreter refuses scalar masks).
    j_active = j_ok & (j * 0 + slot >= 0)
    head_base = data_ptr + block * stride_pb + layer * stride_pl + h * stride_ph

    # Values: one (scale, zero) per group of VALUE_GROUP channels of this token.
    v_row = v_ptr + row * stride_vt + h * stride_vh
    x_full = tl.load(v_row + c, mask=c_ok & (c * 0 + slot >= 0), other=0.0).to(tl.float32)
    x_even = tl.load(v_row + even, mask=j_active, other=0.0).to(tl.float32)
    x_odd = tl.load(v_row + odd, mask=j_active, other=0.0).to(tl.float32)
    lo, hi = _group_stats(x_full, c, c_ok, even, VALUE_GROUP)
    scale_even, zero_even = int4_scale_zero(lo, hi)
    lo, hi = _group_stats(x_full, c, c_ok, odd, VALUE_GROUP)
    scale_odd, zero_odd = int4_scale_zero(lo, hi)
    codes = int4_codes(x_even, scale_even, zero_even, j_ok) | (
        int4_codes(x_odd, scale_odd, zero_odd, j_ok) << 4
    )
    v_ok = j_active
    tl.store(head_base + stride_pkv + offset * stride_pt + j, codes.to(tl.uint8), mask=v_ok)
    v_meta = (vmeta_ptr + block * stride_vmb + layer * stride_vml + h * stride_vmh
              + offset * stride_vmt)  # fmt: skip
    first_even = v_ok & (even % VALUE_GROUP == 0)  # a group's first channel stores its meta
    first_odd = v_ok & (odd % VALUE_GROUP == 0)
    tl.store(v_meta + even // VALUE_GROUP, scale_even, mask=first_even)
    tl.store(v_meta + stride_vms + even // VALUE_GROUP, zero_even, mask=first_even)
    tl.store(v_meta + odd // VALUE_GROUP, scale_odd, mask=first_odd)
    tl.store(v_meta + stride_vms + odd // VALUE_GROUP, zero_odd, mask=first_odd)

    # Keys: the last new token of a group re-quantizes the whole group. The group's
    # slot group_first_slot + t, when new, sits at sorted index i - last_off + t.
    group_first_slot = (slot // KEY_GROUP) * KEY_GROUP
    last_off = slot - group_first_slot
    next_slot = tl.load(sorted_slots_ptr + tl.minimum(i + 1, num_tokens - 1))
    is_last = ((i + 1 == num_tokens) | (next_slot >= group_first_slot + KEY_GROUP)).to(tl.int32)
    group_index = offset // KEY_GROUP
    t = tl.arange(0, KG_PAD)
    t_ok = t < KEY_GROUP
    at = i - last_off + t
    in_run = t_ok & (t <= last_off) & (at >= 0)
    run_slots = tl.load(sorted_slots_ptr + at, mask=in_run, other=-1)
    # The run's first offset: one past the last offset before last_off whose slot is
    # not new (0 when every offset up to last_off is).
    is_gap = (t <= last_off) & (run_slots != group_first_slot + t)
    first_off = tl.max(tl.where(is_gap, t, -1), axis=0) + 1
    j_key = j_active & (j * 0 + is_last != 0)  # this program re-quantizes the group
    t_key = (t * 0 + slot >= 0) & (t * 0 + is_last != 0)
    is_new = (t >= first_off) & (t <= last_off)
    valid = t_ok & (t <= last_off)
    k_rows = head_base + (group_index * KEY_GROUP + t)[:, None] * stride_pt + j[None, :]
    old_mask = (t_key & (t < first_off))[:, None] & j_key[None, :]
    old_bytes = tl.load(k_rows, mask=old_mask, other=0).to(tl.int32)
    k_meta = (kmeta_ptr + block * stride_kmb + layer * stride_kml + h * stride_kmh
              + group_index * stride_kmg)  # fmt: skip
    meta_ok = j_key
    new_rows = tl.load(order_ptr + at, mask=t_key & is_new, other=0)
    new_base = k_ptr + new_rows[:, None] * stride_kt + h * stride_kh
    new_mask = (t_key & is_new)[:, None] & j_key[None, :]
    all_codes = tl.zeros([KG_PAD, HALF_PAD], tl.int32)
    for nibble in tl.static_range(2):
        channels = 2 * j + nibble
        old = int4_dequantize(
            (old_bytes >> (4 * nibble)) & 15,
            tl.load(k_meta + channels, mask=meta_ok, other=0.0)[None, :],
            tl.load(k_meta + stride_kms + channels, mask=meta_ok, other=0.0)[None, :],
        )
        new = tl.load(new_base + channels[None, :], mask=new_mask, other=0.0).to(tl.float32)
        x = tl.where(is_new[:, None], new, old)
        lo = tl.min(tl.where(valid[:, None], x, float("inf")), axis=0)
        hi = tl.max(tl.where(valid[:, None], x, float("-inf")), axis=0)
        scale, zero = int4_scale_zero(lo, hi)
        all_codes = all_codes | (
            int4_codes(x, scale[None, :], zero[None, :], valid[:, None]) << (4 * nibble)
        )
        tl.store(k_meta + channels, scale, mask=meta_ok)
        tl.store(k_meta + stride_kms + channels, zero, mask=meta_ok)
    tl.store(k_rows, all_codes.to(tl.uint8), mask=(t_key & t_ok)[:, None] & j_key[None, :])


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


def _write_dense(
    pool: KVTensors, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """none or fp8 (whose scales are checked): one launch, one program per token."""
    kind = pool.quant.kind
    data = pool.data.view(torch.uint8) if kind == "fp8" else pool.data
    # The kernel indexes the whole scale tensor; none passes any tensor, never read.
    scales = pool.fp8_scales if pool.fp8_scales is not None else data
    num_kv_heads, block_size, head_dim = data.shape[3:]
    _write_kv_kernel[(key.shape[0],)](
        key, value, slots, data, scales, layer,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *data.stride()[:5],
        KIND=KIND_IDS[kind], NUM_KV_HEADS=num_kv_heads,
        H_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
        enable_fp_fusion=False,
    )  # fmt: skip


def _write_int4(
    pool: KVTensors, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """One sort (each key group's new tokens become one run of sorted slots, without a
    host sync), then one launch, one program per (token, kv head)."""
    assert pool.key_meta is not None and pool.value_meta is not None
    num_tokens = slots.shape[0]
    key_group = pool.quant.key_group_tokens
    sorted_slots, order = torch.sort(slots)
    head_dim = pool.head_dim
    half = head_dim // 2
    _write_int4_kernel[(num_tokens, pool.num_kv_heads)](
        key, value, sorted_slots, order,
        pool.data, pool.key_meta, pool.value_meta, layer, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *pool.data.stride()[:5], *pool.key_meta.stride()[:5], *pool.value_meta.stride()[:5],
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim),
        HALF=half, HALF_PAD=triton.next_power_of_2(half), BLOCK_SIZE=pool.block_size,
        KEY_GROUP=key_group, KG_PAD=triton.next_power_of_2(key_group),
        VALUE_GROUP=pool.quant.value_group_channels, enable_fp_fusion=False,
    )  # fmt: skip


def write_kv(
    pool: KVTensors, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """See ``reference.write_kv`` (same contract, same stored bits). Raises ValueError on a
    bad shape, dtype, device or stride, and for NaN (unset) fp8 scales. Mutates ``pool``."""
    check_pool(pool, layer)
    dtype = model_dtype(pool)
    check_heads(key, pool, "key", pool.num_kv_heads, dtype)
    check_heads(value, pool, "value", pool.num_kv_heads, dtype)
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError("key and value must have the same number of tokens")
    check_index(slots, "slots", torch.int64, (num_tokens,), pool.data.device)
    if pool.quant.kind == "fp8":
        check_fp8_scales(pool, layer)
    if num_tokens == 0:
        return
    if pool.quant.kind == "int4":
        _write_int4(pool, layer, key, value, slots)
    else:
        _write_dense(pool, layer, key, value, slots)


def copy_blocks(pool: KVTensors, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor) -> None:
    """See ``reference.copy_blocks``: every block tensor (data, int4 scales/zeros), one
    Triton copy per tensor; ids int64 [n] on the pool's device. Mutates ``pool``."""
    check_pool(pool, 0)
    num_pairs = src_block_ids.shape[0]
    device = pool.data.device
    check_index(src_block_ids, "src_block_ids", torch.int64, (num_pairs,), device)
    check_index(dst_block_ids, "dst_block_ids", torch.int64, (num_pairs,), device)
    if num_pairs == 0:
        return
    for tensor in pool.block_tensors:
        flat = tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor
        block_numel = flat[0].numel()
        chunk = min(4096, triton.next_power_of_2(block_numel))
        grid = (num_pairs, triton.cdiv(block_numel, chunk))
        _copy_blocks_kernel[grid](flat, src_block_ids, dst_block_ids, BLOCK_NUMEL=block_numel,
                                  CHUNK=chunk, enable_fp_fusion=False)  # fmt: skip

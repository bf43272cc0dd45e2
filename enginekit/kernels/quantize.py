"""Pure-torch quantize / dequantize of KV elements: the arithmetic of the storage
formats of ``enginekit.kernels.layout``, shared by the references and the tests; the
Triton kernels implement the same operations in the same order, so their results agree
bit for bit under the interpreter.

fp8 (e4m3, one float32 scale per (layer, K|V, kv head))::

    stored = float8_e4m3fn(clamp(x / scale, -448, 448))      value ≈ stored × scale

int4 (asymmetric, float16 scale and zero per group; ``quantize_int4_groups``): over the
valid elements of a group, in float32, ``zero = fp16(min)``,
``scale = fp16(max(max - zero, 0) / 15)`` and
``code = clamp(floor((x - zero) / scale + 0.5), 0, 15)`` (0 where ``scale`` is 0 or the
element is not valid); ``value ≈ zero + code × scale``. Each element is then within
``max(scale / 2, |zero - min|, max - (zero + 15 × scale))`` of its value (plus float32
rounding): ``scale / 2`` except for the float16 rounding of zero and scale. Codes pack
two per byte: channel ``2i`` in the low nibble of byte ``i``, ``2i + 1`` in the high one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from enginekit.kernels.layout import KVTensors

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT4_MAX = 15
KEY, VALUE = 0, 1


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``float8_e4m3fn(clamp(x / scale, -448, 448))`` computed in float32; ``scale``
    broadcasts against ``x`` (e.g. [kv_heads, 1] for x [N, kv_heads, head_dim]). Values
    beyond the range saturate to ±448 instead of becoming NaN. Pure."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_fp8(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``stored × scale`` in float32 (``scale`` broadcasts). Pure."""
    return stored.float() * scale.float()


def check_fp8_scales(pool: KVTensors, layer: int) -> torch.Tensor:
    """The fp8 scales [2, kv_heads] of ``layer``. Raises ValueError when the pool has none
    (a host pool) or when they are not set yet (calibration or the checkpoint sets them,
    through ``KVTensors.set_fp8_scales``, before the first write). Checks on the host only."""
    if pool.fp8_scales is None:
        raise ValueError("this fp8 pool has no scales (a host pool cannot be written)")
    if not pool.fp8_layers_set[layer]:
        raise ValueError(
            f"fp8 KV scales of layer {layer} are not set: calibrate or load them before "
            "writing the cache"
        )
    return pool.fp8_scales[layer]


class Int4Groups(NamedTuple):
    """Unpacked codes (uint8 in 0..15, the shape of the input) and float16 ``scale`` /
    ``zero`` [..., num_groups] (one per group of the last axis)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


def quantize_int4_groups(
    x: torch.Tensor, group_size: int, valid: torch.Tensor | None = None
) -> Int4Groups:
    """Quantizes ``x`` [..., n] in groups of ``group_size`` consecutive elements of the
    last axis (``group_size`` divides n) by the module's rule. ``valid`` (bool,
    broadcastable to ``x``) excludes elements from their group's min/max and gives them
    code 0; a group with no valid element gets scale 0 and zero 0. Pure."""
    *lead, n = x.shape
    if n % group_size:
        raise ValueError(f"group size {group_size} does not divide {n}")
    groups = x.float().reshape(*lead, n // group_size, group_size)
    if valid is None:
        ok = torch.ones_like(groups, dtype=torch.bool)
    else:
        ok = valid.expand(x.shape).reshape(groups.shape)
    lo = groups.masked_fill(~ok, float("inf")).amin(-1)
    hi = groups.masked_fill(~ok, float("-inf")).amax(-1)
    empty = ~ok.any(-1)
    lo, hi = lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0)
    zero = lo.to(torch.float16)
    scale = ((hi - zero.float()).clamp(min=0.0) / INT4_MAX).to(torch.float16)
    zero_f, scale_f = zero.float()[..., None], scale.float()[..., None]
    is_zero = scale_f == 0
    ratio = (groups - zero_f) / torch.where(is_zero, 1.0, scale_f)
    codes = torch.floor(ratio + 0.5).clamp(0, INT4_MAX)
    codes = torch.where(ok & ~is_zero, codes, 0.0).to(torch.uint8)
    return Int4Groups(codes.reshape(x.shape), scale, zero)


def dequantize_int4(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``zero + code × scale`` in float32, where ``scale``/``zero`` [..., n / group_size]
    hold one entry per group of ``group_size`` elements of the last axis of ``codes``
    [..., n] (unpacked). Pure."""
    scale_f = scale.float().repeat_interleave(group_size, dim=-1)
    zero_f = zero.float().repeat_interleave(group_size, dim=-1)
    return zero_f + codes.float() * scale_f


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2m] (values 0..15) -> bytes [..., m]: code ``2i`` in the low
    nibble of byte ``i``, ``2i + 1`` in the high nibble. Pure."""
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_int4``: bytes [..., m] -> codes [..., 2m] (uint8). Pure."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], -1)


def dequantize_blocks(
    pool: KVTensors, layer: int, block_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``layer`` in blocks ``block_ids`` (int64 [n], on the pool's
    device), each [n, kv_heads, block_size, head_dim]: float32 for fp8/int4, the stored
    dtype for ``none``. Dequantizes only those blocks (never the pool). Every slot of a
    block is decoded, including unwritten ones (garbage the caller must mask); NaN fp8
    scales (unset) give NaN. Raises ValueError for an fp8 pool without scales. Pure."""
    data = pool.data[block_ids, layer]  # [n, 2, kvh, bs, stored_dim]
    kind = pool.quant.kind
    if kind == "none":
        return data[:, KEY], data[:, VALUE]
    if kind == "fp8":
        if pool.fp8_scales is None:
            raise ValueError("this fp8 pool has no scales")
        scales = pool.fp8_scales[layer][:, :, None, None]  # [2, kvh, 1, 1]
        return (
            dequantize_fp8(data[:, KEY], scales[KEY]),
            dequantize_fp8(data[:, VALUE], scales[VALUE]),
        )
    assert pool.key_meta is not None and pool.value_meta is not None
    codes = unpack_int4(data)  # [n, 2, kvh, bs, d]
    key_meta = pool.key_meta[block_ids, layer]  # [n, kvh, key_groups, 2, d]
    value_meta = pool.value_meta[block_ids, layer]  # [n, kvh, bs, 2, value_groups]
    key_group = pool.quant.key_group_tokens
    # Keys: one (scale, zero) per channel per group of tokens; move tokens last.
    key = dequantize_int4(
        codes[:, KEY].transpose(-1, -2),
        key_meta[..., 0, :].transpose(-1, -2),
        key_meta[..., 1, :].transpose(-1, -2),
        key_group,
    ).transpose(-1, -2)
    value = dequantize_int4(
        codes[:, VALUE], value_meta[..., 0, :], value_meta[..., 1, :],
        pool.quant.value_group_channels,
    )  # fmt: skip
    return key, value

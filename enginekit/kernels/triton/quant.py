"""Triton device functions for the KV storage formats, twins of
``enginekit.kernels.quantize`` (same operations in the same order, so the interpreter
matches the references bit for bit; on a GPU too where the launch pins
``enable_fp_fusion=False``, since ``int4_dequantize`` is a multiply-add a compiler may
otherwise fuse into one FMA, rounded once instead of twice).

fp8 is decoded from its bits (``e4m3_to_float32``) and encoded into them
(``float32_to_e4m3``) with integer operations rather than float8 casts: that works under
``TRITON_INTERPRET=1``, where float8 loads and casts are wrong, and on GPUs without native
fp8 conversions, and rounds the same everywhere. Kinds are numbered for ``tl.constexpr``
dispatch.
"""

from __future__ import annotations

import triton
import triton.language as tl

KIND_IDS = {"none": 0, "fp8": 1, "int4": 2}


@triton.jit
def e4m3_to_float32(bits):
    """float8_e4m3fn bytes (any integer type) -> float32: sign, 4-bit exponent with bias 7,
    3-bit mantissa, subnormals at exponent 0, NaN at 0x7F/0xFF (no infinities)."""
    b = bits.to(tl.int32) & 0xFF
    exponent = (b >> 3) & 15
    mantissa = b & 7
    # 2^(exponent - 10) built from its bits: exact, and never an fp32 subnormal.
    power = ((exponent + 117) << 23).to(tl.float32, bitcast=True)
    magnitude = tl.where(
        exponent == 0, mantissa.to(tl.float32) * 0.001953125, (8 + mantissa).to(tl.float32) * power
    )
    magnitude = tl.where((b & 0x7F) == 0x7F, float("nan"), magnitude)
    return tl.where((b & 0x80) != 0, -magnitude, magnitude)


@triton.jit
def float32_to_e4m3(x):
    """float32 -> float8_e4m3fn bits (int32 in 0..255), ``quantize_fp8``'s
    ``clamp(x, -448, 448)`` then cast: magnitudes past 448 (infinities too) saturate to
    448 (0x7E); the rest round to the nearest e4m3 value, ties to even, which below 2^-6
    is a subnormal multiple of 2^-9 (0x08, 2^-6, when it rounds up that far); NaN gives
    0x7F. The sign bit is kept (-0.0 -> 0x80, NaN -> 0x7F or 0xFF)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    # Non-negative float bits order like their values: saturating them saturates x.
    magnitude = tl.minimum(bits & 0x7FFFFFFF, 0x43E00000)  # 448 = 1.75 × 2^8
    exponent = magnitude >> 23
    # Normal (exponent >= 121, i.e. >= 2^-6): keep 3 of the 23 mantissa bits, rounding
    # on the 20 dropped, and rebias the exponent from 127 to 7 (a carry bumps it).
    kept = magnitude >> 20
    dropped = magnitude & 0xFFFFF
    round_up = (dropped > 0x80000) | ((dropped == 0x80000) & ((kept & 1) == 1))
    normal = kept + round_up.to(tl.int32) - (120 << 3)
    # Subnormal: x × 2^9 rounded to an integer, i.e. the 24-bit significand (implicit
    # bit included; none for a float32 subnormal, whose exponent counts as 1) shifted
    # right by 141 - exponent. Shifts of 25 and more give 0, so capping at 30 keeps
    # the shift below 32 without changing a result.
    significand = tl.where(exponent > 0, (magnitude & 0x7FFFFF) | 0x800000, magnitude)
    shift = tl.minimum(141 - tl.maximum(exponent, 1), 30)
    quotient = significand >> shift
    remainder = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    round_up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    subnormal = quotient + round_up.to(tl.int32)
    code = tl.where(exponent >= 121, normal, subnormal)
    code = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7F, code)
    return code | sign


@triton.jit
def int4_scale_zero(lo, hi):
    """float32 min/max of a group -> (float16 scale, float16 zero), the module rule:
    zero = fp16(lo), scale = fp16(max(hi - zero, 0) / 15)."""
    zero = lo.to(tl.float16)
    scale = tl.math.div_rn(tl.maximum(hi - zero.to(tl.float32), 0.0), 15.0).to(tl.float16)
    return scale, zero


@triton.jit
def int4_codes(x, scale, zero, valid):
    """int32 codes clamp(floor((x - zero) / scale + 0.5), 0, 15); 0 where the scale is 0
    or the element is not ``valid``. ``scale``/``zero`` float16, broadcast against ``x``."""
    scale_f = scale.to(tl.float32)
    is_zero = scale_f == 0.0
    ratio = tl.math.div_rn(x - zero.to(tl.float32), tl.where(is_zero, 1.0, scale_f))
    codes = tl.minimum(tl.maximum(tl.floor(ratio + 0.5), 0.0), 15.0)
    return tl.where(valid & ~is_zero, codes, 0.0).to(tl.int32)


@triton.jit
def int4_dequantize(codes, scale, zero):
    """zero + code × scale in float32."""
    return zero.to(tl.float32) + codes.to(tl.float32) * scale.to(tl.float32)

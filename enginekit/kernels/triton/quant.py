"""Triton device functions for the KV storage formats, twins of
``enginekit.kernels.quantize`` (same operations in the same order, so the interpreter
matches the references bit for bit; on a GPU, fused multiply-adds may differ by an ulp).

fp8 is decoded from its bits (``e4m3_to_float32``) rather than by a float8 cast: that
works under ``TRITON_INTERPRET=1``, where loading float8_e4m3fn is wrong, and on GPUs
without native fp8 conversions. Kinds are numbered for ``tl.constexpr`` dispatch.
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

"""The pure-torch KV quantization (``enginekit.kernels.quantize``) and the references that
use it (``enginekit.kernels.reference``): fp8 and int4 error bounds, the int4 storage
layout, the key-group re-quantization, copies and swaps of every block tensor, attention
over quantized pools and attention sinks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit.kernels import reference
from enginekit.kernels.layout import KVTensors, allocate_kv_tensors
from enginekit.kernels.quantize import (
    FP8_MAX,
    dequantize_fp8,
    dequantize_int4,
    pack_int4,
    quantize_fp8,
    quantize_int4_groups,
    unpack_int4,
)
from enginekit.spec.kv import KVSpec
from enginekit.spec.quant import KVQuant

torch.set_num_threads(1)

HEAD_DIM = 16
BLOCK_SIZE = 8
NUM_KV_HEADS = 2
QUANTS = {
    "none": KVQuant(),
    "fp8": KVQuant("fp8"),
    "int4-g4": KVQuant.int4(4, BLOCK_SIZE, HEAD_DIM),
    "int4-g8": KVQuant.int4(8, BLOCK_SIZE, HEAD_DIM),
    "int4-g16": KVQuant.int4(16, BLOCK_SIZE, HEAD_DIM),  # keys capped by the block: 8
}
SETTINGS = settings(max_examples=60, deadline=None)


def spec_of(quant: KVQuant, num_layers: int = 2, model_bits: int = 32) -> KVSpec:
    return KVSpec(
        num_layers, NUM_KV_HEADS, HEAD_DIM, quant.bits_per_element(model_bits), BLOCK_SIZE, quant
    )


def make_pool(quant: KVQuant, num_blocks: int = 8, dtype=torch.float32) -> KVTensors:
    """A zeroed pool; fp8 scales set to 4 / 448 (randn K/V hardly saturate)."""
    pool = allocate_kv_tensors(spec_of(quant), num_blocks, dtype, "cpu")
    if pool.fp8_scales is not None:
        pool.set_fp8_scales(None, torch.tensor(4.0 / FP8_MAX))
    return pool


def slots_of(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return table[positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE


def random_kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(n, 2, NUM_KV_HEADS, HEAD_DIM, generator=g)
    return kv[:, 0], kv[:, 1]


def fill(pool: KVTensors, table: torch.Tensor, key, value, chunks, layer: int = 1) -> None:
    """Writes the sequence's tokens in position order, in chunks of the given sizes."""
    start = 0
    for size in chunks:
        positions = torch.arange(start, start + size)
        reference.write_kv(pool, layer, key[start:start + size], value[start:start + size],
                           slots_of(table, positions))  # fmt: skip
        start += size
    assert start == key.shape[0]


def naive_attention(query, key, value, positions, scale, window, sinks):
    """float64 attention with an explicit per-(query, key) mask; key/value [kvh, L, d]."""
    num_queries, num_heads, _ = query.shape
    group = num_heads // key.shape[0]
    out = torch.zeros(num_queries, num_heads, key.shape[2], dtype=torch.float64)
    for m, p in enumerate(positions.tolist()):
        visible = [
            k for k in range(key.shape[1])
            if k <= p and (window is None or k > p - window or k < sinks)
        ]  # fmt: skip
        for h in range(num_heads):
            kk = key[h // group, visible].double()
            vv = value[h // group, visible].double()
            probs = torch.softmax(kk @ query[m, h].double() * scale, dim=0)
            out[m, h] = probs @ vv
    return out


# fp8 ---------------------------------------------------------------------------------------

finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@SETTINGS
@given(st.lists(finite, min_size=1, max_size=64), st.floats(1e-3, 10.0))
def test_fp8_round_trip_is_within_half_an_e4m3_step(values, scale):
    x = torch.tensor(values)
    s = torch.tensor(scale)
    back = dequantize_fp8(quantize_fp8(x, s), s)
    inside = x.abs() <= FP8_MAX * scale
    # 3 mantissa bits: relative error 2^-4; subnormals (below 2^-6) step 2^-9.
    bound = torch.maximum(x.abs() * 2.0**-4, torch.full_like(x, 2.0**-10 * scale))
    assert bool(((back - x).abs() <= bound * (1 + 1e-6))[inside].all())
    assert bool(torch.isfinite(back).all())


def test_fp8_saturates_beyond_the_range_instead_of_nan():
    scale = torch.tensor(0.5)
    x = torch.tensor([1e6, -1e6, 448 * 0.5 * 1.5, -448 * 0.5 - 1, 224.0])
    back = dequantize_fp8(quantize_fp8(x, scale), scale)
    assert back.tolist() == [224.0, -224.0, 224.0, -224.0, 224.0]


def test_fp8_writes_refuse_unset_scales():
    pool = allocate_kv_tensors(spec_of(KVQuant("fp8")), 4, torch.float32, "cpu")
    key, value = random_kv(3, 0)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="not set"):
        reference.write_kv(pool, 0, key, value, slots)
    pool.set_fp8_scales(0, torch.tensor(0.01))
    reference.write_kv(pool, 0, key, value, slots)  # layer 0 is set
    with pytest.raises(ValueError, match="layer 1"):
        reference.write_kv(pool, 1, key, value, slots)
    host = allocate_kv_tensors(
        spec_of(KVQuant("fp8")), 4, torch.float32, "cpu", with_fp8_scales=False
    )
    with pytest.raises(ValueError, match="no scales"):
        reference.write_kv(host, 0, key, value, slots)


def test_fp8_pool_stores_scaled_e4m3():
    pool = make_pool(QUANTS["fp8"])
    assert pool.fp8_scales is not None
    scales = pool.fp8_scales[1].clone()
    scales[1, 1] = 0.25  # the values of kv head 1
    pool.set_fp8_scales(1, scales)
    key, value = random_kv(2, 1)
    reference.write_kv(pool, 1, key, value, torch.tensor([9, -1]))
    stored = pool.data[1, 1, 1, 1, 1]
    assert stored.dtype == torch.float8_e4m3fn
    assert torch.equal(stored, (value[0, 1] / 0.25).to(torch.float8_e4m3fn))


# int4 --------------------------------------------------------------------------------------


def test_int4_nibble_order():
    codes = torch.tensor([[1, 2, 15, 0, 7, 9]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x0F, 0x97]]
    assert torch.equal(unpack_int4(packed), codes)
    # In the pool: one value group of the whole head, values on the grid 0..15.
    pool = make_pool(KVQuant.int4(HEAD_DIM, BLOCK_SIZE, HEAD_DIM))
    value = torch.zeros(1, NUM_KV_HEADS, HEAD_DIM)
    value[0, 0] = torch.tensor([3, 12, 0, 15] + [1] * 12, dtype=torch.float32)
    reference.write_kv(pool, 0, torch.zeros_like(value), value, torch.tensor([BLOCK_SIZE + 2]))
    assert pool.data[1, 0, 1, 0, 2, :2].tolist() == [0xC3, 0xF0]
    assert pool.value_meta is not None
    assert pool.value_meta[1, 0, 0, 2, :, 0].tolist() == [1.0, 0.0]  # scale, zero


def test_int4_group_shapes():
    x = torch.randn(3, 5, 16)
    q = quantize_int4_groups(x, 4)
    assert q.codes.shape == (3, 5, 16) and q.codes.dtype == torch.uint8
    assert q.scale.shape == q.zero.shape == (3, 5, 4) and q.scale.dtype == torch.float16
    assert int(q.codes.max()) <= 15
    for name, quant in QUANTS.items():
        if quant.kind != "int4":
            continue
        pool = make_pool(quant, num_blocks=3)
        assert pool.data.shape == (3, 2, 2, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM // 2), name
        assert pool.key_meta is not None and pool.value_meta is not None
        key_groups = BLOCK_SIZE // quant.key_group_tokens
        assert pool.key_meta.shape == (3, 2, NUM_KV_HEADS, key_groups, 2, HEAD_DIM)
        value_groups = HEAD_DIM // quant.value_group_channels
        assert pool.value_meta.shape == (3, 2, NUM_KV_HEADS, BLOCK_SIZE, 2, value_groups)


@SETTINGS
@given(
    st.lists(st.integers(0, 15), min_size=6, max_size=6),
    st.integers(-8, 2),
    st.integers(-512, 512),
)
def test_int4_reconstructs_values_on_the_grid_exactly(inner, exponent, zero_units):
    scale = 2.0**exponent
    zero = zero_units * 2.0**-4
    codes = torch.tensor([0, 15, *inner], dtype=torch.float32)
    x = zero + codes * scale
    q = quantize_int4_groups(x[None], 8)
    assert q.scale.item() == scale and q.zero.item() == zero
    assert torch.equal(q.codes[0].float(), codes)
    assert torch.equal(dequantize_int4(q.codes, q.scale, q.zero, 8)[0], x)


@SETTINGS
@given(
    st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=24, max_size=24),
    st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24]),
)
def test_int4_error_is_half_a_step(values, group):
    x = torch.tensor(values)[None]
    q = quantize_int4_groups(x, group)
    back = dequantize_int4(q.codes, q.scale, q.zero, group)
    grouped = x.reshape(*x.shape[:-1], -1, group)
    lo, hi = grouped.amin(-1), grouped.amax(-1)
    scale, zero = q.scale.float(), q.zero.float()
    # scale / 2, except where float16 rounding of zero/scale moved the grid's ends.
    bound = torch.stack([scale / 2, (zero - lo).abs(), hi - (zero + 15 * scale)]).amax(0)
    bound = bound.repeat_interleave(group, -1) + 1e-5 * x.abs() + 1e-6
    assert bool(((back - x).abs() <= bound).all())
    assert bool((q.scale >= 0).all())


def test_int4_constant_group_has_zero_scale_and_codes():
    q = quantize_int4_groups(torch.full((1, 8), 0.5), 4)
    assert q.scale.tolist() == [[0.0, 0.0]] and q.zero.tolist() == [[0.5, 0.5]]
    assert q.codes.sum() == 0
    # 0.1 is no float16: zero rounds below it and a tiny scale covers the rest.
    q = quantize_int4_groups(torch.full((1, 4), 0.1), 4)
    back = dequantize_int4(q.codes, q.scale, q.zero, 4)
    assert torch.allclose(back, torch.full((1, 4), 0.1), rtol=1e-5)


def test_int4_invalid_elements_are_ignored():
    x = torch.tensor([[0.0, 1.0, 1e30, float("nan")]])
    valid = torch.tensor([[True, True, False, False]])
    q = quantize_int4_groups(x, 4, valid)
    assert q.zero.item() == 0.0 and q.scale.item() == pytest.approx(1 / 15, rel=1e-3)
    assert q.codes.tolist() == [[0, 15, 0, 0]]


@pytest.mark.parametrize("name", ["int4-g4", "int4-g8"])
@pytest.mark.parametrize("seed", range(6))
def test_int4_key_groups_requantize_as_tokens_arrive(name, seed):
    """Writing a block one token at a time: each write re-quantizes the key group over
    the tokens already there (dequantized) and the new one. Values (per token) come out
    identical to one write; keys stay within two grid steps of it (re-rounding on a grid
    that grows can add a step: see the report), on average well within one."""
    quant = QUANTS[name]
    one, each = make_pool(quant), make_pool(quant)
    table = torch.tensor([5, 2], dtype=torch.int32)
    n = 2 * BLOCK_SIZE - 3
    key, value = random_kv(n, seed)
    fill(one, table, key, value, [n])
    fill(each, table, key, value, [1] * n)
    k_one, v_one = reference.gather_kv(one, 1, table, n)
    k_each, v_each = reference.gather_kv(each, 1, table, n)
    assert torch.equal(v_one, v_each)
    assert one.key_meta is not None
    step = one.key_meta[table.long(), 1, :, :, 0].float()  # [2, kvh, groups, d]
    step = step.repeat_interleave(quant.key_group_tokens, dim=2)  # [2, kvh, bs, d]
    step = step.transpose(0, 1).reshape(NUM_KV_HEADS, 2 * BLOCK_SIZE, HEAD_DIM)[:, :n]
    truth = key.transpose(0, 1)
    # A group of one token has scale 0: its error is float16's rounding of the zero.
    slack = 2.0**-11 * truth.abs() + 1e-7
    assert bool(((k_one - k_each).abs() <= 2.05 * step + slack).all())
    assert float(((k_one - k_each).abs() / (step + slack)).mean()) <= 0.5
    assert bool(((k_each - truth).abs() <= 2.05 * step + slack).all())


def test_int4_key_group_ignores_garbage_past_the_last_written_token():
    quant = QUANTS["int4-g8"]
    clean, dirty = make_pool(quant), make_pool(quant)
    assert dirty.key_meta is not None
    dirty.data[3] = 0xFF  # codes 15 ...
    dirty.key_meta[3] = 1000.0  # ... that would dequantize to 16000: never joined
    table = torch.tensor([3], dtype=torch.int32)
    key, value = random_kv(5, 3)
    for pool in (clean, dirty):
        fill(pool, table, key, value, [2, 3])
    assert torch.equal(reference.gather_kv(clean, 1, table, 5)[0],
                       reference.gather_kv(dirty, 1, table, 5)[0])  # fmt: skip


# copies and swaps ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(QUANTS))
def test_copy_on_write_then_decode_equals_the_source(name):
    pool = make_pool(QUANTS[name], num_blocks=10)
    table = torch.tensor([4, 7, 1], dtype=torch.int32)
    n = 2 * BLOCK_SIZE + 3
    key, value = random_kv(n + 2, 4)
    fill(pool, table, key[:n], value[:n], [n])
    # The child shares blocks 4 and 7 and copies the partial last block before writing.
    reference.copy_blocks(pool, torch.tensor([1]), torch.tensor([9]))
    child = torch.tensor([4, 7, 9], dtype=torch.int32)
    for tensor in pool.block_tensors:
        assert torch.equal(tensor[9], tensor[1])
    query = torch.randn(1, 4, HEAD_DIM, generator=torch.Generator().manual_seed(5))
    tables = torch.stack([table, child])
    lens = torch.tensor([n, n], dtype=torch.int32)
    out = reference.decode_attention(query.expand(2, -1, -1), pool, 1, tables, lens, 0.3)
    alone = reference.decode_attention(query, pool, 1, child[None], lens[:1], 0.3)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], alone[0])
    # Both continue with the same tokens: the copy behaves as the original did.
    for t in (table, child):
        positions = torch.arange(n, n + 2)
        reference.write_kv(pool, 1, key[n:], value[n:], slots_of(t, positions))
    for tensor in pool.block_tensors:
        assert torch.equal(tensor[9], tensor[1])


@pytest.mark.parametrize("name", list(QUANTS))
def test_swap_out_and_in_moves_every_block_tensor(name):
    quant = QUANTS[name]
    pool = make_pool(quant)
    host = allocate_kv_tensors(spec_of(quant), 3, torch.float32, "cpu", with_fp8_scales=False)
    table = torch.tensor([2, 6], dtype=torch.int32)
    key, value = random_kv(11, 6)
    fill(pool, table, key, value, [4, 7])
    before = reference.gather_kv(pool, 1, table, 11)
    reference.swap_blocks(pool, host, torch.tensor([2, 6]), torch.tensor([0, 2]))
    for tensor in pool.block_tensors:
        tensor[torch.tensor([2, 6])] = 0
    reference.swap_blocks(host, pool, torch.tensor([0, 2]), torch.tensor([5, 3]))
    after = reference.gather_kv(pool, 1, torch.tensor([5, 3], dtype=torch.int32), 11)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    with pytest.raises(ValueError):
        other = make_pool(KVQuant() if quant.kind != "none" else KVQuant("fp8"))
        reference.swap_blocks(pool, other, torch.tensor([1]), torch.tensor([1]))


# attention ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(QUANTS))
def test_attention_over_a_quantized_pool_is_attention_over_its_dequantized_kv(name):
    """The kernels add no error of their own: decode and prefill over the pool equal
    float64 attention over ``gather_kv``'s dequantized K/V."""
    pool = make_pool(QUANTS[name], num_blocks=12)
    tables = torch.tensor([[3, 8, 1, 10], [5, 2, 11, -1]], dtype=torch.int32)
    lens = [4 * BLOCK_SIZE - 1, 2 * BLOCK_SIZE + 5]
    for s, n in enumerate(lens):
        key, value = random_kv(n, 7 + s)
        fill(pool, tables[s], key, value, [n // 3, n - n // 3])
    g = torch.Generator().manual_seed(8)
    query = torch.randn(sum(lens), 4, HEAD_DIM, generator=g)
    starts = [0, lens[0], sum(lens)]
    for window, sinks in ((None, 0), (9, 0), (9, 3)):
        prefill = reference.prefill_attention(query, pool, 1, tables, starts, [0, 0], 0.3,
                                              window, sinks)  # fmt: skip
        decode = reference.decode_attention(
            query[[lens[0] - 1, sum(lens) - 1]], pool, 1, tables,
            torch.tensor(lens, dtype=torch.int32), 0.3, window, sinks,
        )  # fmt: skip
        for s, n in enumerate(lens):
            key, value = reference.gather_kv(pool, 1, tables[s], n)
            want = naive_attention(query[starts[s]:starts[s + 1]], key, value, torch.arange(n),
                                   0.3, window, sinks)  # fmt: skip
            torch.testing.assert_close(prefill[starts[s]:starts[s + 1]].double(), want,
                                       atol=1e-5, rtol=1e-5)  # fmt: skip
            torch.testing.assert_close(decode[s].double(), want[-1], atol=1e-5, rtol=1e-5)


def test_quantization_error_of_attention_is_bounded():
    """Attention over fp8 / int4 pools against the unquantized pool on randn data."""
    n = 5 * BLOCK_SIZE
    key, value = random_kv(n, 9)
    query = torch.randn(n, 4, HEAD_DIM, generator=torch.Generator().manual_seed(10))
    table = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    outs = {}
    for name, quant in QUANTS.items():
        pool = make_pool(quant)
        fill(pool, table, key, value, [7, 1, n - 8])
        outs[name] = reference.prefill_attention(query, pool, 1, table[None], [0, n], [0], 0.3)
    bounds = {"fp8": 0.1, "int4-g4": 0.25, "int4-g8": 0.3, "int4-g16": 0.3}
    for name, bound in bounds.items():
        assert float((outs[name] - outs["none"]).abs().max()) < bound, name


@SETTINGS
@given(
    st.integers(1, 40),
    st.one_of(st.none(), st.integers(1, 12)),
    st.integers(0, 10),
    st.integers(0, 2**16),
)
def test_attention_mask_with_sinks(length, window, sinks, seed):
    pool = make_pool(KVQuant(), num_blocks=7)
    table = torch.tensor([6, 1, 4, 2, 5, 3], dtype=torch.int32)
    key, value = random_kv(length, seed)
    fill(pool, table, key, value, [length])
    query = torch.randn(1, 4, HEAD_DIM, generator=torch.Generator().manual_seed(seed + 1))
    lens = torch.tensor([length], dtype=torch.int32)
    got = reference.decode_attention(query, pool, 1, table[None], lens, 0.5, window, sinks)
    k, v = reference.gather_kv(pool, 1, table, length)
    want = naive_attention(query, k, v, torch.tensor([length - 1]), 0.5, window, sinks)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    mask = reference.attention_mask(torch.tensor([length - 1]), torch.arange(length), window,
                                    sinks)  # fmt: skip
    expected = [
        k <= length - 1 and (window is None or k > length - 1 - window or k < sinks)
        for k in range(length)
    ]
    assert mask[0].tolist() == expected


@pytest.mark.parametrize("name", list(QUANTS))
def test_blocks_between_sinks_and_window_are_never_used(name):
    """Holes (-1 or released blocks full of NaN) between the sink blocks and the window
    leave decode and prefill unchanged."""
    pool = make_pool(QUANTS[name], num_blocks=10)
    table = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    n = 6 * BLOCK_SIZE - 2
    key, value = random_kv(n, 11)
    fill(pool, table, key, value, [n - 3, 3])
    window, sinks = BLOCK_SIZE + 1, 3
    query = torch.randn(3, 4, HEAD_DIM, generator=torch.Generator().manual_seed(12))
    lens = torch.tensor([n], dtype=torch.int32)
    want_d = reference.decode_attention(query[:1], pool, 1, table[None], lens, 0.3, window, sinks)
    want_p = reference.prefill_attention(query, pool, 1, table[None], [0, 3], [n - 3], 0.3,
                                         window, sinks)  # fmt: skip
    holed = torch.tensor([1, -1, 7, -1, 5, 6], dtype=torch.int32)  # block 7 was released
    for tensor in pool.block_tensors:
        if tensor.is_floating_point():
            tensor[7] = float("nan")
            tensor[0] = float("nan")
    got_d = reference.decode_attention(query[:1], pool, 1, holed[None], lens, 0.3, window, sinks)
    got_p = reference.prefill_attention(query, pool, 1, holed[None], [0, 3], [n - 3], 0.3,
                                        window, sinks)  # fmt: skip
    assert torch.equal(got_d, want_d) and torch.equal(got_p, want_p)


@pytest.mark.parametrize("name", list(QUANTS))
def test_gather_kv_dtypes(name):
    pool = make_pool(QUANTS[name], dtype=torch.bfloat16)
    table = torch.tensor([1], dtype=torch.int32)
    key, value = random_kv(3, 13)
    fill(pool, table, key.bfloat16(), value.bfloat16(), [3])
    k, v = reference.gather_kv(pool, 1, table, 3)
    assert k.shape == v.shape == (NUM_KV_HEADS, 3, HEAD_DIM)
    assert k.dtype == (torch.bfloat16 if name == "none" else torch.float32)


# sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(QUANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pool_bytes_per_block_is_the_spec(name, dtype):
    quant = QUANTS[name]
    spec = spec_of(quant, num_layers=3, model_bits=torch.finfo(dtype).bits)
    pool = allocate_kv_tensors(spec, 2, dtype, "cpu")
    assert pool.bytes_per_block == spec.bytes_per_block
    assert pool.head_dim == HEAD_DIM and pool.num_layers == 3
    per_token_elements = spec.num_elements_per_token
    if quant.kind == "int4":
        assert spec.bytes_per_block > per_token_elements * BLOCK_SIZE // 2
    assert math.isclose(spec.bytes_per_token, spec.bytes_per_block / BLOCK_SIZE)

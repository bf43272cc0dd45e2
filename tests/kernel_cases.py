"""Triton kernels against their pure-torch references, under the Triton interpreter.

Run as a script (``python tests/kernel_cases.py [name ... | --shard K/N]``): it sets
TRITON_INTERPRET=1 before Triton is imported, runs the cases on the CPU and prints one
JSON object {case: "ok" | error}. ``tests/kernels/test_torch_kernels.py`` runs it in two
subprocesses.

Pools of every storage kind (none, fp8, int4 with several group sizes) are filled by the
reference write in two chunks per sequence (so int4 key groups are re-quantized), then
poisoned so that an unmasked or misdirected load shows: every block no sequence owns
(block 0 included) holds NaN (int4: NaN scales and zeros), the unused tail slots of last
blocks hold large finite values, and with a window the blocks between the sinks and the
window are released: their table entries become -1 or point at a NaN block.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from enginekit.kernels import reference  # noqa: E402
from enginekit.kernels.layout import KVTensors, allocate_kv_tensors  # noqa: E402
from enginekit.kernels.triton import attention as triton_attention  # noqa: E402
from enginekit.kernels.triton import cache as triton_cache  # noqa: E402
from enginekit.kernels.triton import launch  # noqa: E402
from enginekit.spec.kv import KVSpec  # noqa: E402
from enginekit.spec.quant import KVQuant  # noqa: E402

HEAD_DIM = 16
NUM_LAYERS = 2
LAYER = 1
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
FP8_NAN, FP8_MAX_BITS = 0x7F, 0x7E
NONE = KVQuant()


def quant_of(kind: str, block_size: int, head_dim: int | None = None) -> KVQuant:
    """``none``, ``fp8`` or ``int4-g<group>``; head_dim None: ``HEAD_DIM`` (read at call
    time, so that a runner may change it)."""
    if kind.startswith("int4"):
        return KVQuant.int4(int(kind.split("-g")[1]), block_size, head_dim or HEAD_DIM)
    return KVQuant(kind)


def new_pool(quant, num_blocks, num_kv_heads, block_size, dtype, g, head_dim=None) -> KVTensors:
    bits = quant.bits_per_element(torch.finfo(dtype).bits)
    spec = KVSpec(NUM_LAYERS, num_kv_heads, head_dim or HEAD_DIM, bits, block_size, quant)
    pool = allocate_kv_tensors(spec, num_blocks, dtype, "cpu")
    if pool.fp8_scales is not None:
        pool.set_fp8_scales(None, (0.5 + torch.rand(pool.fp8_scales.shape, generator=g)) * 3 / 448)
    return pool


def poison(pool: KVTensors, block: int, first_slot: int = 0) -> None:
    """Garbage in ``block`` from slot ``first_slot`` on: NaN for a whole block, large
    finite values for a tail (int4 key groups are poisoned only when wholly past it)."""
    kind = pool.quant.kind
    whole = first_slot == 0
    data = pool.data[block, :, :, :, first_slot:]
    if kind == "none":
        data.fill_(float("nan") if whole else 1e4)
    elif kind == "fp8":
        data.view(torch.uint8).fill_(FP8_NAN if whole else FP8_MAX_BITS)
    else:
        assert pool.key_meta is not None and pool.value_meta is not None
        data.copy_(torch.randint(0, 256, data.shape, dtype=torch.uint8))
        garbage = float("nan") if whole else 1e4
        pool.value_meta[block, :, :, first_slot:] = garbage
        group = pool.quant.key_group_tokens
        pool.key_meta[block, :, :, -(-first_slot // group) :] = garbage


def attended_blocks(total, first_query, block_size, window, sinks):
    """Logical blocks holding a position some query in [first_query, total) attends."""
    if window is None:
        positions = set(range(total))
    else:
        positions = set(range(min(sinks, total))) | set(
            range(max(0, first_query - window + 1), total)
        )
    return {p // block_size for p in positions}


def make_pool(seq_lens, num_kv_heads, block_size, dtype, seed, quant=NONE, first_queries=None,
              window=None, sinks=0, head_dim=None):  # fmt: skip
    """(pool, block_tables int32 [S, W] padded with -1) for sequences of ``seq_lens``,
    whose first queries sit at ``first_queries`` (for holes; default: the last token)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(need) + 3
    pool = new_pool(quant, num_blocks, num_kv_heads, block_size, dtype, g, head_dim)
    ids = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    width = max(need) + 1
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    owned = set()
    for s, n in enumerate(seq_lens):
        for j in range(need[s]):
            tables[s, j] = ids.pop()
            owned.add(int(tables[s, j]))
        positions = torch.arange(n)
        slots = tables[s, positions // block_size].long() * block_size + positions % block_size
        kv = torch.randn(n, 2, num_kv_heads, head_dim or HEAD_DIM, generator=g).to(dtype)
        for chunk in (slice(0, n // 2 + 1), slice(n // 2 + 1, n)):
            reference.write_kv(pool, LAYER, kv[chunk, 0], kv[chunk, 1], slots[chunk])
        used = n - (need[s] - 1) * block_size
        if used < block_size:
            poison(pool, int(tables[s, need[s] - 1]), used)
    released = [b for b in range(num_blocks) if b not in owned]
    for block in released:
        poison(pool, block)
    if window is not None:
        for s, n in enumerate(seq_lens):
            first = n - 1 if first_queries is None else first_queries[s]
            keep = attended_blocks(n, first, block_size, window, sinks)
            for j in range(need[s]):
                if j not in keep:
                    tables[s, j] = -1 if j % 2 else released[j % len(released)]
    return pool, tables


def check(got, want, dtype):
    tol = TOLERANCE[dtype]
    if not torch.isfinite(got).all():
        raise AssertionError("non-finite output: a masked or foreign value was read")
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def case_decode(num_heads, num_kv_heads, block_size, window, dtype, kind="none", sinks=0):
    lens = [1, 5, block_size, block_size + 1, 3 * block_size + 2, 7, 5 * block_size + 1]
    pool, tables = make_pool(lens, num_kv_heads, block_size, dtype, num_heads + block_size,
                             quant_of(kind, block_size), None, window, sinks)  # fmt: skip
    q = torch.randn(len(lens), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    want = reference.decode_attention(q, pool, LAYER, tables, ctx, 0.25, window, sinks)
    got = triton_attention.decode_attention(q, pool, LAYER, tables, ctx, 0.25, window, sinks)
    check(got, want, dtype)


def case_prefill(num_heads, num_kv_heads, block_size, window, dtype, kind="none", sinks=0):
    # Cached prefixes ending at a block start, mid-block, none and long; ragged chunks.
    starts = [0, 3, block_size, block_size + 5, 2, 4 * block_size + 1]
    chunk = [5, 1, 2 * block_size + 3, 13, 20, 3]
    totals = [s + c for s, c in zip(starts, chunk, strict=True)]
    pool, tables = make_pool(totals, num_kv_heads, block_size, dtype, block_size,
                             quant_of(kind, block_size), starts, window, sinks)  # fmt: skip
    q_starts = torch.tensor([0] + torch.tensor(chunk).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(chunk), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    q = q.to(dtype)
    ctx = torch.tensor(starts, dtype=torch.int32)
    want = reference.prefill_attention(q, pool, LAYER, tables, q_starts.tolist(), starts, 0.25,
                                       window, sinks)  # fmt: skip
    got = triton_attention.prefill_attention(q, pool, LAYER, tables, q_starts, ctx, max(chunk),
                                             0.25, window, sinks)  # fmt: skip
    check(got, want, dtype)


def case_decode_splits(lens, num_heads, num_kv_heads, block_size, dtype, kind="none",
                       window=None, sinks=0, num_splits=None, head_dim=None):  # fmt: skip
    """Decode with the keys split across programs (``num_splits``, or the launcher's
    choice, which must then split) against the reference, e.g. at a 32K context."""
    head_dim = head_dim or HEAD_DIM
    pool, tables = make_pool(lens, num_kv_heads, block_size, dtype, 7,
                             quant_of(kind, block_size, head_dim), None, window, sinks,
                             head_dim)  # fmt: skip
    q = torch.randn(len(lens), num_heads, head_dim, generator=torch.Generator().manual_seed(8))
    q = q.to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    scale = head_dim**-0.5
    if num_splits is None:
        max_keys = tables.shape[1] * block_size if window is None else window + sinks
        chosen = launch.num_decode_splits(len(lens), num_kv_heads, max_keys)
        assert chosen > 1, chosen
    want = reference.decode_attention(q, pool, LAYER, tables, ctx, scale, window, sinks)
    got = triton_attention.decode_attention(q, pool, LAYER, tables, ctx, scale, window, sinks,
                                            num_splits=num_splits)  # fmt: skip
    check(got, want, dtype)


def needed_key_tiles(starts, chunks, block_m, block_n, window, sinks):
    """Key tiles of ``block_n`` keys a prefill must read at least: for each query tile of
    each chunk (``block_m`` tokens), the keys some row of it attends, in whole tiles."""
    total = 0
    for start, chunk in zip(starts, chunks, strict=True):
        for first in range(0, chunk, block_m):
            rows = range(start + first, start + min(first + block_m, chunk))
            keys = set()
            for p in rows:
                lo = 0 if window is None else max(0, p - window + 1)
                keys.update(range(lo, p + 1))
                keys.update(range(min(sinks, p + 1)))
            total += -(-len(keys) // block_n)
    return total


def case_prefill_tile_loads(num_heads, num_kv_heads, block_size, starts, chunks, window=None,
                            sinks=0):  # fmt: skip
    """A prefill reads at most 1.1x the key tiles its query tiles need (so no tile past
    a chunk's end streams the context), and still equals the reference."""
    dtype = torch.float32
    totals = [s + c for s, c in zip(starts, chunks, strict=True)]
    pool, tables = make_pool(totals, num_kv_heads, block_size, dtype, 9, NONE, starts, window,
                             sinks)  # fmt: skip
    q_starts = torch.tensor([0] + torch.tensor(chunks).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(chunks), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(9))
    ctx = torch.tensor(starts, dtype=torch.int32)
    config = launch.prefill_config(dtype, HEAD_DIM, "none")
    block_m = launch.prefill_query_tile(config, num_heads, num_kv_heads)
    num_programs = -(-max(chunks) // block_m) * num_kv_heads * len(starts)
    counts = torch.full((num_programs,), -1, dtype=torch.int32)
    got = triton_attention.prefill_attention(q, pool, LAYER, tables, q_starts, ctx, max(chunks),
                                             0.25, window, sinks, tile_counts=counts)  # fmt: skip
    want = reference.prefill_attention(q, pool, LAYER, tables, q_starts.tolist(), starts, 0.25,
                                       window, sinks)  # fmt: skip
    check(got, want, dtype)
    assert (counts >= 0).all(), "a program did not report its tiles"
    needed = num_kv_heads * needed_key_tiles(starts, chunks, block_m, config.block_n, window,
                                             sinks)  # fmt: skip
    read = int(counts.sum())
    assert needed <= read <= 1.1 * needed, (read, needed)


def clone(pool: KVTensors) -> KVTensors:
    def copy(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.clone()

    return KVTensors(copy(pool.data), pool.quant, copy(pool.key_meta), copy(pool.value_meta),
                  copy(pool.fp8_scales), list(pool.fp8_layers_set))  # fmt: skip


def fill_random(pool: KVTensors, g: torch.Generator) -> None:
    """Random finite contents in every block tensor (bytes below 120 are finite numbers
    in every dtype used here)."""
    for tensor in pool.block_tensors:
        flat = tensor.view(torch.uint8)
        flat.copy_(torch.randint(0, 120, flat.shape, dtype=torch.uint8, generator=g))


def assert_same_pool(got: KVTensors, want: KVTensors) -> None:
    for a, b in zip(got.block_tensors, want.block_tensors, strict=True):
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def case_write(num_kv_heads, block_size, dtype, kind="none", shuffle_rows=False):
    """A random scatter of tokens (none, fp8), or for int4 a batch continuing sequences
    whose groups already hold tokens, in shuffled sequence order with a skipped slot;
    ``shuffle_rows``: with three skipped slots and every row shuffled, so that a group's
    new tokens are neither adjacent nor in position order in the batch."""
    g = torch.Generator().manual_seed(3)
    quant = quant_of(kind, block_size)
    num_blocks = 10
    pool = new_pool(quant, num_blocks, num_kv_heads, block_size, dtype, g)
    if quant.kind != "int4":
        fill_random(pool, g)
        slots = torch.randperm(num_blocks * block_size, generator=g)[:11]
        slots[4] = -1
        batches = [slots]
    else:
        # (blocks, cached tokens, new tokens) per sequence; the prefix written first.
        seqs = [([1, 4], block_size // 2 + 1, 3), ([6, 3], 0, block_size + 1),
                ([2, 7], block_size, 1), ([8], 1, 1), ([5, 0], block_size - 1, 2)]  # fmt: skip
        prefix, batch = [], []
        for blocks, cached, new in seqs:
            pos = torch.arange(cached + new)
            slots = torch.tensor(blocks)[pos // block_size] * block_size + pos % block_size
            prefix.append(slots[:cached])
            batch.append(slots[cached:])
        order = [3, 0, 4, 1, 2]
        parts = [batch[i] for i in order]
        parts.insert(2, torch.tensor([-1]))
        last = torch.cat(parts)
        if shuffle_rows:
            last = torch.cat([last, torch.tensor([-1, -1])])
            last = last[torch.randperm(last.shape[0], generator=g)]
        batches = [torch.cat(prefix), last]
    want = clone(pool)
    for i, slots in enumerate(batches):
        n = slots.shape[0]
        kv = torch.randn(n, 2 * num_kv_heads, HEAD_DIM, generator=g).to(dtype)
        key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]  # strided views, as the model
        reference.write_kv(want, LAYER, key, value, slots)
        if i == len(batches) - 1:
            triton_cache.write_kv(pool, LAYER, key, value, slots)
        else:
            reference.write_kv(pool, LAYER, key, value, slots)
    assert_same_pool(pool, want)


def fp8_edge_values(g: torch.Generator) -> torch.Tensor:
    """float32 values at every edge of the e4m3 encoding, both signs: each finite e4m3
    value, each midpoint between neighbours (ties, subnormal ones included) and the
    floats one ulp either side of both; the max 448, values past it up to infinity,
    zeros, float32 subnormals and NaN; then 2048 random float32 bit patterns."""
    codes = torch.arange(0x7F, dtype=torch.uint8)  # every finite non-negative e4m3
    exact = codes.view(torch.float8_e4m3fn).double()
    ties = (exact[1:] + exact[:-1]) / 2
    base = torch.cat([exact, ties]).float()
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    near = torch.cat([base, torch.nextafter(base, up), torch.nextafter(base, down)])
    beyond = [448.0, 449.0, 463.99, 464.0, 464.01, 480.0, 1e30, float("inf"), 2.0**-10,
              2.0**-11, 1e-45, 1e-40, float("nan")]  # fmt: skip
    magnitudes = torch.cat([near, torch.tensor(beyond)])
    bits = torch.randint(-(2**31), 2**31, (2048,), dtype=torch.int64, generator=g)
    return torch.cat([magnitudes, -magnitudes, bits.to(torch.int32).view(torch.float32)])


def case_write_fp8_edges():
    """fp8 writes bit for bit on every rounding edge (``fp8_edge_values``): K/V heads with
    power-of-two scales, where ``x / scale`` is exact and the values reach the encoding
    as they are, and a V head with a random scale, whose division rounds."""
    g = torch.Generator().manual_seed(6)
    num_kv_heads, block_size = 2, 16
    edges = fp8_edge_values(g)
    num_tokens = -(-edges.shape[0] // HEAD_DIM)
    num_blocks = -(-num_tokens // block_size) + 1
    pool = new_pool(KVQuant("fp8"), num_blocks, num_kv_heads, block_size, torch.float32, g)
    scales = torch.tensor([[1.0, 0.5], [0.25, 0.0]])
    scales[1, 1] = float(torch.rand(1, generator=g)) * 3 / 448 + 1e-3
    pool.set_fp8_scales(LAYER, scales)
    fill_random(pool, g)
    padded = torch.cat([edges, edges[: num_tokens * HEAD_DIM - edges.shape[0]]])
    tiles = padded.reshape(num_tokens, HEAD_DIM)
    key = torch.stack([tiles * scales[0, h] for h in range(num_kv_heads)], dim=1)
    value = torch.stack([tiles * scales[1, 0], tiles], dim=1)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    want = clone(pool)
    reference.write_kv(want, LAYER, key, value, slots)
    with warnings.catch_warnings():  # numpy, interpreting x / scale past float32's range
        warnings.simplefilter("ignore", RuntimeWarning)
        triton_cache.write_kv(pool, LAYER, key, value, slots)
    assert_same_pool(pool, want)
    stored = pool.data.view(torch.uint8)[slots // block_size, LAYER, :, :, slots % block_size]
    # The keys, whose scales are exact, hit every one of the 256 codes (NaN: 0x7F, 0xFF).
    num_codes = stored[:, 0].unique().numel()
    assert num_codes == 256, num_codes


def case_write_decode(num_kv_heads, block_size, dtype, kind):
    """Token by token, as decode steps write, alternating layers: after each one-token
    write the pools are equal (int4: each write re-quantizes a key group holding earlier
    tokens)."""
    g = torch.Generator().manual_seed(7)
    quant = quant_of(kind, block_size)
    pool = new_pool(quant, 4, num_kv_heads, block_size, dtype, g)
    fill_random(pool, g)
    want = clone(pool)
    blocks = torch.tensor([2, 0, 3])
    for position in range(2 * block_size + 3):
        slot = blocks[position // block_size] * block_size + position % block_size
        for layer in (0, 1):
            kv = torch.randn(1, 2, num_kv_heads, HEAD_DIM, generator=g).to(dtype)
            reference.write_kv(want, layer, kv[:, 0], kv[:, 1], slot.reshape(1))
            triton_cache.write_kv(pool, layer, kv[:, 0], kv[:, 1], slot.reshape(1))
        assert_same_pool(pool, want)


def case_copy(block_size, dtype, kind="none"):
    g = torch.Generator().manual_seed(4)
    pool = new_pool(quant_of(kind, block_size), 7, 2, block_size, dtype, g)
    fill_random(pool, g)
    src, dst = torch.tensor([1, 5, 2]), torch.tensor([3, 0, 6])
    want = clone(pool)
    reference.copy_blocks(want, src, dst)
    triton_cache.copy_blocks(pool, src, dst)
    assert_same_pool(pool, want)


def expect_value_error(fn, *args):
    try:
        fn(*args)
    except ValueError:
        return
    raise AssertionError(f"a bad argument was launched: {fn.__name__}")


def case_checks():
    pool, tables = make_pool([5], 2, 4, torch.float32, seed=0)
    q = torch.randn(1, 4, HEAD_DIM)
    lens = torch.tensor([5], dtype=torch.int32)
    bad = [
        (q.to(torch.bfloat16), tables, lens, 0),  # dtype
        (q, tables.long(), lens, 0),  # table dtype
        (q, tables, torch.tensor([5, 5], dtype=torch.int32), 0),  # lens shape
        (torch.randn(1, 3, HEAD_DIM), tables, lens, 0),  # heads
        (torch.randn(1, HEAD_DIM, 4).transpose(1, 2), tables, lens, 0),  # stride
        (q, tables, lens, -1),  # sinks
    ]
    for query, table, n, sinks in bad:
        expect_value_error(triton_attention.decode_attention, query, pool, 0, table, n, 1.0,
                           4, sinks)  # fmt: skip
    # Quantized pools: fp8 writes need scales; int4 needs its scale/zero tensors.
    g = torch.Generator().manual_seed(0)
    fp8 = new_pool(KVQuant("fp8"), 3, 2, 4, torch.float32, g)
    fp8.fp8_layers_set[LAYER] = False
    kv = torch.randn(2, 2, HEAD_DIM)
    slots = torch.tensor([0, 1])
    expect_value_error(triton_cache.write_kv, fp8, LAYER, kv, kv, slots)
    int4 = new_pool(quant_of("int4-g4", 4), 3, 2, 4, torch.float32, g)
    int4.key_meta = None
    expect_value_error(triton_cache.write_kv, int4, LAYER, kv, kv, slots)
    expect_value_error(triton_attention.decode_attention, q, int4, 0, tables, lens, 1.0)


def case_engine(quantizer="none"):
    """The whole engine with kernels=triton gives the reference kernels' greedy tokens,
    with preemptions, on a pool of the quantizer's storage kind."""
    from enginekit import Engine, SamplingParams

    outputs = []
    quant = [f"+quantizer={quantizer}"] if quantizer != "none" else []
    if quantizer == "int4":
        quant.append("quantizer.group_size=4")
    for kernels in ("reference", "triton"):
        engine = Engine.from_overrides(
            ["executor=torch", "model=tiny", "model.dtype=float32", "progress=false",
             f"kernels={kernels}", "cache.block_size=4", "cache.num_blocks=14",
             "cache.watermark=0", *quant]
        )  # fmt: skip
        g = torch.Generator().manual_seed(5)
        for n in (3, 9, 14, 6):
            prompt = torch.randint(3, 512, (n,), generator=g).tolist()
            engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        result = engine.run()
        assert engine.describe()["kernels"] == kernels
        assert sum(o.num_preemptions for o in result.outputs) > 0
        outputs.append([o.output_token_ids for o in result.outputs])
    assert outputs[0] == outputs[1], outputs


def cases():
    out = {}
    f32 = torch.float32
    for h, kvh in ((4, 4), (8, 2), (8, 1)):  # GQA ratios 1, 4, 8
        for bs in (4, 16):
            for window, sinks in ((None, 0), (6, 0), (6, 3)):
                tag = f"h{h}-kv{kvh}-bs{bs}-w{window}-s{sinks}"
                out[f"decode-{tag}"] = (case_decode, h, kvh, bs, window, f32, "none", sinks)
                out[f"prefill-{tag}"] = (case_prefill, h, kvh, bs, window, f32, "none", sinks)
    for kind in ("fp8", "int4-g4", "int4-g8", "int4-g16"):
        for h, kvh, bs, window, sinks in ((8, 2, 16, None, 0), (4, 4, 4, 5, 2), (8, 1, 16, 7, 5)):
            tag = f"{kind}-h{h}-kv{kvh}-bs{bs}-w{window}-s{sinks}"
            out[f"decode-{tag}"] = (case_decode, h, kvh, bs, window, f32, kind, sinks)
            out[f"prefill-{tag}"] = (case_prefill, h, kvh, bs, window, f32, kind, sinks)
    out["decode-bf16"] = (case_decode, 8, 2, 16, None, torch.bfloat16)
    out["prefill-bf16"] = (case_prefill, 8, 2, 16, 7, torch.bfloat16, "none", 2)
    out["prefill-fp16"] = (case_prefill, 4, 4, 16, None, torch.float16)
    out["decode-fp16"] = (case_decode, 8, 1, 4, 6, torch.float16, "none", 1)
    out["prefill-fp8-bf16"] = (case_prefill, 8, 2, 16, 9, torch.bfloat16, "fp8", 3)
    out["prefill-int4-g8-fp16"] = (case_prefill, 4, 4, 16, None, torch.float16, "int4-g8")
    out["decode-int4-g4-bf16"] = (case_decode, 8, 2, 4, 6, torch.bfloat16, "int4-g4", 2)
    out["decode-fp8-fp16"] = (case_decode, 8, 2, 16, None, torch.float16, "fp8")
    out["prefill-fp8-fp16"] = (case_prefill, 8, 1, 16, 9, torch.float16, "fp8", 3)
    bf16 = torch.bfloat16
    out["decode-split-32k"] = (case_decode_splits, [32768, 5], 4, 1, 16, bf16)
    out["decode-split-fp8-bf16"] = (case_decode_splits, [3000, 70], 4, 1, 32, bf16, "fp8")
    out["decode-split-real-shape-bf16"] = (case_decode_splits, [1200, 17], 32, 8, 16, bf16,
                                           "none", None, 0, None, 128)  # fmt: skip
    out["decode-splits-7-int4-window"] = (case_decode_splits, [1, 70, 300, 1000], 8, 2, 16, f32,
                                          "int4-g8", 200, 4, 7)  # fmt: skip
    out["prefill-tile-loads"] = (case_prefill_tile_loads, 8, 2, 16, [0, 1000, 1000], [256, 16, 1])
    out["prefill-tile-loads-long"] = (case_prefill_tile_loads, 1, 1, 16, [2000, 2000], [256, 16])
    out["prefill-tile-loads-window"] = (case_prefill_tile_loads, 8, 1, 16, [300, 0], [200, 50],
                                        64, 4)  # fmt: skip
    for kvh in (1, 2, 3):
        for bs in (4, 16):
            out[f"write-kv{kvh}-bs{bs}"] = (case_write, kvh, bs, f32)
    out["write-bf16"] = (case_write, 2, 16, torch.bfloat16)
    for kind, kvh, bs, dtype in (("fp8", 2, 4, f32), ("fp8", 3, 16, torch.bfloat16),
                                 ("int4-g4", 2, 4, f32), ("int4-g4", 1, 16, f32),
                                 ("int4-g8", 3, 16, f32), ("int4-g16", 2, 16, torch.bfloat16),
                                 ("int4-g16", 2, 4, torch.float16)):  # fmt: skip
        out[f"write-{kind}-kv{kvh}-bs{bs}-{str(dtype)[6:]}"] = (case_write, kvh, bs, dtype, kind)
    out["write-int4-g4-shuffled"] = (case_write, 2, 4, f32, "int4-g4", True)
    out["write-int4-g8-shuffled-bf16"] = (case_write, 3, 16, torch.bfloat16, "int4-g8", True)
    out["write-fp8-edges"] = (case_write_fp8_edges,)
    decodes = [("none", 2, 4, torch.float16), ("fp8", 3, 8, torch.bfloat16),
               ("int4-g4", 2, 8, f32), ("int4-g16", 1, 16, torch.float16)]  # fmt: skip
    for kind, kvh, bs, dtype in decodes:
        out[f"write-decode-{kind}-{str(dtype)[6:]}"] = (case_write_decode, kvh, bs, dtype, kind)
    out["copy-bs4"] = (case_copy, 4, f32)
    out["copy-bs16-bf16"] = (case_copy, 16, torch.bfloat16)
    out["copy-fp8"] = (case_copy, 4, f32, "fp8")
    out["copy-int4"] = (case_copy, 16, torch.float16, "int4-g8")
    out["launcher-checks"] = (case_checks,)
    out["engine"] = (case_engine,)
    out["engine-fp8"] = (case_engine, "fp8")
    out["engine-int4"] = (case_engine, "int4")
    return out


def main(args):
    """Runs the cases named in ``args`` (all when none), or with ``--shard K/N`` every
    N-th case from the K-th, so that N processes share the cases."""
    names = set(args)
    shard = None
    if args[:1] == ["--shard"]:
        index, count = map(int, args[1].split("/"))
        shard, names = (index, count), set()
    results = {}
    for i, (name, (fn, *case_args)) in enumerate(cases().items()):
        if (names and name not in names) or (shard and i % shard[1] != shard[0]):
            continue
        try:
            fn(*case_args)
            results[name] = "ok"
        except Exception:  # reported per case
            results[name] = traceback.format_exc(limit=3)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])

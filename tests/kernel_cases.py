"""Triton kernels against their pure-torch references, under the Triton interpreter.

Run as a script (``python tests/kernel_cases.py [name ...]``): it sets TRITON_INTERPRET=1
before Triton is imported, runs the cases on the CPU and prints one JSON object
{case: "ok" | error}. ``test_torch_kernels.py`` runs it in a subprocess.

Pools hold random K/V where sequences live, a large finite value (1e4) in the unused
tail slots of their last blocks and NaN in every block no sequence owns (block 0 aside:
the reference reads it for -1 padding), so an unmasked or misdirected load shows.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from enginekit.kernels import reference, triton_attention, triton_cache  # noqa: E402

HEAD_DIM = 16
NUM_LAYERS = 2
LAYER = 1
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_pool(seq_lens, num_kv_heads, block_size, dtype, seed):
    """(pool, block_tables int32 [S, W] padded with -1) for sequences of ``seq_lens``."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(need) + 3
    pool = torch.full((num_blocks, NUM_LAYERS, 2, num_kv_heads, block_size, HEAD_DIM), float("nan"))
    pool[0] = torch.randn(pool[0].shape, generator=g)
    ids = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    width = max(need) + 1
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    for s, n in enumerate(seq_lens):
        for j in range(need[s]):
            block = ids.pop()
            tables[s, j] = block
            pool[block] = torch.randn(pool[block].shape, generator=g)
            used = min(block_size, n - j * block_size)
            pool[block, :, :, :, used:] = 1e4
    return pool.to(dtype), tables


def check(got, want, dtype):
    tol = TOLERANCE[dtype]
    if not torch.isfinite(got).all():
        raise AssertionError("non-finite output: a masked or foreign value was read")
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def case_decode(num_heads, num_kv_heads, block_size, window, dtype):
    lens = [1, 5, block_size, block_size + 1, 3 * block_size + 2, 7]
    pool, tables = make_pool(lens, num_kv_heads, block_size, dtype, seed=num_heads + block_size)
    q = torch.randn(len(lens), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    want = reference.decode_attention(q, pool, LAYER, tables, ctx, 0.25, window)
    got = triton_attention.decode_attention(q, pool, LAYER, tables, ctx, 0.25, window)
    check(got, want, dtype)


def case_prefill(num_heads, num_kv_heads, block_size, window, dtype):
    # Cached prefixes ending at a block start, mid-block and none; ragged chunks.
    starts = [0, 3, block_size, block_size + 5, 2]
    chunk = [5, 1, 2 * block_size + 3, 13, 20]
    totals = [s + c for s, c in zip(starts, chunk, strict=True)]
    pool, tables = make_pool(totals, num_kv_heads, block_size, dtype, seed=block_size)
    q_starts = torch.tensor([0] + torch.tensor(chunk).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(chunk), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    q = q.to(dtype)
    ctx = torch.tensor(starts, dtype=torch.int32)
    want = reference.prefill_attention(q, pool, LAYER, tables, q_starts.tolist(), starts, 0.25,
                                       window)  # fmt: skip
    got = triton_attention.prefill_attention(q, pool, LAYER, tables, q_starts, ctx, max(chunk),
                                             0.25, window)  # fmt: skip
    check(got, want, dtype)


def case_write(num_kv_heads, block_size, dtype):
    g = torch.Generator().manual_seed(3)
    num_blocks = 6
    pool = torch.randn(num_blocks, NUM_LAYERS, 2, num_kv_heads, block_size, HEAD_DIM, generator=g)
    pool = pool.to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:11]
    slots[4] = -1
    kv = torch.randn(11, 2 * num_kv_heads, HEAD_DIM, generator=g).to(dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]  # strided views, as in the model
    want = pool.clone()
    reference.write_kv(want, LAYER, key, value, slots)
    triton_cache.write_kv(pool, LAYER, key, value, slots)
    torch.testing.assert_close(pool, want, rtol=0, atol=0)


def case_copy(block_size, dtype):
    g = torch.Generator().manual_seed(4)
    pool = torch.randn(7, NUM_LAYERS, 2, 2, block_size, HEAD_DIM, generator=g).to(dtype)
    src, dst = torch.tensor([1, 5, 2]), torch.tensor([3, 0, 6])
    want = pool.clone()
    reference.copy_blocks(want, src, dst)
    triton_cache.copy_blocks(pool, src, dst)
    torch.testing.assert_close(pool, want, rtol=0, atol=0)


def case_checks():
    pool, tables = make_pool([5], 2, 4, torch.float32, seed=0)
    q = torch.randn(1, 4, HEAD_DIM)
    bad = [
        (q.to(torch.bfloat16), tables, torch.tensor([5], dtype=torch.int32)),  # dtype
        (q, tables.long(), torch.tensor([5], dtype=torch.int32)),  # table dtype
        (q, tables, torch.tensor([5, 5], dtype=torch.int32)),  # lens shape
        (torch.randn(1, 3, HEAD_DIM), tables, torch.tensor([5], dtype=torch.int32)),  # heads
        (torch.randn(1, HEAD_DIM, 4).transpose(1, 2), tables, torch.tensor([5], dtype=torch.int32)),
    ]
    for query, table, lens in bad:
        try:
            triton_attention.decode_attention(query, pool, 0, table, lens, 1.0)
        except ValueError:
            continue
        raise AssertionError("a bad argument was launched")


def case_engine():
    """The whole engine with kernels=triton gives the reference kernels' greedy tokens."""
    from enginekit import Engine, SamplingParams

    outputs = []
    for kernels in ("reference", "triton"):
        engine = Engine.from_overrides(
            ["executor=torch", "model=tiny", "model.dtype=float32", "progress=false",
             f"kernels={kernels}", "cache.block_size=4", "cache.num_blocks=14",
             "cache.watermark=0"]
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
    for h, kvh in ((4, 4), (8, 2), (8, 1)):  # GQA ratios 1, 4, 8
        for bs in (4, 16):
            for window in (None, 6):
                out[f"decode-h{h}-kv{kvh}-bs{bs}-w{window}"] = (case_decode, h, kvh, bs, window,
                                                                torch.float32)  # fmt: skip
                out[f"prefill-h{h}-kv{kvh}-bs{bs}-w{window}"] = (case_prefill, h, kvh, bs, window,
                                                                 torch.float32)  # fmt: skip
    out["decode-bf16"] = (case_decode, 8, 2, 16, None, torch.bfloat16)
    out["prefill-bf16"] = (case_prefill, 8, 2, 16, 7, torch.bfloat16)
    out["prefill-fp16"] = (case_prefill, 4, 4, 16, None, torch.float16)
    out["decode-fp16"] = (case_decode, 8, 1, 4, 6, torch.float16)
    for kvh in (1, 2, 3):
        for bs in (4, 16):
            out[f"write-kv{kvh}-bs{bs}"] = (case_write, kvh, bs, torch.float32)
    out["write-bf16"] = (case_write, 2, 16, torch.bfloat16)
    out["copy-bs4"] = (case_copy, 4, torch.float32)
    out["copy-bs16-bf16"] = (case_copy, 16, torch.bfloat16)
    out["launcher-checks"] = (case_checks,)
    out["engine"] = (case_engine,)
    return out


def main(names):
    results = {}
    for name, (fn, *args) in cases().items():
        if names and name not in names:
            continue
        try:
            fn(*args)
            results[name] = "ok"
        except Exception:  # reported per case
            results[name] = traceback.format_exc(limit=3)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])

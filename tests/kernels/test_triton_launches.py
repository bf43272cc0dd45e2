"""How the cache kernels launch, checked without a GPU: a child process imports them
with the interpreter off (so they are compiled kernels) and replaces each kernel's
``run`` with one that records the compile key Triton's own argument binder computes for
an H100-class target, instead of compiling. Run as a script, the child prints what it
saw as JSON.

- One compiled variant per pool configuration: across layers 0, 1, 2 and 16 (Triton
  specializes integers equal to 1 and divisible by 16) and batches of 1 to 33 tokens,
  every launch of a write kernel on one pool has the same key.
- Every launch pins ``enable_fp_fusion=False``.
- No torch work around the launches but int4's one sort of the slots (views aside):
  fp8 quantizes inside its kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

NUM_LAYERS = 17
LAYERS = (0, 1, 2, 16)
TOKEN_COUNTS = (1, 2, 16, 17, 33)
HEAD_DIM, NUM_HEADS, NUM_KV_HEADS = 16, 4, 2
# (name, quantizer kind, model dtype, int4 key group, block size)
POOLS = [
    ("none-f32", "none", "float32", 0, 16),
    ("none-bf16", "none", "bfloat16", 0, 4),
    ("fp8-f16", "fp8", "float16", 0, 16),
    ("int4-g4", "int4", "float32", 4, 16),
    ("int4-g16-bf16", "int4", "bfloat16", 16, 16),
]
KERNELS = ("_write_kv_kernel", "_write_int4_kernel", "_copy_blocks_kernel")


def record_launches() -> dict[str, dict[str, list[str]]]:
    """{pool: {kernel: sorted distinct compile keys, "num_block_shapes": [count],
    "torch_ops": names of the non-view torch ops ``write_kv`` ran, one per call}} over
    every launch; raises if a launch does not pin ``enable_fp_fusion=False``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    from enginekit.kernels.layout import allocate_kv_tensors
    from enginekit.kernels.triton import cache
    from enginekit.spec.kv import KVSpec
    from enginekit.spec.quant import KVQuant

    backend = make_backend(GPUTarget("cuda", 90, 32))
    keys: dict[str, set[str]] = defaultdict(set)

    def recorder(name: str, kernel):
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)

        def run(*args, grid, warmup, **kwargs):
            _, specialization, options = binder(*args, **kwargs)
            if options.get("enable_fp_fusion") is not False:
                raise AssertionError(f"{name} launched without enable_fp_fusion=False")
            keys[name].add(str(compute_cache_key({}, specialization, options)))

        return run

    class TorchOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    for name in KERNELS:
        kernel = getattr(cache, name)
        assert isinstance(kernel, triton.runtime.jit.JITFunction), type(kernel)
        kernel.run = recorder(name, kernel)

    out: dict[str, dict[str, list[str]]] = {}
    for pool_name, kind, dtype_name, key_group, block_size in POOLS:
        dtype = getattr(torch, dtype_name)
        if kind == "int4":
            quant = KVQuant.int4(key_group, block_size, HEAD_DIM)
        else:
            quant = KVQuant(kind)
        bits = quant.bits_per_element(torch.finfo(dtype).bits)
        spec = KVSpec(NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, bits, block_size, quant)
        num_blocks = 2 * max(TOKEN_COUNTS) // block_size + 2
        pool = allocate_kv_tensors(spec, num_blocks, dtype, "cpu")
        if pool.fp8_scales is not None:
            pool.set_fp8_scales(None, torch.full(pool.fp8_scales.shape, 0.01))
        keys.clear()
        torch_ops: list[str] = []
        q_size, kv_size = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
        for layer in LAYERS:
            for num_tokens in TOKEN_COUNTS:
                # As the model passes them: keys fresh (after the rotary embedding),
                # values a view of the qkv projection.
                qkv = torch.randn(num_tokens, q_size + 2 * kv_size).to(dtype)
                key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM).to(dtype)
                value = qkv[:, q_size + kv_size :].view(num_tokens, NUM_KV_HEADS, HEAD_DIM)
                slots = torch.randperm(num_blocks * block_size)[:num_tokens]
                with TorchOps() as ops:
                    cache.write_kv(pool, layer, key, value, slots)
                torch_ops.extend(ops.names)
        for num_pairs in (1, 2, 3):
            ids = torch.randperm(num_blocks)[: 2 * num_pairs]
            cache.copy_blocks(pool, ids[:num_pairs].clone(), ids[num_pairs:].clone())
        out[pool_name] = {name: sorted(found) for name, found in keys.items()}
        shapes = {(str(t.dtype), t[0].numel()) for t in pool.block_tensors}
        out[pool_name]["num_block_shapes"] = [str(len(shapes))]
        out[pool_name]["torch_ops"] = torch_ops
    return out


def run_child() -> dict[str, dict[str, list[str]]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__))], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(found) == sorted(name for name, *_ in POOLS)
    return found


@pytest.fixture(scope="module")
def launches() -> dict[str, dict[str, list[str]]]:
    return run_child()


def test_one_compiled_variant_per_pool_configuration(launches):
    for pool_name, kind, *_ in POOLS:
        keys = launches[pool_name]
        write = "_write_int4_kernel" if kind == "int4" else "_write_kv_kernel"
        extra = {"num_block_shapes", "torch_ops"}
        assert sorted(set(keys) - extra) == sorted([write, "_copy_blocks_kernel"])
        assert len(keys[write]) == 1, (pool_name, keys[write])
        # One copy variant per (dtype, elements per block) of the block tensors: the
        # block's size is a compile-time constant.
        num_block_shapes = int(keys["num_block_shapes"][0])
        assert len(keys["_copy_blocks_kernel"]) == num_block_shapes, keys["_copy_blocks_kernel"]


def test_writes_run_no_torch_op_but_the_int4_sort(launches):
    num_calls = len(LAYERS) * len(TOKEN_COUNTS)
    for pool_name, kind, *_ in POOLS:
        want = ["sort"] * num_calls if kind == "int4" else []
        assert launches[pool_name]["torch_ops"] == want, pool_name


if __name__ == "__main__":
    print(json.dumps(record_launches()))

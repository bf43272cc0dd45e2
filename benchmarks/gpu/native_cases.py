"""The kernel cases of ``tests/kernel_cases.py``, compiled and run on a CUDA GPU.

``kernel_cases.py`` checks every Triton kernel against its pure-torch reference under the
interpreter, on the CPU, with head_dim 16. This runner takes the same case functions (the
same pools, poisoning, released blocks and tolerances) and runs the kernels natively:

- the kernels are imported before ``kernel_cases``, which sets ``TRITON_INTERPRET=1`` at
  import, and the variable is cleared again (the launchers read it at every call), so
  every ``@triton.jit`` function is a compiled one;
- the cases still build their inputs and references on the CPU; the kernel modules they
  call are wrapped so that each call copies its tensors to the GPU with their sizes,
  strides and offsets (strided views stay strided), copies every pool back after the
  call (writes and copies mutate it) and returns results on the CPU;
- ``cases()`` are run as they are (head_dim 16; the engine cases are left out: the kit
  runs the engine on the GPU end to end), then ``real_cases()`` at real shapes: head_dim
  128, 32 query heads over 32, 8 or 4 kv heads, blocks of 16 to 64, windows and sinks,
  every storage kind and model dtype.

Cases run in ``--jobs`` processes (each compiles its own kernels; the compiles are what
takes time). Prints one line per failure and a summary; ``--json`` writes every result.
Exit status: 0 all passed, 1 a case failed, 2 no CUDA GPU. ``--interpret`` runs the same
plumbing on the CPU under the interpreter (a check of this runner, not of the kernels).

    python benchmarks/gpu/native_cases.py [--jobs 12] [--json FILE] [--only SUBSTRING,...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = "needs a CUDA GPU; torch.cuda.is_available() is False on this machine"
REAL_HEAD_DIM = 128
ENGINE_CASES = ("engine", "engine-fp8", "engine-int4")


def load(interpret: bool) -> Any:
    """Imports the kernels (compiled unless ``interpret``), then ``kernel_cases`` with its
    kernel modules wrapped for the device; returns ``kernel_cases``."""
    if not interpret:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = "1"
    from enginekit.kernels.triton import attention, cache

    sys.path.insert(0, str(ROOT / "tests"))
    import kernel_cases

    if not interpret:
        os.environ.pop("TRITON_INTERPRET", None)
    device = "cpu" if interpret else "cuda"
    kernel_cases.triton_attention = OnDevice(attention, device)
    kernel_cases.triton_cache = OnDevice(cache, device)
    return kernel_cases


def to_device(x: Any, device: str) -> Any:
    """``x`` on ``device``: a tensor with the same sizes, strides and storage offset (its
    whole storage is copied), a KVTensors tensor by tensor; anything else as it is."""
    import torch

    from enginekit.kernels.layout import KVTensors

    if isinstance(x, torch.Tensor):
        storage = x.untyped_storage()
        flat = torch.empty(0, dtype=x.dtype).set_(
            storage, 0, (storage.nbytes() // x.element_size(),)
        )
        return flat.to(device, copy=True).as_strided(x.size(), x.stride(), x.storage_offset())
    if isinstance(x, KVTensors):

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else to_device(t, device)

        return KVTensors(move(x.data), x.quant, move(x.key_meta), move(x.value_meta),
                         move(x.fp8_scales), list(x.fp8_layers_set))  # fmt: skip
    return x


def copy_back(host: Any, moved: Any) -> None:
    """Copies a moved pool's tensors (and its scales-set flags) into the host pool."""
    from enginekit.kernels.layout import KVTensors

    if not isinstance(host, KVTensors):
        return
    for name in ("data", "key_meta", "value_meta", "fp8_scales"):
        h, m = getattr(host, name), getattr(moved, name)
        if h is not None and m is not None and m.data_ptr() != h.data_ptr():
            h.copy_(m.to(h.device))
    host.fp8_layers_set[:] = moved.fp8_layers_set


class OnDevice:
    """A kernel module whose functions take CPU arguments and run on ``device``."""

    def __init__(self, module: Any, device: str) -> None:
        self._module = module
        self._device = device

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._module, name)
        device = self._device

        def call(*args: Any, **kwargs: Any) -> Any:
            import torch

            moved = [to_device(a, device) for a in args]
            moved_kwargs = {k: to_device(v, device) for k, v in kwargs.items()}
            result = fn(*moved, **moved_kwargs)
            for host, dev in zip(args, moved, strict=True):
                copy_back(host, dev)
            for key, value in kwargs.items():
                copy_back(value, moved_kwargs[key])
            return result.cpu() if isinstance(result, torch.Tensor) else result

        return call


def real_cases(kc: Any) -> dict[str, tuple[Any, ...]]:
    """Cases at Llama-3-8B-like shapes (head_dim 128, 32 query heads): ``name -> (fn,
    *args)`` in kernel_cases' argument order."""
    import torch

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    out: dict[str, tuple[Any, ...]] = {}
    for kv_heads in (32, 8, 4):  # GQA 1, 4, 8
        for bs in (16, 32, 64):
            for kind in ("none", "fp8", "int4-g64"):
                for window, sinks in ((None, 0), (40, 4)):
                    tag = f"real-h32-kv{kv_heads}-bs{bs}-{kind}-w{window}-s{sinks}"
                    out[f"decode-{tag}"] = (kc.case_decode, 32, kv_heads, bs, window, bf16, kind,
                                            sinks)  # fmt: skip
                    out[f"prefill-{tag}"] = (kc.case_prefill, 32, kv_heads, bs, window, bf16,
                                             kind, sinks)  # fmt: skip
    for dtype, name in ((f16, "fp16"), (f32, "fp32")):
        for kind in ("none", "fp8", "int4-g16"):
            tag = f"real-h32-kv8-bs16-{kind}-{name}"
            out[f"decode-{tag}"] = (kc.case_decode, 32, 8, 16, None, dtype, kind)
            out[f"prefill-{tag}"] = (kc.case_prefill, 32, 8, 16, 40, dtype, kind, 4)
    for kind in ("none", "fp8", "int4-g16", "int4-g64"):
        for dtype, name in ((bf16, "bf16"), (f32, "fp32")):
            out[f"write-real-kv8-bs16-{kind}-{name}"] = (kc.case_write, 8, 16, dtype, kind)
        out[f"copy-real-bs16-{kind}"] = (kc.case_copy, 16, bf16, kind)
    return out


def all_cases(kc: Any) -> list[tuple[str, int]]:
    """(name, head_dim) of every case to run, in order."""
    small = [(name, kc.HEAD_DIM) for name in kc.cases() if name not in ENGINE_CASES]
    return small + [(name, REAL_HEAD_DIM) for name in real_cases(kc)]


_KC: Any = None


def _run_one(name: str, head_dim: int, interpret: bool) -> tuple[str, str]:
    global _KC
    if _KC is None:
        _KC = load(interpret)
    kc = _KC
    kc.HEAD_DIM = head_dim  # the case functions read it at call time
    table = real_cases(kc) if head_dim == REAL_HEAD_DIM else kc.cases()
    fn, *args = table[name]
    try:
        fn(*args)
        return name, "ok"
    except Exception:  # reported per case
        return name, traceback.format_exc(limit=4)


def run(names: Sequence[tuple[str, int]], jobs: int, interpret: bool) -> dict[str, str]:
    """Every case in ``names``, in ``jobs`` spawned processes (1: in this one)."""
    if jobs <= 1:
        return dict(_run_one(n, d, interpret) for n, d in names)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_one, n, d, interpret) for n, d in names]
        return dict(f.result() for f in futures)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", default="", help="cases whose name has one of these, a,b,...")
    parser.add_argument(
        "--interpret", action="store_true", help="on the CPU under TRITON_INTERPRET=1"
    )
    args = parser.parse_args(argv)
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print(f"native_cases: {NO_CUDA}", file=sys.stderr)
        return 2
    kc = load(args.interpret)
    wanted = [w for w in args.only.split(",") if w] or [""]
    names = [(n, d) for n, d in all_cases(kc) if any(w in n for w in wanted)]
    start = time.perf_counter()
    results = run(names, args.jobs, args.interpret)
    wall = time.perf_counter() - start
    failures = {n: e for n, e in results.items() if e != "ok"}
    for name, error in failures.items():
        last = [line for line in error.strip().splitlines() if line.strip()][-1]
        print(f"FAILED {name}: {last}")
    where = "interpreted on the CPU" if args.interpret else torch.cuda.get_device_name(0)
    print(f"native kernel cases ({where}): {len(results) - len(failures)}/{len(results)} "
          f"passed in {wall:.0f} s over {args.jobs} processes")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"wall_s": round(wall, 1), "results": results},
                                        indent=1) + "\n")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Offline sm_90a compile proxies for the Triton kernels: registers, spills, shared memory
and instruction counts per configuration, with no GPU.

Each configuration calls a public kernel function (``decode_attention``,
``prefill_attention``, ``write_kv``, ``copy_blocks``) on small CPU tensors while
``triton.runtime.jit.JITFunction.run`` is replaced by a recorder, so every launch the
function would make is captured (kernel, arguments, grid) and none runs. Each recorded
launch is then compiled for ``GPUTarget("cuda", 90, 32)`` (sm_90a, the H100/H200) with
``triton.compile(ASTSource(fn, signature, constexprs, attrs))``, its signature built from
the arguments as Triton's launcher would: tensors by dtype (``*bf16``, ``*u8``, ...),
ints ``i32``/``i64`` (1 becomes a constexpr and a multiple of 16 gets the divisibility
attribute, as at run time, unless the parameter is in ``do_not_specialize``), floats
``fp32``, constexpr keyword arguments as constexprs, ``num_warps``/``num_stages`` as
options. The proxies therefore follow the kernels as they change, as long as the public
functions keep their signatures. What is read from each compiled kernel:

- registers, stack frame, shared memory: ``cuobjdump -res-usage`` on the cubin;
- spill stores and loads (bytes): ptxas's own ``-v`` report of that compile (Triton's
  ``TRITON_DUMP_PTXAS_LOG``), and the local-memory instructions (``STL``/``LDL``) in the
  SASS as a cross-check;
- instructions: the SASS total (``cuobjdump -sass``) and the main loop's, the body of the
  largest innermost backward branch (the KV block loop: one iteration per block of
  ``block_size`` tokens), with its global loads (``LDG``) and matrix instructions
  (``HMMA``/``HGMMA``).

Shapes are Llama-3-8B's and its neighbours: 32 query heads with 32, 8 or 4 kv heads (GQA
1, 4, 8), head_dim 64 or 128, blocks of 16, 32 or 64 tokens, KV stored as is (``none``),
``fp8`` or ``int4`` (``KVQuant.int4(64, ...)``, the quantizer's default group), the model
in bfloat16, and float16 and float32 at the default shape. ``full_grid()`` is that whole
grid (112 attention configurations, plus the cache writes and block copies: 119 kernels,
about 9 minutes over two processes on two cores); ``ci_grid()`` is a representative
subset of 14 (every value of every axis at least once) that
``tests/project/test_kernel_proxies.py`` compiles over two processes and checks for zero spills.

    python tools/kernel_proxies.py [--ci] [--jobs 2] [--json FILE] [--only SUBSTRING]

Needs only Triton's nvidia backend (it ships ``ptxas``, ``cuobjdump`` and ``nvdisasm``);
``tool_problem()`` says when they are missing. Never set ``TRITON_INTERPRET`` here.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels only: the interpreter has none

from enginekit.extras import exit_if_missing  # noqa: E402

exit_if_missing("tools/kernel_proxies.py", extras=["torch"], modules=["triton"])

import torch  # noqa: E402

from enginekit.kernels.layout import KVTensors, allocate_kv_tensors  # noqa: E402
from enginekit.spec.kv import KVSpec  # noqa: E402
from enginekit.spec.quant import KVQuant  # noqa: E402

NUM_HEADS = 32
INT4_GROUP = 64  # the int4 quantizer's default group_size
TARGET_ARCH = 90  # sm_90a: H100 and H200
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.uint8: "*u8",
    torch.int8: "*i8",
    torch.int16: "*i16",
    torch.int32: "*i32",
    torch.int64: "*i64",
}
LAYER = 3  # a layer index with no specialization (neither 1 nor a multiple of 16)
NUM_LAYERS = 4


@dataclass(frozen=True)
class KernelConfig:
    """One call of a public kernel function. ``op``: decode | prefill | write | copy."""

    op: str
    head_dim: int = 128
    num_kv_heads: int = 8
    block_size: int = 16
    kind: str = "none"
    dtype: str = "bf16"

    @property
    def gqa(self) -> int:
        return NUM_HEADS // self.num_kv_heads

    @property
    def name(self) -> str:
        return (
            f"{self.op}-d{self.head_dim}-gqa{self.gqa}-bs{self.block_size}-{self.kind}-{self.dtype}"
        )

    def quant(self) -> KVQuant:
        if self.kind == "int4":
            return KVQuant.int4(INT4_GROUP, self.block_size, self.head_dim)
        return KVQuant(self.kind)


class Launch(NamedTuple):
    """One recorded kernel launch: what ``kernel[grid](*args, **kwargs)`` was given."""

    fn: Any  # triton.runtime.jit.JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grid: Any


class KernelStats(NamedTuple):
    """What one compiled kernel costs (see the module docstring for the sources)."""

    config: str
    kernel: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    local_instructions: int  # STL/LDL in the SASS
    stack_bytes: int
    shared_bytes: int
    num_warps: int
    num_stages: int
    sass_instructions: int
    loop_instructions: int  # 0 when the kernel has no loop
    loop_global_loads: int
    loop_matrix_instructions: int
    num_innermost_loops: int
    block_size: int
    tile_tokens: int  # keys one main-loop iteration reads (a key tile or a page); 0: none
    compile_s: float

    @property
    def has_spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


# ---------------------------------------------------------------------------------------
# The grids


def attention_grid(ops: Sequence[str] = ("decode", "prefill")) -> list[KernelConfig]:
    """decode/prefill x head_dim 64/128 x GQA 1/4/8 x blocks 16/32/64 x none/fp8/int4 in
    bfloat16, then float16 and float32 at the default shape."""
    configs = [
        KernelConfig(op, head_dim, kv_heads, block_size, kind)
        for op in ops
        for head_dim in (64, 128)
        for kv_heads in (32, 8, 4)
        for block_size in (16, 32, 64)
        for kind in ("none", "fp8", "int4")
    ]
    configs += [KernelConfig(op, dtype=dtype) for op in ops for dtype in ("fp16", "fp32")]
    return configs


def cache_grid() -> list[KernelConfig]:
    """The cache writes of every kind and the block copies (unquantized and int4, whose
    scales are extra block tensors), at the default shape."""
    return [KernelConfig("write", kind=kind) for kind in ("none", "fp8", "int4")] + [
        KernelConfig("copy", kind=kind) for kind in ("none", "int4")
    ]


def full_grid() -> list[KernelConfig]:
    return attention_grid() + cache_grid()


def ci_grid() -> list[KernelConfig]:
    """Every value of every axis at least once for both attention ops (float32 in decode,
    float16 in prefill), the int4 cache write (the largest cache kernel) and a block copy:
    the configurations whose compile takes longest (int4 with GQA 8 and blocks of 64, over
    a minute in decode today) are left to the full grid."""
    configs = []
    for op, dtype in (("decode", "fp32"), ("prefill", "fp16")):
        configs += [
            KernelConfig(op),  # Llama-3-8B: head_dim 128, GQA 4, blocks of 16, bfloat16
            KernelConfig(op, kind="fp8"),
            KernelConfig(op, kind="int4"),
            KernelConfig(op, head_dim=64, num_kv_heads=32, block_size=32),
            KernelConfig(op, num_kv_heads=4, block_size=64),
            KernelConfig(op, dtype=dtype),
        ]
    return configs + [KernelConfig("write", kind="int4"), KernelConfig("copy")]


# ---------------------------------------------------------------------------------------
# Inputs and recording


def new_pool(config: KernelConfig, num_blocks: int, device: str | torch.device,
             num_layers: int = NUM_LAYERS) -> KVTensors:  # fmt: skip
    """A pool of ``config``'s format, filled with small random values (fp8 scales set)."""
    dtype = DTYPES[config.dtype]
    quant = config.quant()
    bits = quant.bits_per_element(torch.finfo(dtype).bits)
    spec = KVSpec(num_layers, config.num_kv_heads, config.head_dim, bits, config.block_size, quant)
    pool = allocate_kv_tensors(spec, num_blocks, dtype, device)
    g = torch.Generator(device=device).manual_seed(0)
    for tensor in pool.block_tensors:
        if tensor.dtype == torch.uint8:
            tensor.copy_(torch.randint(0, 256, tensor.shape, generator=g, device=device))
        elif tensor.dtype == torch.float8_e4m3fn:
            tensor.view(torch.uint8).copy_(
                torch.randint(0, 0x70, tensor.shape, generator=g, device=device)
            )
        else:
            tensor.copy_(torch.rand(tensor.shape, generator=g, device=device) * 0.1)
    if pool.fp8_scales is not None:
        pool.set_fp8_scales(None, torch.full_like(pool.fp8_scales, 0.01))
    return pool


def call_kernel(config: KernelConfig, device: str | torch.device = "cpu") -> None:
    """Calls ``config``'s public kernel function once on small inputs (two sequences of a
    few blocks): enough for every launch it makes, with the argument kinds of a real run.
    Decode is split in two, so that the split kernel and the merge kernel are recorded
    (an unsplit decode runs the same kernel but for the epilogue, which stores directly)."""
    from enginekit.kernels.triton import attention, cache

    dtype = DTYPES[config.dtype]
    bs = config.block_size
    pool = new_pool(config, num_blocks=8, device=device)
    g = torch.Generator(device=device).manual_seed(1)
    # A table width that is no multiple of 16, as most batches' are.
    tables = torch.arange(2 * 3, dtype=torch.int32, device=device).reshape(2, 3) + 1
    if config.op in ("decode", "prefill"):
        scale = config.head_dim**-0.5
        if config.op == "decode":
            lens = torch.tensor([bs + 3, 2 * bs + 5], dtype=torch.int32, device=device)
            q = torch.randn(2, NUM_HEADS, config.head_dim, generator=g, device=device)
            attention.decode_attention(q.to(dtype), pool, LAYER, tables, lens, scale,
                                       num_splits=2)  # fmt: skip
        else:
            chunks, starts = [bs + 1, 5], [bs, 3]
            q_starts = torch.tensor([0, chunks[0], sum(chunks)], dtype=torch.int32, device=device)
            ctx = torch.tensor(starts, dtype=torch.int32, device=device)
            q = torch.randn(sum(chunks), NUM_HEADS, config.head_dim, generator=g, device=device)
            attention.prefill_attention(q.to(dtype), pool, LAYER, tables, q_starts, ctx,
                                        max(chunks), scale)  # fmt: skip
    elif config.op == "write":
        num_tokens = 5
        kv = torch.randn(num_tokens, 2, config.num_kv_heads, config.head_dim, generator=g,
                         device=device).to(dtype)  # fmt: skip
        slots = torch.tensor([3, bs + 1, bs + 2, 2 * bs, 7], dtype=torch.int64, device=device)
        cache.write_kv(pool, LAYER, kv[:, 0], kv[:, 1], slots)
    elif config.op == "copy":
        src = torch.tensor([1, 2], dtype=torch.int64, device=device)
        dst = torch.tensor([4, 5], dtype=torch.int64, device=device)
        cache.copy_blocks(pool, src, dst)
    else:
        raise ValueError(f"unknown op {config.op!r}")


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Within the block, every Triton kernel launch is recorded into the yielded list
    instead of running (``JITFunction.run`` replaced; restored on exit)."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    original = JITFunction.run

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs, grid))

    JITFunction.run = record  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


def record_launches(call: Callable[[], object]) -> list[Launch]:
    with recording() as launches:
        call()
    return launches


# ---------------------------------------------------------------------------------------
# Compiling


def _arg_type(value: Any, specialize: bool, align: bool) -> tuple[str, Any, bool]:
    """(signature type, constexpr value or None, has the divisibility-16 attribute) of one
    non-constexpr argument, by the rules of Triton's launcher."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in POINTER_TYPES:
            raise TypeError(f"no Triton pointer type for {value.dtype}")
        return POINTER_TYPES[value.dtype], None, align and value.data_ptr() % 16 == 0
    if value is None:
        return "constexpr", None, False
    if isinstance(value, bool):
        return "u1", None, False
    if isinstance(value, int):
        if specialize and value == 1:
            return "constexpr", 1, False
        if -(2**31) <= value < 2**31:
            kind = "i32"
        elif 0 <= value < 2**63:
            kind = "i64"
        else:
            kind = "u64"
        return kind, None, specialize and align and value % 16 == 0
    if isinstance(value, float):
        return "fp32", None, False
    raise TypeError(f"unsupported kernel argument {type(value).__name__}")


class CompileInput(NamedTuple):
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[tuple[int, ...], list[list[Any]]]
    options: dict[str, Any]


OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")


def compile_input(launch: Launch) -> CompileInput:
    """The signature, constexprs, attributes and options one launch compiles with."""
    fn = launch.fn
    bound = dict(zip(fn.arg_names, launch.args, strict=False))
    options = {k: v for k, v in launch.kwargs.items() if k in OPTION_NAMES}
    bound.update({k: v for k, v in launch.kwargs.items() if k not in OPTION_NAMES})
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, param in enumerate(fn.params):
        name = param.name
        if name not in bound:
            if param.default is inspect.Parameter.empty:
                raise TypeError(f"{fn.__name__}: no value for {name}")
            bound[name] = param.default
        value = bound[name]
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = value
            continue
        kind, const, divisible = _arg_type(
            value, not param.do_not_specialize, not param.do_not_specialize_on_alignment
        )
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = const
        if divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return CompileInput(fn, signature, constexprs, attrs, options)


def tool_dir() -> Path:
    """Triton's nvidia backend's bin folder (ptxas, cuobjdump, nvdisasm)."""
    import triton

    return Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin"


def tool_problem() -> str | None:
    """None when the offline toolchain is there; else what is missing."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError as exc:
        return f"Triton's nvidia backend is not installed ({exc})"
    missing = [t for t in ("ptxas", "cuobjdump") if not (tool_dir() / t).is_file()]
    if missing:
        return f"{', '.join(missing)} missing from {tool_dir()}"
    return None


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:`?\(?)(0x[0-9a-f]+)")


class Instruction(NamedTuple):
    address: int
    opcode: str  # without predicate, e.g. "LDG.E.128"
    text: str


def parse_sass(sass: str) -> list[Instruction]:
    """The instructions of ``cuobjdump -sass`` output, in address order."""
    out = []
    for match in _SASS_LINE.finditer(sass):
        text = match.group(2).strip()
        words = text.split()
        if not words:
            continue
        opcode = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        out.append(Instruction(int(match.group(1), 16), opcode, text))
    return out


class Loop(NamedTuple):
    start: int  # address of the first instruction of the body
    end: int  # address of the backward branch

    def contains(self, other: Loop) -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def innermost_loops(instructions: Sequence[Instruction]) -> list[Loop]:
    """Loops closed by a backward branch (a BRA to a lower address) that contain no other
    such loop; the trailing branch-to-itself is not a loop."""
    loops = []
    for ins in instructions:
        if not ins.opcode.startswith("BRA"):
            continue
        target = _BRANCH.search(ins.text)
        if target and int(target.group(1), 16) < ins.address:
            loops.append(Loop(int(target.group(1), 16), ins.address))
    return [loop for loop in loops if not any(loop.contains(other) for other in loops)]


def sass_counts(instructions: Sequence[Instruction]) -> dict[str, int]:
    """Totals over the kernel and its main loop (the largest innermost loop)."""
    loops = innermost_loops(instructions)

    def body(loop: Loop) -> list[Instruction]:
        return [i for i in instructions if loop.start <= i.address <= loop.end]

    main = max((body(loop) for loop in loops), key=len, default=[])
    return {
        "sass_instructions": len(instructions),
        "loop_instructions": len(main),
        "loop_global_loads": sum(i.opcode.startswith("LDG") for i in main),
        "loop_matrix_instructions": sum(i.opcode.split(".")[0] in MATRIX_OPCODES for i in main),
        "num_innermost_loops": len(loops),
        "local_instructions": sum(i.opcode.startswith(("STL", "LDL")) for i in instructions),
    }


MATRIX_OPCODES = {"HMMA", "HGMMA", "QGMMA", "IMMA", "IGMMA", "BMMA", "DMMA"}
_RES_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_launch(launch: Launch, config: KernelConfig) -> KernelStats:
    """Compiles one recorded launch for sm_90a and reads its costs. Raises what
    ``triton.compile`` raises, or RuntimeError when a tool fails."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    inp = compile_input(launch)
    source = ASTSource(inp.fn, inp.signature, inp.constexprs, inp.attrs)
    target = GPUTarget("cuda", TARGET_ARCH, 32)
    log = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(source, target=target, options=dict(inp.options))
    compile_s = time.perf_counter() - start
    spills = _SPILLS.findall(log.getvalue())
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        res = _run_tool("cuobjdump", "-res-usage", str(cubin))
        sass = _run_tool("cuobjdump", "-sass", str(cubin))
    usage = _RES_USAGE.search(res)
    if usage is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output:\n{res}")
    counts = sass_counts(parse_sass(sass))
    if not spills:  # no ptxas report: the local-memory instructions say whether it spills
        spills = [(counts["local_instructions"], counts["local_instructions"])]
    metadata = kernel.metadata
    return KernelStats(
        config=config.name,
        kernel=inp.fn.__name__,
        registers=int(usage.group(1)),
        spill_store_bytes=sum(int(s) for s, _ in spills),
        spill_load_bytes=sum(int(load) for _, load in spills),
        stack_bytes=int(usage.group(2)),
        shared_bytes=int(getattr(metadata, "shared", 0) or usage.group(3)),
        num_warps=int(metadata.num_warps),
        num_stages=int(metadata.num_stages),
        block_size=config.block_size,
        tile_tokens=int(launch.kwargs.get("BLOCK_N", launch.kwargs.get("BLOCK_SIZE", 0))),
        compile_s=round(compile_s, 2),
        **counts,
    )


def _run_tool(name: str, *args: str) -> str:
    proc = subprocess.run([str(tool_dir() / name), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _key(launch: Launch) -> str:
    inp = compile_input(launch)
    return repr((inp.fn.__name__, inp.signature, inp.constexprs, inp.attrs, inp.options))


def measure(config: KernelConfig) -> list[KernelStats | str]:
    """Every distinct kernel ``config``'s call launches, compiled; a failure is its
    error message (so a grid run reports every failure)."""
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, made explicit
    previous = os.environ.get("TRITON_CACHE_DIR")
    # A fresh cache for each configuration: a cached kernel would skip ptxas and its report.
    with tempfile.TemporaryDirectory(prefix="kernel-proxies-") as cache_dir:
        os.environ["TRITON_CACHE_DIR"] = cache_dir
        try:
            return _measure(config)
        finally:
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = previous


def _measure(config: KernelConfig) -> list[KernelStats | str]:
    try:
        launches = record_launches(lambda: call_kernel(config))
    except Exception as exc:  # reported per configuration
        return [f"{config.name}: the call failed: {type(exc).__name__}: {exc}"]
    results: list[KernelStats | str] = []
    seen: set[str] = set()
    for launch in launches:
        key = _key(launch)
        if key in seen:
            continue
        seen.add(key)
        try:
            results.append(compile_launch(launch, config))
        except Exception as exc:  # reported per kernel
            message = str(exc).strip().splitlines()
            short = next(
                (m for m in message if "error" in m.lower()), message[0] if message else ""
            )
            results.append(f"{config.name} {launch.fn.__name__}: {type(exc).__name__}: {short}")
    if not launches:
        results.append(f"{config.name}: the call launched no kernel")
    return results


def measure_all(configs: Iterable[KernelConfig], jobs: int = 2) -> list[KernelStats | str]:
    """``measure`` over ``configs``, in ``jobs`` processes (fork; no CUDA is touched)."""
    configs = list(configs)
    if jobs <= 1:
        return [r for c in configs for r in measure(c)]
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs) as pool:
        return [r for rs in pool.map(measure, configs, chunksize=1) for r in rs]


# ---------------------------------------------------------------------------------------
# Report


def table(results: Sequence[KernelStats | str]) -> str:
    header = ("configuration", "kernel", "regs", "spill st/ld B", "stack B", "smem B",
              "warps", "SASS", "loop", "loop/token", "LDG", "MMA", "compile s")  # fmt: skip
    rows = []
    for r in results:
        if isinstance(r, str):
            continue
        has_tiles = r.tile_tokens and r.loop_instructions
        per_token = f"{r.loop_instructions / r.tile_tokens:.0f}" if has_tiles else "-"
        rows.append((
            r.config, r.kernel.lstrip("_"), str(r.registers),
            f"{r.spill_store_bytes}/{r.spill_load_bytes}", str(r.stack_bytes),
            str(r.shared_bytes), str(r.num_warps), f"{r.sass_instructions:,}",
            f"{r.loop_instructions:,}", per_token, str(r.loop_global_loads),
            str(r.loop_matrix_instructions), f"{r.compile_s:.1f}",
        ))  # fmt: skip
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(header)]  # fmt: skip
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    failures = [r for r in results if isinstance(r, str)]
    if failures:
        lines += ["", "failed:", *(f"  {f}" for f in failures)]
    return "\n".join(lines)


def summary(results: Sequence[KernelStats | str]) -> str:
    stats = [r for r in results if not isinstance(r, str)]
    spilling = [r for r in stats if r.has_spills]
    failed = len(results) - len(stats)
    return (
        f"{len(stats)} kernels compiled for sm_{TARGET_ARCH}a, {failed} failed, "
        f"{len(spilling)} spill"
        + (f" ({', '.join(f'{r.config} {r.kernel}' for r in spilling)})" if spilling else "")
    )


def versions() -> dict[str, str]:
    import triton

    return {"triton": triton.__version__, "torch": torch.__version__,
            "python": sys.version.split()[0]}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the CI subset, not the full grid")
    parser.add_argument("--jobs", type=int, default=2, help="compile processes")
    parser.add_argument("--only", default="", help="configurations whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    problem = tool_problem()
    if problem:
        print(f"kernel_proxies: cannot compile offline: {problem}", file=sys.stderr)
        return 2
    configs = [c for c in (ci_grid() if args.ci else full_grid()) if args.only in c.name]
    start = time.perf_counter()
    results = measure_all(configs, args.jobs)
    wall = time.perf_counter() - start
    print(f"{versions()}, {len(configs)} configurations, {args.jobs} processes, {wall:.0f} s")
    print(table(results))
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps({
            "versions": versions(), "wall_s": round(wall, 1),
            "results": [r if isinstance(r, str) else {**r._asdict(), "has_spills": r.has_spills}
                        for r in results],
            "configs": [asdict(c) for c in configs],
        }, indent=1) + "\n")  # fmt: skip
    return 1 if any(isinstance(r, str) for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

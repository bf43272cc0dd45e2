"""The paged attention kernels on a CUDA GPU, beside torch's scaled_dot_product_attention.

One layer of Llama-3-8B's attention (32 query heads, 8 kv heads, head_dim 128, bfloat16
queries), KV in pages of 16 tokens stored as is (``none``, bfloat16), ``fp8`` or ``int4``
(``KVQuant.int4(64, ...)``, the quantizer's default), every sequence of the batch at the
same context length, its pages in a random order of the pool. In one run, per point:

- ``decode``: one query per sequence attending its whole context, through the public
  ``decode_attention``; bandwidth = bytes of K/V actually read (every page of the context,
  its int4 scales included) + query + output, over the median time, and its share of the
  H200's 4.8 TB/s;
- ``prefill``: each sequence's whole context as one causal chunk (nothing cached), through
  ``prefill_attention``; rate = 4 × heads × head_dim × L(L+1)/2 FLOPs per sequence (QKᵀ
  and PV over the causal half), and its share of the dense bf16 peak (989 TFLOP/s).
  Points with more than ``MAX_PREFILL_TOKENS`` tokens in the batch are left out;
- torch's ``scaled_dot_product_attention`` (``enable_gqa``, causal for prefill) on the
  same K/V laid out contiguously in bfloat16 (dequantized for fp8/int4), with its own rate
  (its bytes are bfloat16 K/V); ``SDPA ÷ kernel`` is the time ratio, and the relative
  error ‖kernel − SDPA‖ / ‖SDPA‖ checks the kernel on every point.

Times are ``triton.testing.do_bench`` medians (CUDA events, L2 flushed between calls),
after a warm-up that compiles. The run first measures the machine's own ceilings (a
device-to-device copy and a bf16 8192³ matmul on random data) and reports them beside the
datasheet peaks. ``--quick`` runs a small grid.

    python benchmarks/bench_kernels.py [--quick] [--json FILE] [--kinds none,fp8,int4]

Without a CUDA GPU it exits with status 2 and one line saying so; without the torch extra
(torch, triton), likewise, naming the extra.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from enginekit.extras import exit_if_missing

exit_if_missing("benchmarks/bench_kernels.py", extras=["torch"], modules=["triton"])

import torch  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
INT4_GROUP = 64
PEAK_BANDWIDTH = 4.8e12  # H200 HBM3e, bytes/s (enginekit.spec.hardware's h200)
PEAK_FLOPS = 989e12  # dense bf16, FLOP/s
MAX_PREFILL_TOKENS = 65536
KINDS = ("none", "fp8", "int4")
FULL_BATCHES, FULL_CONTEXTS = (1, 4, 16, 64, 256), (256, 1024, 4096, 16384, 32768)
QUICK_BATCHES, QUICK_CONTEXTS = (1, 16, 128), (1024, 8192)
DEQUANT_CHUNK_BLOCKS = 16384  # pages dequantized at a time into the contiguous copy
NO_CUDA = "needs a CUDA GPU; torch.cuda.is_available() is False on this machine"


@dataclass(frozen=True)
class Point:
    op: str  # decode | prefill
    kind: str
    batch: int
    context: int

    @property
    def num_pages(self) -> int:
        """Pages per sequence."""
        return -(-self.context // PAGE)


def grid_points(batches: Sequence[int], contexts: Sequence[int],
                kinds: Sequence[str] = KINDS) -> list[Point]:  # fmt: skip
    """Decode at every (batch, context); prefill where the batch holds at most
    ``MAX_PREFILL_TOKENS`` tokens."""
    points = []
    for op in ("decode", "prefill"):
        for kind in kinds:
            for batch in batches:
                for context in contexts:
                    if op == "prefill" and batch * context > MAX_PREFILL_TOKENS:
                        continue
                    points.append(Point(op, kind, batch, context))
    return points


def quant_of(kind: str):
    from enginekit.spec.quant import KVQuant

    return KVQuant.int4(INT4_GROUP, PAGE, HEAD_DIM) if kind == "int4" else KVQuant(kind)


def page_bytes(kind: str) -> int:
    """Bytes of one page of one layer: K and V of every kv head, int4 scales included."""
    from enginekit.spec.kv import KVSpec

    quant = quant_of(kind)
    return KVSpec(
        1, NUM_KV_HEADS, HEAD_DIM, quant.bits_per_element(16), PAGE, quant
    ).bytes_per_block


def query_output_bytes(num_tokens: int) -> int:
    """The bfloat16 query read and output written."""
    return 2 * num_tokens * NUM_HEADS * HEAD_DIM * 2


def decode_bytes(point: Point) -> int:
    """What the kernel must move: every page of every sequence's context (the fp8
    per-head scales, 2 × kv_heads float32, included), the block table, query and output."""
    pages = point.batch * point.num_pages
    scales = 2 * NUM_KV_HEADS * 4 if point.kind == "fp8" else 0
    return pages * page_bytes(point.kind) + scales + pages * 4 + query_output_bytes(point.batch)


def sdpa_decode_bytes(point: Point) -> int:
    """SDPA's: contiguous bfloat16 K and V of the context, query and output."""
    kv = point.batch * point.context * NUM_KV_HEADS * HEAD_DIM * 2 * 2
    return kv + query_output_bytes(point.batch)


def prefill_flops(point: Point) -> int:
    """QKᵀ and PV over the causal half (L(L+1)/2 pairs per head), 2 FLOPs per MAC."""
    pairs = point.context * (point.context + 1) // 2
    return 4 * point.batch * NUM_HEADS * HEAD_DIM * pairs


class Row(NamedTuple):
    """One point's figures; rates in GB/s (decode) or TFLOP/s (prefill), None where a
    side failed (``note`` says why)."""

    op: str
    kind: str
    batch: int
    context: int
    kernel_ms: float | None
    kernel_rate: float | None
    kernel_pct_peak: float | None
    sdpa_ms: float | None
    sdpa_rate: float | None
    sdpa_pct_peak: float | None
    sdpa_over_kernel: float | None
    rel_error: float | None
    note: str

    @property
    def unit(self) -> str:
        return "GB/s" if self.op == "decode" else "TFLOP/s"


# ---------------------------------------------------------------------------------------
# Data on the device


class Inputs(NamedTuple):
    pool: Any  # KVTensors
    tables: torch.Tensor  # int32 [B, pages]
    query: torch.Tensor  # [tokens, heads, head_dim]
    key: torch.Tensor  # contiguous bf16 [B, kv_heads, L, head_dim]
    value: torch.Tensor


def random_pool(kind: str, num_pages: int, device: torch.device, g: torch.Generator):
    """A one-layer pool of ``num_pages`` pages of random, finite, valid encodings."""
    from enginekit.kernels.layout import allocate_kv_tensors
    from enginekit.spec.kv import KVSpec

    quant = quant_of(kind)
    spec = KVSpec(1, NUM_KV_HEADS, HEAD_DIM, quant.bits_per_element(16), PAGE, quant)
    pool = allocate_kv_tensors(spec, num_pages, torch.bfloat16, device)
    if kind == "none":
        pool.data.normal_(generator=g)
    elif kind == "fp8":
        bits = torch.randint(
            0, 0x7F, pool.data.shape, generator=g, device=device, dtype=torch.uint8
        )
        sign = torch.randint(0, 2, pool.data.shape, generator=g, device=device, dtype=torch.uint8)
        pool.data.view(torch.uint8).copy_(bits | (sign << 7))  # no 0x7F/0xFF: no NaN
        pool.set_fp8_scales(None, torch.full_like(pool.fp8_scales, 1 / 64))
    else:
        pool.data.copy_(torch.randint(0, 256, pool.data.shape, generator=g, device=device,
                                      dtype=torch.uint8))  # fmt: skip
        for meta in (pool.key_meta, pool.value_meta):
            meta[..., 0, :].uniform_(0.05, 0.2, generator=g)  # scales
            meta[..., 1, :].uniform_(-1.0, -0.5, generator=g)  # zero points
    return pool


def contiguous_kv(pool, tables: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of every sequence, bfloat16 [B, kv_heads, context, head_dim]:
    the pages gathered in table order (dequantized a chunk at a time for fp8/int4)."""
    from enginekit.kernels.quantize import dequantize_blocks

    batch, num_pages = tables.shape
    shape = (batch, NUM_KV_HEADS, num_pages * PAGE, HEAD_DIM)
    key = torch.empty(shape, dtype=torch.bfloat16, device=tables.device)
    value = torch.empty_like(key)
    seqs_per_chunk = max(1, DEQUANT_CHUNK_BLOCKS // num_pages)
    for first in range(0, batch, seqs_per_chunk):
        rows = tables[first : first + seqs_per_chunk]
        k, v = dequantize_blocks(pool, 0, rows.reshape(-1).long())  # [n, kvh, page, d]
        for out, x in ((key, k), (value, v)):
            x = x.reshape(rows.shape[0], num_pages, NUM_KV_HEADS, PAGE, HEAD_DIM)
            out[first : first + rows.shape[0]] = (
                x.permute(0, 2, 1, 3, 4).reshape(rows.shape[0], *shape[1:]).to(torch.bfloat16)
            )
    return key[:, :, :context], value[:, :, :context]


def make_inputs(point: Point, device: torch.device, seed: int = 0) -> Inputs:
    g = torch.Generator(device=device).manual_seed(seed)
    num_pages = point.batch * point.num_pages
    pool = random_pool(point.kind, num_pages, device, g)
    order = torch.randperm(num_pages, generator=g, device=device)
    tables = order.to(torch.int32).reshape(point.batch, point.num_pages)
    tokens = point.batch if point.op == "decode" else point.batch * point.context
    query = torch.randn(tokens, NUM_HEADS, HEAD_DIM, generator=g, device=device,
                        dtype=torch.bfloat16)  # fmt: skip
    key, value = contiguous_kv(pool, tables, point.context)
    return Inputs(pool, tables, query, key, value)


def kernel_call(point: Point, inputs: Inputs) -> Callable[[], torch.Tensor]:
    from enginekit.kernels.triton.attention import decode_attention, prefill_attention

    scale = HEAD_DIM**-0.5
    device = inputs.query.device
    batch, context = point.batch, point.context
    if point.op == "decode":
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        return lambda: decode_attention(inputs.query, inputs.pool, 0, inputs.tables, lens, scale)
    q_starts = torch.arange(0, batch * context + 1, context, dtype=torch.int32, device=device)
    ctx_starts = torch.zeros(batch, dtype=torch.int32, device=device)
    return lambda: prefill_attention(inputs.query, inputs.pool, 0, inputs.tables, q_starts,
                                     ctx_starts, context, scale)  # fmt: skip


def sdpa_call(point: Point, inputs: Inputs) -> Callable[[], torch.Tensor]:
    """SDPA on the contiguous copy, returning the kernel's layout [tokens, heads, dim]."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    scale = HEAD_DIM**-0.5
    if point.op == "decode":
        q = inputs.query.view(point.batch, NUM_HEADS, 1, HEAD_DIM)
        return lambda: sdpa(q, inputs.key, inputs.value, scale=scale, enable_gqa=True).view(
            point.batch, NUM_HEADS, HEAD_DIM
        )
    q = inputs.query.view(point.batch, point.context, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    return lambda: (
        sdpa(q, inputs.key, inputs.value, scale=scale, is_causal=True, enable_gqa=True)
        .transpose(1, 2).reshape(-1, NUM_HEADS, HEAD_DIM)
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Measuring


def median_ms(fn: Callable[[], object], warmup_ms: int, rep_ms: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:120] if text else ''}"


def measure_point(point: Point, device: torch.device, warmup_ms: int, rep_ms: int) -> Row:
    notes = []
    kernel_ms = sdpa_ms = rel = None
    try:
        inputs = make_inputs(point, device)
    except torch.OutOfMemoryError as exc:
        return Row(point.op, point.kind, point.batch, point.context, None, None, None, None,
                   None, None, None, None, f"inputs: {_error(exc)}")  # fmt: skip
    kernel, reference = kernel_call(point, inputs), sdpa_call(point, inputs)
    got = want = None
    try:
        got = kernel()  # compiles
        kernel_ms = median_ms(kernel, warmup_ms, rep_ms)
    except Exception as exc:  # reported in the row
        notes.append(f"kernel: {_error(exc)}")
    try:
        want = reference()
        sdpa_ms = median_ms(reference, warmup_ms, rep_ms)
    except Exception as exc:  # reported in the row (e.g. out of memory)
        notes.append(f"SDPA: {_error(exc)}")
    if got is not None and want is not None:
        diff = torch.linalg.vector_norm((got.float() - want.float()).flatten())
        rel = float(diff / torch.linalg.vector_norm(want.float().flatten()).clamp_min(1e-30))
        if not math.isfinite(rel):
            notes.append("non-finite output")
    del inputs, got, want
    torch.cuda.empty_cache()
    if point.op == "decode":
        work, sdpa_work, peak, scale = (
            decode_bytes(point),
            sdpa_decode_bytes(point),
            PEAK_BANDWIDTH,
            1e9,
        )
    else:
        work = sdpa_work = prefill_flops(point)
        peak, scale = PEAK_FLOPS, 1e12

    def rate(num: int, ms: float | None) -> float | None:
        return None if ms is None else num / (ms * 1e-3) / scale

    k_rate, s_rate = rate(work, kernel_ms), rate(sdpa_work, sdpa_ms)
    return Row(
        point.op, point.kind, point.batch, point.context, kernel_ms, k_rate,
        None if k_rate is None else 100 * k_rate * scale / peak, sdpa_ms, s_rate,
        None if s_rate is None else 100 * s_rate * scale / peak,
        None if kernel_ms is None or sdpa_ms is None else sdpa_ms / kernel_ms, rel,
        "; ".join(notes),
    )  # fmt: skip


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """The machine's own copy bandwidth (bytes read + written) and bf16 matmul rate."""
    n = 1 << 30  # 2 GiB of bfloat16 each way
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), 25, 200)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = median_ms(lambda: a @ b, 25, 200)
    return {
        "copy_gb_s": 2 * n * 2 / (copy_ms * 1e-3) / 1e9,
        "bf16_matmul_tflop_s": 2 * 8192**3 / (mm_ms * 1e-3) / 1e12,
    }


def machine() -> dict[str, str]:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_gib": f"{props.total_memory / (1 << 30):.0f}",
        "multiprocessors": str(props.multi_processor_count),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


# ---------------------------------------------------------------------------------------
# Report


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(rows: Sequence[Row]) -> str:
    header = ("op", "kind", "batch", "context", "kernel ms", "kernel rate", "% peak",
              "SDPA ms", "SDPA rate", "% peak", "SDPA ÷ kernel", "rel err", "note")  # fmt: skip
    cells = [
        (r.op, r.kind, str(r.batch), str(r.context), _fmt(r.kernel_ms, ".3f"),
         f"{_fmt(r.kernel_rate, ',.0f' if r.op == 'decode' else '.1f')} {r.unit}",
         _fmt(r.kernel_pct_peak, ".1f"), _fmt(r.sdpa_ms, ".3f"),
         f"{_fmt(r.sdpa_rate, ',.0f' if r.op == 'decode' else '.1f')} {r.unit}",
         _fmt(r.sdpa_pct_peak, ".1f"), _fmt(r.sdpa_over_kernel, ".2f"),
         _fmt(r.rel_error, ".1e"), r.note)
        for r in rows
    ]  # fmt: skip
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip()
              for cell in cells]  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"bench_kernels: {NO_CUDA}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    kinds = [k for k in args.kinds.split(",") if k]
    batches, contexts = QUICK_BATCHES, QUICK_CONTEXTS
    if not args.quick:
        batches, contexts = FULL_BATCHES, FULL_CONTEXTS
    points = grid_points(batches, contexts, kinds)
    start = time.perf_counter()
    info = machine()
    ceilings = measure_ceilings(device)
    torch.cuda.empty_cache()
    print(f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}: copy "
          f"{ceilings['copy_gb_s']:,.0f} GB/s, bf16 matmul {ceilings['bf16_matmul_tflop_s']:.0f} "
          f"TFLOP/s (peaks used: {PEAK_BANDWIDTH / 1e12:.1f} TB/s, {PEAK_FLOPS / 1e12:.0f} "
          "TFLOP/s)", flush=True)  # fmt: skip
    rows = []
    for point in points:
        rows.append(measure_point(point, device, args.warmup_ms, args.rep_ms))
        r = rows[-1]
        print(f"  {r.op} {r.kind} batch {r.batch} context {r.context}: kernel "
              f"{_fmt(r.kernel_ms, '.3f')} ms, SDPA {_fmt(r.sdpa_ms, '.3f')} ms {r.note}",
              flush=True)  # fmt: skip
    wall = time.perf_counter() - start
    print(table(rows))
    print(f"{len(points)} points in {wall:.0f} s")
    if args.json:
        report = {
            "machine": info,
            "ceilings": ceilings,
            "peaks": {"bandwidth_bytes_s": PEAK_BANDWIDTH, "bf16_flops": PEAK_FLOPS},
            "shape": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                      "page": PAGE, "int4_group": INT4_GROUP, "dtype": "bfloat16"},
            "command": "python3 benchmarks/bench_kernels.py" + " --quick" * args.quick,
            "wall_s": round(wall, 1),
            "rows": [{**r._asdict(), "unit": r.unit} for r in rows],
            "points": [asdict(p) for p in points],
        }  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    failed = [r for r in rows if r.kernel_ms is None or "non-finite" in r.note]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

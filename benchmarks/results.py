"""The README's Results section, generated: runs the benchmarks that make sense on this
machine and writes their tables between ``<!-- results:begin -->`` and
``<!-- results:end -->`` in README.md (appended at the end when the markers are absent).

Runs, side by side where there is something to compare:

- ``bench_bookkeeping.py``: Rust structures against their Python twins, per operation and
  per scheduler step with 256 running sequences, both prefix caches;
- ``bench_simulator.py``: wall time per 1,000 requests at growing counts (up to 30,000
  here, 3,000 with ``--quick``; the benchmark's own default reaches 100,000);
- ``bench_kv_quant_capacity.py --executor sim``: its printed tables, verbatim;
- ``bench_kv_quant_quality.py``: its printed tables, when its trained model is cached;
- the claims (``enginekit.claims.job``): the main table, the rest folded;
- ``tools/kernel_proxies.py --ci``: the kernels compiled offline for sm_90a (registers, spills,
  main-loop instructions per key);
- kernels: ``--kernels FILE`` puts the tables of a ``bench_kernels.py --json`` report in
  (measured on a CUDA machine, which the section names); without it, the README's kernel
  figures are carried over, or the section says how to measure them and what checks them.

The section is headed with the machine (CPU, cores, memory, OS, Python and torch
versions, GPU or "no GPU"), the date and the command. Absolute times are this machine's;
the ratios are what carries over.

    python benchmarks/results.py [--quick] [--readme README.md] [--print] [--kernels FILE]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import bench_bookkeeping  # noqa: E402
import bench_simulator  # noqa: E402
import kernel_proxies  # noqa: E402

from enginekit.claims.job import markdown_table, render_markdown, run_claims  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent
SIM_COUNTS, QUICK_SIM_COUNTS = [1000, 3000, 10000, 30000], [1000, 3000]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return None


def gpu_name() -> str | None:
    """The first CUDA device's name, or None without torch or a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_line() -> str:
    """CPU model, cores, memory, OS, Python, torch and GPU, in one line."""
    try:
        torch = f"torch {importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        torch = "no torch"
    memory = _memory_gib()
    gpu = gpu_name() or "no GPU"
    return (
        f"{_cpu_model()}, {os.cpu_count()} cores, "
        f"{'?' if memory is None else f'{memory:.0f}'} GiB memory, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"{torch}, {gpu}"
    )


def bookkeeping_section(quick: bool) -> str:
    steps, rounds = (500, 3) if quick else (2000, 5)
    rows = bench_bookkeeping.run(steps, rounds, echo=False)
    tables = []
    for section in dict.fromkeys(r.section for r in rows):
        header = (f"per {section}", "Rust µs", "Python µs", "Python ÷ Rust")
        cells = [
            (r.name, f"{r.rust_s * 1e6:,.1f}", f"{r.python_s * 1e6:,.1f}", f"{r.ratio:,.1f}×")
            for r in rows
            if r.section == section
        ]
        tables.append(markdown_table(header, cells))
    return (
        "### Host bookkeeping: Rust against the Python twins\n\n"
        f"`python3 benchmarks/bench_bookkeeping.py --steps {steps} --rounds {rounds}`: median "
        f"of {rounds} interleaved rounds of CPU time; operations on 1,024-token prompts (64 "
        f"blocks of 16), steps with {bench_bookkeeping.NUM_SEQS} running sequences of ~1,000 "
        "tokens, 1 in 16 of them filling a block at each step. `schedule + update` is the "
        "scheduler alone (the executor's tokens given); the engine step adds the simulated "
        "execution and the metrics. Goal: schedule + update <= 50 µs.\n\n"
        + "\n\n".join(tables)
        + "\n"
    )


def simulator_section(quick: bool) -> str:
    counts = QUICK_SIM_COUNTS if quick else SIM_COUNTS
    rows = bench_simulator.run(counts, echo=False)
    first, cpu_first = rows[0].per_1k_s, rows[0].cpu_per_1k_s
    header = (
        "requests",
        "setup s",
        "run s",
        "wall s per 1,000",
        "× the first",
        "CPU s per 1,000",
        "× the first",
        "simulated s",
        "steps",
        "peak memory GiB",
    )
    table = markdown_table(
        header,
        [
            (
                f"{r.num_requests:,}",
                f"{r.setup_s:.2f}",
                f"{r.run_s:.2f}",
                f"{r.per_1k_s:.3f}",
                f"{r.per_1k_s / first:.2f}",
                f"{r.cpu_per_1k_s:.3f}",
                f"{r.cpu_per_1k_s / cpu_first:.2f}",
                f"{r.simulated_s:,.0f}",
                f"{r.num_steps:,}",
                f"{r.peak_rss_gib:.2f}",
            )
            for r in rows
        ],
    )
    return (
        "### Simulator: wall time against request count\n\n"
        f"`python3 benchmarks/bench_simulator.py --counts {','.join(map(str, counts))}`: the "
        "default job (Llama-3-8B on a simulated H200, shared_prefix, all requests at once). "
        "Linear growth shows as a flat per-1,000 column (× the first near 1). The "
        "benchmark's default reaches 100,000 requests, which needs ~14 GiB for the prompt "
        "token lists.\n\n"
        f"{table}\n"
    )


def capacity_section() -> str:
    command = [sys.executable, str(BENCHMARKS / "bench_kv_quant_capacity.py"), "--executor", "sim"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return (
        "### KV quantizers: capacity and throughput (simulated)\n\n"
        "`python3 benchmarks/bench_kv_quant_capacity.py --executor sim`, as printed:\n\n"
        f"```text\n{out.strip()}\n```\n"
    )


QUALITY_HEADING = "### KV quantizers: quality (torch, a small Llama trained on the stdlib)"
QUALITY_CARRIED = "(Carried over from an earlier run: the trained model is not cached here.)"


def quality_section(readme: str = "") -> str:
    """The quality benchmark's tables when its trained model is cached (training it takes
    about 12 minutes of one core: ``python3 tools/train_stdlib_llama.py``); else the
    section ``readme`` has, if it holds measured tables, marked as carried over; else how
    to get them."""
    from train_stdlib_llama import cache_dir

    head = QUALITY_HEADING + "\n\n"
    if not (cache_dir() / "training.json").is_file():
        previous = carried_section(readme, QUALITY_HEADING)
        if "```text" in previous:
            if QUALITY_CARRIED not in previous:
                previous = previous.rstrip("\n") + "\n\n" + QUALITY_CARRIED + "\n"
            return previous
        return (
            f"{head}Not run: the model is not cached. `python3 tools/"
            "train_stdlib_llama.py` trains it (about 12 minutes on one core), then "
            "`python3 benchmarks/bench_kv_quant_quality.py` measures.\n"
        )
    command = [sys.executable, str(BENCHMARKS / "bench_kv_quant_quality.py")]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    printed = f"```text\n{out.strip()}\n```\n"
    return f"{head}`python3 benchmarks/bench_kv_quant_quality.py`, as printed:\n\n{printed}"


def claims_section(quick: bool) -> str:
    sections = run_claims(quick)
    text = render_markdown(sections, heading_level=4)
    main_table, _, details = text.partition("\n\n")
    flag = " --quick" if quick else ""
    full = " (without --quick)" if quick else ""
    return (
        "### Claims from the literature, measured\n\n"
        f"`python3 -m enginekit.claims{flag}`; `python3 -m enginekit +experiment=claims` runs "
        f"the same{full} and writes claims.md and claims.json into its run folder.\n\n"
        f"{main_table}\n\n<details><summary>The tables and notes behind the verdicts"
        f"</summary>\n\n{details.strip()}\n\n</details>\n"
    )


KERNELS_HEADING = "### Kernels"
KERNELS_MEASURED = "Measured on "  # how a section of measured kernel figures begins


def kernels_section(path: Path | None = None, readme: str = "") -> str:
    """The attention kernels' figures from ``bench_kernels.py --json`` output at ``path``
    (a section naming the machine that measured them); without one, ``readme``'s kernel
    section when it holds measured figures (carried over as it is); else what checks the
    kernels and how to measure them."""
    if path is not None:
        return kernels_figures(json.loads(path.read_text()))
    previous = carried_section(readme, KERNELS_HEADING)
    if KERNELS_MEASURED in previous:
        return previous
    return (
        f"{KERNELS_HEADING}\n\n"
        "No kernel figures yet: `benchmarks/bench_kernels.py` times the Triton kernels on a "
        "CUDA machine only (`--json FILE`, then `python3 benchmarks/results.py --kernels "
        "FILE` writes its tables here). Their correctness is tested: "
        "`tests/test_torch_kernels.py` runs every kernel against its pure-torch reference "
        "under the Triton interpreter, and the engine end to end with `kernels=triton` "
        "against `kernels=reference`; `tests/test_kernel_proxies.py` compiles them for "
        "sm_90a offline and checks for register spills.\n"
    )


def kernels_figures(report: dict) -> str:
    """The section of one ``bench_kernels.py --json`` report: which machine, its measured
    ceilings, then a decode table (GB/s) and a prefill table (TFLOP/s)."""
    m, c, shape = report["machine"], report["ceilings"], report["shape"]
    peak_tb_s = report["peaks"]["bandwidth_bytes_s"] / 1e12
    peak_tflops = report["peaks"]["bf16_flops"] / 1e12

    def num(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    parts = [
        f"{KERNELS_HEADING}\n\n"
        f"{KERNELS_MEASURED}{m['gpu']} ({m['gpu_memory_gib']} GiB, {m['multiprocessors']} "
        f"multiprocessors; torch {m['torch']}, Triton {m['triton']}, Python {m['python']}) "
        f"on {m['date']}, not on the machine above: `{report['command']} --json FILE`, then "
        "`python3 benchmarks/results.py --kernels FILE`. One layer of "
        f"{shape['num_heads']} query heads over {shape['num_kv_heads']} kv heads, head_dim "
        f"{shape['head_dim']}, {shape['dtype']} queries, pages of {shape['page']} in random "
        "order; every sequence at the context length given. Medians of "
        "`triton.testing.do_bench`; SDPA is torch's `scaled_dot_product_attention` on the "
        "same K/V laid out contiguously in bfloat16 (dequantized for fp8/int4), and the "
        "relative error compares the two outputs. That machine's own ceilings: copy "
        f"{c['copy_gb_s']:,.0f} GB/s, bf16 matmul {c['bf16_matmul_tflop_s']:.0f} TFLOP/s; "
        f"percentages are of the datasheet's {peak_tb_s:.1f} TB/s and {peak_tflops:.0f} "
        "TFLOP/s.\n"
    ]
    tables = (
        ("decode", "GB/s", ",.0f", f"{peak_tb_s:.1f} TB/s"),
        ("prefill", "TFLOP/s", ".1f", f"{peak_tflops:.0f} TFLOP/s"),
    )
    for op, unit, spec, peak in tables:
        rows = [r for r in report["rows"] if r["op"] == op]
        if not rows:
            continue
        header = ("KV", "batch", "context", "kernel ms", f"kernel {unit}", f"% of {peak}",
                  "SDPA ms", f"SDPA {unit}", "SDPA ÷ kernel", "rel. error", "note")  # fmt: skip
        cells = [
            (r["kind"], f"{r['batch']:,}", f"{r['context']:,}", num(r["kernel_ms"], ".3f"),
             num(r["kernel_rate"], spec), num(r["kernel_pct_peak"], ".1f"),
             num(r["sdpa_ms"], ".3f"), num(r["sdpa_rate"], spec),
             num(r["sdpa_over_kernel"], ".2f"), num(r["rel_error"], ".1e"), r["note"])
            for r in rows
        ]  # fmt: skip
        what = "one query per sequence" if op == "decode" else "each context one causal chunk"
        parts.append(f"{op.capitalize()} ({what}):\n\n{markdown_table(header, cells)}\n")
    return "\n".join(parts)


# Sections measured by long runs this generator does not repeat (30 minutes and more on two
# cores): each is carried over from the README as it stands, and says its own commands.
CARRIED_HEADINGS = (
    "### Host cache manager: replayed traffic, before and after",
    "### Simulator at scale: ShareGPT, 1,000 to 1,000,000 requests",
    "### What more memory would buy: the hit-rate curve against reruns",
)


PROXIES_HEADING = "### Kernels compiled offline for sm_90a"


def proxies_section(results: Sequence[kernel_proxies.KernelStats | str] | None = None) -> str:
    """The kernels of ``kernel_proxies.py --ci`` compiled for sm_90a on this machine (no
    GPU needed): registers, spills, shared memory and main-loop instructions per key of a
    tile, for each configuration (``results``: already measured ones, e.g. in tests)."""
    if results is None:
        problem = kernel_proxies.tool_problem()
        if problem is not None:
            return (
                f"{PROXIES_HEADING}\n\nNot measured: this machine has no offline sm_90a "
                f"toolchain ({problem}).\n"
            )
        results = kernel_proxies.measure_all(kernel_proxies.ci_grid())
    stats = [r for r in results if not isinstance(r, str)]
    failures = [r for r in results if isinstance(r, str)]
    header = ("configuration", "kernel", "registers", "spilled B", "shared B", "warps",
              "loop instructions", "per key")  # fmt: skip
    rows = [
        (r.config, r.kernel.lstrip("_"), str(r.registers),
         str(r.spill_store_bytes + r.spill_load_bytes), f"{r.shared_bytes:,}", str(r.num_warps),
         f"{r.loop_instructions:,}",
         f"{r.loop_instructions / r.tile_tokens:.0f}"
         if r.tile_tokens and r.loop_instructions else "—")
        for r in stats
    ]  # fmt: skip
    text = (
        f"{PROXIES_HEADING}\n\n"
        "`python3 tools/kernel_proxies.py --ci` (the full grid without `--ci`): each "
        "kernel launch recorded on CPU tensors and compiled for sm_90a with Triton's bundled "
        "ptxas on this machine, no GPU involved. Loop instructions are the SASS of the "
        "innermost loop, per warp and iteration; per key divides by the keys one iteration "
        "reads. Configurations: decode split in two (and its merge), prefill, the int4 write "
        "and a block copy; `d` head_dim, `gqa` query heads per kv head, `bs` page size. "
        f"{len(stats)} kernels, "
        f"{sum(r.has_spills for r in stats)} with spills, {len(failures)} failed to compile.\n\n"
        + markdown_table(header, rows)
        + "\n"
    )
    return text + "".join(f"\nFailed: {f}\n" for f in failures)


def carried_section(readme: str, heading: str) -> str:
    """The README's section under ``heading`` (up to the next ``###`` heading, the end
    marker or the end of the text), or "" when the README has none."""
    start = readme.find(heading + "\n")
    if start < 0:
        return ""
    ends = [i for i in (readme.find("\n### ", start + 1), readme.find(END, start)) if i >= 0]
    return readme[start : min(ends, default=len(readme))].rstrip("\n") + "\n"


def build_section(quick: bool, command: str, readme: str = "", kernels: Path | None = None) -> str:
    """The whole Results section, markers included; ``readme``: the current README, whose
    long-run sections (``CARRIED_HEADINGS``) are kept as they are; ``kernels``: a
    ``bench_kernels.py --json`` report for the kernel section (see ``kernels_section``)."""
    parts = [
        bookkeeping_section(quick),
        simulator_section(quick),
        *filter(None, (carried_section(readme, h) for h in CARRIED_HEADINGS)),
        capacity_section(),
        quality_section(readme),
        claims_section(quick),
        kernels_section(kernels, readme),
        proxies_section(),
    ]
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    head = (
        "## Results\n\n"
        f"Generated on {date} by `{command}` (rewrite it with that command; edits between "
        "the markers are overwritten).\n\n"
        f"Machine: {machine_line()}.\n\n"
        "Absolute times are this machine's only; ratios were measured side by side in one "
        "run; simulated figures (tok/s, TTFT) are the simulator's H200, not this machine.\n"
    )
    return "\n".join([BEGIN, head, *parts, END]) + "\n"


def apply_section(readme: str, section: str) -> str:
    """``readme`` with ``section`` (markers included) in place of the text between the
    markers, or appended after a blank line when they are absent. Raises ValueError for
    a begin marker without an end marker after it."""
    begin = readme.find(BEGIN)
    if begin < 0:
        return readme.rstrip("\n") + "\n\n" + section
    end = readme.find(END, begin)
    if end < 0:
        raise ValueError(f"{BEGIN} without {END} after it")
    end += len(END)
    if readme[end : end + 1] == "\n":
        end += 1
    return readme[:begin] + section + readme[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, requests, counts")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--print", action="store_true", help="print only, write nothing")
    parser.add_argument(
        "--kernels", type=Path, metavar="FILE", help="a bench_kernels.py --json report"
    )
    args = parser.parse_args(argv)
    command = "python3 benchmarks/results.py" + " --quick" * args.quick
    if args.kernels is not None:
        command += f" --kernels {args.kernels}"
    start = time.perf_counter()
    section = build_section(args.quick, command, args.readme.read_text(), args.kernels)
    if args.print:
        print(section, end="")
    else:
        args.readme.write_text(apply_section(args.readme.read_text(), section))
        print(f"wrote the Results section of {args.readme}")
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""docs/results.md, generated whole: runs the benchmarks that make sense on this machine
and writes their tables into ``docs/results.md`` (every byte of it: edit this script, not
the file), and the headline figures, each linking to its section there, between
``<!-- results:begin -->`` and ``<!-- results:end -->`` in README.md.

Runs, side by side where there is something to compare:

- ``bench_bookkeeping.py``: Rust structures against their Python twins, per operation and
  per scheduler step with 256 running sequences, both prefix caches;
- ``bench_simulator.py``: wall time per 1,000 requests at growing counts, of the default
  job (up to 30,000 here, 3,000 with ``--quick``) and of ShareGPT (up to 100,000 here,
  10,000 with ``--quick``; the benchmark's own default reaches 1,000,000);
- ``bench_cache_manager.py --rust-only``: the cache manager replaying five workloads, its
  hit rates and CPU time per token beside the recorded run of the manager before its
  batched decode path (``benchmarks/results/cache_manager_baseline.json``);
- the hit-rate curve against reruns: one run of multi-turn ShareGPT predicts the hit rate
  at other pool sizes, which reruns at those sizes measure;
- ``bench_kv_quant_capacity.py --executor sim``: its printed tables, verbatim;
- ``bench_tiers.py``: Mooncake's conversation trace replayed whole, device only, with a
  host tier and with host and disk tiers, its printed table verbatim;
- ``bench_eviction.py``: each eviction policy's hit rate against Belady's OPT on
  Mooncake's trace at three pools (and on ShareGPT's conversations), its table verbatim;
- ``bench_queue.py``: each queue order at saturation (throughput, cold requests' TTFT)
  and two tenants, one flooding (the service each gets), its tables verbatim;
- ``bench_clients.py`` (its report, ``--clients``): vLLM's bench serve, guidellm and
  aiperf against the simulated server beside the server's own figures, and lm-eval;
- ``bench_kv_quant_quality.py``: its printed tables, when its trained model is cached;
- the claims (``enginekit.claims.job``): the main table, the rest folded;
- ``tools/kernel_proxies.py --ci``: the kernels compiled offline for sm_90a (registers,
  spills, main-loop instructions per key);
- kernels: ``--kernels FILE`` puts the tables of a ``bench_kernels.py --json`` report in
  (measured on a CUDA machine, which the section names); without it, the kernel figures
  of the previous docs/results.md are carried over, or the section says how to measure
  them and what checks them. Nothing here needs a GPU.

The file is headed with the machine (CPU, cores, memory, OS, Python and torch versions,
GPU or "no GPU"), the date, the command and how long it took. Absolute times are this
machine's; the ratios are what carries over.

    python3 benchmarks/results.py [--quick] [--out docs/results.md] [--readme README.md]
        [--print] [--kernels FILE] [--tiers FILE] [--eviction FILE]
        [--eviction-sharegpt FILE] [--queue FILE] [--clients FILE]

``--tiers``, ``--eviction``, ``--eviction-sharegpt`` and ``--queue`` take the ``--json``
report of a run of that benchmark (the replays take from seconds to half an hour); without
one the benchmark runs here. ``--clients`` takes the report of ``bench_clients.py`` (real
serving clients from environments of their own); without one the last results file's
section is carried over.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from enginekit.extras import exit_if_missing  # noqa: E402

# the kernels compiled offline and the quantized model's quality (torch, triton); ShareGPT
# and the claims (data)
exit_if_missing("benchmarks/results.py", extras=["data", "torch"], modules=["triton"])

import bench_bookkeeping  # noqa: E402
import bench_eviction  # noqa: E402
import bench_queue  # noqa: E402
import bench_simulator  # noqa: E402
import bench_tiers  # noqa: E402
import kernel_proxies  # noqa: E402

from enginekit.claims.job import markdown_table, render_markdown, run_claims  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent
RESULTS_MD = ROOT / "docs" / "results.md"
RESULTS_LINK = "docs/results.md"  # as the README links it
SIM_COUNTS, QUICK_SIM_COUNTS = [1000, 3000, 10000, 30000], [1000, 3000]
SHAREGPT_COUNTS, QUICK_SHAREGPT_COUNTS = [1000, 10000, 100000], [1000, 10000]


class Headline(NamedTuple):
    """One row of the README's table: what, the figure, and the heading of the section of
    docs/results.md it comes from."""

    what: str
    figure: str
    heading: str


def anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: its text lower-cased, punctuation
    dropped, spaces as hyphens (``## KV bytes: one token`` -> ``kv-bytes-one-token``)."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def title(heading: str) -> str:
    return heading.lstrip("#").strip()


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


def _count(x: int | None) -> str:
    return "—" if x is None else f"{x:,}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


BOOKKEEPING_HEADING = "## Host bookkeeping: Rust against the Python twins"


def bookkeeping_section(quick: bool) -> tuple[str, list[Headline]]:
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
    text = (
        f"{BOOKKEEPING_HEADING}\n\n"
        f"`python3 benchmarks/bench_bookkeeping.py --steps {steps} --rounds {rounds}`: median "
        f"of {rounds} interleaved rounds of CPU time; operations on 1,024-token prompts (64 "
        f"blocks of 16), steps with {bench_bookkeeping.NUM_SEQS} running sequences of ~1,000 "
        "tokens, 1 in 16 of them filling a block at each step. `schedule + update` is the "
        "scheduler alone (the executor's tokens given); the engine step adds the simulated "
        "execution and the metrics. Goal: schedule + update <= 50 µs.\n\n"
        + "\n\n".join(tables)
        + "\n"
    )
    headlines = [
        Headline(
            f"Scheduler step ({r.name.split(',')[0]}) at {bench_bookkeeping.NUM_SEQS} running "
            f"sequences, {r.name.split(', ')[-1]}",
            f"{r.rust_s * 1e6:,.1f} µs (Python twins: {r.python_s * 1e6:,.1f} µs, {r.ratio:,.1f}×)",
            BOOKKEEPING_HEADING,
        )
        for r in rows
        if r.name.startswith("schedule + update")
    ]
    return text, headlines


SIMULATOR_HEADING = "## Simulator: wall time against request count"
SHAREGPT_HEADING = "## Simulator at scale: ShareGPT requests"


def _simulator_table(rows: Sequence[bench_simulator.Row]) -> str:
    first, cpu_first = rows[0].per_1k_s, rows[0].cpu_per_1k_s
    header = ("requests", "setup s", "run s", "wall s per 1,000", "× the first",
              "CPU s per 1,000", "× the first", "simulated s", "steps",
              "peak memory GiB")  # fmt: skip
    return markdown_table(
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
        ],  # fmt: skip
    )


def simulator_section(quick: bool) -> tuple[str, list[Headline]]:
    counts = QUICK_SIM_COUNTS if quick else SIM_COUNTS
    rows = bench_simulator.run(counts, echo=False, workload="shared_prefix", isolate=True)
    text = (
        f"{SIMULATOR_HEADING}\n\n"
        f"`python3 benchmarks/bench_simulator.py --workload shared_prefix --counts "
        f"{','.join(map(str, counts))}`: the default job (Llama-3-8B on a simulated H200, "
        "shared_prefix, all requests at once), each count in a fresh process. Linear growth "
        "shows as a flat per-1,000 column (× the first near 1).\n\n"
        f"{_simulator_table(rows)}\n"
    )
    last = rows[-1]
    headline = Headline(
        f"Simulator, default job, {last.num_requests:,} requests",
        f"{last.per_1k_s:.2f} wall s per 1,000 requests ({last.per_1k_s / rows[0].per_1k_s:.2f}× "
        f"the rate at {rows[0].num_requests:,}), {last.peak_rss_gib:.2f} GiB peak",
        SIMULATOR_HEADING,
    )
    return text, [headline]


def sharegpt_section(quick: bool) -> tuple[str, list[Headline]]:
    counts = QUICK_SHAREGPT_COUNTS if quick else SHAREGPT_COUNTS
    rows = bench_simulator.run(counts, echo=False, workload="sharegpt", isolate=True)
    text = (
        f"{SHAREGPT_HEADING}\n\n"
        f"`python3 benchmarks/bench_simulator.py --counts {','.join(map(str, counts))}`: "
        "ShareGPT V3 single-turn requests sampled as vLLM's benchmark samples them (Mistral "
        "SentencePiece tokens; beyond the pairs the filter keeps, they are replayed in fresh "
        "orders), Llama-3-8B on a simulated H200, all arriving at once; each count in a fresh "
        "process, so the peak memory is its own. Above 10,000 requests the driver streams: "
        "requests are drawn as the run needs them and released when they finish, and the "
        "ideal, the miss causes and the hit-rate curve come from one pass (10,000 requests "
        "do not stream: their setup tokenizes every pair up front). The benchmark's default "
        "(`python3 benchmarks/bench_simulator.py`) goes on to 1,000,000 requests, whose goal "
        "is under 20 minutes and 4 GiB on two cores; it is not rerun here.\n\n"
        f"{_simulator_table(rows)}\n"
    )
    last = rows[-1]
    headline = Headline(
        f"Simulator, ShareGPT, {last.num_requests:,} requests",
        f"{last.wall_s:,.1f} s wall ({last.per_1k_s:.2f} s per 1,000), "
        f"{last.peak_rss_gib:.2f} GiB peak",
        SHAREGPT_HEADING,
    )
    return text, [headline]


MANAGER_HEADING = "## Host cache manager: replayed traffic"
MANAGER_BASELINE = BENCHMARKS / "results" / "cache_manager_baseline.json"
_WORKLOAD_NAMES = {"sharegpt_multi": "ShareGPT sessions"}


def _served(row: dict) -> float | None:
    """Prompt tokens served from the cache, first admissions and re-admissions together."""
    prompt = row["num_first_prompt_tokens"] + row["num_readmit_prompt_tokens"]
    hits = row["num_first_hit_tokens"] + row["num_readmit_hit_tokens"]
    return hits / prompt if prompt else None


def manager_section(
    now: dict | None = None, before: dict | None = None
) -> tuple[str, list[Headline]]:
    """The manager's replay now (``bench_cache_manager.py --rust-only``, run here unless
    ``now`` is given) beside the recorded run of the manager before its batched decode path
    and radix's block-granular eviction (``before``: the baseline file)."""
    if now is None:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "now.json"
            command = [sys.executable, str(BENCHMARKS / "bench_cache_manager.py"),
                       "--rust-only", "--json", str(out)]  # fmt: skip
            subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            now = json.loads(out.read_text())
    if before is None:
        before = json.loads(MANAGER_BASELINE.read_text())

    def rows_of(report: dict) -> dict[tuple[str, int, str], dict]:
        return {
            (r["workload"], r["num_blocks"], r["prefix"]): r
            for r in report["rows"]
            if r["backend"] == "rust"
        }

    new, old = rows_of(now), rows_of(before)
    header = ("workload", "pool", "block_hash served", "radix served, before",
              "radix served, now", "µs per token block_hash, before → now",
              "µs per token radix, before → now", "preemptions (block_hash / radix)")  # fmt: skip
    cells = []
    for workload, pool in dict.fromkeys((w, p) for w, p, _ in new):
        bh, rx = new[(workload, pool, "block_hash")], new[(workload, pool, "radix")]
        old_bh, old_rx = old.get((workload, pool, "block_hash")), old.get((workload, pool, "radix"))

        def us(then: dict | None, row: dict) -> str:
            was = "—" if then is None else f"{then['us_per_token']:.2f}"
            return f"{was} → {row['us_per_token']:.2f}"

        cells.append((
            _WORKLOAD_NAMES.get(workload, workload), f"{pool:,}", _pct(_served(bh)),
            _pct(None if old_rx is None else _served(old_rx)), _pct(_served(rx)),
            us(old_bh, bh), us(old_rx, rx),
            f"{bh['num_preemptions']:,} / {rx['num_preemptions']:,}",
        ))  # fmt: skip
    meta_old = before["meta"]
    text = (
        f"{MANAGER_HEADING}\n\n"
        "`python3 benchmarks/bench_cache_manager.py --rust-only --json FILE` replays each "
        "workload through a `KVCacheManager` the way a serving step calls it (every running "
        "request grows by a token, preempting the newest by recompute when the pool is short; "
        "first-come-first-served admission of whole prompts; at most "
        f"{now['meta']['max_num_seqs']} running; blocks of {now['meta']['block_size']}, "
        "Llama-3-8B's KV) and reports the manager's CPU time per generated token and the "
        "prompt tokens its prefix cache served, first admissions and re-admissions after "
        'preemption together. "Before" is `benchmarks/results/cache_manager_baseline.json`, '
        f"the same replay of the manager before its batched decode path and radix's "
        f"block-granular eviction (commit `{meta_old['commit'][:7]}`), recorded once and not "
        "rerun: its times were taken on another occasion, so their ratio to this run's carries "
        "the difference in the machine's load too. `tools/compare_checkouts.py` measures two "
        "checkouts side by side, and `tools/count_manager_instructions.py` counts the "
        "manager's instructions under callgrind, which the load does not move.\n\n"
        f"{markdown_table(header, cells)}\n"
    )
    headlines = []
    for prefix in ("block_hash", "radix"):
        key = ("multiturn", 4096, prefix)
        if key in new:
            was = old.get(key)
            figure = f"{new[key]['us_per_token']:.2f} µs"
            if was is not None:
                figure += f" (before the batched path: {was['us_per_token']:.2f} µs)"
            what = (
                f"Cache manager CPU time per generated token, multiturn at 4,096 blocks, {prefix}"
            )
            headlines.append(Headline(what, figure, MANAGER_HEADING))
    return text, headlines


CURVE_HEADING = "## What more memory would buy: the hit-rate curve against reruns"
CURVE_POOL, CURVE_MULTIPLES = 4096, (0.25, 0.5, 1.0, 2.0, 4.0)
CURVE_WORKLOAD = ("workload=sharegpt", "workload.sharegpt_mode=multi",
                  "workload.num_requests=1500", "workload.arrival_rate=2")  # fmt: skip


def _simulate(*overrides: str) -> dict:
    from enginekit import Engine
    from enginekit.driver import WorkloadDriver

    engine = Engine.from_overrides(["progress=false", *overrides])
    driver = WorkloadDriver(engine)
    driver.add_workload()
    return driver.run().summary


def curve_section() -> tuple[str, list[Headline]]:
    """One run at ``CURVE_POOL`` blocks predicts the first-admission hit rate at every pool
    size from its LRU stack distances; reruns of the same requests at each multiple
    measure it."""
    from enginekit import metric_keys as mk

    header = ["pool (blocks)", "× the run's"]
    columns: dict[int, list[str]] = {}
    worst: dict[str, float] = {}
    for prefix in ("block_hash", "radix"):
        base = _simulate(*CURVE_WORKLOAD, f"cache.num_blocks={CURVE_POOL}", f"+prefix={prefix}")
        curve = dict(map(tuple, base[mk.PREFIX_CACHE_HIT_RATE_CURVE.key]))
        header += [f"{prefix} predicted", "measured", "error (points)", "preemptions"]
        for multiple in CURVE_MULTIPLES:
            pool = int(CURVE_POOL * multiple)
            run = (
                base
                if pool == CURVE_POOL
                else _simulate(*CURVE_WORKLOAD, f"cache.num_blocks={pool}", f"+prefix={prefix}")
            )
            measured = run[mk.PREFIX_CACHE_FIRST_HIT_RATE.key]
            predicted = curve.get(pool)
            error = None if predicted is None or measured is None else 100 * (predicted - measured)
            if error is not None:
                worst[prefix] = max(worst.get(prefix, 0.0), abs(error))
            cells = columns.setdefault(pool, [f"{pool:,}", f"{multiple:g}×"])
            cells += [
                "not predicted" if predicted is None else _pct(predicted),
                _pct(measured),
                "—" if error is None else f"{error:+.1f}",
                f"{run[mk.NUM_PREEMPTIONS_TOTAL.key]:,}",
            ]
    min_blocks = base.get(mk.PREFIX_CACHE_HIT_RATE_CURVE_MIN_BLOCKS.key)
    overrides = " ".join(CURVE_WORKLOAD)
    text = (
        f"{CURVE_HEADING}\n\n"
        f"One run of 1,500 ShareGPT turns (whole conversations, 2 starting per second; "
        f"Llama-3-8B, simulated H200) at a {CURVE_POOL:,}-block pool predicts, from its LRU "
        "stack distances, the first-admission hit rate at every pool size; the same requests "
        "are then rerun at each size: `python3 -m enginekit "
        f"{overrides} cache.num_blocks=<pool> [+prefix=radix]`. The prediction takes out of "
        "each pool the blocks the run's running requests referenced or were promised at each "
        "lookup, which no pool can use to cache. Sizes below the run's peak of pinned blocks "
        f"with the admission watermark to spare ({_count(min_blocks)} "
        "blocks for radix here) would have queued or preempted differently, and are not "
        "predicted. For `radix` the curve counts whole blocks only.\n\n"
        f"{markdown_table(header, list(columns.values()))}\n"
    )
    figure = ", ".join(f"{p} {w:.1f}" for p, w in worst.items())
    return text, [Headline(
        "Hit rate predicted from one run's stack distances, against reruns at ½× to 4× the pool",
        f"largest error, points: {figure}",
        CURVE_HEADING,
    )]  # fmt: skip


CAPACITY_HEADING = "## KV quantizers: capacity and throughput (simulated)"


def capacity_section() -> tuple[str, list[Headline]]:
    command = [sys.executable, str(BENCHMARKS / "bench_kv_quant_capacity.py"), "--executor", "sim"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    text = (
        f"{CAPACITY_HEADING}\n\n"
        "`python3 benchmarks/bench_kv_quant_capacity.py --executor sim`, as printed:\n\n"
        f"```text\n{out.strip()}\n```\n"
    )
    figures = []
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] in ("fp8", "int4") and words[-1].startswith("x"):
            figures.append(f"{words[0]} {words[3]}× the tokens, {words[-1][1:]}× the throughput")
    headlines = [
        Headline(
            "KV quantizers in a 4 GiB pool, against 16-bit (simulated)",
            "; ".join(figures),
            CAPACITY_HEADING,
        )
    ] if figures else []  # fmt: skip
    return text, headlines


QUALITY_HEADING = "## KV quantizers: quality (torch, a small Llama trained on the stdlib)"
QUALITY_CARRIED = "(Carried over from an earlier run: the trained model is not cached here.)"


def quality_section(previous: str = "") -> str:
    """The quality benchmark's tables when its trained model is cached (training it takes
    about 12 minutes of one core: ``python3 tools/train_stdlib_llama.py``); else the
    section ``previous`` (the last docs/results.md) has, if it holds measured tables, marked
    as carried over; else how to get them."""
    from train_stdlib_llama import cache_dir

    head = QUALITY_HEADING + "\n\n"
    if not (cache_dir() / "training.json").is_file():
        carried = carried_section(previous, QUALITY_HEADING)
        if "```text" in carried:
            if QUALITY_CARRIED not in carried:
                carried = carried.rstrip("\n") + "\n\n" + QUALITY_CARRIED + "\n"
            return carried
        return (
            f"{head}Not run: the model is not cached. `python3 tools/"
            "train_stdlib_llama.py` trains it (about 12 minutes on one core), then "
            "`python3 benchmarks/bench_kv_quant_quality.py` measures.\n"
        )
    command = [sys.executable, str(BENCHMARKS / "bench_kv_quant_quality.py")]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    printed = f"```text\n{out.strip()}\n```\n"
    return f"{head}`python3 benchmarks/bench_kv_quant_quality.py`, as printed:\n\n{printed}"


def quality_headlines(section: str) -> list[Headline]:
    """Δ perplexity of fp8 and int4 from the quality tables, when the section has them."""
    figures = []
    for line in section.splitlines():
        words = line.split()
        if len(words) >= 7 and words[0] in ("fp8", "int4") and words[-1].endswith("%"):
            figures.append(f"{words[0]} {words[-1]}")
    if not figures:
        return []
    return [Headline("Perplexity change with a quantized KV cache (small Llama, torch)",
                     ", ".join(figures), QUALITY_HEADING)]  # fmt: skip


CLAIMS_HEADING = "## Claims from the literature, measured"


def claims_section(quick: bool) -> tuple[str, list[Headline]]:
    sections = run_claims(quick)
    text = render_markdown(sections, heading_level=4)
    main_table, _, details = text.partition("\n\n")
    flag = " --quick" if quick else ""
    full = " (without --quick)" if quick else ""
    verdicts = [row.verdict for section in sections for row in section.rows]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
    text = (
        f"{CLAIMS_HEADING}\n\n"
        f"`python3 -m enginekit.claims{flag}`; `python3 -m enginekit +experiment=claims` runs "
        f"the same{full} and writes claims.md and claims.json into its run folder.\n\n"
        f"{main_table}\n\n<details><summary>The tables and notes behind the verdicts"
        f"</summary>\n\n{details.strip()}\n\n</details>\n"
    )
    return text, [Headline(
        f"KV-cache claims from the literature, measured ({len(verdicts)})",
        f"holds? {counts}", CLAIMS_HEADING,
    )]  # fmt: skip


KERNELS_HEADING = "## Kernels"
KERNELS_MEASURED = "Measured on "  # how a section of measured kernel figures begins


def kernels_section(path: Path | None = None, previous: str = "") -> str:
    """The attention kernels' figures from ``bench_kernels.py --json`` output at ``path``
    (a section naming the machine that measured them); without one, ``previous``'s kernel
    section when it holds measured figures (carried over as it is); else what checks the
    kernels and how to measure them."""
    if path is not None:
        return kernels_figures(json.loads(path.read_text()))
    carried = carried_section(previous, KERNELS_HEADING)
    if KERNELS_MEASURED in carried:
        return carried
    return (
        f"{KERNELS_HEADING}\n\n"
        "No kernel figures yet: they need a CUDA GPU, which this file's machine does not "
        "have. On one, `python3 benchmarks/bench_kernels.py --json FILE` times the Triton "
        "kernels beside torch's SDPA (decode GB/s, prefill TFLOP/s), then `python3 "
        "benchmarks/results.py --kernels FILE` writes its tables here; "
        "`benchmarks/gpu/run_kit.sh` runs that benchmark and the kernels' native checks on a "
        "bare GPU machine without network (`benchmarks/gpu/README.md`). Their correctness is "
        "tested without one: `tests/kernels/test_torch_kernels.py` runs every kernel against "
        "its pure-torch reference under the Triton interpreter, and the engine end to end with "
        "`kernels=triton` against `kernels=reference`; `tests/project/test_kernel_proxies.py` "
        "compiles them for sm_90a offline and checks for register spills.\n"
    )


def kernels_headlines(section: str) -> list[Headline]:
    if KERNELS_MEASURED in section:
        machine = section.split(KERNELS_MEASURED, 1)[1].split(" (", 1)[0]
        figure = f"measured on {machine}: decode GB/s and prefill TFLOP/s beside SDPA"
    else:
        figure = "not measured: needs a CUDA GPU (`python3 benchmarks/bench_kernels.py`)"
    return [Headline("Triton attention kernels on a GPU", figure, KERNELS_HEADING)]


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


PROXIES_HEADING = "## Kernels compiled offline for sm_90a"


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


def proxies_headlines(section: str) -> list[Headline]:
    found = re.search(r"(\d+) kernels, (\d+) with spills, (\d+) failed to compile", section)
    figure = (
        f"{found[1]} kernels, {found[2]} with register spills, {found[3]} failed"
        if found
        else "not measured: no offline toolchain here"
    )
    return [Headline("Triton kernels compiled offline for sm_90a (H100/H200)", figure,
                     PROXIES_HEADING)]  # fmt: skip


_HEADING_LINE = re.compile(r"^#{1,3} ", re.M)


def carried_section(text: str, heading: str) -> str:
    """The section of ``text`` under ``heading`` (at its level or one deeper: a README's
    ``### X`` is carried as ``## X``) up to the next heading of level 1 to 3, an end marker
    or the end of the text, with ``heading`` as its first line; "" when it has none."""
    for form in (heading, "#" + heading):
        start = text.find(form + "\n")
        if start >= 0:
            break
    else:
        return ""
    body_start = start + len(form) + 1
    following = _HEADING_LINE.search(text, body_start)
    ends = [
        i for i in (following.start() - 1 if following else -1, text.find(END, start)) if i >= 0
    ]
    body = text[body_start : min(ends, default=len(text))]
    return (heading + "\n" + body).rstrip("\n") + "\n"


def _bench_json(path: Path | None, script: str, *args: str) -> object:
    """The ``--json`` report in ``path``, or (None) that of a run of ``script`` here."""
    if path is not None:
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        command = [sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)]
        subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
        return json.loads(out.read_text())


TIERS_HEADING = "## KV tiers on Mooncake's conversation trace (simulated)"


def tiers_section(path: Path | None = None) -> tuple[str, list[Headline]]:
    """bench_tiers.py on the whole trace (its replays, two at a time), or the rows of such
    a run in ``path`` (``bench_tiers.py --json``: the replays take half an hour here)."""
    listed = _bench_json(path, "bench_tiers.py")
    assert isinstance(listed, list)
    out = bench_tiers.format_table(listed)
    rows = {(row["config"], row["time_scale"]): row for row in listed}
    text = (
        f"{TIERS_HEADING}\n\n"
        "`python3 benchmarks/bench_tiers.py`, as printed: Mooncake's 12,031 requests at their "
        "own arrival times (`x time` 1) and at half that rate (2), on Llama-3.1-8B and an "
        "H200, the device pool alone, with 256 GiB of host memory under it, and with host "
        "and 2 TiB of disk; hit shares are of prompt tokens, `unbounded` is the hit rate of "
        "a cache that keeps every block, `x device` the device-only mean TTFT over this "
        "one's at the same rate:\n\n"
        f"```text\n{out.strip()}\n```\n"
    )
    device, host, best = (rows[name, 1.0] for name in ("device", "+host", "+host+disk"))
    speedups = ", ".join(
        f"{rows['device', scale]['ttft_mean_s'] / rows['+host+disk', scale]['ttft_mean_s']:.1f}× "
        f"at {'its own rate' if scale == 1 else f'1/{scale:g} of it'}"
        for scale in sorted({scale for _, scale in rows})
    )
    figure = (
        f"hit rate {device['hit_rate']:.1%} device only, {host['hit_rate']:.1%} + host, "
        f"{best['hit_rate']:.1%} + host + disk (unbounded: {best['hit_rate_unbounded']:.1%}); "
        f"mean TTFT with host + disk lower {speedups}"
    )
    what = "KV tiers, Mooncake conversation trace on Llama-3.1-8B / H200 (simulated)"
    return text, [Headline(what, figure, TIERS_HEADING)]


EVICTION_HEADING = "## Eviction policies against Belady's OPT (simulated)"


def eviction_section(
    mooncake: Path | None = None, sharegpt: Path | None = None
) -> tuple[str, list[Headline]]:
    """bench_eviction.py on Mooncake's trace and on ShareGPT's conversations (or their
    ``--json`` reports)."""
    trace_rows = _bench_json(mooncake, "bench_eviction.py")
    chat_rows = _bench_json(sharegpt, "bench_eviction.py", "--workload", "sharegpt")
    assert isinstance(trace_rows, list) and isinstance(chat_rows, list)
    text = (
        f"{EVICTION_HEADING}\n\n"
        "`python3 benchmarks/bench_eviction.py`: Mooncake's 12,031 requests at an eighth of "
        "their rate (one simulated H200 serves that without a queue) on Llama-3.1-8B, "
        "`block_hash`, each policy at three device pools. `OPT` is Belady's on the same "
        "run's block accesses (furthest next lookup first, per block: an upper bound on "
        "every policy's hits on the stream's model of the pool), `share of OPT` the "
        "policy's first-admission hit rate over it, `LRU curve` the LRU stack-distance "
        "prediction, `unbounded` a cache that keeps every block:\n\n"
        f"{bench_eviction.format_table(trace_rows)}\n\n"
        "`python3 benchmarks/bench_eviction.py --workload sharegpt`: ShareGPT V3 "
        "conversations turn by turn (`+experiment=sharegpt_multiturn`: Llama-2-7B, 2,000 "
        "turns):\n\n"
        f"{bench_eviction.format_table(chat_rows)}\n"
    )
    sizes = sorted({r["num_blocks"] for r in trace_rows})
    by = {(r["policy"], r["num_blocks"]): r for r in trace_rows}
    best = {
        n: max((r for r in trace_rows if r["num_blocks"] == n), key=lambda r: r["hit_rate"])
        for n in sizes
    }
    figure = (
        f"share of OPT at {' / '.join(f'{n:,}' for n in sizes)} blocks: lru "
        + " / ".join(f"{by['lru', n]['share_of_opt']:.0%}" for n in sizes)
        + "; best "
        + " / ".join(f"{best[n]['policy']} {best[n]['share_of_opt']:.0%}" for n in sizes)
    )
    what = "Eviction policies, Mooncake trace at 1/8 rate on Llama-3.1-8B / H200 (simulated)"
    return text, [Headline(what, figure, EVICTION_HEADING)]


QUEUE_HEADING = "## Queue order at saturation (simulated)"


def queue_section(path: Path | None = None) -> tuple[str, list[Headline]]:
    """bench_queue.py (or its ``--json`` report)."""
    report = _bench_json(path, "bench_queue.py")
    assert isinstance(report, dict)
    rows = report["rows"]
    text = (
        f"{QUEUE_HEADING}\n\n"
        "`python3 benchmarks/bench_queue.py`: (a) prompt groups sharing long prefixes and "
        "cold prompts arriving faster than a simulated H200 serves them (Llama-3-8B); "
        "a cold request is one that hit no cached token at its first admission. (b) two "
        "tenants, one arriving ten times as fast, and the tokens each was served while "
        "both had work:\n\n"
        f"{bench_queue.table(rows)}\n"
    )
    prefix = {r["queue"]: r for r in rows if r["experiment"] == "prefix"}
    tenants = {r["queue"]: r for r in rows if r["experiment"] == "tenants"}
    fcfs, lpm = prefix["fcfs"], prefix["lpm"]
    figure = (
        f"lpm {lpm['total_tokens_per_s'] / fcfs['total_tokens_per_s']:.2f}× fcfs's "
        f"throughput, cold p99 TTFT {lpm['cold_ttft_p99_s'] / fcfs['cold_ttft_p99_s']:.2f}×; "
        f"fair: flooding/light service {tenants['fair']['flood_to_light']:.2f} "
        f"(fcfs {tenants['fcfs']['flood_to_light']:.2f})"
    )
    what = "Queue order: lpm and fair against fcfs at saturation (simulated)"
    return text, [Headline(what, figure, QUEUE_HEADING)]


CLIENTS_HEADING = "## Real clients against the simulated server (Llama-3-8B / H200)"
CLIENTS_SHORT = "In short: "  # the line of the section the README's row repeats


def clients_section(path: Path | None = None, previous: str = "") -> tuple[str, list[Headline]]:
    """The report of ``bench_clients.py`` in ``path`` (``benchmarks/results/clients.json``;
    the clients run from environments of their own, for minutes): its side-by-side table,
    lm-eval's metrics and their check, the commands. Without one, ``previous``'s section
    when it holds measured figures (carried over as it is), else how to measure them."""
    what = "Real clients against the simulated server (Llama-3-8B / H200)"
    if path is None:
        carried = carried_section(previous, CLIENTS_HEADING)
        short = re.search(f"^{CLIENTS_SHORT}(.*)$", carried, re.MULTILINE)
        if short:
            return carried, [Headline(what, short.group(1).rstrip("."), CLIENTS_HEADING)]
        text = (
            f"{CLIENTS_HEADING}\n\nNot measured here: the clients run from environments of "
            "their own (`benchmarks/clients/README.md` installs them); `python3 "
            "benchmarks/bench_clients.py` writes `benchmarks/results/clients.json`, then "
            "`python3 benchmarks/results.py --clients benchmarks/results/clients.json` "
            "writes its tables here.\n"
        )
        return text, []
    import bench_clients

    report = json.loads(path.read_text())
    assert isinstance(report, dict)
    runs, load = report["runs"], report["load"]
    versions = ", ".join(
        f"{name} {info['version']}" for name, info in report["clients"].items() if info["version"]
    )
    commands = "\n".join(
        f"- {run['client']} at concurrency {run['concurrency']}: `{run['command']}`"
        for run in runs
        if "command" in run
    )
    lm_eval = report.get("lm_eval") or {}
    if "command" in lm_eval:
        commands += f"\n- lm-eval: `{lm_eval['command']}`"
    ranges = bench_clients.ratio_ranges(runs)

    def span(name: str) -> str:
        low, high = ranges[name]
        return f"{low:.2f}–{high:.2f}×"

    figure = (
        f"client / server, mean TTFT {span('ttft')}, ITL {span('itl')}, output tok/s "
        f"{span('throughput')} (vLLM, guidellm, aiperf; concurrency "
        f"{', '.join(map(str, load['concurrency']))})"
    )
    results, check = lm_eval.get("results"), lm_eval.get("check")
    if results and check:
        acc = results["enginekit_choice"]["acc,none"]
        match = results["enginekit_generate"]["exact_match,none"]
        figure += (
            f"; lm-eval on a random small Llama: acc {acc:.2f}, exact match {match:.2f} "
            f"(loglikelihoods within {check['choice']['max_abs_diff']:.0e} of transformers', "
            f"{check['generate']['num_equal']}/{check['generate']['num_docs']} generations "
            "the same)"
        )
    overrides = " ".join(report["server_overrides"])
    text = (
        f"{CLIENTS_HEADING}\n\n"
        "`python3 benchmarks/bench_clients.py` (`benchmarks/clients/README.md` installs the "
        f"clients): {versions}, each unmodified from its own environment, against a fresh "
        f"`python3 -m enginekit.serve {overrides}` per run, serving Llama-3-8B's shape: "
        f"{load['num_requests']} streaming completions of {load['input_len']:,} random "
        f"tokens, {load['output_len']} out (`ignore_eos`), at each concurrency. Measured at "
        f"commit `{(report.get('engine_commit') or 'unknown')[:10]}`, on {report['machine']} "
        "(clients and server share those cores). The client's figures beside the server's "
        "own, and the engine's in simulated time:\n\n"
        f"{bench_clients.markdown_table(runs)}\n"
        "A client's TTFT also holds what the server's does not count: the request's wait "
        "for the server's event loop to read it and start on it (the server counts from "
        "there), the first chunk's way from its release to the socket, and the client's own "
        "send and parse, which grow with concurrency on cores the client shares with the "
        "server; `benchmarks/clients/README.md` times each.\n\n"
        "lm-eval's `local-completions` against `executor=torch` on a small Llama with "
        "seeded random weights (the scores check the plumbing, not a model), then its "
        "logged answers against transformers on the same weights:\n\n"
        f"{bench_clients.lm_eval_table(lm_eval)}\n"
        f"{CLIENTS_SHORT}{figure}.\n\n"
        f"<details><summary>The commands</summary>\n\n{commands}\n\n</details>\n"
    )
    return text, [Headline(what, figure, CLIENTS_HEADING)]


def build(
    quick: bool,
    previous: str = "",
    kernels: Path | None = None,
    tiers: Path | None = None,
    eviction: tuple[Path | None, Path | None] = (None, None),
    queue: Path | None = None,
    clients: Path | None = None,
) -> tuple[list[str], list[Headline]]:
    """Every section of docs/results.md, in order, and the README's headline rows;
    ``previous``: the last docs/results.md, whose GPU and trained-model figures are kept
    when they cannot be measured here; ``kernels``: a ``bench_kernels.py --json`` report;
    ``tiers``: a ``bench_tiers.py --json`` report (None: run it); ``eviction``: the
    ``bench_eviction.py --json`` reports of Mooncake's trace and of ShareGPT; ``queue``:
    a ``bench_queue.py --json`` report (None: run them); ``clients``: a
    ``bench_clients.py`` report (None: ``previous``'s section)."""
    sections: list[str] = []
    headlines: list[Headline] = []
    for measure in (
        lambda: bookkeeping_section(quick),
        lambda: manager_section(),
        lambda: simulator_section(quick),
        lambda: sharegpt_section(quick),
        curve_section,
        capacity_section,
        lambda: tiers_section(tiers),
        lambda: eviction_section(*eviction),
        lambda: queue_section(queue),
        lambda: clients_section(clients, previous),
    ):
        text, rows = measure()
        sections.append(text)
        headlines += rows
    quality = quality_section(previous)
    claims, claim_rows = claims_section(quick)
    kernel_text = kernels_section(kernels, previous)
    proxies = proxies_section()
    sections += [quality, claims, kernel_text, proxies]
    headlines += [*quality_headlines(quality), *claim_rows, *kernels_headlines(kernel_text),
                  *proxies_headlines(proxies)]  # fmt: skip
    return sections, headlines


def results_document(sections: Sequence[str], command: str, elapsed_s: float) -> str:
    """docs/results.md: its head (command, date, time taken, machine) and ``sections``."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    contents = "\n".join(
        f"- [{title(s.splitlines()[0])}](#{anchor(s.splitlines()[0])})" for s in sections
    )
    head = (
        "# Results\n\n"
        f"Generated on {date} by `{command}`, in {elapsed_s / 60:.0f} minutes, on: "
        f"{machine_line()}.\n\n"
        "This file is written whole by `benchmarks/results.py`: change the script, not the "
        "file, and run it again to refresh every figure (`--quick`: fewer rounds and smaller "
        "counts). Absolute times are this machine's only; "
        "ratios were measured side by side in one run; simulated figures (tok/s, TTFT) are the "
        "simulator's H200, not this machine. The README's Results table is written by the "
        "same command.\n\n"
        f"{contents}\n"
    )
    return "\n".join([head, *sections])


def headline_block(headlines: Sequence[Headline], command: str) -> str:
    """The README's Results table, markers included: one row per headline figure, each
    linking to its section of docs/results.md."""
    rows = [
        (h.what, h.figure, f"[{title(h.heading)}]({RESULTS_LINK}#{anchor(h.heading)})")
        for h in headlines
    ]
    table = markdown_table(("figure", "measured", "details"), rows)
    return (
        f"{BEGIN}\n"
        f"{table}\n\n"
        f"Written by `{command}` with [{RESULTS_LINK}]({RESULTS_LINK}), which holds every table "
        "and the commands behind each.\n"
        f"{END}\n"
    )


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
    parser.add_argument("--quick", action="store_true", help="fewer rounds, requests, counts")
    parser.add_argument("--out", type=Path, default=RESULTS_MD, help="the results file")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--print", action="store_true", help="print only, write nothing")
    parser.add_argument(
        "--kernels", type=Path, metavar="FILE", help="a bench_kernels.py --json report"
    )
    parser.add_argument(
        "--tiers", type=Path, metavar="FILE", help="a bench_tiers.py --json report (else run it)"
    )
    for flag, what in (
        ("--eviction", "a bench_eviction.py --json report of Mooncake's trace"),
        ("--eviction-sharegpt", "a bench_eviction.py --workload sharegpt --json report"),
        ("--queue", "a bench_queue.py --json report"),
    ):
        parser.add_argument(flag, type=Path, metavar="FILE", help=f"{what} (else run it)")
    parser.add_argument(
        "--clients",
        type=Path,
        metavar="FILE",
        help="a bench_clients.py report (else the last results file's section)",
    )
    args = parser.parse_args(argv)
    command = "python3 benchmarks/results.py" + " --quick" * args.quick
    if args.kernels is not None:
        command += f" --kernels {args.kernels}"
    for flag, value in (
        ("--tiers", args.tiers),
        ("--eviction", args.eviction),
        ("--eviction-sharegpt", args.eviction_sharegpt),
        ("--queue", args.queue),
        ("--clients", args.clients),
    ):
        if value is not None:
            command += f" {flag} {value}"
    start = time.perf_counter()
    # the last results file; before the first, the README, where the results used to be
    previous = (args.out if args.out.is_file() else args.readme).read_text()
    sections, headlines = build(
        args.quick,
        previous,
        args.kernels,
        args.tiers,
        (args.eviction, args.eviction_sharegpt),
        args.queue,
        args.clients,
    )
    document = results_document(sections, command, time.perf_counter() - start)
    block = headline_block(headlines, command)
    if args.print:
        print(document, end="")
        print(block, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(document)
        args.readme.write_text(apply_section(args.readme.read_text(), block))
        print(f"wrote {args.out} and the Results table of {args.readme}")
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

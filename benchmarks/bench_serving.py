"""A bounded load generator against an OpenAI-compatible server on loopback, reporting what
vLLM's ``benchmark_serving.py`` reports: TTFT, TPOT and ITL (mean, p50, p90, p99), request
and token throughput, and errors.

    python -m enginekit.serve executor=torch model=tiny +prefix=radix serve.port=8000 &
    python3 benchmarks/bench_serving.py --num-prompts 200 --max-concurrency 16 -- \\
        model=tiny workload=shared_prefix workload.shared_prefix_len=256 \\
        workload.unique_prompt_len=64 workload.min_output_len=16 workload.max_output_len=64

Prompts come from an enginekit workload (the overrides after ``--``, as ``python -m
enginekit`` takes them: ``workload.*`` picks the requests, generated, ShareGPT
(``workload=sharegpt``) or a trace, and ``model.*`` the vocabulary and context they are
made for) as token ids sent to ``/v1/completions``, each asking for its workload's output
length with ``ignore_eos``. Workloads whose later turns need earlier outputs in their
prompts (multiturn, ShareGPT's multi mode) are refused: each request here is
independent.

Load: ``--request-rate`` requests per second (Poisson arrivals; inf: all at once),
``--max-concurrency`` requests in flight at most, ``--num-prompts`` requests, and
``--time-limit-s`` for the whole run: no request starts after it, and those still in
flight then are cancelled and counted as errors. Every request streams (so TTFT and ITL
are measured per chunk) and asks for its usage. Against an enginekit server the report
adds the prefix-cache hit rate over the run, read from ``/metrics`` before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from enginekit.extras import exit_if_missing

exit_if_missing("benchmarks/bench_serving.py", modules=["httpx"])

import httpx  # noqa: E402
import numpy as np  # noqa: E402


@dataclass(frozen=True)
class Prompt:
    prompt: list[int]
    max_tokens: int


@dataclass
class Outcome:
    """One request as the client saw it (times in seconds from its own start)."""

    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    latency: float | None = None
    itls: list[float] = field(default_factory=list)


# ---- prompts ----------------------------------------------------------------------------


def workload_prompts(overrides: list[str], num_prompts: int) -> list[Prompt]:
    """The first ``num_prompts`` requests of the enginekit workload the overrides
    configure (generated, ShareGPT or a trace), as token ids."""
    from enginekit.app import compose_config
    from enginekit.executor.factory import model_shape
    from enginekit.tokenizer import Tokenizer
    from enginekit.workloads import open_workload

    cfg = compose_config([*overrides, f"workload.num_requests={num_prompts}"])
    shape = model_shape(cfg.model)
    workload = open_workload(
        cfg.workload,
        shape.vocab_size,
        shape.max_model_len,
        lambda: Tokenizer.for_workload(cfg.model.path),
    )
    prompts = []
    for request in workload:
        if request.follows is not None and request.prepend_context:
            raise SystemExit(
                f"error: workload {cfg.workload.name!r} has turns that wait on earlier "
                "outputs; this benchmark sends independent requests"
            )
        prompts.append(Prompt([int(t) for t in request.prompt_token_ids], request.max_tokens))
        if len(prompts) == num_prompts:
            break
    return prompts


# ---- requests ---------------------------------------------------------------------------


def request_body(prompt: Prompt, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt.prompt,
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Outcome:
    """Streams one request; every chunk with choices is a token step (TTFT for the first,
    an ITL sample for each later one)."""
    outcome = Outcome()
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                outcome.error = f"HTTP {response.status_code}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.error = "stream error"
                    return outcome
                if chunk.get("usage"):
                    outcome.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    outcome.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if outcome.ttft is None:
                        outcome.ttft = now - start
                    else:
                        outcome.itls.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        outcome.error = type(exc).__name__
        return outcome
    outcome.latency = time.perf_counter() - start
    outcome.ok = outcome.ttft is not None
    if not outcome.ok:
        outcome.error = "no tokens"
    return outcome


async def run_load(
    base_url: str,
    model: str,
    prompts: list[Prompt],
    request_rate: float,
    max_concurrency: int | None,
    time_limit_s: float,
    seed: int,
) -> tuple[list[Outcome], float]:
    """Sends ``prompts`` at ``request_rate`` (Poisson), at most ``max_concurrency`` at a
    time, within ``time_limit_s``; returns the outcomes (one per prompt started, in
    order) and the run's wall duration."""
    path = "/v1/completions"
    rng = np.random.default_rng(seed)
    limit = max_concurrency or len(prompts) or 1
    gate = asyncio.Semaphore(limit)
    timeout = httpx.Timeout(time_limit_s + 10.0)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[Outcome]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:

        async def one(prompt: Prompt) -> Outcome:
            async with gate:
                return await send(client, path, request_body(prompt, model))

        start = time.perf_counter()
        deadline = start + time_limit_s
        for prompt in prompts:
            if time.perf_counter() >= deadline:
                break
            tasks.append(asyncio.ensure_future(one(prompt)))
            if math.isfinite(request_rate):
                await asyncio.sleep(float(rng.exponential(1.0 / request_rate)))
        remaining = max(0.0, deadline - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=remaining) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        duration = time.perf_counter() - start
        for task in tasks:
            if task in pending:
                outcomes.append(Outcome(error="time limit"))
            else:
                outcomes.append(task.result())
    return outcomes, duration


# ---- the report ---------------------------------------------------------------------------


def _stats_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    array = np.asarray(values) * 1000.0
    p50, p90, p99 = np.percentile(array, [50, 90, 99]).tolist()
    return {"mean": float(array.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarize(outcomes: list[Outcome], duration: float, num_prompts: int) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    input_tokens = sum(o.prompt_tokens for o in ok)
    output_tokens = sum(o.output_tokens for o in ok)
    tpots = [
        (o.latency - o.ttft) / (o.output_tokens - 1)
        for o in ok
        if o.latency is not None and o.ttft is not None and o.output_tokens > 1
    ]
    errors = Counter(o.error for o in outcomes if not o.ok)
    errors["not started (time limit)"] += num_prompts - len(outcomes)
    return {
        "successful_requests": len(ok),
        "failed_requests": sum(errors.values()),
        "errors": {k: v for k, v in sorted(errors.items()) if v},
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration if duration else None,
        "output_throughput": output_tokens / duration if duration else None,
        "total_token_throughput": (input_tokens + output_tokens) / duration if duration else None,
        "ttft_ms": _stats_ms([o.ttft for o in ok if o.ttft is not None]),
        "tpot_ms": _stats_ms(tpots),
        "itl_ms": _stats_ms([itl for o in ok for itl in o.itls]),
    }


def prefix_counters(base_url: str) -> tuple[float, float] | None:
    """(prefix-cache queries, hits) from a server's /metrics (vLLM's counters, which
    enginekit serves too; summed over their series); None elsewhere."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    values: dict[str, float] = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        name = series.partition("{")[0]
        if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            values[name] = values.get(name, 0.0) + float(value)
    if len(values) < 2:
        return None
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def render(result: dict[str, Any]) -> str:
    def num(value: Any, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    lines = [
        "{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="),
        f"{'Successful requests:':<40}{result['successful_requests']:<10}",
        f"{'Failed requests:':<40}{result['failed_requests']:<10}",
        f"{'Benchmark duration (s):':<40}{num(result['duration_s'])}",
        f"{'Total input tokens:':<40}{result['total_input_tokens']:<10}",
        f"{'Total generated tokens:':<40}{result['total_output_tokens']:<10}",
        f"{'Request throughput (req/s):':<40}{num(result['request_throughput'])}",
        f"{'Output token throughput (tok/s):':<40}{num(result['output_throughput'])}",
        f"{'Total token throughput (tok/s):':<40}{num(result['total_token_throughput'])}",
    ]
    for key, title, short in (
        ("ttft_ms", "Time to First Token", "TTFT"),
        ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl_ms", "Inter-token Latency", "ITL"),
    ):
        stats = result[key]
        lines.append("{s:{c}^50}".format(s=title, c="-"))
        lines.append(f"{f'Mean {short} (ms):':<40}{num(stats['mean'])}")
        lines.append(f"{f'Median {short} (ms):':<40}{num(stats['p50'])}")
        lines.append(f"{f'P90 {short} (ms):':<40}{num(stats['p90'])}")
        lines.append(f"{f'P99 {short} (ms):':<40}{num(stats['p99'])}")
    if result.get("prefix_cache_hit_rate") is not None:
        lines.append("{s:{c}^50}".format(s="Prefix cache (server)", c="-"))
        lines.append(f"{'Hit rate over the run:':<40}{result['prefix_cache_hit_rate']:.1%}")
    if result["errors"]:
        lines.append("{s:{c}^50}".format(s="Errors", c="-"))
        lines += [f"{error + ':':<40}{count}" for error, count in result["errors"].items()]
    lines.append("=" * 50)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    cut = args_in.index("--") if "--" in args_in else len(args_in)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--request-rate", type=float, default=math.inf)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--time-limit-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-json", default=None)
    args = parser.parse_args(args_in[:cut])
    overrides = args_in[cut + 1 :]
    base_url = args.base_url.rstrip("/")
    if args.num_prompts < 1 or args.time_limit_s <= 0 or args.request_rate <= 0:
        parser.error("--num-prompts, --time-limit-s and --request-rate must be positive")
    prompts = workload_prompts(overrides, args.num_prompts)
    model = args.model or httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    before = prefix_counters(base_url)
    outcomes, duration = asyncio.run(
        run_load(
            base_url,
            model,
            prompts,
            args.request_rate,
            args.max_concurrency,
            args.time_limit_s,
            args.seed,
        )
    )
    result = summarize(outcomes, duration, len(prompts))
    after = prefix_counters(base_url)
    if before is not None and after is not None and after[0] > before[0]:
        result["prefix_cache_hit_rate"] = (after[1] - before[1]) / (after[0] - before[0])
    result["config"] = {**vars(args), "overrides": overrides}
    print(render(result))
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2, default=str)
    return 0 if result["successful_requests"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""enginekit's torch executor against transformers on the same tiny model, side by side.

One run, one process, the same seeded weights (the ``tiny`` model, float32): enginekit
(``executor=torch``, prefix none and block_hash), transformers' plain batched ``generate``
(left-padded, greedy) and, when the installed transformers has it, its continuous-batching
``generate_batch`` (small explicit cache sizes, so it runs on a CPU). Two scaled-down
workloads: ``unique`` (ragged prompts, nothing shared) and ``shared_prefix`` (one system
prompt, short unique tails). Output tokens are forced to the same count everywhere (EOS
ignored). Prints output tokens/s per system and the ratios to enginekit, then enginekit's
TTFT with and without prefix hits: the mean over a batch arriving at once, and one request
arriving after the prefix was served.

    python benchmarks/bench_torch_vs_transformers.py [--requests 16] [--output-len 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from enginekit import Engine, SamplingParams
from enginekit.models.tiny import random_state_dict, tiny_hf_config

VOCAB = 512  # prompts draw their ids below it (the tiny model has 32,000)


def unique_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lens = [max(4, min(400, round(rng.lognormvariate(4.0, 0.6)))) for _ in range(n)]
    return [[rng.randrange(3, VOCAB) for _ in range(k)] for k in lens]


def shared_prefix_prompts(n: int, seed: int, prefix_len: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(16, 48))]
            for _ in range(n)]  # fmt: skip


REPEATS = 3  # every figure is the best (wall) or median (TTFT) of this many runs


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def best(fn: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    runs = [fn() for _ in range(REPEATS)]
    return min(r[0] for r in runs), statistics.median(r[1] for r in runs)


def make_engine(prefix: str) -> Engine:
    return Engine.from_overrides(
        ["executor=torch", "model=tiny", "model.dtype=float32", "progress=false",
         f"+prefix={prefix}", "cache.num_blocks=4096"]
    )  # fmt: skip


def run_enginekit(prompts: list[list[int]], output_len: int, prefix: str) -> tuple[float, float]:
    """(wall seconds, mean TTFT seconds) for the batch arriving at once."""
    engine = make_engine(prefix)
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=output_len, ignore_eos=True))
    wall, result = timed(engine.run)
    ttfts = [o.first_token_time - o.arrival_time for o in result.outputs]  # type: ignore[attr-defined]
    return wall, statistics.mean(ttfts)


def single_request_ttft(prompts: list[list[int]], prefix: str) -> float:
    """Median TTFT of single requests, each served after the previous one finished (from
    the second on, the shared prefix is cached under block_hash)."""
    engine = make_engine(prefix)
    engine.add_request(prompts[0], SamplingParams(max_tokens=1))
    engine.run()
    ttfts = []
    for prompt in prompts[1:]:
        rid = engine.add_request(prompt, SamplingParams(max_tokens=1))
        engine.run()
        out = engine.output(rid)
        assert out.first_token_time is not None
        ttfts.append(out.first_token_time - out.arrival_time)
    return statistics.median(ttfts)


def run_generate(model, prompts: list[list[int]], output_len: int) -> float:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.no_grad():
        wall, _ = timed(lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=output_len, min_new_tokens=output_len,
            do_sample=False, pad_token_id=0,
        ))  # fmt: skip
    return wall


def run_generate_batch(model, prompts: list[list[int]], output_len: int) -> float | str:
    if not hasattr(model, "generate_batch"):
        return "not in this transformers"
    from transformers import GenerationConfig

    kwargs: dict[str, object] = {}
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        longest = max(map(len, prompts)) + output_len
        kwargs["continuous_batching_config"] = ContinuousBatchingConfig(
            page_size=16, num_blocks=len(prompts) * (longest // 16 + 2), max_batch_tokens=512
        )
    except ImportError:
        pass
    config = GenerationConfig(max_new_tokens=output_len, min_new_tokens=output_len,
                              do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    try:
        wall, _ = timed(lambda: model.generate_batch(prompts, generation_config=config,
                                                     warmup=False, **kwargs))  # fmt: skip
    except Exception as exc:  # reported, not fatal: an optional comparison
        return f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    config = tiny_hf_config()
    model = AutoModelForCausalLM.from_config(config).eval().float()
    model.load_state_dict(random_state_dict(config, seed=0))  # = model=tiny, model.seed=0
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tiny model (float32, "
          f"CPU), {args.requests} requests x {args.output_len} output tokens\n")  # fmt: skip
    workloads = {
        "unique": unique_prompts(args.requests, seed=1),
        "shared_prefix": shared_prefix_prompts(args.requests, seed=2),
    }
    # Warm both systems up, so import and first-call costs fall outside the timings.
    run_enginekit(workloads["unique"][:4], 4, "none")
    run_generate(model, workloads["unique"][:4], 4)
    for name, prompts in workloads.items():
        tokens = len(prompts) * args.output_len
        rows: dict[str, float | str] = {}
        ek_none, ttft_none = best(lambda p=prompts: run_enginekit(p, args.output_len, "none"))
        ek_hash, ttft_hash = best(lambda p=prompts: run_enginekit(p, args.output_len, "block_hash"))
        rows["enginekit +prefix=none"] = ek_none
        rows["enginekit +prefix=block_hash"] = ek_hash
        rows["transformers generate (padded batch)"] = min(
            run_generate(model, prompts, args.output_len) for _ in range(REPEATS)
        )
        rows["transformers generate_batch"] = run_generate_batch(model, prompts, args.output_len)
        mean_prompt = statistics.mean(map(len, prompts))
        print(f"== {name}: prompts {min(map(len, prompts))}..{max(map(len, prompts))} "
              f"(mean {mean_prompt:.0f}) tokens")  # fmt: skip
        print(f"{'system':40} {'wall s':>8} {'out tok/s':>10} {'enginekit(block_hash) x':>24}")
        for system, wall in rows.items():
            if isinstance(wall, str):
                print(f"{system:40} {wall}")
                continue
            print(f"{system:40} {wall:8.2f} {tokens / wall:10.0f} {wall / ek_hash:24.2f}")
        ratio = ttft_none / ttft_hash
        print(f"enginekit mean TTFT, batch at once: prefix none {ttft_none * 1e3:.0f} ms, "
              f"block_hash {ttft_hash * 1e3:.0f} ms (ratio {ratio:.2f})")  # fmt: skip
        if name == "unique":
            print()
            continue  # nothing shared: no prefix to serve first
        cold = single_request_ttft(prompts, "none")
        warm = single_request_ttft(prompts, "block_hash")
        print(f"enginekit median TTFT, one request at a time (prefix served before): "
              f"prefix none {cold * 1e3:.1f} ms, block_hash {warm * 1e3:.1f} ms "
              f"(ratio {cold / warm:.2f})\n")  # fmt: skip


if __name__ == "__main__":
    main()

"""End to end on a CUDA GPU: a random-weight Llama-3-8B-shaped model in bfloat16 through
enginekit (``executor=torch device=cuda``, the Triton kernels) and through transformers'
``generate``, on the same weights, with the simulator's predicted time beside every step.

The model: Llama-3-8B's shape (32 layers, hidden 4096, 32 heads over 8 kv heads, head_dim
128, MLP 14336, vocabulary 128256, rope theta 500000), weights drawn on the GPU from a
seeded generator as the embedded tiny model draws them (linear weights N(0, 1/fan_in),
norms 1 + N(0, 0.1²), embeddings N(0, 1): activations stay O(1) and greedy tokens are
not decided by rounding), stored in bfloat16 as one safetensors file (in /dev/shm when
it has room) that both systems load.

The work: ``--requests`` prompts of ``--prompt-len`` random token ids arriving at once,
``--output-len`` greedy tokens each (EOS ignored), after a short warm-up run of each system
(so that compiles stay out of the figures). Reported per system: output tokens/s over
the run's wall time, mean TTFT and mean TPOT. enginekit's are its engine clock (the sum
of measured step times, each synchronised by reading the tokens back); transformers':
the wall time of one ``generate`` of the whole batch, TTFT that of a one-token
``generate``, TPOT the rest over the remaining tokens. Every enginekit step is printed
with the simulator's prediction for the same scheduled work (``SimExecutor.step_cost`` on
an H200 of this shape and KV format), and the share of tokens both systems agree on.

    python benchmarks/gpu/e2e.py [--quick] [--json FILE]

Exit status 2 without a CUDA GPU (one line says so).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

NO_CUDA = "needs a CUDA GPU; torch.cuda.is_available() is False on this machine"
MODEL_BYTES = 16_060_522_496  # Llama-3-8B in bfloat16 (8.03e9 parameters)


def llama3_8b_config() -> dict[str, Any]:
    """config.json of a Llama-3-8B-shaped model (the simulator's ``llama-3-8b`` preset)."""
    from enginekit.models.tiny import llama_config
    from enginekit.spec.model import model_preset

    return llama_config(
        model_preset("llama-3-8b"),
        architectures=["LlamaForCausalLM"],
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        bos_token_id=128000,
        eos_token_id=128001,
        attention_bias=False,
        mlp_bias=False,
        torch_dtype="bfloat16",
    )


def write_random_model(
    folder: Path, seed: int, device: torch.device, config: dict[str, Any] | None = None
) -> None:
    """config.json and model.safetensors of seeded random weights (see the module doc) of
    ``config`` (default: Llama-3-8B's), drawn on ``device``."""
    from safetensors.torch import save_file

    from enginekit.models.tiny import llama_parameter_shapes

    config = config or llama3_8b_config()
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in sorted(llama_parameter_shapes(config).items()):
        t = torch.empty(shape, dtype=torch.float32, device=device).normal_(generator=g)
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * t
        elif not name.endswith("embed_tokens.weight"):
            t = t * shape[-1] ** -0.5
        tensors[name] = t.to(torch.bfloat16).cpu()
        del t
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def model_folder() -> Path:
    """A fresh folder for the weights: in /dev/shm when it has room for them, else /tmp."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 1.5 * MODEL_BYTES:
        return Path(tempfile.mkdtemp(prefix="enginekit-e2e-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="enginekit-e2e-"))


def prompts(num: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (num, length), generator=g).tolist()


class Step(NamedTuple):
    num_prefill_tokens: int
    num_decodes: int
    measured_s: float
    predicted_s: float


class SystemResult(NamedTuple):
    name: str
    wall_s: float
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    output_token_ids: list[list[int]]


def run_enginekit(
    folder: Path, batch: list[list[int]], output_len: int, memory_gib: float, device: str = "cuda"
) -> tuple[SystemResult, list[Step], dict[str, Any]]:
    """Runs the batch (after a warm-up) and records every step beside its prediction."""
    from enginekit import Engine, SamplingParams
    from enginekit.executor.sim.executor import SimExecutor
    from enginekit.spec.hardware import hardware_preset

    engine = Engine.from_overrides(
        ["executor=torch", f"device={device}", f"model.path={folder}", "model.dtype=bfloat16",
         "progress=false", f"cache.memory_gib={memory_gib}"]
    )  # fmt: skip
    sim = SimExecutor(engine.shape, hardware_preset("h200"), engine.kv_spec, 2)
    # Warm-up on other prompts (the kernels compile here; nothing of it is cached for the run).
    for p in prompts(2, min(64, len(batch[0])), engine.shape.vocab_size, seed=99):
        engine.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True))
    engine.run()
    steps: list[Step] = []
    execute = engine.executor.execute

    def recorded(scheduled: Any) -> Any:
        output = execute(scheduled)
        steps.append(Step(sum(scheduled.prefill_lens), len(scheduled.decode_context_lens),
                          output.step_time_s, sim.step_cost(scheduled).step_time_s))  # fmt: skip
        return output

    engine.executor.execute = recorded  # type: ignore[method-assign]
    ids = [engine.add_request(p, SamplingParams(max_tokens=output_len, ignore_eos=True))
           for p in batch]  # fmt: skip
    start = time.perf_counter()
    engine.run()
    wall = time.perf_counter() - start
    outputs = [engine.output(i) for i in ids]
    ttft = statistics.mean(o.first_token_time - o.arrival_time for o in outputs)
    tpot = statistics.mean(
        (o.finish_time - o.first_token_time) / max(1, len(o.output_token_ids) - 1) for o in outputs
    )
    clock = sum(s.measured_s for s in steps)
    result = SystemResult("enginekit (torch, Triton kernels)", clock,
                          len(batch) * output_len / clock, ttft, tpot,
                          [list(o.output_token_ids) for o in outputs])  # fmt: skip
    return result, steps, {"engine": str(engine.describe()), "host_wall_s": wall}


def run_transformers(
    folder: Path, batch: list[list[int]], output_len: int, device: str = "cuda"
) -> SystemResult:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    except TypeError:  # transformers before `dtype`
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    model = model.to(device).eval()
    ids = torch.tensor(batch, device=device)

    def synchronize() -> None:
        if ids.is_cuda:
            torch.cuda.synchronize()

    def generate(tokens: torch.Tensor, n: int) -> tuple[float, torch.Tensor]:
        synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=0)  # fmt: skip
        synchronize()
        return time.perf_counter() - start, out

    generate(ids[:2, :64], 4)  # warm-up
    ttft, _ = generate(ids, 1)
    wall, out = generate(ids, output_len)
    tokens = out[:, ids.shape[1] :].tolist()
    return SystemResult("transformers generate", wall, len(batch) * output_len / wall, ttft,
                        (wall - ttft) / max(1, output_len - 1), tokens)  # fmt: skip


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Share of requests whose first token agrees, and the mean agreeing prefix length."""
    prefixes = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        prefixes.append(n)
    return {"first_token": sum(p > 0 for p in prefixes) / len(prefixes),
            "mean_prefix": statistics.mean(prefixes)}  # fmt: skip


def print_steps(steps: Sequence[Step]) -> None:
    print(f"{'step':>5} {'prefill tok':>11} {'decodes':>7} {'measured ms':>11} "
          f"{'predicted ms':>12} {'meas/pred':>9}")  # fmt: skip
    for i, s in enumerate(steps):
        ratio = s.measured_s / s.predicted_s if s.predicted_s else float("nan")
        print(f"{i:5d} {s.num_prefill_tokens:11d} {s.num_decodes:7d} {s.measured_s * 1e3:11.2f} "
              f"{s.predicted_s * 1e3:12.2f} {ratio:9.2f}")  # fmt: skip
    measured, predicted = sum(s.measured_s for s in steps), sum(s.predicted_s for s in steps)
    print(f"total: measured {measured:.3f} s, predicted {predicted:.3f} s "
          f"(measured / predicted {measured / predicted:.2f})")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 requests, 256 + 32 tokens")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--memory-gib", type=float, default=24.0, help="enginekit's KV pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"e2e: {NO_CUDA}", file=sys.stderr)
        return 2
    if args.quick:
        args.requests, args.prompt_len, args.output_len = 8, 256, 32
    device = torch.device("cuda")
    folder = model_folder()
    try:
        start = time.perf_counter()
        write_random_model(folder, args.seed, device)
        print(f"random Llama-3-8B-shaped weights written to {folder} in "
              f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
        batch = prompts(args.requests, args.prompt_len, llama3_8b_config()["vocab_size"], args.seed)
        ek, steps, described = run_enginekit(folder, batch, args.output_len, args.memory_gib)
        gc.collect()
        torch.cuda.empty_cache()
        hf = run_transformers(folder, batch, args.output_len)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{torch.cuda.get_device_name(0)}: {args.requests} requests x {args.prompt_len} "
          f"prompt + {args.output_len} output tokens, bfloat16\n")  # fmt: skip
    print_steps(steps)
    print(f"\n{'system':36} {'tok/s':>8} {'TTFT ms':>8} {'TPOT ms':>8} {'wall s':>7}")
    for r in (ek, hf):
        print(f"{r.name:36} {r.tokens_per_s:8.0f} {r.ttft_s * 1e3:8.1f} {r.tpot_s * 1e3:8.2f} "
              f"{r.wall_s:7.2f}")  # fmt: skip
    agree = agreement(ek.output_token_ids, hf.output_token_ids)
    print(f"enginekit ÷ transformers: tokens/s {ek.tokens_per_s / hf.tokens_per_s:.2f}x, "
          f"TTFT {ek.ttft_s / hf.ttft_s:.2f}x, TPOT {ek.tpot_s / hf.tpot_s:.2f}x; greedy tokens: "
          f"first agrees in {agree['first_token']:.0%} of requests, mean agreeing prefix "
          f"{agree['mean_prefix']:.1f} of {args.output_len}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(0), "args": vars(args) | {"json": str(args.json)},
            "systems": [{k: v for k, v in r._asdict().items() if k != "output_token_ids"}
                        for r in (ek, hf)],
            "agreement": agree, "steps": [s._asdict() for s in steps], "enginekit": described,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Quality of a quantized KV cache against the unquantized one, on a real (small) model.

Random weights make these figures meaningless, so the model is a small Llama trained on
the Python standard library's own sources (``train_stdlib_llama.py``; trained once,
cached outside the repository). Its held-out files were never trained on. For each
quantizer, on the same held-out windows, side by side in one run:

- attention error: each layer's attention output over K/V stored in the quantized
  format, against the same queries over unquantized K/V (relative Frobenius error,
  mean over layers and windows). The inputs are the unquantized model's own Q/K/V, so
  this isolates the cache's error from its knock-on effects;
- KL(unquantized ‖ quantized) of the next-token distributions, teacher-forced, averaged
  over every position;
- greedy agreement: the share of positions whose most likely next token is the same;
- perplexity of the held-out text, and its change;
- free-running greedy generation through the engine (decode kernels, a calibrating
  fp8 pool): the share of generated positions equal to the unquantized engine's, and
  the mean number of tokens before the first difference.

Every window is prefilled in chunks through the paged cache (``scoring``), so from the
second chunk on the model attends keys and values that went through the quantizer, as
cached prefixes and decodes do. Goals: fp8 KL < 1e-3 and agreement > 99 %; int4
perplexity within a few percent.

The model was trained on windows of 256 tokens, so the held-out windows are that long
(past its training length its perplexity degrades for reasons unrelated to the cache).

    python benchmarks/bench_kv_quant_quality.py [--windows 32] [--length 256] [--chunk 64]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from train_stdlib_llama import ensure_model, held_out_windows, set_threads  # noqa: E402

from enginekit import Engine, SamplingParams  # noqa: E402
from enginekit.executor.torch.fp8_scales import calibrated_scale  # noqa: E402
from enginekit.executor.torch.scoring import teacher_forced_logprobs  # noqa: E402
from enginekit.kernels import reference  # noqa: E402
from enginekit.kernels.layout import allocate_kv_tensors  # noqa: E402
from enginekit.kernels.ops import REFERENCE_OPS  # noqa: E402
from enginekit.models.llama import LlamaModel  # noqa: E402
from enginekit.models.weights import load_hf_folder  # noqa: E402
from enginekit.spec.kv import KVSpec  # noqa: E402
from enginekit.spec.quant import KVQuant  # noqa: E402
from enginekit.tokenizer import Tokenizer  # noqa: E402

DTYPE = torch.float32


def formats(block_size: int, head_dim: int, group_size: int) -> dict[str, KVQuant]:
    return {
        "none": KVQuant(),
        "fp8": KVQuant("fp8"),
        f"int4 g{group_size}": KVQuant.int4(group_size, block_size, head_dim),
    }


def attention_error(
    model: LlamaModel, spec: KVSpec, qkv: list[tuple[torch.Tensor, ...]], margin: float
) -> float:
    """Mean over layers of ||attn(q, quantized K/V) - attn(q, K/V)|| / ||attn(q, K/V)||
    for one window whose per-layer (q, k, v) are given. fp8 scales are calibrated on the
    window itself (max-abs × ``margin``), as the engine calibrates on its first prefill."""
    shape = model.arch.shape
    num_tokens = qkv[0][1].shape[0]
    table = torch.arange(spec.num_blocks_for(num_tokens), dtype=torch.int32)[None]
    slots = torch.arange(num_tokens)
    plain_spec = KVSpec.of(shape, 32, spec.block_size)
    errors = []
    for layer, (q, k, v) in enumerate(qkv):
        outs = []
        for s in (plain_spec, spec):
            pool = allocate_kv_tensors(s, table.shape[1], DTYPE, "cpu")
            if pool.fp8_scales is not None:  # calibrated on this window, as the engine does
                scales = torch.stack([calibrated_scale(k, margin), calibrated_scale(v, margin)])
                pool.set_fp8_scales(layer, scales)
            reference.write_kv(pool, layer, k, v, slots)
            outs.append(
                reference.prefill_attention(
                    q,
                    pool,
                    layer,
                    table,
                    [0, num_tokens],
                    [0],
                    model.scale,
                    shape.sliding_window,
                    shape.attention_sinks,
                )  # fmt: skip
            )
        errors.append(float((outs[1] - outs[0]).norm() / outs[0].norm()))
    return sum(errors) / len(errors)


def generated(folder: Path, quantizer: str, prompts: list[list[int]], num_tokens: int):
    """Greedy outputs of the torch engine with ``quantizer`` on ``prompts``."""
    engine = Engine.from_overrides(
        [
            "executor=torch",
            f"model.path={folder}",
            "model.dtype=float32",
            "progress=false",
            "threads=1",
            "+prefix=none",
            f"+quantizer={quantizer}",
        ]
    )
    sampling = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, sampling)
    return [o.output_token_ids for o in engine.run().outputs]


def generation_agreement(got: list[list[int]], want: list[list[int]]) -> tuple[float, float]:
    """(share of equal positions, mean tokens before the first difference)."""
    equal = [
        sum(a == b for a, b in zip(g, w, strict=True)) / len(w)
        for g, w in zip(got, want, strict=True)
    ]
    prefix = [next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), len(w))
              for g, w in zip(got, want, strict=True)]  # fmt: skip
    return sum(equal) / len(equal), sum(prefix) / len(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=64, help="prefill chunk in tokens")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--generate-prompts", type=int, default=8)
    parser.add_argument("--generate-tokens", type=int, default=64)
    parser.add_argument("--png", help="also plot capacity and quality into this PNG file")
    args = parser.parse_args()
    set_threads(args.threads)

    folder = ensure_model()
    arch, weights = load_hf_folder(folder, DTYPE, "cpu")
    model = LlamaModel(arch, weights, DTYPE, "cpu")
    windows = held_out_windows(Tokenizer(str(folder)), args.windows, args.length)
    ops = REFERENCE_OPS
    shape = arch.shape
    kinds = formats(args.block_size, shape.head_dim, args.group_size)
    print(
        f"model: {folder.name} ({shape.num_layers} layers, {shape.num_heads} heads, "
        f"{shape.num_kv_heads} kv heads, head_dim {shape.head_dim}); {args.windows} held-out "
        f"windows of {args.length} tokens, prefilled in chunks of {args.chunk}; blocks of "
        f"{args.block_size}"
    )

    started = time.perf_counter()
    logprobs: dict[str, list[torch.Tensor]] = {name: [] for name in kinds}
    qkv_by_window: list[list[tuple[torch.Tensor, ...]]] = []
    for window in windows:
        captured: list[tuple[torch.Tensor, ...]] = []

        def capture(layer: int, q, k, v, captured=captured) -> None:
            if len(captured) == layer:  # the whole window's Q/K/V in one piece
                captured.append((q.clone(), k.clone(), v.clone()))
            else:
                captured[layer] = tuple(
                    torch.cat([a, b]) for a, b in zip(captured[layer], (q, k, v), strict=True)
                )

        for name, quant in kinds.items():
            spec = KVSpec.of(shape, 32, args.block_size, quant)
            hook = capture if name == "none" else None
            logprobs[name].append(
                teacher_forced_logprobs(model, ops, spec, window, args.chunk, on_qkv=hook)
            )
        qkv_by_window.append(captured)

    base = torch.cat([lp[:-1] for lp in logprobs["none"]])
    targets = torch.cat([torch.tensor(w[1:]) for w in windows])
    base_nll = float(-base.gather(1, targets[:, None]).mean())
    print(
        f"\n{'cache':>10} {'B/token':>9} {'attn rel err':>13} {'KL':>10} {'greedy agree':>13} "
        f"{'ppl':>8} {'Δppl':>8}"
    )
    rows: dict[str, dict[str, float]] = {}
    for name, quant in kinds.items():
        spec = KVSpec.of(shape, 16, args.block_size, quant)  # bytes as a 16-bit model's
        lp = torch.cat([x[:-1] for x in logprobs[name]])
        nll = float(-lp.gather(1, targets[:, None]).mean())
        kl = float((base.exp() * (base - lp)).sum(-1).mean())
        agree = float((base.argmax(-1) == lp.argmax(-1)).float().mean())
        attn = 0.0
        if name != "none":
            stored = KVSpec.of(shape, 32, args.block_size, quant)
            attn = sum(attention_error(model, stored, qkv, 2.0) for qkv in qkv_by_window)
            attn /= len(qkv_by_window)
        rows[name] = {"bytes_per_token": spec.bytes_per_token, "kl": kl, "agreement": agree,
                      "ppl_change": math.exp(nll) / math.exp(base_nll) - 1}  # fmt: skip
        print(
            f"{name:>10} {spec.bytes_per_token:>9,.0f} {attn:>13.2e} {kl:>10.2e} "
            f"{100 * agree:>12.2f}% {math.exp(nll):>8.3f} "
            f"{100 * (math.exp(nll) / math.exp(base_nll) - 1):>+7.2f}%"
        )
    prompts = [w[: args.length // 2] for w in windows[: args.generate_prompts]]
    outputs = {
        q: generated(folder, q, prompts, args.generate_tokens) for q in ("none", "fp8", "int4")
    }
    print(
        f"\nfree-running greedy, {len(prompts)} prompts of {args.length // 2} tokens, "
        f"{args.generate_tokens} new tokens each (engine defaults: int4 group 64)"
    )
    print(f"{'cache':>10} {'positions equal':>16} {'tokens before first difference':>31}")
    for q in ("fp8", "int4"):
        share, run = generation_agreement(outputs[q], outputs["none"])
        print(f"{q:>10} {100 * share:>15.1f}% {run:>31.1f}")
    print(f"\n(B/token as a 16-bit model stores them; {time.perf_counter() - started:.0f} s)")
    if args.png:
        plot(rows, Path(args.png))
        print(f"plot: {args.png}")


def plot(rows: dict[str, dict[str, float]], path: Path) -> None:
    """Capacity (tokens per GiB, relative to none) beside quality (KL, perplexity change,
    greedy disagreement) per cache format, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    base = rows["none"]["bytes_per_token"]
    fig, (capacity, quality) = plt.subplots(1, 2, figsize=(10, 4))
    capacity.bar(names, [base / rows[n]["bytes_per_token"] for n in names], color="tab:blue")
    capacity.set_ylabel("tokens per byte of KV, × none")
    capacity.set_title("capacity")
    x = range(len(names))
    width = 0.27
    series = [
        ("KL (×1e3)", [1e3 * rows[n]["kl"] for n in names]),
        ("perplexity change (%)", [100 * rows[n]["ppl_change"] for n in names]),
        ("greedy disagreement (%)", [100 * (1 - rows[n]["agreement"]) for n in names]),
    ]
    for i, (label, values) in enumerate(series):
        quality.bar([j + (i - 1) * width for j in x], values, width, label=label)
    quality.set_xticks(list(x), names)
    quality.set_title("quality against the unquantized cache (lower is better)")
    quality.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()

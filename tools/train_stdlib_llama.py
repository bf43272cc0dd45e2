"""Trains a small Llama on the Python standard library's own sources, for quality benchmarks.

Random weights make KV-cache quality figures (attention error, KL of next-token
distributions, greedy agreement, perplexity) meaningless; this script makes a model whose
outputs mean something, from text every machine with Python already has: the ``.py`` files
of ``sysconfig.get_paths()["stdlib"]`` (no site-packages, no test folders, no file over
300 kB). A stable hash of each file's relative path holds out about 10% of the files (the
same files on every machine and Python version); the tokenizer and the model never see them.

The result is a Hugging Face folder that enginekit loads by path (``model.path=...``):
``config.json`` + ``model.safetensors`` (``LlamaForCausalLM``, float32, head_dim 64, GQA),
a byte-level BPE tokenizer (``tokenizer.json`` + ``tokenizer_config.json``, BOS added to
every encoding) and ``training.json`` (steps, minutes, losses, held-out perplexity, seed,
file counts). It lives in ``$ENGINEKIT_CACHE/stdlib-llama-v1``, or in
``~/.cache/enginekit/stdlib-llama-v1`` when that variable is unset; it is written to a
temporary folder beside it and renamed when complete.

    python tools/train_stdlib_llama.py [--minutes 12] [--threads 1] [--force]
    python tools/train_stdlib_llama.py --check   # the cached folder, in enginekit

A benchmark imports ``ensure_model()`` (the folder, trained first if missing),
``held_out_texts()``, ``held_out_token_ids(tokenizer)`` and
``held_out_windows(tokenizer, num_windows, length)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

CACHE_NAME = "stdlib-llama-v1"
SEED = 0
HELD_OUT_PERCENT = 10
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
MAX_FILE_BYTES = 300_000  # pydoc_data/topics.py is one huge string, not code
VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SEQ_LEN = 256
BATCH_SIZE = 16  # in 12 minutes, batches of 4 or 8 ended at a worse held-out loss
PEAK_LR = 3e-3
WARMUP_STEPS = 40
EVAL_WINDOWS = 64
LOG_EVERY_S = 30.0


class Encoder(Protocol):
    """A transformers tokenizer or enginekit's ``Tokenizer``: text to token ids."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class TrainingRecord:
    """What ``training.json`` holds."""

    seed: int
    python_version: str  # whose standard library it learnt
    num_train_files: int
    num_held_out_files: int
    num_train_tokens: int
    vocab_size: int
    num_params: int
    seq_len: int
    batch_size: int
    peak_lr: float
    threads: int
    bf16_autocast: bool
    steps: int
    minutes: float
    final_train_loss: float
    held_out_windows: int
    held_out_loss: float
    held_out_ppl: float


def cache_dir() -> Path:
    """Where the model folder lives: ``$ENGINEKIT_CACHE/<name>`` or the user's cache."""
    root = os.environ.get("ENGINEKIT_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "enginekit"
    return base / CACHE_NAME


def is_held_out(relative_path: str) -> bool:
    """Whether a file (by its path relative to the stdlib, ``/``-separated) is held out:
    a stable hash, the same on every machine and run."""
    digest = hashlib.sha256(f"{SEED}:{relative_path}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of every usable stdlib ``.py`` file, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        found.append((rel.as_posix(), path))
    return sorted(found)


def read_texts(held_out: bool) -> list[str]:
    """The texts of the held-out files (``held_out=True``) or of the training files, in
    relative-path order; empty files are skipped."""
    texts = []
    for rel, path in stdlib_files():
        if is_held_out(rel) == held_out:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                texts.append(text)
    return texts


def held_out_texts() -> list[str]:
    """The held-out files' texts: never seen by the tokenizer or the model."""
    return read_texts(held_out=True)


def held_out_token_ids(tokenizer: Encoder, max_tokens: int | None = None) -> list[int]:
    """The held-out files encoded one by one (each starts with BOS, which the saved
    tokenizer adds) and concatenated, cut to ``max_tokens`` if given."""
    ids: list[int] = []
    for text in held_out_texts():
        ids.extend(tokenizer.encode(text))
        if max_tokens is not None and len(ids) >= max_tokens:
            return ids[:max_tokens]
    return ids


def held_out_windows(tokenizer: Encoder, num_windows: int, length: int) -> list[list[int]]:
    """``num_windows`` non-overlapping windows of ``length`` tokens, evenly spaced over the
    held-out token stream (the same windows on every run)."""
    ids = held_out_token_ids(tokenizer)
    stride = len(ids) // num_windows
    if stride < length:
        raise ValueError(f"held-out text has {len(ids)} tokens: too few for the windows")
    return [ids[i * stride : i * stride + length] for i in range(num_windows)]


def train_tokenizer(texts: Sequence[str]) -> Any:
    """A byte-level BPE of ``VOCAB_SIZE`` tokens trained on ``texts``, wrapped as a
    transformers fast tokenizer that adds BOS to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    bos_id = bpe.token_to_id(BOS)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )


def model_config(tokenizer: Any) -> Any:
    """The Llama shape: hidden 256, 4 layers, 4 query and 2 KV heads of 64 channels."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_corpus(tokenizer: Any, texts: Sequence[str]) -> Any:
    """All ``texts`` encoded (each with its BOS) into one 1-D tensor of token ids."""
    import torch

    encodings = tokenizer.backend_tokenizer.encode_batch(list(texts))
    return torch.tensor([i for e in encodings for i in e.ids], dtype=torch.long)


def learning_rate(step: int, progress: float) -> float:
    """Linear warmup over ``WARMUP_STEPS``, then cosine decay to 10% of the peak as the
    wall-clock budget is spent (``progress`` in [0, 1])."""
    warmup = min(1.0, (step + 1) / WARMUP_STEPS)
    return PEAK_LR * warmup * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), which makes
    autocast training about twice as fast; elsewhere bfloat16 is emulated, slower."""
    import torch

    return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())


class TrainResult(NamedTuple):
    steps: int
    minutes: float
    final_loss: float  # mean training loss of the last 20 steps
    bf16_autocast: bool


def train(model: Any, tokens: Any, minutes: float) -> TrainResult:
    """AdamW on random ``SEQ_LEN``-token windows of ``tokens`` until ``minutes`` of wall
    clock are spent (float32 weights; bfloat16 autocast where the CPU has it). Mutates
    ``model``."""
    import torch

    bf16 = has_fast_bf16()
    print(f"bfloat16 autocast: {bf16}", flush=True)
    generator = torch.Generator().manual_seed(SEED)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR,
        betas=(0.9, 0.95),
    )
    model.train()
    budget_s, start, last_log = minutes * 60.0, time.monotonic(), time.monotonic()
    recent: list[float] = []
    step = 0
    while (elapsed := time.monotonic() - start) < budget_s:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, elapsed / budget_s)
        starts = torch.randint(0, len(tokens) - SEQ_LEN, (BATCH_SIZE,), generator=generator)
        batch = torch.stack([tokens[s : s + SEQ_LEN] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent = [*recent[-19:], loss.item()]
        step += 1
        if time.monotonic() - last_log >= LOG_EVERY_S:
            last_log = time.monotonic()
            mean = sum(recent) / len(recent)
            print(f"step {step:5d}  {elapsed / 60:5.1f} min  loss {mean:.3f}", flush=True)
    model.eval()
    spent = (time.monotonic() - start) / 60.0
    return TrainResult(step, spent, sum(recent) / max(1, len(recent)), bf16)


def held_out_loss(model: Any, windows: Sequence[Sequence[int]]) -> float:
    """Mean next-token negative log-likelihood (nats) of ``model`` over ``windows``, with
    transformers' own forward, every predicted token weighted alike."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for window in windows:
            ids = torch.tensor([list(window)])
            loss = model(input_ids=ids, labels=ids).loss
            total += loss.item() * (len(window) - 1)
            count += len(window) - 1
    return total / count


def verify_in_enginekit(folder: Path) -> None:
    """Checks that enginekit's Tokenizer round-trips a held-out snippet and that enginekit
    (``executor=torch``, float32) decodes greedily the same tokens as transformers from
    held-out prompts. Raises AssertionError otherwise."""
    import torch
    from transformers import LlamaForCausalLM

    from enginekit import Engine, SamplingParams
    from enginekit.tokenizer import Tokenizer

    tokenizer = Tokenizer(str(folder))
    snippet = held_out_texts()[0][:2000]
    ids = tokenizer.encode(snippet)
    assert tokenizer.decode(ids) == snippet, "the tokenizer does not round-trip"
    prompts = held_out_windows(tokenizer, num_windows=4, length=96)
    engine = Engine.from_overrides(
        ["executor=torch", f"model.path={folder}", "model.dtype=float32", "progress=false"]
    )
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=32, ignore_eos=True))
    outputs = engine.run().outputs
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = torch.tensor([prompt])
        mask = torch.ones_like(ids)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
        expected = expected[0, len(prompt) :].tolist()
        assert output.output_token_ids == expected, "enginekit and transformers differ"
    print(f"enginekit: tokenizer round-trips; greedy tokens equal transformers' on {len(prompts)}")
    print("sample:", repr(tokenizer.decode(prompts[0][-40:] + outputs[0].output_token_ids)))


def build(folder: Path, minutes: float, threads: int) -> TrainingRecord:
    """Trains tokenizer and model and writes the complete folder at ``folder`` (through a
    temporary sibling renamed at the end). Returns what it wrote to ``training.json``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    train_texts = read_texts(held_out=False)
    num_held_out = len(held_out_texts())
    tokenizer = train_tokenizer(train_texts)
    tokens = encode_corpus(tokenizer, train_texts)
    print(f"{len(train_texts)} training files, {num_held_out} held out; {len(tokens)} tokens")
    # eager attention trains ~10% faster than sdpa on a CPU at this size; same maths
    model = LlamaForCausalLM._from_config(model_config(tokenizer), attn_implementation="eager")
    num_params = sum(p.numel() for p in model.parameters())
    print(f"{num_params / 1e6:.2f}M parameters; training for {minutes} min", flush=True)
    result = train(model, tokens, minutes)
    eval_loss = held_out_loss(model, held_out_windows(tokenizer, EVAL_WINDOWS, SEQ_LEN))
    record = TrainingRecord(
        seed=SEED,
        python_version=platform.python_version(),
        num_train_files=len(train_texts),
        num_held_out_files=num_held_out,
        num_train_tokens=len(tokens),
        vocab_size=len(tokenizer),
        num_params=num_params,
        seq_len=SEQ_LEN,
        batch_size=BATCH_SIZE,
        peak_lr=PEAK_LR,
        threads=threads,
        bf16_autocast=result.bf16_autocast,
        steps=result.steps,
        minutes=round(result.minutes, 2),
        final_train_loss=round(result.final_loss, 4),
        held_out_windows=EVAL_WINDOWS,
        held_out_loss=round(eval_loss, 4),
        held_out_ppl=round(math.exp(eval_loss), 3),
    )
    print(f"{result.steps} steps in {result.minutes:.1f} min: train loss {result.final_loss:.3f}; "
          f"held-out loss {eval_loss:.3f}, perplexity {math.exp(eval_loss):.2f}")  # fmt: skip
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "training.json").write_text(json.dumps(asdict(record), indent=2) + "\n")
        assert (tmp / "model.safetensors").is_file(), "transformers wrote no model.safetensors"
        for file in tmp.iterdir():
            file.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp made it private
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def set_threads(threads: int) -> None:
    """Limits torch and the tokenizer library to ``threads`` CPU threads."""
    import torch

    os.environ["RAYON_NUM_THREADS"] = str(threads)  # read when tokenizers first trains
    torch.set_num_threads(threads)


def ensure_model(minutes: float = 12.0, threads: int = 1) -> Path:
    """The model folder, trained first (``minutes`` of training on ``threads`` CPU threads)
    when it is not in the cache yet."""
    folder = cache_dir()
    if not (folder / "training.json").is_file():
        set_threads(threads)
        build(folder, minutes, threads)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="training wall clock")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    parser.add_argument("--check", action="store_true", help="only check the cached folder")
    args = parser.parse_args()
    folder = cache_dir()
    if args.check and not (folder / "training.json").is_file():
        raise SystemExit(
            f"error: no trained model in {folder} to check; train it first with\n"
            f"  python3 tools/train_stdlib_llama.py   (about {args.minutes:g} min)\n"
            "(ENGINEKIT_CACHE chooses the cache folder)"
        )
    set_threads(args.threads)
    if not args.check:
        if args.force or not (folder / "training.json").is_file():
            build(folder, args.minutes, args.threads)
        else:
            print(f"cached (--force retrains): {folder}")
    print(json.loads((folder / "training.json").read_text()))
    verify_in_enginekit(folder)
    print(folder)


if __name__ == "__main__":
    main()

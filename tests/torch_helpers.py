"""Shared helpers of the torch tests: small HF configs, HF models on seeded weights, and
hand-made paged batches."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from enginekit import Engine
from enginekit.executor.torch.batch import build_batch
from enginekit.kernels.layout import allocate_kv_tensors
from enginekit.models.arch import ModelArch
from enginekit.models.llama import LlamaModel
from enginekit.models.tiny import random_state_dict, tiny_hf_config
from enginekit.models.weights import weights_from_state_dict
from enginekit.spec.kv import KVSpec
from enginekit.step import SchedulerOutput

FP32_ATOL = 2e-5  # logits are O(1); fp32 forwards agree to ~1e-6

# The models here are tiny: intra-op threads buy nothing, and on a busy machine their
# spin-waits cost up to 50x (measured on 2 shared cores).
torch.set_num_threads(1)


def hf_config(kind: str) -> Any:
    """Small configs of each supported architecture (and the variants worth testing)."""
    import transformers

    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
    )
    if kind == "tiny":
        return tiny_hf_config()
    if kind == "llama3":  # Llama-3.1 rope scaling, MHA, head_dim != hidden / heads
        return transformers.LlamaConfig(
            **{**common, "num_key_value_heads": 4, "head_dim": 32},
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if kind == "llama_mqa":
        return transformers.LlamaConfig(**{**common, "num_key_value_heads": 1})
    if kind == "qwen2":  # q/k/v biases, tied embeddings, GQA 4
        return transformers.Qwen2Config(
            **{**common, "num_attention_heads": 8, "num_key_value_heads": 2},
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    if kind == "mistral":  # sliding window shorter than the prompts
        return transformers.MistralConfig(**common, sliding_window=12, head_dim=16)
    raise ValueError(kind)


def hf_model(config: Any, state: dict[str, torch.Tensor]) -> Any:
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval().float()


def hf_generate(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` of ``max_new_tokens`` after ``prompt``."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def our_model(config: Any, state: dict[str, torch.Tensor], dtype=torch.float32) -> LlamaModel:
    arch = ModelArch.from_hf_config(config.to_dict(), name="test")
    return LlamaModel(arch, weights_from_state_dict(arch, state, dtype, "cpu"), dtype, "cpu")


def models(kind: str, seed: int = 0) -> tuple[Any, LlamaModel]:
    config = hf_config(kind)
    state = random_state_dict(config, seed)
    return hf_model(config, state), our_model(config, state)


def prompts(vocab: int, shared: int, seed: int, n: int = 6) -> list[list[int]]:
    """``n`` seeded prompts: a common prefix of ``shared`` tokens, then 1-29 of their own
    (ids from 3 up: 0-2 are special in the test configs)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    return [
        prefix + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 30))] for _ in range(n)
    ]


def saved_engine(folder: Any, *overrides: str) -> Engine:
    """The torch engine on the model saved in ``folder``, in float32 with blocks of 4, on
    a pool of 512 blocks (room for every test's prompts) unless ``overrides`` size it: the
    default would hold max_num_seqs sequences of the model's whole context."""
    sized = any(o.startswith(("cache.num_blocks=", "cache.memory_gib=")) for o in overrides)
    return Engine.from_overrides(
        [
            "executor=torch",
            f"model.path={folder}",
            "model.dtype=float32",
            "progress=false",
            "cache.block_size=4",
            *([] if sized else ["cache.num_blocks=512"]),
            *overrides,
        ]
    )


class PagedSequences:
    """Sequences with block tables over a shuffled pool, to drive the forward by hand."""

    def __init__(self, model: LlamaModel, block_size: int, num_blocks: int, seed: int = 0):
        shape = model.arch.shape
        self.spec = KVSpec.of(shape, bits_per_element=32, block_size=block_size)
        self.pool = allocate_kv_tensors(self.spec, num_blocks, model.dtype, "cpu")
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}
        self.block_size = block_size

    def reserve(self, seq_id: int, num_tokens: int) -> None:
        table = self.tables.setdefault(seq_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free.pop())

    def step(
        self,
        prefills: list[tuple[int, int, int]],
        decodes: list[tuple[int, int]],
    ) -> SchedulerOutput:
        """prefills: (seq_id, start, length); decodes: (seq_id, context_len)."""
        for seq_id, start, length in prefills:
            self.reserve(seq_id, start + length)
        for seq_id, context_len in decodes:
            self.reserve(seq_id, context_len)
        seq_ids = [p[0] for p in prefills] + [d[0] for d in decodes]
        width = max(len(self.tables[s]) for s in seq_ids)
        tables = np.full((len(seq_ids), width), -1, dtype=np.int32)
        for row, seq_id in enumerate(seq_ids):
            tables[row, : len(self.tables[seq_id])] = self.tables[seq_id]
        return SchedulerOutput(
            step=0,
            prefill_seq_ids=[p[0] for p in prefills],
            prefill_starts=[p[1] for p in prefills],
            prefill_lens=[p[2] for p in prefills],
            decode_seq_ids=[d[0] for d in decodes],
            decode_context_lens=[d[1] for d in decodes],
            sample_seq_ids=[d[0] for d in decodes] + [p[0] for p in prefills],
            finished_seq_ids=[],
            preempted_seq_ids=[],
            block_copies=[],
            block_tables=tables,
        )

    def batch(self, scheduled: SchedulerOutput, tokens: dict[int, list[int]], all_rows: bool):
        scheduled = scheduled._replace(
            prefill_token_ids=[
                tokens[seq_id][start : start + length]
                for seq_id, start, length in zip(
                    scheduled.prefill_seq_ids,
                    scheduled.prefill_starts,
                    scheduled.prefill_lens,
                    strict=True,
                )
            ],
            decode_token_ids=[
                tokens[seq_id][context_len - 1]
                for seq_id, context_len in zip(
                    scheduled.decode_seq_ids, scheduled.decode_context_lens, strict=True
                )
            ],
        )
        batch = build_batch(scheduled, self.block_size, torch.device("cpu"))
        if all_rows:
            n = batch.input_ids.shape[0]
            batch = batch._replace(logits_indices=torch.arange(n))
        return batch

"""TorchExecutor: real tokens from a Llama-family model over paged KV tensors.

Per step: register the step's forks, then forget ``finished_seq_ids``; read the KV tier
saves' blocks out (their payloads come back in ``ModelOutput.saved_payloads``), then apply
swap-outs, swap-ins, tier loads and copy-on-write block copies (in that order, the step
contract's: a block written down or swapped out can be reused by the same step); build
the flat batch (prefill chunks, then decodes) from the scheduler's block tables; run the
forward, which writes the new tokens' K/V and attends over the pool; sample one token for
each ``sample_seq_ids`` entry. ``step_time_s`` is the measured wall time of all of it (the
device is synchronised by reading the tokens back).

Per-sequence state lives from ``add_sequence`` until ``finished_seq_ids`` lists the
sequence: its sampling parameters and its generator (the tokens each step computes come
in the SchedulerOutput). A preempted sequence keeps both. A forked sequence gets its
parent's parameters and a generator of its own (seeded with the request's seed + the
sample's index, when the request has a seed); a forked sample draws its first token from
the parent's logits.

A sequence whose sampling is shaped by its own tokens or asks for logprobs (penalties,
``min_tokens``, ``logprobs``) also keeps its tokens (``SequenceTokens``: the prompt, then
each token a step computes), a fork a copy of its parent's. While no such sequence is
registered a step samples as it always has; while one is, a step looks each of its
computed sequences up once, and only the rows that ask are shaped (``sample_shaped``).
``prompt_logprobs`` are computed when a request arrives (``score_prompt``: one more
prefill of the prompt), and their time is added to the next step's.

A sequence with a structured output keeps a grammar matcher (``structured``): its grammar
is compiled when the request is added (``prepare_structured``, the admission check), its
matcher starts when the sequence is added, a fork's is a copy of its parent's, and each
token the sequence draws moves it on. A step fills the bitmask of its constrained rows
and masks their logits after the penalties; while no such sequence is registered, a step
checks one empty set. Tokens are never drawn again (a recomputed or swapped sequence
samples only what follows its tokens), so a matcher stays where its sequence is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from enginekit.executor.base import Executor
from enginekit.executor.torch.batch import build_batch
from enginekit.executor.torch.fp8_scales import FP8Scales
from enginekit.executor.torch.kv_tensors import PagedKVTensors
from enginekit.executor.torch.sampler import (
    beam_candidates,
    request_seed,
    sample,
    sample_shaped,
)
from enginekit.executor.torch.shaping import SequenceTokens, held_stop_ids
from enginekit.executor.torch.structured import StructuredGrammars
from enginekit.kernels.ops import PagedOps
from enginekit.models.llama import LlamaModel
from enginekit.request import SamplingParams, TokenLogprob
from enginekit.spec.kv import KVSpec
from enginekit.step import ModelOutput, SchedulerOutput


class _Sequence(NamedTuple):
    sampling: SamplingParams
    generator: torch.Generator
    tokens: SequenceTokens | None  # kept for shaped sequences only (``_is_shaped``)
    grammar: Any = None  # a structured output's xgrammar.GrammarMatcher, else None


def _is_shaped(sampling: SamplingParams) -> bool:
    """Whether sampling ``sampling`` needs the sequence's tokens or its logprobs."""
    return sampling.has_penalties or sampling.min_tokens > 0 or sampling.logprobs is not None


class TorchExecutor(Executor):
    """Runs ``model`` on ``device`` with a pool of ``num_blocks`` KV blocks (and
    ``num_host_blocks`` host blocks for swapping), stored in ``kv_spec.quant``'s format.
    An fp8 pool takes its scales from the checkpoint or calibrates them on the first
    prefill, as ``kv_spec.quant.fp8_scales`` and ``fp8_calibration_margin`` say (see
    ``FP8Scales``). ``eos_token_id`` is the model's, for the
    scheduler. ``model_path`` is the model's Hugging Face folder (None without one), whose
    tokenizer structured outputs read. ``num_steps`` and ``busy_time_s`` accumulate over
    non-empty steps."""

    needs_block_tables = True
    supports_forks = True
    supports_beam_search = True
    has_distribution = True

    def __init__(
        self,
        model: LlamaModel,
        kv_spec: KVSpec,
        num_blocks: int,
        ops: PagedOps,
        *,
        num_host_blocks: int = 0,
        base_seed: int = 0,
        model_path: str | None = None,
    ) -> None:
        self.model = model
        self.kv_spec = kv_spec
        self.device = model.device
        self.ops = ops
        self.kv_tensors = PagedKVTensors(
            kv_spec, num_blocks, num_host_blocks, model.dtype, model.device, ops
        )
        self.fp8_scales = FP8Scales.of_pool(
            self.kv_tensors.on_device, kv_spec.quant, model.weights.kv_scales
        )
        self.base_seed = base_seed
        self.eos_token_id = model.arch.eos_token_id
        self._sequences: dict[int, _Sequence] = {}
        self._shaped: dict[int, SequenceTokens] = {}  # the shaped sequences' tokens
        self.structured = StructuredGrammars(
            model_path, model.arch.shape.vocab_size, self.eos_token_id, self.device
        )
        self._constrained: set[int] = set()  # the sequences with a grammar matcher
        self._unbilled_s = 0.0  # prompt scoring since the last step, added to its time
        # What the builder chose and by which rule (pool sizing, threads), for describe().
        self.build_notes: dict[str, object] = {}
        self.num_steps = 0
        self.busy_time_s = 0.0

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def add_sequence(
        self,
        seq_id: int,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        scripted_output_ids: Sequence[int] | None = None,
    ) -> None:
        """Registers ``seq_id`` (the prompt comes with each step, and is kept only by a
        sequence whose sampling is shaped by its tokens; ``scripted_output_ids`` is
        ignored: the model decides); a structured output's matcher starts at its
        grammar's beginning. Raises ValueError if it is already registered,
        InvalidRequestError for a structured output ``prepare_structured`` refuses."""
        tokens = None
        if _is_shaped(sampling):
            tokens = SequenceTokens(list(prompt_token_ids), len(prompt_token_ids))
        grammar = None
        if sampling.structured is not None:
            grammar = self.structured.matcher(sampling)
        self._register(seq_id, sampling, tokens, grammar)

    def prepare_structured(self, sampling: SamplingParams) -> None:
        """Compiles ``sampling.structured``'s grammar over the model's vocabulary (kept
        for the sequence: ``StructuredGrammars.check``); InvalidRequestError naming the
        field when it cannot be served."""
        self.structured.check(sampling)

    def _register(
        self,
        seq_id: int,
        sampling: SamplingParams,
        tokens: SequenceTokens | None,
        grammar: Any = None,
    ) -> None:
        if seq_id in self._sequences:
            raise ValueError(f"sequence {seq_id} is already registered with the executor")
        generator = torch.Generator(device=self.device)
        generator.manual_seed(request_seed(self.base_seed, seq_id, sampling))
        self._sequences[seq_id] = _Sequence(sampling, generator, tokens, grammar)
        if tokens is not None:
            self._shaped[seq_id] = tokens
        if grammar is not None:
            self._constrained.add(seq_id)

    def execute(self, scheduled: SchedulerOutput) -> ModelOutput:
        """Registers the forks' children, then forgets ``finished_seq_ids`` (unknown ids
        ignored; a parent finishing in the step that forks it is still forked), reads the
        tier saves' blocks out, applies the block operations, runs the forward and
        samples. Mutates the KV pools and the sampled sequences' tokens and generators.
        Raises KeyError for a scheduled sequence never added, KVCacheError for a tier
        payload of the wrong size."""
        started = time.perf_counter()
        sequences = self._sequences
        # Forks first: a beam's parent may be listed as finished in the step that forks it.
        for fork in scheduled.forks:
            parent = sequences[fork.parent_seq_id]
            sampling = parent.sampling
            if sampling.seed is not None:
                sampling = dataclasses.replace(sampling, seed=sampling.seed + fork.sample_index)
            copied = None if parent.tokens is None else parent.tokens.copy()
            grammar = None if parent.grammar is None else parent.grammar.fork()
            self._register(fork.child_seq_id, sampling, copied, grammar)
        for seq_id in scheduled.finished_seq_ids:
            sequences.pop(seq_id, None)
            self._shaped.pop(seq_id, None)
            self._constrained.discard(seq_id)
        kv = self.kv_tensors
        saved = kv.read_blocks([save.device_block_id for save in scheduled.tier_saves])
        kv.apply(
            scheduled.swap_outs, scheduled.swap_ins, scheduled.block_copies, scheduled.tier_loads
        )
        if scheduled.is_empty:
            return ModelOutput([], time.perf_counter() - started, saved_payloads=saved)
        if self._shaped:
            self._record_computed_tokens(scheduled)
        batch = build_batch(scheduled, self.kv_spec.block_size, self.device)
        logits = self.model.forward(
            batch, self.kv_tensors.on_device, self.ops, self._before_write()
        )
        sampled = [sequences[seq_id] for seq_id in scheduled.sample_seq_ids]
        params = [s.sampling for s in sampled]
        generators = [s.generator for s in sampled]
        widths = [p.beam_width for p in params]
        logprobs: list[TokenLogprob | None] | None = None
        held: list[list[int]] | None = None
        grammars = None
        allowed = None
        if self._constrained:
            grammars = [s.grammar for s in sampled]
            allowed = self.structured.allowed(grammars)
        if allowed is not None or (self._shaped and any(s.tokens is not None for s in sampled)):
            held = [self._held_stop_ids(s) for s in sampled]
            tokens, logprobs = sample_shaped(
                logits, params, generators, [s.tokens for s in sampled], held, allowed
            )
            if not any(p.logprobs is not None for p in params):
                logprobs = None
        else:
            tokens = sample(logits, params, generators)
        if grammars is not None:
            self.structured.accept(grammars, tokens)
        candidates = None
        if max(widths, default=1) > 1:
            candidates = beam_candidates(logits, widths, held)
        elapsed = time.perf_counter() - started + self._unbilled_s
        self._unbilled_s = 0.0
        self.num_steps += 1
        self.busy_time_s += elapsed
        return ModelOutput(tokens, elapsed, candidates, saved, logprobs)

    def _held_stop_ids(self, sequence: _Sequence) -> list[int]:
        """The tokens ``min_tokens`` forbids ``sequence`` to draw now."""
        if sequence.tokens is None or not sequence.sampling.min_tokens:
            return []
        return held_stop_ids(
            sequence.sampling, sequence.tokens.num_output_tokens, self.eos_token_id
        )

    def _record_computed_tokens(self, scheduled: SchedulerOutput) -> None:
        """The shaped sequences' tokens grow by what this step computes (a sampled
        token is learnt at the step that computes it: the next)."""
        shaped = self._shaped
        for seq_id, start, chunk in zip(
            scheduled.prefill_seq_ids,
            scheduled.prefill_starts,
            scheduled.prefill_token_ids,
            strict=True,
        ):
            tokens = shaped.get(seq_id)
            if tokens is not None:
                tokens.record(start, chunk)
        for seq_id, context_len, token in zip(
            scheduled.decode_seq_ids,
            scheduled.decode_context_lens,
            scheduled.decode_token_ids,
            strict=True,
        ):
            tokens = shaped.get(seq_id)
            if tokens is not None:
                tokens.record(context_len - 1, (token,))

    def _before_write(
        self,
    ) -> Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None:
        """The forward's hook while fp8 scales still wait for their calibration."""
        scales = self.fp8_scales
        if scales is None or not scales.is_pending:
            return None
        return lambda layer, _query, key, value: scales.calibrate(layer, key, value)

    def prompt_logprobs(self, token_ids: Sequence[int], chunk_tokens: int = 512) -> torch.Tensor:
        """float32 [len(token_ids), vocab] teacher-forced log-probabilities through a
        private pool of this executor's KV format (see ``scoring``); this executor's
        pool and sequences are untouched."""
        from enginekit.executor.torch.scoring import teacher_forced_logprobs

        return teacher_forced_logprobs(
            self.model,
            self.ops,
            self.kv_spec,
            token_ids,
            chunk_tokens,
        )

    def score_prompt(
        self, token_ids: Sequence[int], num_top: int, chunk_tokens: int = 512
    ) -> list[TokenLogprob | None]:
        """``prompt_logprobs``: each prompt token's TokenLogprob given the tokens before
        it (None for the first), with ``num_top`` alternatives. Costs one more prefill of
        the whole prompt, in chunks of ``chunk_tokens`` through a private pool of this
        executor's KV format (``scoring.prompt_token_logprobs``: a prefix-cache hit saves
        none of it and changes nothing), and a [chunk_tokens, vocab] float32 buffer at a
        time; its time is added to the next step's. This executor's pool and sequences
        are untouched."""
        from enginekit.executor.torch.scoring import prompt_token_logprobs

        started = time.perf_counter()
        entries = prompt_token_logprobs(
            self.model, self.ops, self.kv_spec, token_ids, num_top, chunk_tokens
        )
        self._unbilled_s += time.perf_counter() - started
        return entries

    def tier_payload_bytes(self) -> int:
        return self.kv_tensors.payload_bytes

    def describe(self) -> dict[str, object]:
        """Where and how the run happens: device, model, kernels, the KV pool and the host
        swap pool (blocks and bytes; the host blocks allocated so far), and what the
        builder chose and why (``build_notes``)."""
        shape = self.model.arch.shape
        block_bytes = self.kv_spec.bytes_per_block
        info: dict[str, object] = {
            "executor": "torch",
            "device": str(self.device),
            "model": shape.name,
            "architecture": self.model.arch.model_type,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "kernels": self.ops.name,
            "kv_storage": self.kv_spec.quant.kind,
            "kv_bytes_per_token": self.kv_spec.bytes_per_token,
            "block_size": self.kv_spec.block_size,
            "kv_pool_blocks": self.kv_tensors.num_blocks,
            "kv_pool_bytes": self.kv_tensors.num_blocks * block_bytes,
            "kv_pool_gib": self.kv_tensors.num_blocks * block_bytes / (1 << 30),
            "swap_pool_blocks": self.kv_tensors.num_host_blocks,
            "swap_pool_bytes": self.kv_tensors.num_host_blocks * block_bytes,
            "swap_pool_blocks_allocated": self.kv_tensors.num_host_blocks_allocated,
        }
        info.update(self.build_notes)
        if self.fp8_scales is not None:
            info["fp8_scales"] = self.fp8_scales.describe()
        return info

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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from enginekit.executor.base import Executor
from enginekit.executor.torch.batch import build_batch
from enginekit.executor.torch.fp8_scales import FP8Scales
from enginekit.executor.torch.kv_tensors import PagedKVTensors
from enginekit.executor.torch.sampler import beam_candidates, request_seed, sample
from enginekit.kernels.ops import PagedOps
from enginekit.models.llama import LlamaModel
from enginekit.request import SamplingParams
from enginekit.spec.kv import KVSpec
from enginekit.step import ModelOutput, SchedulerOutput


class _Sequence(NamedTuple):
    sampling: SamplingParams
    generator: torch.Generator


class TorchExecutor(Executor):
    """Runs ``model`` on ``device`` with a pool of ``num_blocks`` KV blocks (and
    ``num_host_blocks`` host blocks for swapping), stored in ``kv_spec.quant``'s format.
    An fp8 pool takes its scales from the checkpoint or calibrates them on the first
    prefill, as ``kv_spec.quant.fp8_scales`` and ``fp8_calibration_margin`` say (see
    ``FP8Scales``). ``eos_token_id`` is the model's, for the
    scheduler. ``num_steps`` and ``busy_time_s`` accumulate over non-empty steps."""

    needs_block_tables = True
    supports_forks = True
    supports_beam_search = True

    def __init__(
        self,
        model: LlamaModel,
        kv_spec: KVSpec,
        num_blocks: int,
        ops: PagedOps,
        *,
        num_host_blocks: int = 0,
        base_seed: int = 0,
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
        """Registers ``seq_id`` (the prompt comes with each step; ``scripted_output_ids`` is
        ignored: the model decides).
        Raises ValueError if it is already registered."""
        if seq_id in self._sequences:
            raise ValueError(f"sequence {seq_id} is already registered with the executor")
        generator = torch.Generator(device=self.device)
        generator.manual_seed(request_seed(self.base_seed, seq_id, sampling))
        self._sequences[seq_id] = _Sequence(sampling, generator)

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
            self.add_sequence(fork.child_seq_id, (), sampling)
        for seq_id in scheduled.finished_seq_ids:
            sequences.pop(seq_id, None)
        kv = self.kv_tensors
        saved = kv.read_blocks([save.device_block_id for save in scheduled.tier_saves])
        kv.apply(
            scheduled.swap_outs, scheduled.swap_ins, scheduled.block_copies, scheduled.tier_loads
        )
        if scheduled.is_empty:
            return ModelOutput([], time.perf_counter() - started, saved_payloads=saved)
        batch = build_batch(scheduled, self.kv_spec.block_size, self.device)
        logits = self.model.forward(
            batch, self.kv_tensors.on_device, self.ops, self._before_write()
        )
        sampled = [sequences[seq_id] for seq_id in scheduled.sample_seq_ids]
        tokens = sample(logits, [s.sampling for s in sampled], [s.generator for s in sampled])
        widths = [s.sampling.beam_width for s in sampled]
        candidates = beam_candidates(logits, widths) if max(widths, default=1) > 1 else None
        elapsed = time.perf_counter() - started
        self.num_steps += 1
        self.busy_time_s += elapsed
        return ModelOutput(tokens, elapsed, candidates, saved)

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

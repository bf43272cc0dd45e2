"""SimExecutor: a roofline cost model in place of a GPU, and scripted tokens in place of a model.

Step time is ``max(FLOPs / effective FLOP/s, bytes / effective HBM bandwidth) +
STEP_OVERHEAD_S`` over the work the scheduler actually put in the step:

FLOPs
    ``2 × shape.num_matmul_params_per_token`` per batched token (every prefill-chunk token
    and every decode), plus attention: ``4 × layers × num_heads × head_dim`` per
    (query, key) pair. A prefill chunk of ``c`` new tokens after ``s`` cached ones has
    ``c·s + c(c+1)/2`` pairs (causal); a decode attending ``L`` tokens has ``L``.
bytes
    The matmul weights once per step (``num_matmul_params_per_token × weight_bytes_per_param``;
    the input embedding is a lookup of a few rows and is left out). KV: a decode reads
    its ``L`` tokens and writes 1; a prefill chunk reads its ``s`` cached tokens and writes
    its ``c``; all at ``kv_spec.bytes_per_token``. A copy-on-write block copy reads and
    writes one block. Activations are left out (small next to weights and KV).

With a sliding-window model every attended length is capped at the window, plus the
attention sinks (``shape.attention_sinks``) that lie outside it: a query seeing ``L`` keys
attends ``min(L, window) + min(sinks, max(0, L - window))``. An empty step (no prefill, no
decode) costs nothing: no kernel is launched.

Tokens (``ScriptedTokens``): each sequence returns its scripted output ids in order, one
per appearance in ``sample_seq_ids``; its count survives preemption (the re-prefill's
sample continues the script). Past the script's end it returns ``fallback_token_id(seq_id,
output position)``, a pseudo-random id of those two only, so runs are deterministic and
independent of batching.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import NamedTuple

from enginekit.executor.base import Executor
from enginekit.executor.sim.tokens import ScriptedTokens, fallback_token_id
from enginekit.request import SamplingParams
from enginekit.spec.hardware import HardwareSpec
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import ModelShape
from enginekit.step import ModelOutput, SchedulerOutput

STEP_OVERHEAD_S = 30e-6
"""Fixed cost of every non-empty step: kernel launches of one CUDA-graph replay, the sampler
and the host<->device hand-off of a batch, which a well-tuned engine keeps to tens of µs."""


class StepCost(NamedTuple):
    """The roofline of one step. ``step_time_s = max(compute_time_s, memory_time_s) +
    STEP_OVERHEAD_S`` (0 for an empty step)."""

    flops: int
    bytes: float  # KV bytes per token may be fractional (a block's int4 scales)
    compute_time_s: float
    memory_time_s: float
    step_time_s: float
    is_compute_bound: bool


_EMPTY_COST = StepCost(0, 0, 0.0, 0.0, 0.0, False)


def _causal_pairs(start: int, length: int, window: int | None) -> int:
    """(query, key) pairs of a causal chunk of ``length`` queries at positions
    ``start .. start+length-1``, each attending to itself and everything before it, at most
    ``window`` keys."""
    if window is None or start + length <= window:
        return length * start + length * (length + 1) // 2
    # Query at position p attends min(p + 1, window) keys.
    num_under = max(0, window - 1 - start)  # queries with p + 1 < window
    under = num_under * start + num_under * (num_under + 1) // 2
    return under + (length - num_under) * window


def _sinks_outside(num_keys: int, window: int, sinks: int) -> int:
    """Sink keys a query that sees ``num_keys`` keys (itself included) reaches beyond its
    window."""
    return min(sinks, max(0, num_keys - window))


def _sink_pairs(start: int, length: int, window: int, sinks: int) -> int:
    """(query, sink key) pairs beyond the window of a chunk of ``length`` queries at
    positions ``start .. start+length-1``: the sum of ``_sinks_outside(p + 1, ...)``."""

    def upto(num_queries: int) -> int:  # the sum over positions 0 .. num_queries - 1
        beyond = num_queries - window
        if beyond <= sinks:
            return max(0, beyond) * (max(0, beyond) + 1) // 2
        return sinks * (sinks + 1) // 2 + (beyond - sinks) * sinks

    return upto(start + length) - upto(start)


__all__ = ["STEP_OVERHEAD_S", "SimExecutor", "StepCost", "fallback_token_id"]


class SimExecutor(Executor):
    """Simulated executor. Per-sequence state: its script and output position (in
    ``ScriptedTokens``), from ``add_sequence`` until the step whose ``finished_seq_ids``
    lists the sequence. ``last_cost`` is the roofline
    of the latest step; ``num_steps``, ``num_compute_bound_steps`` and ``busy_time_s``
    accumulate over non-empty steps. A forked sample draws pseudo-random tokens. Its
    tokens are scripted, not drawn from a distribution (``has_distribution`` is False):
    requests asking for logprobs, penalties or min_p are refused when added, while
    ``min_tokens`` (the scheduler's stop rule) and ``seed`` are taken."""

    supports_forks = True
    supports_beam_search = True

    def __init__(
        self,
        shape: ModelShape,
        hw: HardwareSpec,
        kv_spec: KVSpec,
        weight_bytes_per_param: int = 2,
        *,
        num_blocks: int | None = None,
        num_host_blocks: int = 0,
    ) -> None:
        self.shape = shape
        self.hw = hw
        self.kv_spec = kv_spec
        self.weight_bytes_per_param = weight_bytes_per_param
        self.num_blocks = num_blocks  # pool size, for describe() only
        self.num_host_blocks = num_host_blocks  # host swap pool, for describe() only
        self.weight_bytes = shape.num_params * weight_bytes_per_param  # resident footprint
        self.weight_read_bytes = shape.num_matmul_params_per_token * weight_bytes_per_param
        self._flops_per_token = 2 * shape.num_matmul_params_per_token
        self._flops_per_pair = 4 * shape.num_layers * shape.num_heads * shape.head_dim
        self._kv_bytes_per_token = kv_spec.bytes_per_token
        self._copy_bytes = 2 * kv_spec.bytes_per_block
        self._window = shape.sliding_window
        self._sinks = shape.attention_sinks
        self._effective_flops = hw.effective_flops
        self._effective_bandwidth = hw.effective_bandwidth
        self._vocab_size = shape.vocab_size
        self._block_transfer_s = hw.block_transfer_s(kv_spec.bytes_per_block)
        self._tier_block_s: list[float] = []  # one block over each KV tier level's link
        self._tokens = ScriptedTokens(shape.vocab_size)
        self._beam_widths: dict[int, int] = {}  # beam-search sequences: their beam width
        self.last_cost: StepCost = _EMPTY_COST
        self.num_steps = 0
        self.num_compute_bound_steps = 0
        self.busy_time_s = 0.0

    def add_sequence(
        self,
        seq_id: int,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        scripted_output_ids: Sequence[int] | None = None,
    ) -> None:
        """Registers ``seq_id``; raises ValueError if it is already registered (a preempted
        sequence stays registered and must not be added again)."""
        if seq_id in self._tokens:
            raise ValueError(f"sequence {seq_id} is already registered with the executor")
        self._tokens.add(seq_id, scripted_output_ids or (), seq_id)
        if sampling.beam_width > 1:
            self._beam_widths[seq_id] = sampling.beam_width

    @property
    def num_sequences(self) -> int:
        return len(self._tokens)

    def step_cost(self, scheduled: SchedulerOutput) -> StepCost:
        """The roofline of ``scheduled``, without running it. Pure."""
        if not scheduled.prefill_lens and not scheduled.decode_context_lens:
            return _EMPTY_COST
        context_lens = scheduled.decode_context_lens
        starts = scheduled.prefill_starts
        lens = scheduled.prefill_lens
        window = self._window
        num_decodes = len(context_lens)
        num_prefill_tokens = sum(lens)
        if window is None:
            decode_keys = sum(context_lens)
            cached_keys = sum(starts)
            pairs = decode_keys
            for s, c in zip(starts, lens, strict=True):
                pairs += c * s + c * (c + 1) // 2
        else:
            decode_keys = sum(map(min, context_lens, itertools.repeat(window)))
            cached_keys = sum(map(min, starts, itertools.repeat(window)))
            pairs = decode_keys
            for s, c in zip(starts, lens, strict=True):
                pairs += _causal_pairs(s, c, window)
            if sinks := self._sinks:
                decode_sinks = sum(_sinks_outside(n, window, sinks) for n in context_lens)
                decode_keys += decode_sinks
                cached_keys += sum(_sinks_outside(s, window, sinks) for s in starts)
                pairs += decode_sinks
                for s, c in zip(starts, lens, strict=True):
                    pairs += _sink_pairs(s, c, window, sinks)
        flops = (
            self._flops_per_token * (num_prefill_tokens + num_decodes)
            + self._flops_per_pair * pairs
        )
        kv_tokens = decode_keys + num_decodes + cached_keys + num_prefill_tokens
        num_bytes = (
            self.weight_read_bytes
            + self._kv_bytes_per_token * kv_tokens
            + self._copy_bytes * len(scheduled.block_copies)
        )
        compute_s = flops / self._effective_flops
        memory_s = num_bytes / self._effective_bandwidth
        is_compute_bound = compute_s > memory_s
        num_swapped = len(scheduled.swap_outs) + len(scheduled.swap_ins)
        swap_s = num_swapped * self._block_transfer_s
        roofline_s = compute_s if is_compute_bound else memory_s
        if scheduled.tier_loads or scheduled.tier_saves:
            roofline_s = max(roofline_s, self._tier_transfer_s(scheduled))
        step_s = roofline_s + swap_s + STEP_OVERHEAD_S
        return StepCost(flops, num_bytes, compute_s, memory_s, step_s, is_compute_bound)

    def attach_tiers(self, link_bytes_per_s: Sequence[float]) -> None:
        block_bytes = self.kv_spec.bytes_per_block
        self._tier_block_s = [block_bytes / speed for speed in link_bytes_per_s]

    def _tier_transfer_s(self, scheduled: SchedulerOutput) -> float:
        """The time of the step's tier loads (to the device) and saves (from it), each
        direction on its own, which the step's compute hides up to its own length: a
        transfer moves layer by layer ahead of the layers computing with it."""
        block_s = self._tier_block_s
        load_s = sum(block_s[load.level] for load in scheduled.tier_loads)
        save_s = sum(block_s[save.level] for save in scheduled.tier_saves)
        return max(load_s, save_s)

    def execute(self, scheduled: SchedulerOutput) -> ModelOutput:
        """Registers the step's forks, then forgets ``finished_seq_ids`` (unknown ids are
        ignored; a parent finishing in the step that forks it is still forked), costs the
        step into ``last_cost`` and returns the next token of every ``sample_seq_ids``
        entry. Raises KeyError for a sampled sequence that was never added."""
        tokens = self._tokens
        # Forks first: a beam's parent may be listed as finished in the step that forks it.
        for fork in scheduled.forks:  # a sample of its own: pseudo-random tokens that depend
            # on the request and the sample's index only, as a seeded sampler's would
            key = (fork.parent_seq_id + 1) * 1_000_003 + fork.sample_index
            tokens.remove(fork.child_seq_id)
            tokens.add(fork.child_seq_id, (), key)
            if fork.parent_seq_id in self._beam_widths:
                self._beam_widths[fork.child_seq_id] = self._beam_widths[fork.parent_seq_id]
        for seq_id in scheduled.finished_seq_ids:
            tokens.remove(seq_id)
            self._beam_widths.pop(seq_id, None)
        cost = self.step_cost(scheduled)
        self.last_cost = cost
        if cost.step_time_s:
            self.num_steps += 1
            self.num_compute_bound_steps += cost.is_compute_bound
            self.busy_time_s += cost.step_time_s
        next_token_ids = tokens.draw(scheduled.sample_seq_ids)
        if not self._beam_widths:
            return ModelOutput(next_token_ids, cost.step_time_s)
        return ModelOutput(next_token_ids, cost.step_time_s, self._beam_candidates(scheduled))

    def _beam_candidates(self, scheduled: SchedulerOutput) -> list[list[tuple[int, float]]]:
        """For each sampled beam sequence: 2 × beam_width pseudo-random continuations with
        log-probabilities, a function of its last token and position only (so a beam's
        candidates do not depend on which sequence holds it)."""
        last: dict[int, tuple[int, int]] = {}  # seq_id -> (last token, its position)
        for seq_id, token, context_len in zip(
            scheduled.decode_seq_ids,
            scheduled.decode_token_ids,
            scheduled.decode_context_lens,
            strict=True,
        ):
            last[seq_id] = (token, context_len - 1)
        for seq_id, start, length, chunk in zip(
            scheduled.prefill_seq_ids,
            scheduled.prefill_starts,
            scheduled.prefill_lens,
            scheduled.prefill_token_ids,
            strict=True,
        ):
            last[seq_id] = (chunk[-1], start + length - 1)
        candidates: list[list[tuple[int, float]]] = []
        for seq_id in scheduled.sample_seq_ids:
            width = self._beam_widths.get(seq_id)
            if width is None:
                candidates.append([])
                continue
            candidates.append(self.beam_candidates(*last[seq_id], width))
        return candidates

    def beam_candidates(self, token: int, position: int, width: int) -> list[tuple[int, float]]:
        """The 2 × ``width`` continuations (token, log-probability), likeliest first, that
        the simulator offers a beam whose last token is ``token`` at ``position``. Pure."""
        rng = random.Random(token * 1_000_003 + position)
        tokens = rng.sample(range(self._vocab_size), 2 * width)
        logprobs = sorted((math.log(rng.random()) for _ in tokens), reverse=True)
        return list(zip(tokens, logprobs, strict=True))

    def swap_time_s(self, num_blocks: int) -> float:
        """Time to copy ``num_blocks`` KV blocks over PCIe in one direction."""
        return num_blocks * self.hw.block_transfer_s(self.kv_spec.bytes_per_block)

    def describe(self) -> dict[str, object]:
        info: dict[str, object] = {
            "executor": "sim",
            "model": self.shape.name,
            "hardware": self.hw.name,
            "peak_tflops": self.hw.peak_flops / 1e12,
            "hbm_bandwidth_tb_s": self.hw.hbm_bandwidth / 1e12,
            "compute_efficiency": self.hw.compute_efficiency,
            "memory_efficiency": self.hw.memory_efficiency,
            "weight_gib": self.weight_bytes / (1 << 30),
            "kv_bytes_per_token": self.kv_spec.bytes_per_token,
            "block_size": self.kv_spec.block_size,
            "step_overhead_us": STEP_OVERHEAD_S * 1e6,
        }
        block_bytes = self.kv_spec.bytes_per_block
        if self.num_blocks is not None:
            info["kv_pool_blocks"] = self.num_blocks
            info["kv_pool_bytes"] = self.num_blocks * block_bytes
            info["kv_pool_gib"] = self.num_blocks * block_bytes / (1 << 30)
        if self.num_host_blocks:
            info["swap_pool_blocks"] = self.num_host_blocks
            info["swap_pool_bytes"] = self.num_host_blocks * block_bytes
        return info

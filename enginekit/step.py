"""The step contract: what the scheduler hands an executor each step, and what comes back.

The scheduler decides; the executor computes. What crosses is plain data: sequence ids,
token counts and block operations, never Request objects, so an executor could run in
another process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from enginekit.request import TokenLogprob


class BlockCopy(NamedTuple):
    src_block_id: int
    dst_block_id: int


class BlockSwap(NamedTuple):
    device_block_id: int
    host_block_id: int


class TierSave(NamedTuple):
    """Read device block ``device_block_id`` out for tier level ``level`` (an index into
    the run's levels, fastest first); the executor returns its bytes in
    ``ModelOutput.saved_payloads``."""

    device_block_id: int
    level: int


class TierLoad(NamedTuple):
    """Write ``payload`` (a block's bytes as a tier level returned them; None in the
    simulator, which moves no data) into device block ``device_block_id``; ``level`` is
    the level it came from, whose link the transfer takes."""

    device_block_id: int
    level: int
    payload: object


class Fork(NamedTuple):
    """A new sequence, sample ``sample_index`` of its parent's request: it starts with a copy
    of the parent's tokens and shares its KV blocks."""

    parent_seq_id: int
    child_seq_id: int
    sample_index: int


class SchedulerOutput(NamedTuple):
    """The work of one step.

    Prefill chunk i computes tokens [prefill_starts[i], prefill_starts[i] + prefill_lens[i])
    of sequence prefill_seq_ids[i]; the tokens before prefill_starts[i] are already in the
    cache (prefix hit or earlier chunks) and are attended to. Decode i computes the last
    token of decode_seq_ids[i] and attends to decode_context_lens[i] tokens (itself
    included). sample_seq_ids lists, in order, the sequences that get a new token this
    step: every decode, then every prefill whose chunk reaches the end of its tokens.

    Before computing, the executor applies, in this order: ``tier_saves`` (device blocks
    read out for a KV tier), ``swap_outs`` (device block to host block), ``swap_ins`` (host
    block to device block), ``tier_loads`` (a tier's bytes into a device block),
    ``block_copies`` (copy-on-write), so a device block freed by a swap-out or written down
    to a tier can be reused by this very step. The simulator overlaps tier transfers with
    the step's compute (they move layer by layer ahead of it); swaps add to the step.
    ``block_tables`` (only for executors whose ``needs_block_tables`` is true) holds one
    int32 row per prefill sequence then per decode sequence, padded with -1.

    ``forks`` (parallel sampling and beam search; only for executors whose
    ``supports_forks`` is true) register new sequences before the step, each a copy of its
    parent's sampling state (seed + sample_index). A child with no chunk or decode of its
    own this step is listed in ``sample_seq_ids`` right after its parent and draws from the
    parent's logits (parallel sampling forks when the prompt is computed).

    ``prefill_token_ids`` and ``decode_token_ids`` carry the tokens the step computes, so an
    executor needs no token history of its own.

    The lists may be shared with one another (``sample_seq_ids`` is ``decode_seq_ids`` when
    no prefill samples) and with the scheduler's own state: read them, never mutate them.
    """

    step: int
    prefill_seq_ids: list[int]
    prefill_starts: list[int]
    prefill_lens: list[int]
    decode_seq_ids: list[int]
    decode_context_lens: list[int]
    sample_seq_ids: list[int]
    finished_seq_ids: list[int]  # left the engine since the last step: drop their state
    preempted_seq_ids: list[int]  # lost their KV blocks this step; keep their tokens
    block_copies: list[BlockCopy]
    swap_outs: Sequence[BlockSwap] = ()
    swap_ins: Sequence[BlockSwap] = ()
    block_tables: np.ndarray | None = None
    forks: Sequence[Fork] = ()
    prefill_token_ids: Sequence[Sequence[int]] = ()  # each chunk's tokens
    decode_token_ids: Sequence[int] = ()  # each decode's token (its last)
    tier_saves: Sequence[TierSave] = ()
    tier_loads: Sequence[TierLoad] = ()

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_lens)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.prefill_lens) + len(self.decode_seq_ids)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_seq_ids and not self.decode_seq_ids


class ModelOutput(NamedTuple):
    """next_token_ids[i] is the token sampled for sample_seq_ids[i]; step_time_s is the
    time the step took (simulated or measured). For a beam-search sequence
    (``sampling.beam_width`` > 1) candidates[i] holds its 2 × beam_width most likely next
    tokens with their log-probabilities, most likely first (empty for other sequences).
    saved_payloads[i] is the bytes of ``SchedulerOutput.tier_saves[i]``'s block (empty
    from an executor that moves no data: the simulator). logprobs[i] is the
    ``TokenLogprob`` of next_token_ids[i] for a sequence whose ``sampling.logprobs`` is
    set, else None; the whole list is None when no sampled sequence asked."""

    next_token_ids: list[int]
    step_time_s: float
    candidates: Sequence[Sequence[tuple[int, float]]] | None = None
    saved_payloads: Sequence[object] = ()
    logprobs: Sequence[TokenLogprob | None] | None = None


class KVUsage(NamedTuple):
    """The cache's state after a step, for the metrics."""

    num_total_blocks: int
    num_used_blocks: int  # referenced by a running sequence
    num_evictable_blocks: int  # cached, unreferenced: reclaimable
    num_free_blocks: int
    num_table_blocks: int  # held by block tables, a shared block once per table
    num_table_slots: int  # token slots of those blocks
    num_unused_slots: int  # of those slots, the ones no computed token fills

"""Turns a SchedulerOutput and the sequences' tokens into the forward's flat batch.

Row order: every prefill chunk (in ``prefill_seq_ids`` order), then one row per decode.
Block-table rows follow the same order (the scheduler's export). The batch is assembled
in numpy on the host and moved to the device once per tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from enginekit.models.llama import ForwardBatch
from enginekit.step import SchedulerOutput


def build_batch(scheduled: SchedulerOutput, block_size: int, device: torch.device) -> ForwardBatch:
    """The ForwardBatch of ``scheduled`` (its tokens come with it). Logits rows come in
    ``sample_seq_ids`` order. Raises ValueError when the block tables are missing or do not
    cover a scheduled token."""
    tables = scheduled.block_tables
    num_prefills = len(scheduled.prefill_seq_ids)
    num_decodes = len(scheduled.decode_seq_ids)
    if tables is None or tables.shape[0] != num_prefills + num_decodes:
        raise ValueError("the step's block_tables must hold one row per scheduled sequence")

    starts = np.asarray(scheduled.prefill_starts, dtype=np.int64)
    lens = np.asarray(scheduled.prefill_lens, dtype=np.int64)
    context_lens = np.asarray(scheduled.decode_context_lens, dtype=np.int64)
    query_starts = np.zeros(num_prefills + 1, dtype=np.int64)
    np.cumsum(lens, out=query_starts[1:])
    num_prefill_tokens = int(query_starts[-1])

    if (
        len(scheduled.prefill_token_ids) != num_prefills
        or len(scheduled.decode_token_ids) != num_decodes
    ):
        raise ValueError("the step must carry the tokens of every chunk and decode")
    ids: list[int] = [t for chunk in scheduled.prefill_token_ids for t in chunk]
    if len(ids) != int(lens.sum()):
        raise ValueError("a prefill chunk's tokens do not match its length")
    ids.extend(scheduled.decode_token_ids)

    # Position and block-table row of every batch token.
    rows = np.concatenate(
        [np.repeat(np.arange(num_prefills), lens), num_prefills + np.arange(num_decodes)]
    )
    positions = np.concatenate(
        [
            np.arange(num_prefill_tokens) - np.repeat(query_starts[:-1] - starts, lens),
            context_lens - 1,
        ]
    )
    logical = positions // block_size
    if len(positions) and int(logical.max(initial=0)) >= tables.shape[1]:
        raise ValueError("a scheduled token lies beyond its sequence's block table")
    block_ids = tables[rows, logical].astype(np.int64)
    if len(block_ids) and int(block_ids.min()) < 0:
        raise ValueError("a scheduled token's block is unassigned (-1) in its block table")
    slots = block_ids * block_size + positions % block_size

    # Logits rows: decodes first, then prefills whose chunk ends their tokens.
    row_of = {seq_id: num_prefill_tokens + i for i, seq_id in enumerate(scheduled.decode_seq_ids)}
    for i, seq_id in enumerate(scheduled.prefill_seq_ids):
        row_of.setdefault(seq_id, int(query_starts[i + 1]) - 1)
    for fork in scheduled.forks:  # a child without a row draws from its parent's logits
        if fork.parent_seq_id in row_of:
            row_of.setdefault(fork.child_seq_id, row_of[fork.parent_seq_id])
    logits_indices = [row_of[seq_id] for seq_id in scheduled.sample_seq_ids]

    def to_device(array: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(device, non_blocking=True)

    return ForwardBatch(
        input_ids=to_device(ids, torch.int64),
        positions=to_device(positions, torch.int64),
        slots=to_device(slots, torch.int64),
        num_prefill_tokens=num_prefill_tokens,
        prefill_query_starts=to_device(query_starts, torch.int32),
        prefill_context_starts=to_device(starts, torch.int32),
        prefill_block_tables=to_device(tables[:num_prefills], torch.int32),
        prefill_max_query_len=int(lens.max(initial=0)),
        decode_block_tables=to_device(tables[num_prefills:], torch.int32),
        decode_context_lens=to_device(context_lens, torch.int32),
        logits_indices=to_device(logits_indices, torch.int64),
    )

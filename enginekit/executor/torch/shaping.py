"""Logit shaping that needs a sequence's own tokens (vLLM's semantics): the ``min_tokens``
mask of stop tokens and the repetition, frequency and presence penalties.

The executor keeps the tokens (``SequenceTokens``) only of sequences that ask for one of
these or for logprobs; everything here works on those rows of the step's logits, in
place, in a few batched tensor operations for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from enginekit.request import SamplingParams


@dataclass(slots=True)
class SequenceTokens:
    """A sequence's tokens as far as the executor has computed them: its prompt, then its
    output tokens (every token a step computed; the last sampled one joins at the step
    that computes it). Grows by ``record``; a fork starts with a ``copy``."""

    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int:
        """Output tokens before the one the sequence samples next."""
        return len(self.token_ids) - self.num_prompt_tokens

    def record(self, start: int, computed: Sequence[int]) -> None:
        """A step computed ``computed`` at positions ``start ...``: appends those past the
        tokens already held (a recompute after preemption computes known ones again).
        Raises ValueError for a gap (a position past the end held)."""
        held = len(self.token_ids)
        if start > held:
            raise ValueError(f"a step computed position {start} of a sequence holding {held}")
        if start + len(computed) > held:
            self.token_ids.extend(computed[held - start :])

    def copy(self) -> SequenceTokens:
        return SequenceTokens(list(self.token_ids), self.num_prompt_tokens)


def held_stop_ids(
    sampling: SamplingParams, num_output_tokens: int, eos_token_id: int | None
) -> list[int]:
    """The tokens ``min_tokens`` forbids now: ``stop_token_ids`` and EOS (unless
    ``ignore_eos``) while the output has fewer than ``min_tokens`` tokens; else []. Pure."""
    if num_output_tokens >= sampling.min_tokens:
        return []
    held = list(sampling.stop_token_ids)
    if eos_token_id is not None and not sampling.ignore_eos:
        held.append(eos_token_id)
    return held


def mask_tokens(logits: torch.Tensor, rows: Sequence[int], token_ids: Sequence[list[int]]) -> None:
    """Sets ``logits[rows[k], token_ids[k]]`` to -inf for every k (ids outside the
    vocabulary are ignored: they can never be drawn). Mutates ``logits``."""
    vocab = logits.shape[-1]
    flat_rows = [row for row, ids in zip(rows, token_ids, strict=True) for t in ids if t < vocab]
    flat_ids = [t for ids in token_ids for t in ids if t < vocab]
    if flat_ids:
        logits[flat_rows, flat_ids] = float("-inf")


def apply_penalties(
    logits: torch.Tensor,
    rows: Sequence[int],
    sequences: Sequence[SequenceTokens],
    params: Sequence[SamplingParams],
) -> None:
    """Applies row ``rows[k]``'s penalties (``params[k]``, over ``sequences[k]``'s tokens)
    to float32 ``logits`` [n, V], in place: the repetition penalty divides the positive
    logits of every token seen in the prompt or output and multiplies the negative ones;
    then each token's logit loses ``frequency_penalty`` times its count in the output and
    ``presence_penalty`` if that count is not 0. One scatter builds every row's counts.
    Mutates ``logits``."""
    if not rows:
        return
    vocab = logits.shape[-1]
    device = logits.device
    width = max(1, max(len(s.token_ids) for s in sequences))
    # Every row's tokens side by side, padded with the id ``vocab`` (a column dropped).
    ids = np.full((len(rows), width), vocab, dtype=np.int64)
    is_output = np.zeros((len(rows), width), dtype=np.float32)
    for k, tokens in enumerate(sequences):
        ids[k, : len(tokens.token_ids)] = tokens.token_ids
        is_output[k, tokens.num_prompt_tokens : len(tokens.token_ids)] = 1.0
    index = torch.from_numpy(ids).to(device)
    counts = torch.zeros((len(rows), vocab + 1), dtype=logits.dtype, device=device)
    counts.scatter_add_(1, index, torch.from_numpy(is_output).to(device=device, dtype=logits.dtype))
    counts = counts[:, :vocab]
    seen = torch.zeros((len(rows), vocab + 1), dtype=torch.bool, device=device)
    seen.scatter_(1, index, torch.ones_like(index, dtype=torch.bool))
    seen = seen[:, :vocab]

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=logits.dtype, device=device)[:, None]

    repetition = column([p.repetition_penalty for p in params])
    frequency = column([p.frequency_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    row_index = torch.tensor(list(rows), dtype=torch.int64, device=device)
    shaped = logits.index_select(0, row_index)
    repeated = torch.where(shaped > 0, shaped / repetition, shaped * repetition)
    shaped = torch.where(seen, repeated, shaped)
    shaped = shaped - frequency * counts - presence * (counts > 0).to(logits.dtype)
    logits.index_copy_(0, row_index, shaped)

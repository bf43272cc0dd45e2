"""Next-token choice: greedy, or temperature / min-p / top-k / top-p sampling with a
per-request ``torch.Generator``; the shaping of ``SamplingParams`` (the ``min_tokens`` mask,
the penalties, the grammar of a structured output) and the raw logprobs of the tokens
chosen.

A request's draws come from its own generator only, so its samples depend on its seed
and its logits, not on which other requests share the step. A row's logits go through, in
order (vLLM's): its raw logprobs are recorded (``logprobs``), the ``min_tokens`` mask, the
penalties, the grammar's mask (``structured``: the tokens it does not allow next), then
greedy rows take the argmax and sampled rows apply division by the temperature, min-p
(drop tokens less likely than ``min_p`` times the most likely one), top-k (keep the k
largest), top-p (keep the smallest set of most likely tokens whose probability reaches p;
the most likely token always stays), then one multinomial draw.

Rows that ask for nothing that needs their tokens, their logprobs or a grammar take
``sample`` alone, as they always have; ``sample_shaped`` shapes only the rows that ask,
batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from enginekit.executor.torch.logprobs import token_logprobs
from enginekit.executor.torch.shaping import SequenceTokens, apply_penalties, mask_tokens
from enginekit.request import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    from enginekit.executor.torch.structured import AllowedTokens

_SEED_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def request_seed(base_seed: int, seq_id: int, sampling: SamplingParams) -> int:
    """The request's own ``seed`` if set, else one derived from (``base_seed``, ``seq_id``)."""
    if sampling.seed is not None:
        return sampling.seed & _SEED_MASK
    return (base_seed * _SEED_MIX + seq_id + 1) & _SEED_MASK


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """float32 [V] logits with temperature applied and tokens outside min-p / top-k /
    top-p set to -inf. Pure."""
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if sampling.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.max(), float("-inf"))
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= sampling.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> list[int]:
    """One token per row of float32 ``logits`` [n, V]; row i uses ``params[i]`` and draws
    from ``generators[i]`` (advanced only by sampled rows; greedy rows draw nothing)."""
    if not len(params):
        return []
    tokens = torch.argmax(logits, dim=-1)
    sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
    for i in sampled_rows:
        probs = torch.softmax(filter_logits(logits[i], params[i]), dim=-1)
        tokens[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return [int(t) for t in tokens.tolist()]


def sample_shaped(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
    sequences: Sequence[SequenceTokens | None],
    held: Sequence[list[int]],
    allowed: AllowedTokens | None = None,
) -> tuple[list[int], list[TokenLogprob | None]]:
    """``sample`` after the shaping of the rows that ask for it: row i's raw logprobs are
    read first (``params[i].logprobs``), then the tokens ``held[i]`` are masked (the
    ``min_tokens`` rule: see ``shaping.held_stop_ids``), the penalties of ``params[i]``
    applied over ``sequences[i]``'s tokens (None: a row that needs none) and the tokens
    outside ``allowed`` (a structured output's grammar; None: no row has one) masked.
    Returns (the tokens, one TokenLogprob per row that asked for logprobs, else None).
    ``logits`` is left as it was (the shaping works on a copy)."""
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    raw = torch.log_softmax(logits[lp_rows], dim=-1) if lp_rows else None
    masked_rows = [i for i, ids in enumerate(held) if ids]
    penalized_rows = [i for i, p in enumerate(params) if p.has_penalties]
    if masked_rows or penalized_rows or allowed is not None:
        logits = logits.clone()
        mask_tokens(logits, masked_rows, [held[i] for i in masked_rows])
        penalized = [sequences[i] for i in penalized_rows]
        if any(s is None for s in penalized):
            raise ValueError("a row with penalties needs its sequence's tokens")
        apply_penalties(
            logits,
            penalized_rows,
            [s for s in penalized if s is not None],
            [params[i] for i in penalized_rows],
        )
        if allowed is not None:
            allowed.apply(logits)
    tokens = sample(logits, params, generators)
    entries: list[TokenLogprob | None] = [None] * len(params)
    if raw is not None:
        chosen = token_logprobs(
            raw,
            [tokens[i] for i in lp_rows],
            [params[i].logprobs or 0 for i in lp_rows],
        )
        for i, entry in zip(lp_rows, chosen, strict=True):
            entries[i] = entry
    return tokens, entries


def beam_candidates(
    logits: torch.Tensor,
    beam_widths: Sequence[int],
    held: Sequence[list[int]] | None = None,
) -> list[list[tuple[int, float]]]:
    """For each row of float32 ``logits`` [n, V] whose beam width w exceeds 1: its 2w most
    likely tokens with their log-probabilities, likeliest first, leaving out the row's
    ``held[row]`` tokens (``min_tokens``; the others keep their raw log-probabilities);
    [] for other rows. Pure."""
    out: list[list[tuple[int, float]]] = []
    for row, width in enumerate(beam_widths):
        if width <= 1:
            out.append([])
            continue
        logprobs = torch.log_softmax(logits[row], dim=-1)
        if held is not None and held[row]:
            mask_tokens(logprobs[None], [0], [held[row]])
        top = torch.topk(logprobs, min(2 * width, logprobs.shape[-1]))
        pairs = zip(top.indices.tolist(), top.values.tolist(), strict=True)
        out.append([(token, logprob) for token, logprob in pairs if logprob != float("-inf")])
    return out

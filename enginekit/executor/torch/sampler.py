"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a per-request
``torch.Generator``.

A request's draws come from its own generator only, so its samples depend on its seed
and its logits, not on which other requests share the step. Sampled rows apply, in order:
division by the temperature, top-k (keep the k largest), top-p (keep the smallest set of
most likely tokens whose probability reaches p; the most likely token always stays), then
one multinomial draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from enginekit.request import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def request_seed(base_seed: int, seq_id: int, sampling: SamplingParams) -> int:
    """The request's own ``seed`` if set, else one derived from (``base_seed``, ``seq_id``)."""
    if sampling.seed is not None:
        return sampling.seed & _SEED_MASK
    return (base_seed * _SEED_MIX + seq_id + 1) & _SEED_MASK


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """float32 [V] logits with temperature applied and tokens outside top-k / top-p set to
    -inf. Pure."""
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
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


def beam_candidates(
    logits: torch.Tensor, beam_widths: Sequence[int]
) -> list[list[tuple[int, float]]]:
    """For each row of float32 ``logits`` [n, V] whose beam width w exceeds 1: its 2w most
    likely tokens with their log-probabilities, likeliest first; [] for other rows. Pure."""
    out: list[list[tuple[int, float]]] = []
    for row, width in enumerate(beam_widths):
        if width <= 1:
            out.append([])
            continue
        logprobs = torch.log_softmax(logits[row], dim=-1)
        top = torch.topk(logprobs, min(2 * width, logprobs.shape[-1]))
        out.append(list(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
    return out

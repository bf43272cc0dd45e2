"""Tokens' log-probabilities as the caller reads them (``TokenLogprob``), from rows of
log-probabilities over the vocabulary: the chosen token's logprob, its rank and the most
likely alternatives, for a batch of rows at once."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from enginekit.request import TokenLogprob


def token_logprobs(
    logprobs: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]
) -> list[TokenLogprob]:
    """One TokenLogprob per row of float32 ``logprobs`` [m, V] (log_softmax rows): row i's
    token ``token_ids[i]`` with its logprob, its rank (the number of tokens at least as
    likely: 1 for the most likely, ties placed last) and its ``num_top[i]`` most likely
    tokens, likeliest first (at most V). Three batched reductions and one copy to the
    host for all rows. Pure."""
    num_rows = len(token_ids)
    if not num_rows:
        return []
    chosen_ids = torch.tensor(token_ids, dtype=torch.int64, device=logprobs.device)
    chosen = logprobs.gather(1, chosen_ids[:, None])
    ranks = (logprobs >= chosen).sum(dim=-1).tolist()
    values = chosen[:, 0].tolist()
    most = min(max(num_top), logprobs.shape[-1])
    top_ids: list[list[int]] = [[] for _ in range(num_rows)]
    top_values: list[list[float]] = [[] for _ in range(num_rows)]
    if most > 0:
        top = torch.topk(logprobs, most, dim=-1)
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    return [
        TokenLogprob(
            token_ids[i],
            values[i],
            ranks[i],
            tuple(zip(top_ids[i][: num_top[i]], top_values[i][: num_top[i]], strict=True)),
        )
        for i in range(num_rows)
    ]

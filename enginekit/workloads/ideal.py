"""The prefix-cache hits a perfect cache would get: the yardstick for measured hit rates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast


class _HasTokens(Protocol):
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...

    @property
    def arrival_time(self) -> float: ...


def ideal_prefix_hit_tokens(
    requests: Sequence[_HasTokens] | Sequence[Sequence[int]],
    block_size: int,
    include_outputs: bool = False,
) -> int:
    """Prompt tokens served from cache by a block-granular prefix cache with unlimited memory.

    ``requests`` holds requests (anything with ``prompt_token_ids``, ``output_token_ids``
    and ``arrival_time``, e.g. WorkloadRequest) taken in arrival order (ties: list order),
    or bare prompts (sequences of token ids) taken in list order, with no outputs.

    A request hits the longest run of whole leading blocks of its prompt that was a leading
    run of blocks of an earlier request's prompt (of its prompt and its output but the last,
    sampled token with ``include_outputs``, as if every earlier request had finished),
    capped at
    ``(len(prompt) - 1) // block_size`` blocks because an engine always computes the last
    prompt token. Returns hit blocks × ``block_size`` summed over requests;
    ``block_size=1`` gives the token-granular (radix) ideal.

    Exact: a block is keyed by (its parent's node id, its tokens), so no hash can collide.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    items: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    if requests and hasattr(requests[0], "prompt_token_ids"):
        reqs = cast(Sequence[_HasTokens], requests)
        for i in sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time):
            # The last output token is sampled, never computed into the cache.
            output = tuple(reqs[i].output_token_ids)[:-1] if include_outputs else ()
            items.append((tuple(reqs[i].prompt_token_ids), output))
    else:
        items = [(tuple(prompt), ()) for prompt in cast(Sequence[Sequence[int]], requests)]
    # (parent node id, block tokens) -> node id; node 0 is the empty prefix.
    nodes: dict[tuple[int, tuple[int, ...]], int] = {}
    hits = 0
    for prompt, output in items:
        tokens = prompt + output if output else prompt
        max_hit_blocks = (len(prompt) - 1) // block_size
        parent = 0
        num_hit_blocks = 0
        for b in range(len(tokens) // block_size):
            key = (parent, tokens[b * block_size : (b + 1) * block_size])
            node = nodes.get(key)
            if node is None:
                node = len(nodes) + 1
                nodes[key] = node
            elif b == num_hit_blocks and b < max_hit_blocks:
                num_hit_blocks += 1
            parent = node
        hits += num_hit_blocks * block_size
    return hits

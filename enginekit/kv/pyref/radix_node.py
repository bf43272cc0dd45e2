"""The node record of the twin radix tree (``enginekit.kv.pyref.radix``), its limits and its
argument checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from enginekit.kv.pyref.args import int_list, u32_buffer

ROOT = 0
MAX_TOKEN = (1 << 32) - 1
MAX_BLOCK_ID = (1 << 31) - 1


@dataclass
class Node:
    """One node: the edge of tokens at positions [start, end) and the blocks covering them."""

    parent: int  # the root's is itself, never read
    start: int
    tokens: list[int]
    blocks: list[int]
    children: dict[int, int] = field(default_factory=dict)  # first token -> child id
    lock_count: int = 0  # locks on this node or any descendant
    own_locks: int = 0  # locks on this node itself
    stamp: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def check_token(t: int) -> int:
    if not 0 <= t <= MAX_TOKEN:
        raise ValueError(f"token id {t} is not in [0, 2**32)")
    return t


def check_block_id(b: int) -> int:
    if not 0 <= b <= MAX_BLOCK_ID:
        raise ValueError(f"block id {b} is not in [0, 2**31)")
    return b


def token_list(token_ids: Sequence[int], limit: int | None = None) -> list[int]:
    """The first ``limit`` token ids (all if None) of a list or tuple, each checked; those
    after them are not read. An ``array("I")`` (a 1-D buffer of u32) is read as it is:
    every value is a token id."""
    buffered = u32_buffer(token_ids)
    if buffered is not None:
        return buffered if limit is None else buffered[:limit]
    if limit is not None and isinstance(token_ids, (list, tuple)):
        token_ids = token_ids[:limit]  # the type is checked as for the whole list
    return int_list(token_ids, "token_ids", check_token)

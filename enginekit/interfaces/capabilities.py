"""Optional plugin capabilities for block tables with holes in them.

A policy that gives back the blocks of a running sequence that attention can no longer
reach (``sliding_window``) leaves holes in its table, in front of the window and behind the
attention-sink blocks it keeps. The group interfaces do not require these; the cache
manager checks for them (``isinstance``) where it needs them, and a plugin that needs one
refuses, at config time, a combination that lacks it (``sliding_window`` checks
``issubclass(selected["allocator"], HoleAllocator)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class HoleAllocator(Protocol):
    """An allocator that can release blocks from the middle of a table and recreate holes."""

    def release_range(self, seq_id: int, first: int, end: int) -> int:
        """Gives back the sequence's blocks ``first .. end - 1``, leaving holes; returns how
        many were still held. Mutates pool and tables."""
        ...

    def append_holes(self, seq_id: int, num_holes: int) -> None:
        """Appends ``num_holes`` holes to the sequence's table (a sequence restored from a
        swap with its released blocks still released). Mutates tables."""
        ...


@runtime_checkable
class WindowedEviction(Protocol):
    """An eviction policy that bounds the blocks a running sequence holds."""

    @property
    def max_blocks_per_sequence(self) -> int:
        """Blocks a sequence holds at most between steps, and during a step when it decodes
        (or prefills under ``strict_bound``). Pure."""
        ...

    @property
    def strict_bound(self) -> bool:
        """True: a prefill step too stays within ``max_blocks_per_sequence`` (chunks shrink);
        False: a prefill chunk may also use, for that step, blocks no sequence is promised."""
        ...

    def kept_blocks(self, block_ids: Sequence[int], num_computed_tokens: int) -> list[int]:
        """Of a table's leading blocks ``block_ids``, those a sequence that has computed
        ``num_computed_tokens`` tokens keeps (the others lie outside every future query's
        attention), in order. Pure."""
        ...

"""SwapSpace: host memory that preempted sequences are swapped out to, as block ids.

The cache manager owns it: a swapped-out sequence's blocks are copied to host blocks of
this space (the executor moves the bytes) and its table's layout is remembered here, so
that it comes back with its holes where they were (a sliding window keeps sink blocks in
front of them). Sized by ``enginekit.spec.kv.swap_space_num_blocks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from enginekit.errors import KVCacheError, OutOfBlocksError


class SwappedTable(NamedTuple):
    """A swapped-out sequence: the host blocks holding its blocks, in logical order, and
    its table's layout as runs of (is_hole, length)."""

    host_block_ids: list[int]
    layout: list[tuple[bool, int]]

    @property
    def num_holes(self) -> int:
        return sum(n for is_hole, n in self.layout if is_hole)

    @property
    def num_blocks(self) -> int:
        return len(self.host_block_ids)


def table_layout(entries: Sequence[int]) -> list[tuple[bool, int]]:
    """A table's entries (block ids, -1 for a hole) as runs of (is_hole, length). Pure."""
    layout: list[tuple[bool, int]] = []
    for is_hole in (b < 0 for b in entries):
        if layout and layout[-1][0] == is_hole:
            layout[-1] = (is_hole, layout[-1][1] + 1)
        else:
            layout.append((is_hole, 1))
    return layout


class SwapSpace:
    """A fixed number of host blocks, each free or holding one swapped-out device block.

    Ids are handed out lowest first: ids below ``num_touched_blocks`` (the high-water
    mark) are each free, used or quarantined; ids above it were never handed out. So the
    pool's memory and ``check_integrity`` grow with what has been used, not with the
    pool's size, and an executor that allocates host memory on demand needs only
    ``num_touched_blocks`` blocks of it.

    Freed blocks are quarantined until ``release_quarantined`` (called once per step,
    after the step ran), so that a block a swap-in reads in step t cannot be overwritten
    by a swap-out decided later in the same step.

    ``swapped`` maps each swapped-out sequence to its ``SwappedTable``: ``put`` adds one,
    ``take`` removes it (its host blocks are freed once the step copying them back ran).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"a swap space needs >= 0 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_touched_blocks = 0
        self._free: list[int] = []  # returned ids below the mark, a stack
        self._used: set[int] = set()
        self._quarantined: list[int] = []
        self.swapped: dict[int, SwappedTable] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_blocks - self.num_touched_blocks

    @property
    def num_used_blocks(self) -> int:
        return len(self._used)

    def _allocate(self, num_blocks: int) -> list[int]:
        """The lowest free ids first. Raises OutOfBlocksError, changing nothing, if fewer
        are free."""
        if num_blocks > self.num_free_blocks:
            raise OutOfBlocksError(
                f"cannot allocate {num_blocks} host blocks: only {self.num_free_blocks} free"
            )
        num_reused = min(num_blocks, len(self._free))
        block_ids = [self._free.pop() for _ in range(num_reused)]
        start = self.num_touched_blocks
        self.num_touched_blocks += num_blocks - num_reused
        block_ids.extend(range(start, self.num_touched_blocks))
        self._used.update(block_ids)
        return block_ids

    def _release(self, block_ids: Sequence[int]) -> None:
        """Marks the blocks unused; they become allocatable after release_quarantined.
        Raises KVCacheError, changing nothing, for a block that is not in use."""
        if len(set(block_ids)) != len(block_ids) or not self._used.issuperset(block_ids):
            raise KVCacheError(f"host blocks {list(block_ids)} are not all in use")
        self._used.difference_update(block_ids)
        self._quarantined.extend(block_ids)

    def put(self, seq_id: int, entries: Sequence[int]) -> list[int]:
        """Host blocks for the blocks of a table whose entries are ``entries`` (-1: a hole),
        one per block in logical order; remembers the table's layout. Raises
        OutOfBlocksError, changing nothing, if the space lacks room."""
        host_block_ids = self._allocate(sum(1 for b in entries if b >= 0))
        self.swapped[seq_id] = SwappedTable(host_block_ids, table_layout(entries))
        return host_block_ids

    def take(self, seq_id: int) -> SwappedTable:
        """Forgets a swapped-out sequence (it is being swapped in, or dropped) and frees
        its host blocks: quarantined until the step reading them has run."""
        table = self.swapped.pop(seq_id)
        self._release(table.host_block_ids)
        return table

    def release_quarantined(self) -> None:
        if self._quarantined:
            self._free.extend(self._quarantined)
            self._quarantined.clear()
            self._free.sort(reverse=True)  # lowest on top: reuse keeps the mark low

    def check_integrity(self) -> None:
        """Every id below the mark in exactly one state; the mark within the pool. Time
        proportional to the mark, not the pool."""
        free, quarantined = set(self._free), set(self._quarantined)
        everything = free | quarantined | self._used
        if (
            not 0 <= self.num_touched_blocks <= self.num_blocks
            or len(free) != len(self._free)
            or len(quarantined) != len(self._quarantined)
            or free & quarantined
            or free & self._used
            or quarantined & self._used
            or everything != set(range(self.num_touched_blocks))
        ):
            raise KVCacheError("swap space: every block must be in exactly one state")
        held = sum(t.num_blocks for t in self.swapped.values())
        if held != len(self._used):
            raise KVCacheError(
                f"swap space: {len(self._used)} blocks used, swapped sequences hold {held}"
            )

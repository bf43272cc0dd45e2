"""HostSwapPool: KV blocks in host memory that preempted sequences are swapped out to."""

from __future__ import annotations

from collections.abc import Sequence

from enginekit.errors import KVCacheError, OutOfBlocksError


class HostSwapPool:
    """A fixed number of host blocks, each free or holding one swapped-out device block.

    Freed blocks are quarantined until ``release_quarantined`` (called once per step by
    the scheduler), so that a block a swap-in reads in step t cannot be overwritten by a
    swap-out decided later in the same step.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"a host swap pool needs >= 0 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: 0 is handed out first
        self._used: set[int] = set()
        self._quarantined: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self._used)

    def allocate(self, num_blocks: int) -> list[int]:
        """Raises OutOfBlocksError, changing nothing, if fewer are free."""
        if num_blocks > len(self._free):
            raise OutOfBlocksError(
                f"cannot allocate {num_blocks} host blocks: only {len(self._free)} free"
            )
        block_ids = [self._free.pop() for _ in range(num_blocks)]
        self._used.update(block_ids)
        return block_ids

    def free(self, block_ids: Sequence[int]) -> None:
        """Marks the blocks unused; they become allocatable after release_quarantined.
        Raises KVCacheError, changing nothing, for a block that is not in use."""
        if len(set(block_ids)) != len(block_ids) or not self._used.issuperset(block_ids):
            raise KVCacheError(f"host blocks {list(block_ids)} are not all in use")
        self._used.difference_update(block_ids)
        self._quarantined.extend(block_ids)

    def release_quarantined(self) -> None:
        self._free.extend(reversed(self._quarantined))
        self._quarantined.clear()

    def check_integrity(self) -> None:
        free, quarantined = set(self._free), set(self._quarantined)
        everything = free | quarantined | self._used
        if (
            len(free) != len(self._free)
            or free & quarantined
            or free & self._used
            or quarantined & self._used
            or everything != set(range(self.num_blocks))
        ):
            raise KVCacheError("host swap pool: every block must be in exactly one state")

"""HostSwapPool: KV blocks in host memory that preempted sequences are swapped out to,
and the one rule that sizes it (``host_pool_num_blocks``), which the swap plugin's
bookkeeping and the torch executor's host tensors both follow."""

from __future__ import annotations

from collections.abc import Sequence

from enginekit.errors import ConfigError, KVCacheError, OutOfBlocksError

_GIB = 1 << 30


def host_pool_num_blocks(
    swap_space_gib: float, bytes_per_block: int, num_device_blocks: int
) -> int:
    """Host blocks of a swap pool of ``swap_space_gib`` GiB (``preemption.swap_space_gib``),
    at most ``num_device_blocks``: one step never swaps out more than the device pool
    holds, and a victim that finds the host pool full is recomputed instead. Raises
    ConfigError for a negative size."""
    if swap_space_gib < 0:
        raise ConfigError(f"preemption.swap_space_gib must be >= 0, got {swap_space_gib}")
    return min(int(swap_space_gib * _GIB) // bytes_per_block, num_device_blocks)


class HostSwapPool:
    """A fixed number of host blocks, each free or holding one swapped-out device block.

    Ids are handed out lowest first: ids below ``num_touched_blocks`` (the high-water
    mark) are each free, used or quarantined; ids above it were never handed out. So the
    pool's memory and ``check_integrity`` grow with what has been used, not with the
    pool's size, and an executor that allocates host memory on demand needs only
    ``num_touched_blocks`` blocks of it.

    Freed blocks are quarantined until ``release_quarantined`` (called once per step by
    the scheduler), so that a block a swap-in reads in step t cannot be overwritten by a
    swap-out decided later in the same step.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"a host swap pool needs >= 0 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_touched_blocks = 0
        self._free: list[int] = []  # returned ids below the mark, a stack
        self._used: set[int] = set()
        self._quarantined: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_blocks - self.num_touched_blocks

    @property
    def num_used_blocks(self) -> int:
        return len(self._used)

    def allocate(self, num_blocks: int) -> list[int]:
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

    def free(self, block_ids: Sequence[int]) -> None:
        """Marks the blocks unused; they become allocatable after release_quarantined.
        Raises KVCacheError, changing nothing, for a block that is not in use."""
        if len(set(block_ids)) != len(block_ids) or not self._used.issuperset(block_ids):
            raise KVCacheError(f"host blocks {list(block_ids)} are not all in use")
        self._used.difference_update(block_ids)
        self._quarantined.extend(block_ids)

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
            raise KVCacheError("host swap pool: every block must be in exactly one state")

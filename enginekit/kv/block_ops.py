"""BlockOps: the block copies, swaps and tier loads the cache manager has decided for the
next step."""

from __future__ import annotations

from collections.abc import Sequence

from enginekit.step import BlockCopy, BlockSwap, TierLoad


class BlockOps:
    """Copies (copy-on-write), swap-outs, swap-ins and tier loads queued for the executor,
    which runs them before the step computes; and the copy sources pinned (one pool reference each)
    until that step has run, so nothing reuses a block before it is copied."""

    def __init__(self) -> None:
        self._copies: list[BlockCopy] = []
        self._swap_outs: list[BlockSwap] = []
        self._swap_ins: list[BlockSwap] = []
        self._tier_loads: list[TierLoad] = []
        self.pinned_block_ids: list[int] = []  # copy sources, one pool reference each

    def copy(self, src_block_id: int, dst_block_id: int, pin: bool = True) -> None:
        """Queues a copy; ``pin``: the caller hands over one reference to the source,
        dropped by the manager once the step has run (``take_pins``)."""
        self._copies.append(BlockCopy(src_block_id, dst_block_id))
        if pin:
            self.pinned_block_ids.append(src_block_id)

    def swap_out(self, device_block_ids: Sequence[int], host_block_ids: Sequence[int]) -> None:
        """Queues copies of device blocks to host blocks, pairwise."""
        pairs = zip(device_block_ids, host_block_ids, strict=True)
        self._swap_outs.extend(BlockSwap(d, h) for d, h in pairs)

    def swap_in(self, device_block_ids: Sequence[int], host_block_ids: Sequence[int]) -> None:
        """Queues copies of host blocks back to device blocks, pairwise."""
        pairs = zip(device_block_ids, host_block_ids, strict=True)
        self._swap_ins.extend(BlockSwap(d, h) for d, h in pairs)

    def tier_load(self, loads: Sequence[TierLoad]) -> None:
        """Queues payloads read out of a KV tier, each into its device block."""
        self._tier_loads.extend(loads)

    def take_tier_loads(self) -> list[TierLoad]:
        """The tier loads queued since the last call; clears them."""
        loads, self._tier_loads = self._tier_loads, []
        return loads

    def take(self) -> tuple[list[BlockCopy], list[BlockSwap], list[BlockSwap]]:
        """(copies, swap-outs, swap-ins) queued since the last call; clears them."""
        ops = (self._copies, self._swap_outs, self._swap_ins)
        self._copies, self._swap_outs, self._swap_ins = [], [], []
        return ops

    def take_pins(self) -> list[int]:
        """The pinned copy sources (the step copying them has run); clears them."""
        pins, self.pinned_block_ids = self.pinned_block_ids, []
        return pins

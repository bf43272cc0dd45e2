"""Swapping a sequence out to host memory and back, with the holes of its table where
they were (a sliding window keeps sink blocks in front of them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from enginekit.errors import OutOfBlocksError
from enginekit.interfaces.capabilities import HoleAllocator, WindowedEviction
from enginekit.request import Request
from enginekit.step import BlockSwap

if TYPE_CHECKING:
    from enginekit._native import BlockTables
    from enginekit.interfaces import Allocator


class SwapMixin:
    """The KVCacheManager's swapping half; it uses the manager's tables, room and
    promises."""

    tables: BlockTables
    allocator: Allocator
    _window: WindowedEviction | None
    _swap_outs: list[BlockSwap]
    _swap_ins: list[BlockSwap]
    # Swapped-out sequences: their tables' layouts, as runs of (is_hole, length).
    _swapped: dict[int, list[tuple[bool, int]]]
    release: Callable[[Request], int]
    make_room: Callable[[int], bool]
    _hole_allocator: Callable[[], HoleAllocator]
    _promise: Callable[[Request, int], None]

    def swap_out(self, request: Request, host_block_ids: Sequence[int]) -> None:
        """Queues copies of the request's blocks (in logical order, holes skipped) to
        ``host_block_ids``, remembers where its table has holes, and releases the blocks;
        the request keeps its computed tokens. Raises ValueError, changing nothing, unless
        there is one host block per block."""
        entries = self.tables.block_ids(request.seq_id)
        block_ids = [b for b in entries if b >= 0]
        if len(block_ids) != len(host_block_ids):
            raise ValueError(
                f"swap-out of sequence {request.seq_id}: {len(block_ids)} blocks, "
                f"{len(host_block_ids)} host blocks"
            )
        self._swap_outs.extend(map(BlockSwap, block_ids, host_block_ids))
        self.release(request)
        layout: list[tuple[bool, int]] = []
        for is_hole in (b < 0 for b in entries):
            if layout and layout[-1][0] == is_hole:
                layout[-1] = (is_hole, layout[-1][1] + 1)
            else:
                layout.append((is_hole, 1))
        self._swapped[request.seq_id] = layout

    def _num_blocks_to_restore(self, request: Request) -> int:
        """Free blocks swap_in takes for a swapped-out request (promised ones included)."""
        layout = self._swapped[request.seq_id]
        num_holes = sum(n for is_hole, n in layout if is_hole)
        num_held = sum(n for is_hole, n in layout if not is_hole)
        if request.is_prefilling:
            return max(num_held, self._peak_to_restore(request))
        return self.allocator.num_blocks_to_admit(request, 0) - num_holes

    def _peak_to_restore(self, request: Request) -> int:
        peak = self.allocator.num_blocks_to_admit(request, 0)
        return peak if self._window is None else min(peak, self._window.max_blocks_per_sequence)

    def swap_in(self, request: Request, host_block_ids: Sequence[int], num_holes: int = 0) -> None:
        """Gives the request a fresh block table with the layout it was swapped out with
        (through the allocator, making room): a block for each host block, in order, and
        its holes where they were. ``num_holes`` is the holes that layout has (a request
        this manager did not swap out is taken to have had them in front). Queues the
        copies of ``host_block_ids`` into the blocks; a request past its prompt gets room
        for its next token too, one still prefilling its promise. Keeps
        ``num_computed_tokens``. Raises OutOfBlocksError, changing nothing, if the room is
        not there (call can_admit(request, NO_MATCH) first)."""
        seq_id = request.seq_id
        layout = self._swapped.setdefault(seq_id, [(True, num_holes), (False, len(host_block_ids))])
        if sum(n for is_hole, n in layout if is_hole) != num_holes:
            raise ValueError(f"swap-in of sequence {seq_id}: its layout has other holes")
        num_needed = self._num_blocks_to_restore(request)
        if not self.make_room(num_needed):
            raise OutOfBlocksError(
                f"restoring sequence {seq_id} needs {num_needed} free blocks beyond the "
                "prefill promises"
            )
        del self._swapped[seq_id]
        self.allocator.admit(request, [])
        num_slots = self.tables.num_blocks(seq_id)  # a reserving allocator's whole slab
        position = 0
        for is_hole, length in layout:
            position += length
            if position <= num_slots or length == 0:
                continue
            if is_hole:
                self._hole_allocator().append_holes(
                    seq_id, position - max(num_slots, position - length)
                )
            else:
                self.allocator.grow([seq_id], [position * self.tables.block_size])
        entries = self.tables.block_ids(seq_id)[:position]
        device_block_ids = [b for b in entries if b >= 0]
        self._swap_ins.extend(map(BlockSwap, device_block_ids, host_block_ids))
        if request.is_prefilling:
            self._promise(request, self._peak_to_restore(request))
        else:
            self.allocator.grow([seq_id], [request.num_tokens])

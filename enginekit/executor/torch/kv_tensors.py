"""PagedKVTensors: the KV blocks' tensors on the device and in host memory, and the
step's block operations on them.

Both have the layout of ``enginekit.kernels.layout`` in the cache's storage format
(``KVSpec.quant``): a block is index ``b`` of each block tensor, so a block moves (with
its int4 scales) by copying that index. The host tensors are allocated on the first
swap-out (a run without swaps costs no host memory), grow with the host ids the swaps use
(the swap space hands out the lowest first), and are pinned only where CUDA exists. The
cache manager owns both id spaces: it names device blocks by their block-pool id and
host blocks by their swap-space id.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from enginekit.errors import KVCacheError
from enginekit.kernels import reference
from enginekit.kernels.layout import KVTensors, allocate_kv_tensors
from enginekit.kernels.ops import PagedOps
from enginekit.spec.kv import KVSpec
from enginekit.step import BlockCopy, BlockSwap


class PagedKVTensors:
    """``on_device``: ``num_blocks`` blocks on ``device``; ``on_host``: up to
    ``num_host_blocks`` blocks on the CPU, allocated as swap-outs reach them (None before
    the first; grown by doubling, its blocks kept), so a run holds host memory for the
    blocks its swaps have used, not for the whole swap space. ``dtype`` is the model's."""

    def __init__(
        self,
        spec: KVSpec,
        num_blocks: int,
        num_host_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
        ops: PagedOps,
    ) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.num_host_blocks = num_host_blocks
        self.dtype = dtype
        self.device = device
        self.ops = ops
        self.on_device = allocate_kv_tensors(spec, num_blocks, dtype, device)
        self.on_host: KVTensors | None = None

    @property
    def num_host_blocks_allocated(self) -> int:
        return 0 if self.on_host is None else self.on_host.num_blocks

    def _host(self, host_block_ids: Sequence[int]) -> KVTensors:
        """The host tensors, grown to hold ``host_block_ids``. Raises KVCacheError, changing
        nothing, for an id outside the swap space."""
        num_needed = max(host_block_ids) + 1
        if num_needed > self.num_host_blocks:
            raise KVCacheError(
                f"host block {num_needed - 1} is outside the swap space of "
                f"{self.num_host_blocks} blocks (preemption.swap_space_gib)"
            )
        old = self.on_host
        if old is None or old.num_blocks < num_needed:
            num_allocated = 0 if old is None else old.num_blocks
            size = min(self.num_host_blocks, max(num_needed, 2 * num_allocated, 16))
            self.on_host = allocate_kv_tensors(
                self.spec,
                size,
                self.dtype,
                "cpu",
                pin_memory=torch.cuda.is_available(),
                with_fp8_scales=False,
            )
            if old is not None:
                for new_tensor, old_tensor in zip(
                    self.on_host.block_tensors, old.block_tensors, strict=True
                ):
                    new_tensor[:num_allocated].copy_(old_tensor)
        assert self.on_host is not None
        return self.on_host

    def _ids(self, ids: Sequence[int], device: torch.device | str) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64, device=device)

    def swap_out(self, swaps: Sequence[BlockSwap]) -> None:
        """Copies device blocks to host blocks. Mutates the host tensors."""
        if swaps:
            host_block_ids = [s.host_block_id for s in swaps]
            reference.swap_blocks(
                self.on_device,
                self._host(host_block_ids),
                self._ids([s.device_block_id for s in swaps], self.device),
                self._ids(host_block_ids, "cpu"),
            )

    def swap_in(self, swaps: Sequence[BlockSwap]) -> None:
        """Copies host blocks to device blocks. Mutates the device pool."""
        if swaps:
            host_block_ids = [s.host_block_id for s in swaps]
            reference.swap_blocks(
                self._host(host_block_ids),
                self.on_device,
                self._ids(host_block_ids, "cpu"),
                self._ids([s.device_block_id for s in swaps], self.device),
            )

    def copy(self, copies: Sequence[BlockCopy]) -> None:
        """Copy-on-write copies inside the device pool. Mutates the device pool."""
        if copies:
            self.ops.copy_blocks(
                self.on_device,
                self._ids([c.src_block_id for c in copies], self.device),
                self._ids([c.dst_block_id for c in copies], self.device),
            )

    def apply(
        self,
        swap_outs: Sequence[BlockSwap],
        swap_ins: Sequence[BlockSwap],
        copies: Sequence[BlockCopy],
    ) -> None:
        """A step's block operations in the contract's order: swap-outs, swap-ins, copies."""
        self.swap_out(swap_outs)
        self.swap_in(swap_ins)
        self.copy(copies)

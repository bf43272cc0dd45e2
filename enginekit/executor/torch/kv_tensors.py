"""PagedKVTensors: the KV blocks' tensors on the device and in host memory, and the
step's block operations on them.

Both have the layout of ``enginekit.kernels.layout`` in the cache's storage format
(``KVSpec.quant``): a block is index ``b`` of each block tensor, so a block moves (with
its int4 scales) by copying that index. The host tensors are allocated on the first
swap-out (a run without swaps costs no host memory), grow with the host ids the swaps use
(the swap space hands out the lowest first), and are pinned only where CUDA exists. The
cache manager owns both id spaces: it names device blocks by their block-pool id and
host blocks by their swap-space id.

A KV tier's *payload* is one device block read out as one contiguous run of bytes in host
memory (a uint8 numpy array over a tensor of its own, pinned where CUDA exists): index
``b`` of every block tensor in turn (the K/V elements, then int4's key and value scales
and zero points), then, for fp8, the pool's scales [layers, K|V, kv heads] in float32.
The fp8 scales are the pool's, not the block's, but they travel with it: a payload is
named by its tokens alone, and another engine (a shared tier) may have calibrated other
scales. Writing a payload back takes its bytes as they are where its scales are the
pool's, sets the pool's scales from it for layers not calibrated yet, and otherwise
re-quantizes its fp8 elements to the pool's scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from enginekit.errors import KVCacheError
from enginekit.executor.torch.fp8_scales import FP8_E4M3_MAX
from enginekit.kernels import reference
from enginekit.kernels.layout import KVTensors, allocate_kv_tensors
from enginekit.kernels.ops import PagedOps
from enginekit.spec.kv import KVSpec
from enginekit.step import BlockCopy, BlockSwap, TierLoad


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
        tier_loads: Sequence[TierLoad] = (),
    ) -> None:
        """A step's block operations in the contract's order: swap-outs, swap-ins, tier
        loads, copies (a tier's saves are read out before all of them: ``read_blocks``)."""
        self.swap_out(swap_outs)
        self.swap_in(swap_ins)
        if tier_loads:
            self.write_blocks(
                [load.device_block_id for load in tier_loads],
                [load.payload for load in tier_loads],
            )
        self.copy(copies)

    # -- payloads of KV tiers ---------------------------------------------------------------

    @property
    def payload_bytes(self) -> int:
        """Bytes of one block's payload: the block's bytes over every block tensor, and
        fp8's pool scales."""
        pool = self.on_device
        scales = pool.fp8_scales
        return pool.bytes_per_block + (0 if scales is None else scales.numel() * 4)

    def _payload_parts(self) -> list[tuple[torch.Tensor, int]]:
        """Each block tensor and the bytes one block of it takes, in payload order."""
        return [(t, t[0].numel() * t.element_size()) for t in self.on_device.block_tensors]

    def read_blocks(self, block_ids: Sequence[int]) -> list[np.ndarray]:
        """The payloads of device blocks ``block_ids``, in order: one uint8 array each, in
        host memory of its own (pinned where CUDA exists). Reads the device pool only."""
        if not block_ids:
            return []
        num = len(block_ids)
        ids = self._ids(block_ids, self.device)
        parts = [
            t.index_select(0, ids).view(torch.uint8).reshape(num, -1)
            for t in self.on_device.block_tensors
        ]
        scales = self.on_device.fp8_scales
        if scales is not None:
            parts.append(scales.contiguous().view(torch.uint8).reshape(1, -1).expand(num, -1))
        staged = torch.cat(parts, dim=1)  # [num, payload_bytes] on the device
        pinned = torch.cuda.is_available()
        asynchronous = pinned and self.device.type == "cuda"
        payloads = []
        for row in staged:
            host = torch.empty(row.shape[0], dtype=torch.uint8, pin_memory=pinned)
            host.copy_(row, non_blocking=asynchronous)
            payloads.append(host)
        if asynchronous:
            torch.cuda.current_stream(self.device).synchronize()
        return [host.numpy() for host in payloads]

    def write_blocks(self, block_ids: Sequence[int], payloads: Sequence[Any]) -> None:
        """Writes ``payloads`` (objects with the buffer protocol, as ``read_blocks`` made
        them or a tier level returned them) into device blocks ``block_ids``. Mutates the
        device pool (and fp8 scales of layers not set yet). Raises KVCacheError, changing
        nothing, for a payload of the wrong size or with fp8 scales that are not positive
        and finite."""
        if not block_ids:
            return
        num, size = len(block_ids), self.payload_bytes
        if len(payloads) != num:
            raise KVCacheError(f"{len(payloads)} payloads for {num} blocks")
        pinned = torch.cuda.is_available()
        staging = torch.empty((num, size), dtype=torch.uint8, pin_memory=pinned)
        rows = staging.numpy()
        for i, payload in enumerate(payloads):
            if payload is None:
                raise KVCacheError(f"no payload to write into device block {block_ids[i]}")
            data = np.frombuffer(memoryview(payload), dtype=np.uint8)
            if data.size != size:
                raise KVCacheError(
                    f"a payload of {data.size} bytes for device block {block_ids[i]}: a "
                    f"block's payload here is {size} bytes"
                )
            rows[i] = data
        source = staging.to(self.device, non_blocking=pinned)
        blocks: list[torch.Tensor] = []
        offset = 0
        for tensor, nbytes in self._payload_parts():
            part = source[:, offset : offset + nbytes].contiguous()
            blocks.append(part.view(tensor.dtype).view(num, *tensor.shape[1:]))
            offset += nbytes
        pool = self.on_device
        if pool.fp8_scales is not None:
            scales = source[:, offset:].contiguous().view(torch.float32)
            blocks[0] = self._to_pool_scales(blocks[0], scales.view(num, *pool.fp8_scales.shape))
        ids = self._ids(block_ids, self.device)
        for tensor, block in zip(pool.block_tensors, blocks, strict=True):
            tensor[ids] = block

    def _to_pool_scales(self, data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """``data`` [num, layers, 2, kv heads, block size, head dim], fp8 elements stored
        with ``scales`` [num, layers, 2, kv heads], as the pool's scales store them. Layers
        whose pool scales are not set yet take the first payload's (the data then moves as
        it is). Mutates those layers' pool scales."""
        pool = self.on_device
        assert pool.fp8_scales is not None
        if not bool(((scales > 0) & scales.isfinite()).all()):
            raise KVCacheError("a tier payload's fp8 scales are not positive and finite")
        for layer, is_set in enumerate(pool.fp8_layers_set):
            if not is_set:
                pool.set_fp8_scales(layer, scales[0, layer])
        ratio = scales / pool.fp8_scales  # payload scale over pool scale
        if bool((ratio == 1).all()):
            return data
        values = data.float() * ratio[..., None, None]
        return values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(data.dtype)

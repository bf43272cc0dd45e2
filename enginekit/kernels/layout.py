"""The physical layout of the paged KV pool, shared by the references and the kernels.

A pool is a ``KVTensors``: tensors whose first axis is the block id, so a block moves
(copy-on-write, swap) by copying index ``b`` of each. The K/V elements::

    data[num_blocks, num_layers, 2, num_kv_heads, block_size, stored_dim]   (contiguous)

with ``stored_dim`` = head_dim in the model's dtype (``none``) or in float8_e4m3fn
(``fp8``), and head_dim / 2 bytes (uint8) for ``int4`` (channel 2i in the low nibble of
byte i, 2i + 1 in the high nibble). ``int4`` adds, per block, its float16 scales and
zero points (``value ≈ zero + code × scale``)::

    key_meta[num_blocks, num_layers, num_kv_heads, block_size // key_group_tokens, 2, head_dim]
    value_meta[num_blocks, num_layers, num_kv_heads, block_size, 2,
               head_dim // value_group_channels]

where index 0 of the ``2`` axis is the scale and 1 the zero point. ``fp8`` has one
float32 scale per (layer, K|V, kv head) for the whole pool (``value ≈ stored × scale``)::

    fp8_scales[num_layers, 2, num_kv_heads]

which is not per block and so does not travel with swaps (a host pool has none).

Why this order: a block's bytes are one contiguous run per tensor, and for one (block,
layer, K|V, kv head) each token's ``stored_dim`` elements are contiguous, so the attention
kernels, which gather tiles of keys across a sequence's blocks per kv head, load every
token's row with wide coalesced reads and share the tile among the query heads of its GQA
group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from enginekit.spec.kv import KVSpec
from enginekit.spec.quant import KVQuant

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class KVTensors:
    """The tensors of one pool (device or host). ``quant`` says which are present:
    ``key_meta``/``value_meta`` for int4, ``fp8_scales`` for fp8 device pools.
    ``fp8_layers_set`` says, on the host, which layers' fp8 scales have been set (through
    ``set_fp8_scales``), so that every write can check without reading the device."""

    data: torch.Tensor
    quant: KVQuant
    key_meta: torch.Tensor | None = None
    value_meta: torch.Tensor | None = None
    fp8_scales: torch.Tensor | None = None
    fp8_layers_set: list[bool] = field(default_factory=list)

    def set_fp8_scales(self, layer: int | None, scales: torch.Tensor) -> None:
        """Sets the fp8 scales of ``layer`` ([2, kv_heads]), or of every layer when None
        ([layers, 2, kv_heads]; broadcasting allowed), and marks them set. Mutates the
        pool. Raises ValueError for a pool without fp8 scales."""
        if self.fp8_scales is None:
            raise ValueError("this pool has no fp8 scales")
        if layer is None:
            self.fp8_scales.copy_(scales)
            self.fp8_layers_set = [True] * self.fp8_scales.shape[0]
        else:
            self.fp8_scales[layer] = scales
            self.fp8_layers_set[layer] = True

    @property
    def block_tensors(self) -> list[torch.Tensor]:
        """Every tensor indexed by block id: what a block copy or swap moves."""
        return [t for t in (self.data, self.key_meta, self.value_meta) if t is not None]

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    @property
    def block_size(self) -> int:
        return self.data.shape[4]

    @property
    def num_kv_heads(self) -> int:
        return self.data.shape[3]

    @property
    def num_layers(self) -> int:
        return self.data.shape[1]

    @property
    def head_dim(self) -> int:
        """Channels of one K or V vector (int4 stores two per byte)."""
        stored_dim = self.data.shape[5]
        return 2 * stored_dim if self.quant.kind == "int4" else stored_dim

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes in this pool, over every block tensor."""
        return sum(t[0].numel() * t.element_size() for t in self.block_tensors)


def kv_tensors_shape(spec: KVSpec, num_blocks: int) -> tuple[int, int, int, int, int, int]:
    """Shape of ``data`` (see the module docstring)."""
    stored_dim = spec.head_dim // 2 if spec.quant.kind == "int4" else spec.head_dim
    return (num_blocks, spec.num_layers, 2, spec.num_kv_heads, spec.block_size, stored_dim)


def allocate_kv_tensors(
    spec: KVSpec,
    num_blocks: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    pin_memory: bool = False,
    with_fp8_scales: bool = True,
) -> KVTensors:
    """A zeroed pool of ``num_blocks`` blocks in ``spec.quant``'s format; ``dtype`` is
    the model's (what ``none`` stores). fp8 scales start as NaN: they must be set (from
    a checkpoint or by calibration) before the first write. ``pin_memory`` only for host
    pools and only where CUDA exists (pinning needs a CUDA context)."""
    quant = spec.quant
    kind = quant.kind
    if kind == "int4" and spec.head_dim % 2:
        raise ValueError(f"int4 needs an even head_dim, got {spec.head_dim}")
    data_dtype = {"none": dtype, "fp8": torch.float8_e4m3fn, "int4": torch.uint8}[kind]

    def zeros(shape: tuple[int, ...], of: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=of, device=device, pin_memory=pin_memory)

    pool = KVTensors(zeros(kv_tensors_shape(spec, num_blocks), data_dtype), quant)
    layers, heads, bs, d = spec.num_layers, spec.num_kv_heads, spec.block_size, spec.head_dim
    if kind == "int4":
        key_groups = bs // quant.key_group_tokens
        value_groups = d // quant.value_group_channels
        pool.key_meta = zeros((num_blocks, layers, heads, key_groups, 2, d), torch.float16)
        pool.value_meta = zeros((num_blocks, layers, heads, bs, 2, value_groups), torch.float16)
    if kind == "fp8" and with_fp8_scales:
        pool.fp8_scales = torch.full(
            (layers, 2, heads), float("nan"), dtype=torch.float32, device=device
        )
        pool.fp8_layers_set = [False] * layers
    return pool

"""Pure-torch reference implementations of the paged-KV operations.

These are the specification the Triton kernels (``enginekit.kernels.triton.ops``) are
tested against, and what the torch executor runs where Triton cannot (CPU).

KV pool: a ``KVTensors`` (see ``enginekit.kernels.layout``), K/V elements in::

    pool.data[num_blocks, num_layers, 2, num_kv_heads, block_size, stored_dim]

Token ``pos`` of a sequence lives in physical block ``block_table[pos // block_size]`` at
offset ``pos % block_size``; its slot is ``block_id * block_size + offset``. Index 0 of the
third axis holds keys, 1 values. Quantized pools (fp8, int4) are quantized on write and
dequantized on read, block by block, with the arithmetic of
``enginekit.kernels.quantize``; nothing ever makes a full-precision copy of the pool.

Attention semantics (shared by decode and prefill): a query at absolute position ``p``
attends every cached key at position ``k`` with ``k <= p`` and, when ``window`` is set,
``k > p - window`` (exactly ``window`` keys, as transformers' sliding-window mask) or
``k < sinks`` (StreamingLLM's attention sinks; ``sinks`` has no effect without a window).
Scores and the softmax are computed in float32 from the dequantized K/V; the output is
cast to the query's dtype. Block table entries that no attended key falls into may be
anything (``-1`` padding or holes, released blocks holding garbage): they never affect
the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from enginekit.kernels.layout import KVTensors
from enginekit.kernels.quantize import (
    check_fp8_scales,
    dequantize_blocks,
    pack_int4,
    quantize_fp8,
    quantize_int4_groups,
    unpack_int4,
)

KEY, VALUE = 0, 1


def write_kv(
    pool: KVTensors, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """Stores ``key[i]`` and ``value[i]`` ([N, num_kv_heads, head_dim], model dtype) of
    layer ``layer`` at slot ``slots[i]`` (int64 [N]); a negative slot is skipped.

    none: stored as is. fp8: ``quantize_fp8`` with the layer's scales; raises ValueError
    when they are NaN (unset) or absent. int4: values per token and group of channels;
    keys per channel over their group of ``key_group_tokens`` tokens, re-quantizing each
    touched group over its valid tokens: those before the first newly written offset
    (dequantized from the pool) and the new ones; codes past the last new offset are 0.
    Tokens must arrive in position order per sequence, a group's new slots consecutive
    and distinct. Mutates ``pool`` (data, and the int4 meta of the touched slots/groups).
    """
    kind = pool.quant.kind
    fp8_scales = check_fp8_scales(pool, layer) if kind == "fp8" else None
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    if slots.numel() == 0:
        return
    block_size = pool.block_size
    block_ids = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    data = pool.data
    # Advanced indices split by slices: the indexed result is [N, num_kv_heads, stored_dim].
    if kind == "none":
        data[block_ids, layer, KEY, :, offsets, :] = key.to(data.dtype)
        data[block_ids, layer, VALUE, :, offsets, :] = value.to(data.dtype)
    elif fp8_scales is not None:
        data[block_ids, layer, KEY, :, offsets, :] = quantize_fp8(key, fp8_scales[KEY, :, None])
        data[block_ids, layer, VALUE, :, offsets, :] = quantize_fp8(
            value, fp8_scales[VALUE, :, None]
        )
    else:
        _write_int4_values(pool, layer, value, block_ids, offsets)
        _write_int4_keys(pool, layer, key, slots)


def _write_int4_values(
    pool: KVTensors, layer: int, value: torch.Tensor, block_ids: torch.Tensor, offsets: torch.Tensor
) -> None:
    assert pool.value_meta is not None
    q = quantize_int4_groups(value, pool.quant.value_group_channels)
    pool.data[block_ids, layer, VALUE, :, offsets, :] = pack_int4(q.codes)
    pool.value_meta[block_ids, layer, :, offsets, 0, :] = q.scale
    pool.value_meta[block_ids, layer, :, offsets, 1, :] = q.zero


def _write_int4_keys(pool: KVTensors, layer: int, key: torch.Tensor, slots: torch.Tensor) -> None:
    """Re-quantizes every key group a new slot falls in (see ``write_kv``)."""
    assert pool.key_meta is not None
    group = pool.quant.key_group_tokens
    block_size = pool.block_size
    # Groups never straddle blocks, so slot // group numbers the groups of the pool.
    group_ids, inverse = torch.unique(
        torch.div(slots, group, rounding_mode="floor"), return_inverse=True
    )
    num_groups = group_ids.shape[0]
    offsets = slots % group
    last = torch.full((num_groups,), -1, dtype=torch.int64, device=slots.device)
    last = last.scatter_reduce(0, inverse, offsets, "amax")
    first_slots = group_ids * group
    blocks = torch.div(first_slots, block_size, rounding_mode="floor")
    group_index = torch.div(first_slots % block_size, group, rounding_mode="floor")
    tokens = group_index[:, None] * group + torch.arange(group, device=slots.device)  # [U, G]
    old_codes = unpack_int4(pool.data[blocks[:, None], layer, KEY, :, tokens, :])  # [U,G,kvh,d]
    meta = pool.key_meta[blocks, layer, :, group_index]  # [U, kvh, 2, d]
    scale, zero = meta[:, None, :, 0].float(), meta[:, None, :, 1].float()
    tile = zero + old_codes.float() * scale  # tokens before the first new offset are valid
    tile[inverse, offsets] = key.float()
    valid = torch.arange(group, device=slots.device)[None, :] <= last[:, None]  # [U, G]
    q = quantize_int4_groups(tile.permute(0, 2, 3, 1), group, valid[:, None, None, :])
    pool.data[blocks[:, None], layer, KEY, :, tokens, :] = pack_int4(q.codes.permute(0, 3, 1, 2))
    pool.key_meta[blocks, layer, :, group_index, 0, :] = q.scale[..., 0]
    pool.key_meta[blocks, layer, :, group_index, 1, :] = q.zero[..., 0]


def attention_mask(
    query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None, sinks: int
) -> torch.Tensor:
    """Bool [M, L]: whether the key at ``key_positions[l]`` is visible to the query at
    ``query_positions[m]`` (the module's rule: causal, window, sinks). Pure."""
    q = query_positions[:, None]
    k = key_positions[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= (k > q - window) | (k < sinks)
    return allowed


def gather_kv(
    pool: KVTensors, layer: int, block_table: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the first ``num_tokens`` positions of one sequence, each
    [num_kv_heads, num_tokens, head_dim]: dequantized to float32 (fp8, int4) or in the
    stored dtype (none). Reads only the blocks those positions fall in (a ``-1`` entry
    reads block 0). Pure."""
    block_size = pool.block_size
    num_blocks = -(-num_tokens // block_size)
    ids = block_table[:num_blocks].long().clamp(min=0)
    key, value = dequantize_blocks(pool, layer, ids)  # [n, kvh, bs, d]

    def tokens(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).reshape(x.shape[1], num_blocks * block_size, -1)[:, :num_tokens]

    return tokens(key), tokens(value)


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_positions: torch.Tensor,
    scale: float,
    window: int | None,
    sinks: int,
) -> torch.Tensor:
    """query [M, H, d] at ``query_positions`` [M]; key/value [kvh, L, d] at positions 0..L-1.
    Keys no query attends may hold anything (NaN). Returns [M, H, d] in the query's dtype."""
    num_queries, num_heads, head_dim = query.shape
    num_kv_heads, num_keys, _ = key.shape
    group = num_heads // num_kv_heads
    allowed = attention_mask(
        query_positions, torch.arange(num_keys, device=query.device), window, sinks
    )
    used = allowed.any(0)[None, :, None]  # zero unattended K/V: 0 × NaN would poison
    key = key.float().masked_fill(~used, 0.0)
    value = value.float().masked_fill(~used, 0.0)
    q = query.float().reshape(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    scores = torch.matmul(q, key.transpose(-1, -2).unsqueeze(1)) * scale  # [kvh, g, M, L]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value.unsqueeze(1))  # [kvh, g, M, d]
    return out.permute(2, 0, 1, 3).reshape(num_queries, num_heads, head_dim).to(query.dtype)


def decode_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: int = 0,
) -> torch.Tensor:
    """One query token per sequence. ``query`` [B, H, d]; ``block_tables`` int32 [B, W];
    ``context_lens`` [B] counts the attended tokens including the query's own (already
    written). The query of row b sits at position ``context_lens[b] - 1``. Returns
    [B, H, d]. Pure."""
    num_seqs, num_heads, head_dim = query.shape
    if num_seqs == 0:
        return query.new_empty(query.shape)
    block_size, num_kv_heads = pool.block_size, pool.num_kv_heads
    max_len = int(context_lens.max())
    num_blocks = -(-max_len // block_size)
    ids = block_tables[:, :num_blocks].long().clamp(min=0)
    key, value = dequantize_blocks(pool, layer, ids.reshape(-1))  # [B * n, kvh, bs, d]

    def tokens(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(num_seqs, num_blocks, num_kv_heads, block_size, head_dim)
        return x.transpose(1, 2).reshape(num_seqs, num_kv_heads, -1, head_dim).float()

    last = context_lens.long() - 1
    key_pos = torch.arange(num_blocks * block_size, device=query.device)
    allowed = attention_mask(last, key_pos, window, sinks)  # [B, L]
    unused = ~allowed[:, None, :, None]
    k, v = tokens(key).masked_fill(unused, 0.0), tokens(value).masked_fill(unused, 0.0)
    group = num_heads // num_kv_heads
    q = query.float().reshape(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bhld->bhgl", q, k) * scale
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgl,bhld->bhgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def prefill_attention(
    query: torch.Tensor,
    pool: KVTensors,
    layer: int,
    block_tables: torch.Tensor,
    query_starts: Sequence[int],
    context_starts: Sequence[int],
    scale: float,
    window: int | None = None,
    sinks: int = 0,
) -> torch.Tensor:
    """A ragged batch of prefill chunks. Sequence i owns query rows
    ``query_starts[i] .. query_starts[i + 1]`` of ``query`` [T, H, d] (``query_starts`` has
    one more entry than sequences, the last being T); its first row is at position
    ``context_starts[i]`` (the length of its cached prefix). Keys are read from the pool,
    where the chunk's own K/V must already be written: every row attends its cached prefix
    and, causally, the chunk up to itself. Returns [T, H, d]. Pure."""
    out = torch.empty_like(query)
    for i, context_start in enumerate(context_starts):
        begin, end = query_starts[i], query_starts[i + 1]
        if end == begin:
            continue
        num_tokens = context_start + end - begin
        key, value = gather_kv(pool, layer, block_tables[i], num_tokens)
        positions = torch.arange(context_start, num_tokens, device=query.device)
        out[begin:end] = _attend(query[begin:end], key, value, positions, scale, window, sinks)
    return out


def copy_blocks(pool: KVTensors, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor) -> None:
    """``t[dst[i]] = t[src[i]]`` for every block tensor ``t`` of the pool (data and int4
    scales/zeros; all layers, K and V): copy-on-write. Sources must not also be
    destinations. Mutates ``pool``."""
    if src_block_ids.numel():
        src, dst = src_block_ids.long(), dst_block_ids.long()
        for tensor in pool.block_tensors:
            tensor[dst] = tensor[src]


def swap_blocks(
    src_pool: KVTensors,
    dst_pool: KVTensors,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """``t_dst[dst[i]] = t_src[src[i]]`` for every block tensor across devices (device <->
    host swap pool); the id tensors live on ``src_pool``'s and ``dst_pool``'s devices
    respectively. fp8 scales are per pool and do not move. Raises ValueError when the
    pools' storage formats differ. Mutates ``dst_pool``."""
    if src_pool.quant != dst_pool.quant:
        raise ValueError(f"cannot swap between {src_pool.quant} and {dst_pool.quant} pools")
    if src_block_ids.numel():
        src, dst = src_block_ids.long(), dst_block_ids.long()
        for src_t, dst_t in zip(src_pool.block_tensors, dst_pool.block_tensors, strict=True):
            dst_t[dst] = src_t[src].to(dst_t.device)

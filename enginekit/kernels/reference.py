"""Pure-torch reference implementations of the paged-KV operations.

These are the specification the Triton kernels (``enginekit.kernels.triton_ops``) are
tested against, and what the torch executor runs where Triton cannot (CPU).

KV pool layout (see ``enginekit.kernels.layout``)::

    pool[num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim]

Token ``pos`` of a sequence lives in physical block ``block_table[pos // block_size]`` at
offset ``pos % block_size``; its slot is ``block_id * block_size + offset``. Index 0 of the
third axis holds keys, 1 values.

Attention semantics (shared by decode and prefill): a query at absolute position ``p``
attends every cached key at position ``k`` with ``k <= p`` and, when ``window`` is set,
``k > p - window`` (exactly ``window`` keys, as transformers' sliding-window mask).
Scores and the softmax are computed in float32; the output is cast to the query's dtype.
Block table entries that no attended key falls into may be anything (``-1`` padding,
released blocks): they are never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

KEY, VALUE = 0, 1


def write_kv(
    pool: torch.Tensor, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """Stores ``key[i]`` and ``value[i]`` ([N, num_kv_heads, head_dim]) of layer ``layer`` at
    slot ``slots[i]`` (int64 [N]); a negative slot is skipped. Mutates ``pool``."""
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    block_size = pool.shape[4]
    block_ids = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    # Advanced indices split by slices: the indexed result is [N, num_kv_heads, head_dim].
    pool[block_ids, layer, KEY, :, offsets, :] = key.to(pool.dtype)
    pool[block_ids, layer, VALUE, :, offsets, :] = value.to(pool.dtype)


def gather_kv(
    pool: torch.Tensor, layer: int, block_table: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the first ``num_tokens`` positions of one sequence, each
    [num_kv_heads, num_tokens, head_dim]. Reads only the blocks those positions fall in."""
    block_size = pool.shape[4]
    num_blocks = -(-num_tokens // block_size)
    ids = block_table[:num_blocks].long()
    blocks = pool[ids, layer]  # [n, 2, kvh, bs, d]
    kv = blocks.permute(1, 2, 0, 3, 4).reshape(2, pool.shape[3], num_blocks * block_size, -1)
    return kv[KEY, :, :num_tokens], kv[VALUE, :, :num_tokens]


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_positions: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """query [M, H, d] at ``query_positions`` [M]; key/value [kvh, L, d] at positions 0..L-1.
    Returns [M, H, d] in the query's dtype."""
    num_queries, num_heads, head_dim = query.shape
    num_kv_heads, num_keys, _ = key.shape
    group = num_heads // num_kv_heads
    q = query.float().reshape(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    scores = torch.matmul(q, key.float().transpose(-1, -2).unsqueeze(1)) * scale  # [kvh,g,M,L]
    key_pos = torch.arange(num_keys, device=query.device)
    allowed = key_pos[None, :] <= query_positions[:, None]
    if window is not None:
        allowed &= key_pos[None, :] > query_positions[:, None] - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value.float().unsqueeze(1))  # [kvh, g, M, d]
    return out.permute(2, 0, 1, 3).reshape(num_queries, num_heads, head_dim).to(query.dtype)


def decode_attention(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """One query token per sequence. ``query`` [B, H, d]; ``block_tables`` int32 [B, W];
    ``context_lens`` [B] counts the attended tokens including the query's own (already
    written). The query of row b sits at position ``context_lens[b] - 1``. Returns
    [B, H, d]."""
    num_seqs, num_heads, head_dim = query.shape
    if num_seqs == 0:
        return query.new_empty(query.shape)
    block_size, num_kv_heads = pool.shape[4], pool.shape[3]
    max_len = int(context_lens.max())
    num_blocks = -(-max_len // block_size)
    ids = block_tables[:, :num_blocks].long().clamp(min=0)
    blocks = pool[ids, layer]  # [B, n, 2, kvh, bs, d]
    kv = blocks.permute(2, 0, 3, 1, 4, 5).reshape(2, num_seqs, num_kv_heads, -1, head_dim)
    group = num_heads // num_kv_heads
    q = query.float().reshape(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bhld->bhgl", q, kv[KEY].float()) * scale
    key_pos = torch.arange(kv.shape[3], device=query.device)
    last = context_lens.long()[:, None] - 1
    allowed = key_pos[None, :] <= last
    if window is not None:
        allowed &= key_pos[None, :] > last - window
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgl,bhld->bhgd", probs, kv[VALUE].float())
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def prefill_attention(
    query: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    query_starts: Sequence[int],
    context_starts: Sequence[int],
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """A ragged batch of prefill chunks. Sequence i owns query rows
    ``query_starts[i] .. query_starts[i + 1]`` of ``query`` [T, H, d] (``query_starts`` has
    one more entry than sequences, the last being T); its first row is at position
    ``context_starts[i]`` (the length of its cached prefix). Keys are read from the pool,
    where the chunk's own K/V must already be written: every row attends its cached prefix
    and, causally, the chunk up to itself. Returns [T, H, d]."""
    out = torch.empty_like(query)
    for i, context_start in enumerate(context_starts):
        begin, end = query_starts[i], query_starts[i + 1]
        if end == begin:
            continue
        num_tokens = context_start + end - begin
        key, value = gather_kv(pool, layer, block_tables[i], num_tokens)
        positions = torch.arange(context_start, num_tokens, device=query.device)
        out[begin:end] = _attend(query[begin:end], key, value, positions, scale, window)
    return out


def copy_blocks(
    pool: torch.Tensor, src_block_ids: torch.Tensor, dst_block_ids: torch.Tensor
) -> None:
    """``pool[dst[i]] = pool[src[i]]`` for every pair (all layers, K and V): copy-on-write.
    Sources must not also be destinations. Mutates ``pool``."""
    if src_block_ids.numel():
        pool[dst_block_ids.long()] = pool[src_block_ids.long()]


def swap_blocks(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """``dst_pool[dst[i]] = src_pool[src[i]]`` across devices (device <-> host swap pool);
    the id tensors live on ``src_pool``'s and ``dst_pool``'s devices respectively. Mutates
    ``dst_pool``."""
    if src_block_ids.numel():
        dst_pool[dst_block_ids.long()] = src_pool[src_block_ids.long()].to(dst_pool.device)

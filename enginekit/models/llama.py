"""The Llama-family forward over a flat batch of tokens and a paged KV pool.

One call runs every scheduled token of a step: the prefill chunks first (sequence by
sequence), then one token per decoding sequence. Per layer: RMSNorm, fused QKV projection
(with biases for Qwen2), rotary embedding, K/V written to their slots, attention read
back from the pool (prefill rows and decode rows separately), output projection, residual,
RMSNorm, gated SiLU MLP, residual. Only the rows that sample (``logits_indices``) go
through the final norm and LM head. Llama, Mistral (sliding window) and Qwen2 differ
only in the ``ModelArch`` and in which weights exist; GQA/MQA come from the shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from enginekit.kernels.layout import KVTensors
from enginekit.kernels.ops import PagedOps
from enginekit.models.arch import ModelArch
from enginekit.models.rope import RotaryTable


class LayerWeights(NamedTuple):
    """One decoder layer. ``qkv`` is q, k, v stacked on the output axis (likewise its
    bias); ``gate_up`` is gate then up."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class LlamaWeights(NamedTuple):
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # the embedding itself when the model ties them
    # fp8 KV-cache scales shipped with the checkpoint: float32 [layers, K|V, kv_heads]
    kv_scales: torch.Tensor | None = None


class ForwardBatch(NamedTuple):
    """A step's flat batch, on the model's device. T tokens: the first
    ``num_prefill_tokens`` are prefill chunks (S sequences), the rest one decode each (B).

    ``slots`` int64 [T] are the tokens' cache slots. Prefill: ``prefill_query_starts`` int32
    [S + 1] (row offsets into the batch), ``prefill_context_starts`` int32 [S] (cached
    prefix lengths), ``prefill_block_tables`` int32 [S, W], ``prefill_max_query_len``.
    Decode: ``decode_block_tables`` int32 [B, W'], ``decode_context_lens`` int32 [B].
    ``logits_indices`` int64: the rows whose next-token logits are returned, in order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    num_prefill_tokens: int
    prefill_query_starts: torch.Tensor
    prefill_context_starts: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_max_query_len: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    logits_indices: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the statistics in float32, scaled after casting back (as Llama)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class LlamaModel:
    """Weights, rotary table and settings of one model on one device. Stateless across
    calls: the KV pool is passed in."""

    def __init__(
        self,
        arch: ModelArch,
        weights: LlamaWeights,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = arch.shape
        self.arch = arch
        self.weights = weights
        self.dtype = dtype
        self.device = torch.device(device)
        self.rotary = RotaryTable(arch.rope, shape.head_dim, shape.max_model_len, dtype, device)
        self.scale = shape.head_dim**-0.5
        self.q_size = shape.num_heads * shape.head_dim
        self.kv_size = shape.num_kv_heads * shape.head_dim

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        pool: KVTensors,
        ops: PagedOps,
        before_write: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Writes every batch token's K/V into ``pool`` (mutated) and returns float32
        logits [len(logits_indices), vocab]. ``before_write(layer, query, key, value)``,
        if given, sees each layer's query [T, heads, head_dim] and new K/V [T, kv_heads,
        head_dim] (after the rotary embedding) before the K/V are stored: fp8
        calibration and quality measurements hook in there."""
        shape = self.arch.shape
        eps = self.arch.rms_norm_eps
        num_heads, num_kv_heads, head_dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
        window, sinks = shape.sliding_window, shape.attention_sinks
        num_prefill = batch.num_prefill_tokens
        has_decodes = batch.input_ids.shape[0] > num_prefill
        w = self.weights
        hidden = F.embedding(batch.input_ids, w.embed)
        for layer, lw in enumerate(w.layers):
            x = rms_norm(hidden, lw.input_norm, eps)
            qkv = F.linear(x, lw.qkv, lw.qkv_bias)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self.rotary.apply(q.reshape(-1, num_heads, head_dim), batch.positions)
            k = self.rotary.apply(k.reshape(-1, num_kv_heads, head_dim), batch.positions)
            v = v.reshape(-1, num_kv_heads, head_dim)
            if before_write is not None:
                before_write(layer, q, k, v)
            ops.write_kv(pool, layer, k, v, batch.slots)
            parts = []
            if num_prefill:
                parts.append(
                    ops.prefill_attention(
                        q[:num_prefill],
                        pool,
                        layer,
                        batch.prefill_block_tables,
                        batch.prefill_query_starts,
                        batch.prefill_context_starts,
                        batch.prefill_max_query_len,
                        self.scale,
                        window,
                        sinks,
                    )
                )
            if has_decodes:
                parts.append(
                    ops.decode_attention(
                        q[num_prefill:],
                        pool,
                        layer,
                        batch.decode_block_tables,
                        batch.decode_context_lens,
                        self.scale,
                        window,
                        sinks,
                    )
                )
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            hidden = hidden + F.linear(attn.reshape(-1, self.q_size), lw.o, lw.o_bias)
            x = rms_norm(hidden, lw.post_norm, eps)
            gate, up = F.linear(x, lw.gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, lw.down)
        last = rms_norm(hidden[batch.logits_indices], w.norm, eps)
        return F.linear(last, w.lm_head).float()

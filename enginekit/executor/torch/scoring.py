"""Teacher-forced scoring through the paged cache: log-probabilities of every next token
of a text, with its K/V stored in (and read back from) the cache's storage format.

Quality measurements of a KV format need the model's distribution at every position,
not only the sampled ones the scheduler asks for. ``teacher_forced_logprobs`` prefills a
token sequence chunk by chunk into a private pool of the executor's format (so every
chunk after the first attends keys and values that went through the quantizer, exactly
as cached prefixes and decodes do) and returns every row's log-probabilities. It does
not touch the executor's own pool. ``prompt_token_logprobs`` reads a request's
``prompt_logprobs`` out of those rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from enginekit.executor.torch.fp8_scales import FP8Scales
from enginekit.executor.torch.logprobs import token_logprobs
from enginekit.kernels.layout import KVTensors, allocate_kv_tensors
from enginekit.kernels.ops import PagedOps
from enginekit.models.llama import ForwardBatch, LlamaModel
from enginekit.request import TokenLogprob
from enginekit.spec.kv import KVSpec

# Sees each layer's query, key and value [T, heads, head_dim] before the K/V are stored.
QKVHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def private_pool(
    model: LlamaModel,
    kv_spec: KVSpec,
    num_tokens: int,
) -> tuple[KVTensors, FP8Scales | None]:
    """A pool of ``kv_spec``'s format just large enough for ``num_tokens``, with its fp8
    scales handled as the executor does (checkpoint or calibration)."""
    pool = allocate_kv_tensors(
        kv_spec, kv_spec.num_blocks_for(num_tokens), model.dtype, model.device
    )
    return pool, FP8Scales.of_pool(pool, kv_spec.quant, model.weights.kv_scales)


def chunk_batch(
    token_ids: Sequence[int], start: int, end: int, block_size: int, device: torch.device
) -> ForwardBatch:
    """The ForwardBatch prefilling ``token_ids[start:end]`` of one sequence whose blocks
    are 0, 1, 2, ... of the pool, with logits for every row."""
    num_rows = end - start
    table = torch.arange(-(-end // block_size), dtype=torch.int32, device=device)[None]
    positions = torch.arange(start, end, device=device)
    return ForwardBatch(
        input_ids=torch.as_tensor(token_ids[start:end], dtype=torch.int64, device=device),
        positions=positions,
        slots=positions.clone(),  # block b holds positions b*bs .. b*bs + bs - 1
        num_prefill_tokens=num_rows,
        prefill_query_starts=torch.tensor([0, num_rows], dtype=torch.int32, device=device),
        prefill_context_starts=torch.tensor([start], dtype=torch.int32, device=device),
        prefill_block_tables=table,
        prefill_max_query_len=num_rows,
        decode_block_tables=torch.zeros((0, 1), dtype=torch.int32, device=device),
        decode_context_lens=torch.zeros(0, dtype=torch.int32, device=device),
        logits_indices=torch.arange(num_rows, device=device),
    )


def teacher_forced_chunks(
    model: LlamaModel,
    ops: PagedOps,
    kv_spec: KVSpec,
    token_ids: Sequence[int],
    chunk_tokens: int,
    *,
    on_qkv: QKVHook | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """(start, float32 [end - start, vocab]) for each prefill chunk [start, end) of
    ``chunk_tokens`` tokens in turn: row r is log p(· | token_ids[:start + r + 1]),
    computed over a private pool of ``kv_spec``'s format, so a caller holds one chunk's
    rows at a time. An fp8 pool calibrates on the first chunk unless the checkpoint has
    scales. Pure with respect to everything but ``on_qkv``'s own effects."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    pool, scales = private_pool(model, kv_spec, len(token_ids))

    def before_write(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if scales is not None:
            scales.calibrate(layer, k, v)
        if on_qkv is not None:
            on_qkv(layer, q, k, v)

    for start in range(0, len(token_ids), chunk_tokens):
        end = min(start + chunk_tokens, len(token_ids))
        batch = chunk_batch(token_ids, start, end, kv_spec.block_size, model.device)
        yield start, model.forward(batch, pool, ops, before_write).log_softmax(-1)


def teacher_forced_logprobs(
    model: LlamaModel,
    ops: PagedOps,
    kv_spec: KVSpec,
    token_ids: Sequence[int],
    chunk_tokens: int,
    *,
    on_qkv: QKVHook | None = None,
) -> torch.Tensor:
    """float32 [len(token_ids), vocab]: row i is log p(· | token_ids[:i + 1]), the rows of
    ``teacher_forced_chunks`` end to end. Pure with respect to everything but ``on_qkv``'s
    own effects."""
    chunks = teacher_forced_chunks(model, ops, kv_spec, token_ids, chunk_tokens, on_qkv=on_qkv)
    return torch.cat([rows for _, rows in chunks])


def prompt_token_logprobs(
    model: LlamaModel,
    ops: PagedOps,
    kv_spec: KVSpec,
    token_ids: Sequence[int],
    num_top: int,
    chunk_tokens: int,
) -> list[TokenLogprob | None]:
    """Each of ``token_ids``' TokenLogprob given the tokens before it, with its
    ``num_top`` most likely alternatives; None for the first token (no context). One
    teacher-forced prefill of the tokens over a private pool (``teacher_forced_chunks``),
    whatever a prefix cache holds, so the result depends on the tokens alone; it holds one
    chunk's [chunk_tokens, vocab] rows at a time. Pure."""
    entries: list[TokenLogprob | None] = [None]
    for start, rows in teacher_forced_chunks(model, ops, kv_spec, token_ids, chunk_tokens):
        # Row r predicts token start + r + 1; the prompt's last row predicts no token of it.
        num_rows = min(rows.shape[0], len(token_ids) - start - 1)
        if num_rows > 0:
            targets = list(token_ids[start + 1 : start + 1 + num_rows])
            entries += token_logprobs(rows[:num_rows], targets, [num_top] * num_rows)
    return entries

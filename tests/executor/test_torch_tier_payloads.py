"""The torch executor's side of KV tiers: a device block read out as one payload (every
layer's K and V with the storage format's scales) and written back into another block
is bit for bit the same block, for every quantizer; a step reads its tier saves out before
anything in it writes, and a block loaded from a payload makes the next step's attention
what it was over the block it was read from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from enginekit import Engine
from enginekit.errors import KVCacheError
from enginekit.executor.torch.kv_tensors import PagedKVTensors
from enginekit.kernels.ops import REFERENCE_OPS
from enginekit.request import SamplingParams
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.spec.quant import KVQuant
from enginekit.step import SchedulerOutput, TierLoad, TierSave

BLOCK = 4
SHAPE = model_preset("tiny")
QUANTS = {
    "none": KVQuant(),
    "fp8": KVQuant("fp8"),
    "int4": KVQuant.int4(BLOCK, BLOCK, SHAPE.head_dim),
}


def random_tensors(quantizer: str, num_blocks: int = 12, seed: int = 0) -> PagedKVTensors:
    """A CPU pool of ``quantizer``'s format whose every block tensor holds random bits
    (finite: fp8 elements and float16 scales drawn as values), fp8 scales set."""
    spec = KVSpec.of(SHAPE, bits_per_element=32, block_size=BLOCK, quant=QUANTS[quantizer])
    tensors = PagedKVTensors(spec, num_blocks, 0, torch.float32, torch.device("cpu"), REFERENCE_OPS)
    generator = torch.Generator().manual_seed(seed)
    for t in tensors.on_device.block_tensors:
        if t.dtype == torch.uint8:
            t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=generator))
        else:
            t.copy_(torch.randn(t.shape, generator=generator).to(t.dtype))
    if tensors.on_device.fp8_scales is not None:
        scales = torch.rand(tensors.on_device.fp8_scales.shape, generator=generator) + 0.5
        tensors.on_device.set_fp8_scales(None, scales)
    return tensors


def block_bytes(tensors: PagedKVTensors, block_id: int) -> list[bytes]:
    return [
        t[block_id].contiguous().view(torch.uint8).numpy().tobytes()
        for t in tensors.on_device.block_tensors
    ]


@pytest.mark.parametrize("quantizer", ["none", "fp8", "int4"])
def test_a_block_read_out_and_written_into_another_is_bit_identical(quantizer):
    tensors = random_tensors(quantizer)
    payloads = tensors.read_blocks([3, 5, 3])
    scale_bytes = 0 if quantizer != "fp8" else SHAPE.num_layers * 2 * SHAPE.num_kv_heads * 4
    assert tensors.payload_bytes == tensors.on_device.bytes_per_block + scale_bytes
    for p in payloads:
        assert isinstance(p, np.ndarray) and p.dtype == np.uint8
        assert p.shape == (tensors.payload_bytes,) and p.flags.c_contiguous
    assert not np.shares_memory(payloads[0], payloads[2])  # each its own memory
    # the buffer protocol is all a level keeps: bytes, a memoryview, a bytearray
    tensors.write_blocks([7, 8, 9], [payloads[0].tobytes(), memoryview(payloads[1]), payloads[2]])
    assert block_bytes(tensors, 7) == block_bytes(tensors, 3) == block_bytes(tensors, 9)
    assert block_bytes(tensors, 8) == block_bytes(tensors, 5)
    assert block_bytes(tensors, 7) != block_bytes(tensors, 5)
    # into a pool of its own, the same
    other = random_tensors(quantizer, seed=1)
    if other.on_device.fp8_scales is not None:
        other.on_device.fp8_scales.copy_(tensors.on_device.fp8_scales)
    other.write_blocks([0], [bytearray(payloads[1])])
    assert block_bytes(other, 0) == block_bytes(tensors, 5)


def test_fp8_payloads_bring_their_scales_to_a_pool_not_calibrated_yet_and_else_are_rescaled():
    source = random_tensors("fp8")
    (payload,) = source.read_blocks([2])
    fresh = PagedKVTensors(
        source.spec, 4, 0, torch.float32, torch.device("cpu"), REFERENCE_OPS
    )  # scales NaN: no prefill calibrated them
    assert not any(fresh.on_device.fp8_layers_set)
    fresh.write_blocks([1], [payload])
    assert all(fresh.on_device.fp8_layers_set)
    assert torch.equal(fresh.on_device.fp8_scales, source.on_device.fp8_scales)
    assert block_bytes(fresh, 1) == block_bytes(source, 2)
    # a pool calibrated otherwise (another engine's scales) stores the same values, to
    # e4m3's precision (3 mantissa bits: within 1/16, relative; absolute near zero)
    other = random_tensors("fp8", seed=3)
    other.on_device.set_fp8_scales(None, source.on_device.fp8_scales * 1.5)
    other.write_blocks([0], [payload])
    want = source.on_device.data[2].float() * source.on_device.fp8_scales[..., None, None]
    got = other.on_device.data[0].float() * other.on_device.fp8_scales[..., None, None]
    assert torch.allclose(got, want, rtol=1 / 16, atol=1e-2)
    assert not torch.equal(got, want)  # re-quantized, not copied


def test_a_payload_of_the_wrong_size_or_with_broken_scales_changes_nothing():
    tensors = random_tensors("fp8")
    (payload,) = tensors.read_blocks([1])
    before = block_bytes(tensors, 4)
    with pytest.raises(KVCacheError, match="a block's payload here is"):
        tensors.write_blocks([4], [payload[:-1]])
    broken = payload.copy()
    broken[-4:] = np.frombuffer(np.float32(np.nan).tobytes(), dtype=np.uint8)
    with pytest.raises(KVCacheError, match="not positive and finite"):
        tensors.write_blocks([4], [broken])
    with pytest.raises(KVCacheError, match="2 payloads for 1 blocks"):
        tensors.write_blocks([4], [payload, payload])
    assert block_bytes(tensors, 4) == before
    assert tensors.read_blocks([]) == [] and tensors.write_blocks([], []) is None


# -- the executor ----------------------------------------------------------------------------


def tiny_executor(quantizer: str):
    eng = Engine.from_overrides(
        ["executor=torch", "model=tiny", "progress=false", f"+quantizer={quantizer}",
         f"cache.block_size={BLOCK}", "cache.num_blocks=32", "kernels=reference"]
    )  # fmt: skip
    return eng.executor


def step(number: int, tables: dict[int, list[int]], **work) -> SchedulerOutput:
    """A step over ``tables`` (seq id -> block table): ``prefill`` (seq, start, tokens)
    or ``decode`` (seq, context length, token), and tier saves and loads."""
    prefills = work.pop("prefill", [])
    decodes = work.pop("decode", [])
    seq_ids = [p[0] for p in prefills] + [d[0] for d in decodes]
    width = max((len(tables[s]) for s in seq_ids), default=1)
    rows = np.full((len(seq_ids), width), -1, dtype=np.int32)
    for row, seq_id in enumerate(seq_ids):
        rows[row, : len(tables[seq_id])] = tables[seq_id]
    return SchedulerOutput(
        step=number,
        prefill_seq_ids=[p[0] for p in prefills],
        prefill_starts=[p[1] for p in prefills],
        prefill_lens=[len(p[2]) for p in prefills],
        decode_seq_ids=[d[0] for d in decodes],
        decode_context_lens=[d[1] for d in decodes],
        sample_seq_ids=[d[0] for d in decodes] + [p[0] for p in prefills],
        finished_seq_ids=[],
        preempted_seq_ids=[],
        block_copies=[],
        block_tables=rows,
        prefill_token_ids=[p[2] for p in prefills],
        decode_token_ids=[d[2] for d in decodes],
        **work,
    )


@pytest.mark.parametrize("quantizer", ["none", "fp8", "int4"])
def test_blocks_saved_by_one_step_and_loaded_by_another_give_the_same_attention(
    quantizer, monkeypatch
):
    executor = tiny_executor(quantizer)
    logits: list[torch.Tensor] = []
    forward = executor.model.forward

    def recording_forward(*args, **kwargs):
        logits.append(forward(*args, **kwargs))
        return logits[-1]

    monkeypatch.setattr(executor.model, "forward", recording_forward)
    prompt = [5, 17, 42, 7, 99, 23, 11, 64, 3, 250, 8, 31]  # three full blocks
    tables = {1: [5, 6, 7, 8], 2: [20, 21, 22, 23]}
    for seq_id in tables:
        executor.add_sequence(seq_id, prompt, SamplingParams(max_tokens=4))
    (token,) = executor.execute(step(0, tables, prefill=[(1, 0, prompt)])).next_token_ids
    # the blocks of seq 1's prompt are read out, the step's decode writes into block 8
    out = executor.execute(
        step(1, tables, decode=[(1, 13, token)], tier_saves=[TierSave(b, 0) for b in (5, 6, 7)])
    )
    payloads = out.saved_payloads
    assert len(payloads) == 3
    assert all(p.shape == (executor.kv_tensors.payload_bytes,) for p in payloads)
    # seq 2, the same tokens, finds them in blocks 20-22 loaded from the payloads
    loads = [TierLoad(b, 0, p) for b, p in zip((20, 21, 22), payloads, strict=True)]
    again = executor.execute(step(2, tables, decode=[(2, 13, token)], tier_loads=loads))
    pool = executor.kv_tensors.on_device
    for t in pool.block_tensors:
        assert torch.equal(t[20:23].view(torch.uint8), t[5:8].view(torch.uint8))
    assert torch.equal(logits[2], logits[1])
    assert again.next_token_ids == out.next_token_ids and again.saved_payloads == []


def test_a_step_reads_its_saves_before_it_writes_any_block():
    executor = tiny_executor("none")
    kv = executor.kv_tensors
    data = kv.on_device.data
    data[3].fill_(1.0)
    data[4].fill_(2.0)
    (incoming,) = kv.read_blocks([4])
    out = executor.execute(
        step(0, {}, tier_saves=[TierSave(3, 0)], tier_loads=[TierLoad(3, 0, incoming)])
    )
    (saved,) = out.saved_payloads
    assert out.next_token_ids == []
    assert np.all(saved.view(np.float32) == 1.0)  # block 3 as it was before the load
    assert torch.equal(data[3], data[4])


def test_an_fp8_engine_whose_first_blocks_come_from_a_tier_takes_their_scales():
    source = tiny_executor("fp8")
    pool = source.kv_tensors.on_device
    assert pool.fp8_scales is not None
    pool.set_fp8_scales(None, torch.full_like(pool.fp8_scales, 0.25))
    (payload,) = source.kv_tensors.read_blocks([0])
    executor = tiny_executor("fp8")
    assert executor.describe()["fp8_scales"] == "not calibrated yet (no prefill has run)"
    executor.execute(step(0, {}, tier_loads=[TierLoad(3, 0, payload)]))
    assert (
        executor.describe()["fp8_scales"]
        == "from the KV blocks a tier loaded before any prefill ran"
    )
    assert torch.all(executor.kv_tensors.on_device.fp8_scales == 0.25)

"""SimExecutor's roofline and scripted tokens; hardware presets and KV pool sizing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from enginekit.config import HardwareConfig
from enginekit.errors import ConfigError
from enginekit.executor.sim.executor import (
    STEP_OVERHEAD_S,
    SimExecutor,
    _causal_pairs,
    _sink_pairs,
    fallback_token_id,
)
from enginekit.executor.sim.tokens import ScriptedTokens, fallback_token_ids, mixed_key
from enginekit.request import SamplingParams
from enginekit.spec.hardware import HARDWARE_PRESETS, hardware_preset, kv_pool_num_blocks
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import ModelShape, model_preset
from enginekit.step import BlockCopy, BlockSwap, Fork, SchedulerOutput

SHAPE = model_preset("llama-3-8b")
HW = hardware_preset("h200")
KV = KVSpec.of(SHAPE, bits_per_element=16, block_size=16)
SP = SamplingParams(max_tokens=8)
PAIR_FLOPS = 4 * SHAPE.num_layers * SHAPE.num_heads * SHAPE.head_dim
TOKEN_FLOPS = 2 * SHAPE.num_matmul_params_per_token
WEIGHT_BYTES = 2 * SHAPE.num_matmul_params_per_token


def step(
    prefills: list[tuple[int, int, int]] = (),  # (seq_id, start, len)
    decodes: list[tuple[int, int]] = (),  # (seq_id, context_len)
    sample: list[int] | None = None,
    finished: list[int] = (),
    copies: list[BlockCopy] = (),
) -> SchedulerOutput:
    decode_ids = [d[0] for d in decodes]
    return SchedulerOutput(
        step=0,
        prefill_seq_ids=[p[0] for p in prefills],
        prefill_starts=[p[1] for p in prefills],
        prefill_lens=[p[2] for p in prefills],
        decode_seq_ids=decode_ids,
        decode_context_lens=[d[1] for d in decodes],
        sample_seq_ids=decode_ids if sample is None else sample,
        finished_seq_ids=list(finished),
        preempted_seq_ids=[],
        block_copies=list(copies),
    )


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def make_executor(num_seqs: int = 0, script_len: int = 4) -> SimExecutor:
    ex = SimExecutor(SHAPE, HW, KV)
    for i in range(num_seqs):
        ex.add_sequence(i, [1, 2, 3], SP, [1000 * i + k for k in range(script_len)])
    return ex


def test_big_decode_batch_is_memory_bound_and_matches_bytes_over_bandwidth():
    ex = make_executor(256)
    lens = [1000 + 7 * i for i in range(256)]
    ex.execute(step(decodes=list(zip(range(256), lens, strict=True))))
    cost = ex.last_cost
    kv_bytes = KV.bytes_per_token * (sum(lens) + 256)  # read L, write 1, per decode
    expected_bytes = WEIGHT_BYTES + kv_bytes
    assert cost.bytes == expected_bytes
    assert cost.flops == TOKEN_FLOPS * 256 + PAIR_FLOPS * sum(lens)
    assert not cost.is_compute_bound
    expected = expected_bytes / (HW.hbm_bandwidth * HW.memory_efficiency) + STEP_OVERHEAD_S
    assert rel(cost.step_time_s, expected) < 1e-9


def test_long_prefill_is_compute_bound_and_matches_flops_over_peak():
    ex = make_executor(1)
    c = 8192
    out = ex.execute(step(prefills=[(0, 0, c)], sample=[0]))
    cost = ex.last_cost
    expected_flops = TOKEN_FLOPS * c + PAIR_FLOPS * c * (c + 1) // 2
    assert cost.flops == expected_flops
    assert cost.bytes == WEIGHT_BYTES + KV.bytes_per_token * c
    assert cost.is_compute_bound
    expected = expected_flops / (HW.peak_flops * HW.compute_efficiency) + STEP_OVERHEAD_S
    assert rel(cost.step_time_s, expected) < 1e-9
    assert out.step_time_s == cost.step_time_s


def test_cached_prefix_costs_fewer_flops_by_the_exact_formula():
    ex = make_executor(1)
    cold = ex.step_cost(step(prefills=[(0, 0, 4000)]))
    warm = ex.step_cost(step(prefills=[(0, 3000, 1000)]))
    cold_pairs = 4000 * 4001 // 2
    warm_pairs = 1000 * 3000 + 1000 * 1001 // 2
    assert cold.flops - warm.flops == TOKEN_FLOPS * 3000 + PAIR_FLOPS * (cold_pairs - warm_pairs)
    assert warm.flops < cold.flops
    # The warm chunk reads its 3000 cached tokens and writes 1000: the same KV traffic.
    assert warm.bytes == cold.bytes


def test_mixed_step_sums_prefill_chunks_decodes_and_block_copies():
    ex = make_executor(3)
    s = step(
        prefills=[(0, 16, 32), (1, 0, 5)],
        decodes=[(2, 100)],
        copies=[BlockCopy(1, 2), BlockCopy(3, 4)],
    )
    cost = ex.step_cost(s)
    pairs = (32 * 16 + 32 * 33 // 2) + (5 * 6 // 2) + 100
    assert cost.flops == TOKEN_FLOPS * (32 + 5 + 1) + PAIR_FLOPS * pairs
    kv_tokens = (16 + 32) + 5 + (100 + 1)
    assert cost.bytes == WEIGHT_BYTES + KV.bytes_per_token * kv_tokens + 2 * 2 * KV.bytes_per_block


def test_empty_step_costs_nothing_and_still_forgets_finished():
    ex = make_executor(2)
    out = ex.execute(step(finished=[0]))
    assert (out.next_token_ids, out.step_time_s, out.candidates) == ([], 0.0, None)
    assert ex.num_sequences == 1
    assert ex.num_steps == 0


def test_sliding_window_pairs_match_brute_force():
    for start, length, window in itertools.product(range(0, 12), range(1, 12), range(1, 10)):
        brute = sum(min(p + 1, window) for p in range(start, start + length))
        assert _causal_pairs(start, length, window) == brute, (start, length, window)
    assert _causal_pairs(7, 5, None) == sum(p + 1 for p in range(7, 12))


def test_sliding_window_caps_decode_reads():
    shape = ModelShape(**{**SHAPE.__dict__, "name": "windowed", "sliding_window": 512})
    ex = SimExecutor(shape, HW, KV)
    cost = ex.step_cost(step(decodes=[(0, 100), (1, 4000)]))
    assert cost.flops == TOKEN_FLOPS * 2 + PAIR_FLOPS * (100 + 512)
    assert cost.bytes == WEIGHT_BYTES + KV.bytes_per_token * (100 + 512 + 2)


def visible(p: int, k: int, window: int, sinks: int) -> bool:
    """The visibility rule: the query at p sees the key at k."""
    return k <= p and (k > p - window or k < sinks)


def test_sink_pairs_match_the_visibility_rule():
    for start, length, window, sinks in itertools.product(
        range(0, 14), range(1, 9), range(1, 8), range(0, 6)
    ):
        brute = sum(
            visible(p, k, window, sinks) for p in range(start, start + length) for k in range(p + 1)
        )
        got = _causal_pairs(start, length, window) + _sink_pairs(start, length, window, sinks)
        assert got == brute, (start, length, window, sinks)


def test_sinks_add_the_keys_outside_the_window_to_decode_and_prefill_costs():
    fields = {**SHAPE.__dict__, "name": "windowed", "sliding_window": 512}
    plain = SimExecutor(ModelShape(**fields), HW, KV)
    sinks = SimExecutor(ModelShape(**{**fields, "attention_sinks": 4}), HW, KV)
    # Decodes seeing 100, 514 and 4000 keys: min(L, 512) + the sinks not inside the window.
    s = step(decodes=[(0, 100), (1, 514), (2, 4000)])
    keys = (100 + 0) + (512 + 2) + (512 + 4)
    assert sinks.step_cost(s).flops == TOKEN_FLOPS * 3 + PAIR_FLOPS * keys
    assert sinks.step_cost(s).bytes == WEIGHT_BYTES + KV.bytes_per_token * (keys + 3)
    assert sinks.step_cost(s).flops - plain.step_cost(s).flops == PAIR_FLOPS * (2 + 4)
    # A chunk of 100 queries at 1000..1099 after 1000 cached tokens: each query sees its
    # window and all 4 sinks; the chunk reads the window and the sinks of its cached part.
    s = step(prefills=[(0, 1000, 100)])
    assert sinks.step_cost(s).flops - plain.step_cost(s).flops == PAIR_FLOPS * 100 * 4
    assert sinks.step_cost(s).bytes - plain.step_cost(s).bytes == KV.bytes_per_token * 4
    # Inside the window the sinks change nothing.
    s = step(prefills=[(0, 0, 300)], decodes=[(1, 512)])
    assert sinks.step_cost(s) == plain.step_cost(s)


def test_scripted_tokens_come_back_in_order_across_preemption():
    ex = make_executor(2, script_len=4)
    out = ex.execute(step(prefills=[(0, 0, 3), (1, 0, 3)], sample=[0, 1]))
    assert out.next_token_ids == [0, 1000]
    out = ex.execute(step(decodes=[(1, 4), (0, 4)]))
    assert out.next_token_ids == [1001, 1]
    # Sequence 0 is preempted and recomputed: its re-prefill's sample continues the script.
    out = ex.execute(step(prefills=[(0, 0, 5)], decodes=[(1, 5)], sample=[1, 0]))
    assert out.next_token_ids == [1002, 2]
    out = ex.execute(step(decodes=[(0, 6), (1, 6)]))
    assert out.next_token_ids == [3, 1003]
    # Past the script: deterministic fallback ids from (seq_id, position), < vocab_size.
    out = ex.execute(step(decodes=[(0, 7), (1, 7)]))
    assert out.next_token_ids == [
        fallback_token_id(0, 4, SHAPE.vocab_size),
        fallback_token_id(1, 4, SHAPE.vocab_size),
    ]
    assert all(0 <= t < SHAPE.vocab_size for t in out.next_token_ids)


def test_finished_sequences_are_forgotten_and_can_be_added_again():
    ex = make_executor(1)
    with pytest.raises(ValueError, match="already registered"):
        ex.add_sequence(0, [1], SP, [5])
    ex.execute(step(finished=[0], decodes=[]))
    with pytest.raises(KeyError):
        ex.execute(step(decodes=[(0, 3)]))
    ex.add_sequence(0, [1], SP, [5])
    assert ex.execute(step(decodes=[(0, 2)])).next_token_ids == [5]


def test_a_beam_forked_from_a_parent_finishing_in_the_same_step_is_still_a_beam():
    """The step contract (as the torch executor keeps it): forks are registered before the
    finished sequences are forgotten, so a beam whose parent finished as it forked it keeps
    its parent's beam width and gets candidates."""
    ex = SimExecutor(SHAPE, HW, KV)
    beams = SamplingParams(max_tokens=4, beam_width=2, temperature=0.0)
    ex.add_sequence(0, [1, 2, 3], beams)
    scheduled = step(decodes=[(1, 5)], finished=[0])._replace(
        forks=[Fork(0, 1, 1)], decode_token_ids=[7]
    )
    out = ex.execute(scheduled)
    assert out.candidates == [ex.beam_candidates(7, 4, 2)]
    assert len(out.candidates[0]) == 4


def test_fallback_without_script_is_deterministic_and_in_vocab():
    ex = SimExecutor(SHAPE, HW, KV)
    ex.add_sequence(42, [1], SP)
    got = [ex.execute(step(decodes=[(42, 2 + k)])).next_token_ids[0] for k in range(200)]
    assert got == [fallback_token_id(42, k, SHAPE.vocab_size) for k in range(200)]
    assert len(set(got)) > 150


def run_trace(ex: SimExecutor) -> list[tuple[list[int], float]]:
    trace = []
    for i in range(8):
        ex.add_sequence(i, [1, 2], SP, [i] * 3)
    trace.append(
        ex.execute(step(prefills=[(i, 0, 100 + i) for i in range(8)], sample=list(range(8))))
    )
    for k in range(6):
        trace.append(ex.execute(step(decodes=[(i, 101 + i + k) for i in range(8)])))
    return [(out.next_token_ids, out.step_time_s) for out in trace]


def test_deterministic():
    assert run_trace(make_executor()) == run_trace(make_executor())


def test_256_decodes_draw_their_scripts_then_the_fallback():
    ex = make_executor(256, script_len=3)
    s = step(decodes=[(i, 1500 + i) for i in range(256)])
    for k in range(5):
        expected = [
            1000 * i + k if k < 3 else fallback_token_id(i, k, SHAPE.vocab_size) for i in range(256)
        ]
        assert ex.execute(s).next_token_ids == expected


def test_the_vectorized_fallback_is_its_scalar_specification():
    rng = np.random.default_rng(4)
    keys = [0, 1, 2**62 + 5, (2**62 + 1) * 1_000_003 + 7, *rng.integers(0, 2**63, 20).tolist()]
    positions = np.asarray([0, 1, 63, 64, 10**9, *rng.integers(0, 2**40, 19).tolist()])
    for vocab in (1, 7, SHAPE.vocab_size):
        got = fallback_token_ids(
            np.asarray([mixed_key(k) for k in keys], dtype=np.uint64), positions, vocab
        )
        assert got.tolist() == [
            fallback_token_id(k, int(p), vocab) for k, p in zip(keys, positions, strict=True)
        ]


def test_the_arena_compacts_and_keeps_every_live_script():
    tokens = ScriptedTokens(50)
    for seq_id in range(10):
        tokens.add(seq_id, [seq_id] * 40, seq_id)
    assert tokens.draw([3, 8]) == [3, 8]
    for seq_id in range(6):
        tokens.remove(seq_id)
    tokens.check_integrity()
    used = tokens._arena_end
    tokens.add(10, list(range(49)) * 40, 10)  # needs room: 240 of 400 tokens are dead
    tokens.check_integrity()
    assert tokens._arena_end == 4 * 40 + 49 * 40 < used + 49 * 40
    assert tokens.draw([9, 8, 10, 6, 7]) == [9, 8, 0, 6, 7]
    assert tokens.draw([8]) == [8]  # its third token: positions moved with the scripts


class ScriptsMachine(RuleBasedStateMachine):
    """ScriptedTokens against a dict of token lists: the same tokens in every order of
    adds, removes and draws, the arena compacting as it goes, its integrity checked after
    every operation."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = ScriptedTokens(50)
        self.model: dict[int, tuple[list[int], int]] = {}  # seq id -> (script, position)
        self.keys: dict[int, int] = {}

    @rule(seq_id=st.integers(0, 12), script=st.lists(st.integers(0, 49), max_size=150))
    def add(self, seq_id: int, script: list[int]) -> None:
        if seq_id in self.model:
            with pytest.raises(ValueError):
                self.tokens.add(seq_id, script, seq_id + 100)
            return
        self.tokens.add(seq_id, script, seq_id + 100)
        self.model[seq_id] = (script, 0)
        self.keys[seq_id] = seq_id + 100

    @rule(seq_id=st.integers(0, 12))
    def remove(self, seq_id: int) -> None:
        self.tokens.remove(seq_id)
        self.model.pop(seq_id, None)

    @rule(data=st.data())
    def draw(self, data: st.DataObject) -> None:
        seq_ids = data.draw(st.lists(st.integers(0, 12), unique=True, max_size=8))
        if any(seq_id not in self.model for seq_id in seq_ids):
            with pytest.raises(KeyError):  # and no position moves: the next draws tell
                self.tokens.draw(seq_ids)
            return
        expected = []
        for seq_id in seq_ids:
            script, position = self.model[seq_id]
            key = self.keys[seq_id]
            expected.append(
                script[position] if position < len(script) else fallback_token_id(key, position, 50)
            )
            self.model[seq_id] = (script, position + 1)
        assert self.tokens.draw(seq_ids) == expected

    @invariant()
    def consistent(self) -> None:
        self.tokens.check_integrity()
        assert len(self.tokens) == len(self.model)
        assert all(seq_id in self.tokens for seq_id in self.model)


TestScriptedTokens = ScriptsMachine.TestCase
TestScriptedTokens.settings = settings(max_examples=60, stateful_step_count=100, deadline=None)


def test_hardware_presets_and_unknown_name():
    assert set(HARDWARE_PRESETS) == {"h100-sxm", "h200"}
    assert hardware_preset("h100-sxm").hbm_bandwidth == 3.35e12
    with pytest.raises(ConfigError, match="h100-sxm, h200"):
        hardware_preset("a100")


def test_kv_pool_num_blocks_formula():
    cfg = HardwareConfig(name="h200", memory_utilization=0.9, reserve_gib=2.0)
    weights = SHAPE.num_params * 2
    n = kv_pool_num_blocks(HW, cfg, SHAPE, KV, weights)
    free = int(HW.hbm_capacity * 0.9) - weights - 2 * (1 << 30)
    assert n == free // KV.bytes_per_block
    assert n > 0


def test_kv_pool_refuses_a_70b_model_on_one_h100():
    shape = model_preset("llama-3-70b")
    kv = KVSpec.of(shape, 16, 16)
    with pytest.raises(ConfigError, match="no room for a KV cache.*llama-3-70b weights take 131"):
        kv_pool_num_blocks(
            hardware_preset("h100-sxm"), HardwareConfig(), shape, kv, shape.num_params * 2
        )


def test_describe_names_model_hardware_and_pool():
    info = SimExecutor(SHAPE, HW, KV, num_blocks=1000).describe()
    assert info["model"] == "llama-3-8b"
    assert info["hardware"] == "h200"
    assert info["kv_pool_blocks"] == 1000
    assert info["kv_pool_bytes"] == 1000 * KV.bytes_per_block
    assert info["kv_pool_gib"] == 1000 * KV.bytes_per_block / (1 << 30)
    assert "swap_pool_blocks" not in info


def test_the_report_says_how_large_the_swap_pool_is():
    """4 GiB of 2 MiB blocks, or the whole device pool when that is smaller."""
    from enginekit import Engine

    for num_blocks, expected in ((100_000, 2048), (1000, 1000)):
        engine = Engine.from_overrides(
            ["progress=false", "+preemption=swap", f"cache.num_blocks={num_blocks}"]
        )
        info = engine.describe()
        assert info["swap_pool_blocks"] == engine.cache.swap_space.num_blocks == expected
        assert info["swap_pool_bytes"] == expected * engine.kv_spec.bytes_per_block


def test_swap_time_over_effective_pcie():
    ex = make_executor()
    expected = 10 * (
        HW.pcie_latency_s + KV.bytes_per_block / (HW.pcie_bandwidth * HW.pcie_efficiency)
    )
    assert rel(ex.swap_time_s(10), expected) < 1e-12


def test_swaps_are_charged_to_the_step():
    ex = make_executor(num_seqs=1)
    plain = ex.step_cost(step(decodes=[(0, 100)])).step_time_s
    swaps = [BlockSwap(i, i) for i in range(3)]
    with_swaps = ex.step_cost(
        step(decodes=[(0, 100)])._replace(swap_outs=swaps[:2], swap_ins=swaps[2:])
    )
    assert rel(with_swaps.step_time_s - plain, ex.swap_time_s(3)) < 1e-9

"""The sliding_window eviction with attention sinks, end to end on the simulated executor:
exact block counts per step (during prefill too, and while each step runs), sinks kept in
front of the holes, the prefix cache around holes, swaps of tables with holes, config
refusals. Every test checks every cache invariant after every step."""

from __future__ import annotations

import random
from typing import Any

import pytest

from enginekit import Engine, SamplingParams
from enginekit.errors import ConfigError, RequestRejectedError
from enginekit.kv.backend import make_backend

WINDOW, SINKS, BLOCK = 64, 4, 16
BOUND = -(-SINKS // BLOCK) + -(-WINDOW // BLOCK) + 1  # 1 + 4 + 1 = 6


def make_engine(*overrides: str, native: bool = True) -> Engine:
    """An engine of ``overrides``, on the Rust structures or (``native`` false) their
    Python twins."""
    return Engine.from_overrides(["progress=false", *overrides], make_backend(native))


def windowed(*overrides: str, prefix: str = "none", native: bool = True) -> Engine:
    """Llama-3-8B made windowed: window 64, the default 4 sinks, 16-token blocks."""
    return make_engine(
        "+eviction=sliding_window",
        f"eviction.window={WINDOW}",
        f"+prefix={prefix}",
        "cache.watermark=0",
        *overrides,
        native=native,
    )


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 32000) for _ in range(n)]


def held(engine: Engine, seq_id: int) -> int:
    tables = engine.cache.tables
    return tables.num_blocks(seq_id) - tables.num_holes(seq_id)


class Trace:
    """Per step: blocks each running sequence holds while the step runs (recorded as the
    executor is called) and after it (once its releases are done); checks every invariant
    after every step."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.during: list[dict[int, int]] = []
        self.after: list[dict[int, int]] = []
        self.chunks: list[list[int]] = []
        execute = engine.executor.execute

        def recording_execute(scheduled: Any) -> Any:
            seq_ids = [*scheduled.prefill_seq_ids, *scheduled.decode_seq_ids]
            self.during.append({s: held(engine, s) for s in seq_ids})
            self.chunks.append(list(scheduled.prefill_lens))
            return execute(scheduled)

        engine.executor.execute = recording_execute  # type: ignore[method-assign]

    def run(self) -> Trace:
        engine = self.engine
        engine.check_integrity()
        while engine.has_unfinished_requests():
            engine.step()
            engine.check_integrity()
            self.after.append({r.seq_id: held(engine, r.seq_id) for r in engine.scheduler.running})
        assert engine.cache.tables.num_sequences == 0
        assert engine.cache.num_promised_blocks == 0
        return self

    def max_during(self) -> int:
        return max((max(d.values(), default=0) for d in self.during), default=0)

    def max_after(self) -> int:
        return max((max(d.values(), default=0) for d in self.after), default=0)


@pytest.mark.parametrize("native", [True, False])
def test_strict_bound_holds_one_sink_four_window_one_spare_block_at_every_step(native):
    engine = windowed("eviction.strict_bound=true", native=native)
    engine.add_request(tokens(300, 1), SamplingParams(max_tokens=100, ignore_eos=True))
    trace = Trace(engine).run()
    assert engine.cache.eviction.max_blocks_per_sequence == BOUND == 6
    during = [d[0] for d in trace.during]
    after = [a.get(0, 0) for a in trace.after]
    # Prefill: the first chunk takes the 6 promised blocks (96 tokens); each later chunk
    # one block (16 tokens), once the window's first block has been given back.
    assert trace.chunks[:14] == [[96]] + [[16]] * 12 + [[12]]
    assert during[:14] == [6] * 14
    # After each chunk: the sink block and the blocks of positions >= computed - 63.
    assert after[:14] == [5] * 13 + [6]
    # Decodes: 300 + k tokens computed; the block of position 300 + k is held while the
    # step runs, and the window's first block is given back once the next query no longer
    # reaches it.
    assert max(during) == max(after[:-1]) == BOUND
    assert min(during[14:-1]) == 5
    assert after[-1] == 0
    assert sum(trace.chunks, []) == [96] + [16] * 12 + [12]


@pytest.mark.parametrize("native", [True, False])
def test_prefill_chunks_take_free_blocks_for_their_step_and_give_them_back(native):
    engine = windowed(native=native)
    engine.add_request(tokens(300, 1), SamplingParams(max_tokens=40, ignore_eos=True))
    trace = Trace(engine).run()
    # One chunk: all 19 blocks of the prompt while it runs, then the sink block and the
    # five blocks of positions 236..299 (237..299 is the next query's window).
    assert trace.chunks[0] == [300]
    assert trace.during[0] == {0: 19}
    assert trace.after[0] == {0: 6}
    assert trace.max_after() == BOUND
    assert max(d.get(0, 0) for d in trace.during[1:]) == BOUND


def test_the_sink_block_stays_in_front_of_the_holes():
    engine = windowed()
    engine.add_request(tokens(300, 2), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    engine.check_integrity()
    table = engine.cache.tables.block_ids(0)
    # 19 logical blocks: the sink block, 13 holes, the window's five blocks (236..299).
    assert len(table) == 19
    assert table[0] >= 0 and table[1:14] == [-1] * 13 and min(table[14:]) >= 0
    assert engine.cache.tables.num_holes(0) == 13
    assert engine.executor.shape.attention_sinks == SINKS
    assert engine.executor.shape.sliding_window == WINDOW


def test_tight_pool_admits_by_promises_and_every_sequence_stays_in_its_bound():
    """A pool of 30 blocks, 5 prompts of 200-400 tokens (13-25 blocks each): admission
    promises each prefill its bound of 6 blocks, so 5 run at once where whole prompts
    would fit one at a time; none is preempted."""
    engine = windowed("cache.num_blocks=30", "scheduler.max_num_batched_tokens=512")
    for i in range(5):
        engine.add_request(
            tokens(200 + 50 * i, 10 + i), SamplingParams(max_tokens=60, ignore_eos=True)
        )
    trace = Trace(engine).run()
    assert trace.max_after() <= BOUND
    assert engine.summary()["num_running_peak"] == 5
    assert engine.summary()["num_preemptions_total"] == 0
    assert all(len(o.output_token_ids) == 60 for o in engine.outputs())


def test_block_hash_never_publishes_a_hole_and_a_repeat_hits_its_released_blocks():
    engine = windowed("cache.num_blocks=200", prefix="block_hash")
    prompt = tokens(300, 3)
    engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True), request_id="a")
    Trace(engine).run()
    cached = engine.cache.pool.cached_blocks()
    assert len(cached) == 302 // BLOCK  # 302 tokens computed: 18 full blocks
    assert all(0 <= b < engine.cache.num_blocks for b in cached.values())
    # The repeat matches all 18 full prompt blocks (released ones included: they stayed
    # cached), keeps the sink block and the window's, and releases the rest at admission.
    engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True), request_id="b")
    engine.step()
    engine.check_integrity()
    assert engine.output("b").num_cached_tokens == 288
    seq_id = engine.scheduler.running[0].seq_id
    table = engine.cache.tables.block_ids(seq_id)
    assert table[0] >= 0 and table[1:14] == [-1] * 13 and min(table[14:]) >= 0
    Trace(engine).run()
    assert len(engine.output("b").output_token_ids) == 3
    assert len(engine.cache.pool.cached_blocks()) == 302 // BLOCK


@pytest.mark.parametrize("strict", [True, False])
def test_shared_prefixes_in_a_tight_pool_short_a_promise_but_never_stall(strict):
    """Ten requests cut from one 150-token prompt, block_hash, 16 blocks: a prefill that
    releases matched blocks another sequence still holds frees nothing, so its promise runs
    short and a chunk waits a step; every request still finishes within the bound."""
    engine = windowed(f"eviction.strict_bound={str(strict).lower()}", "cache.num_blocks=16",
                      "scheduler.max_num_batched_tokens=64", "scheduler.max_num_seqs=6",
                      prefix="block_hash")  # fmt: skip
    waits = []
    reserve = engine.cache.reserve_prefill

    def recording_reserve(request: Any, num_tokens: int) -> int:
        got = reserve(request, num_tokens)
        waits.append(got == 0)
        return got

    engine.cache.reserve_prefill = recording_reserve  # type: ignore[method-assign]
    rng = random.Random(0)
    base = tokens(150, 0)
    for i in range(10):
        prompt = base[: rng.randrange(20, 150)] + tokens(rng.randrange(0, 30), 100 + i)
        sampling = SamplingParams(max_tokens=rng.randrange(1, 40), ignore_eos=True)
        engine.add_request(prompt, sampling, arrival_time=rng.choice([0.0, 0.01]))
    trace = Trace(engine).run()
    assert any(waits)
    assert trace.max_after() == BOUND
    assert (trace.max_during() == BOUND) == strict
    assert engine.summary()["num_requests_finished"] == 10


def test_swap_brings_a_table_back_with_its_holes_where_they_were():
    """Four sequences with short prompts (admitted together) that decode to 200 tokens
    (13 blocks) in a pool of 16: each holds at most 6, but four of them do not fit, so
    decodes swap others out and back in, holes and all."""
    common = ["+preemption=swap", "scheduler.max_num_seqs=4"]
    outputs = {}
    for num_blocks in (16, 1000):
        engine = windowed(*common, f"cache.num_blocks={num_blocks}")
        for i in range(4):
            sampling = SamplingParams(max_tokens=180 - 10 * i, ignore_eos=True)
            script = tokens(180 - 10 * i, 50 + i)
            engine.add_request(tokens(20 + 10 * i, 30 + i), sampling, scripted_output_ids=script)
        trace = Trace(engine).run()
        assert trace.max_after() <= BOUND
        outputs[num_blocks] = [o.output_token_ids for o in engine.outputs()]
        summary = engine.summary()
        assert summary["swap_in_bytes_total"] == summary["swap_out_bytes_total"]
        assert summary["recomputed_tokens_total"] == 0
        if num_blocks == 16:
            assert summary["num_preemptions_by_kind"].get("swap", 0) > 0
    assert outputs[16] == outputs[1000]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=mistral-7b", "eviction.sink_tokens=4"], "eviction.sink_tokens=4 is refused"),
        (["eviction.window=64", "eviction.sink_tokens=-1"], "eviction.sink_tokens must be >= 0"),
        (["eviction.window=0"], "eviction.window must be >= 1"),
    ],
)
def test_sinks_are_refused_where_they_would_change_an_exact_window(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_engine("+eviction=sliding_window", *overrides)


@pytest.mark.parametrize(
    ("overrides", "window", "sinks", "bound"),
    [
        (["eviction.window=64"], 64, 4, 6),  # the approximation keeps StreamingLLM's 4 sinks
        (["eviction.window=64", "eviction.sink_tokens=0"], 64, 0, 5),
        (["eviction.window=64", "eviction.sink_tokens=20"], 64, 20, 7),
        (["model=mistral-7b"], 4096, 0, 257),  # exact: no sinks
        (["model=mistral-7b", "eviction.sink_tokens=0"], 4096, 0, 257),
        (["model=mistral-7b", "eviction.window=1000"], 1000, 0, 64),
    ],
)
def test_sinks_default_to_four_in_the_approximation_and_none_on_a_windowed_model(
    overrides, window, sinks, bound
):
    engine = make_engine("+eviction=sliding_window", *overrides)
    assert (engine.shape.sliding_window, engine.shape.attention_sinks) == (window, sinks)
    assert engine.executor.shape.attention_sinks == sinks
    assert engine.cache.eviction.sinks == sinks  # declared by the policy, not written back
    assert engine.cache.eviction.max_blocks_per_sequence == bound


def test_lru_leaves_the_shape_without_sinks():
    engine = make_engine("+eviction=lru")
    assert engine.shape.attention_sinks == 0


def test_a_prompt_longer_than_the_pool_is_served_within_the_window_bound():
    """A windowed sequence never holds more than its bound, so a prompt needing more
    blocks than the whole pool is accepted and served; without the window it is refused
    up front."""
    common = ["progress=false", "model=mistral-7b", "cache.num_blocks=400", "cache.watermark=0"]
    prompt = list(range(1, 12_001))  # 750 blocks of 16
    windowed = Engine.from_overrides([*common, "+prefix=none", "+eviction=sliding_window"])
    request_id = windowed.add_request(prompt, SamplingParams(max_tokens=8))
    while windowed.has_unfinished_requests():
        windowed.step()
        windowed.check_integrity()
    assert len(windowed.output(request_id).output_token_ids) == 8
    plain = Engine.from_overrides([*common, "+prefix=none"])
    with pytest.raises(RequestRejectedError, match="whole cache has 400"):
        plain.add_request(prompt, SamplingParams(max_tokens=8))

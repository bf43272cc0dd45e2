"""The sliding window's approximation with attention sinks, on real tensors.

A Llama without a window of its own, run with ``+eviction=sliding_window``, attends the
last ``eviction.window`` positions and the first ``eviction.sink_tokens`` (StreamingLLM);
the policy gives back every block holding neither, which leaves holes between the sink
blocks and the window. The oracle is the same masked attention with nothing released and
nothing cached: each greedy token taken from a fresh teacher-forced prefill of the whole
sequence so far (one chunk, a private pool). Giving blocks back must not change a token,
with any storage format.
"""

from __future__ import annotations

import random

import pytest

from enginekit import Engine, SamplingParams
from enginekit.executor.torch.scoring import teacher_forced_logprobs

WINDOW, SINKS, BLOCK = 12, 5, 4
NEW_TOKENS = 20


def engine(*overrides: str) -> Engine:
    return Engine.from_overrides(
        [
            "executor=torch",
            "model=tiny",
            "model.dtype=float32",
            "progress=false",
            "+eviction=sliding_window",
            f"eviction.window={WINDOW}",
            f"cache.block_size={BLOCK}",
            "cache.num_blocks=256",
            *overrides,
        ]
    )


def held_blocks(eng: Engine, seq_id: int) -> int:
    """Blocks ``seq_id``'s table holds (holes excluded)."""
    tables = eng.cache.tables
    return tables.num_blocks(seq_id) - tables.num_holes(seq_id)


def oracle_greedy(eng: Engine, prompt: list[int]) -> list[int]:
    """Greedy tokens from full prefills under the engine's own mask (window and sinks):
    no block is ever released there."""
    executor = eng.executor
    tokens = list(prompt)
    for _ in range(NEW_TOKENS):
        logprobs = teacher_forced_logprobs(
            executor.model, executor.ops, executor.kv_spec, tokens, len(tokens)
        )
        tokens.append(int(logprobs[-1].argmax()))
    return tokens[len(prompt) :]


def oracle_choices(eng: Engine, prompt: list[int], output: list[int]) -> list[int]:
    """The oracle's greedy choice at each of ``output``'s positions, ``output`` itself
    teacher-forced (one full prefill under the engine's mask): a token the engine chose
    otherwise does not carry into the choices after it."""
    executor = eng.executor
    tokens = [*prompt, *output]
    logprobs = teacher_forced_logprobs(
        executor.model, executor.ops, executor.kv_spec, tokens, len(tokens)
    )
    return logprobs[len(prompt) - 1 : -1].argmax(-1).tolist()


@pytest.mark.parametrize("sinks", [SINKS, 0])
def test_released_blocks_change_no_token(sinks):
    eng = engine(f"eviction.sink_tokens={sinks}", "+prefix=none")
    assert (eng.shape.sliding_window, eng.shape.attention_sinks) == (WINDOW, sinks)
    rng = random.Random(7)
    batch = [[rng.randrange(3, 500) for _ in range(n)] for n in (9, 30)]
    ids = [
        eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)) for p in batch
    ]
    bound = -(-sinks // BLOCK) + -(-WINDOW // BLOCK) + 1
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
        for seq in eng.scheduler.running:
            assert held_blocks(eng, seq.seq_id) <= bound
    for request_id, prompt in zip(ids, batch, strict=True):
        assert eng.output(request_id).output_token_ids == oracle_greedy(eng, prompt)


def test_sinks_matter():
    """The same run without sinks gives other tokens: the sinks are attended."""
    rng = random.Random(7)
    prompt = [rng.randrange(3, 500) for _ in range(30)]
    outputs = []
    for sinks in (SINKS, 0):
        eng = engine(f"eviction.sink_tokens={sinks}", "+prefix=none")
        request_id = eng.add_request(prompt, SamplingParams(max_tokens=NEW_TOKENS))
        eng.run()
        outputs.append(eng.output(request_id).output_token_ids)
    assert outputs[0] != outputs[1]


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
def test_quantized_windowed_cache_with_sinks(quantizer):
    """The kernels skip the holes with every storage format. A decode's K/V differ from
    the oracle's prefill in the last float bits (and int4 re-quantizes a filling key
    group where the prefill quantizes it once), enough to move a rounding of the
    quantizer: nearly every token is the oracle's choice on the same tokens before it,
    not every one. Reading a released block instead would leave almost none."""
    eng = engine(f"+quantizer={quantizer}", "+prefix=none")
    rng = random.Random(3)
    batch = [[rng.randrange(3, 500) for _ in range(n)] for n in (26, 8)]
    ids = [
        eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)) for p in batch
    ]
    eng.run()
    outputs = [eng.output(request_id).output_token_ids for request_id in ids]
    pairs = [
        (a, b)
        for prompt, output in zip(batch, outputs, strict=True)
        for a, b in zip(output, oracle_choices(eng, prompt, output), strict=True)
    ]
    assert sum(a == b for a, b in pairs) / len(pairs) >= 0.9

"""Quantized KV caches end to end: bytes per block, pool capacity, fp8 scale origins, and
fp8 / int4 running with every other plugin in the torch executor.

With a quantized cache the tokens are no longer transformers' own, so the oracle here is
the same quantized engine on an unconstrained pool without a prefix cache: sharing,
copy-on-write, preemption and swapping must not change a single token, because they move
quantized blocks with their scales rather than recompute them. (int4 re-quantizes a key
group when tokens join it, so a cached partial block is re-quantized where a fresh
prefill quantizes once: for int4 the radix cache's partial-block hits are compared with
an agreement bound instead.)
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch_helpers import hf_config, hf_model, prompts, saved_engine

from enginekit import Engine, SamplingParams
from enginekit.driver import WorkloadDriver
from enginekit.errors import ConfigError
from enginekit.models.tiny import random_state_dict
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.spec.quant import KVQuant

NEW_TOKENS = 12
GIB = 1 << 30


# -- bytes ----------------------------------------------------------------------------------


def test_llama3_8b_bytes_per_token_by_storage():
    shape = model_preset("llama-3-8b")

    def per_token(quant: KVQuant, block_size: int = 16) -> float:
        return KVSpec.of(shape, 16, block_size, quant).bytes_per_token

    assert per_token(KVQuant()) == 131_072  # 2 × 32 layers × 8 heads × 128 × 2 bytes
    assert per_token(KVQuant("fp8")) == 65_536
    # int4, groups of 64: 4 bits + (scale, zero) fp16 per 64 values = 4.5 bits per value.
    assert per_token(KVQuant.int4(64, 64, 128), block_size=64) == 131_072 * 4.5 / 16
    # Blocks of 16 tokens cap the key groups at 16 tokens: keys cost 6 bits per value.
    assert per_token(KVQuant.int4(64, 16, 128)) == 131_072 * (6 + 4.5) / 2 / 16


@pytest.mark.parametrize(
    ("group_size", "block_size", "message"),
    [(0, 16, ">= 1"), (24, 16, "must divide cache.block_size=16"), (48, 64, "head dim 128")],
)
def test_int4_group_size_errors_name_the_key(group_size, block_size, message):
    with pytest.raises(ConfigError, match="quantizer.group_size") as info:
        KVQuant.int4(group_size, block_size, 128)
    assert message in str(info.value)


@pytest.mark.parametrize("quantizer", ["none", "fp8", "int4"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_torch_pool_bytes_equal_kvspec(quantizer, block_size):
    eng = Engine.from_overrides(
        [
            "executor=torch",
            "model=tiny",
            "progress=false",
            f"+quantizer={quantizer}",
            f"cache.block_size={block_size}",
            "cache.num_blocks=8",
        ]
    )
    pool = eng.executor.kv_tensors.on_device
    assert pool.bytes_per_block == eng.kv_spec.bytes_per_block


@pytest.mark.parametrize("executor", ["sim", "torch"])
def test_same_budget_holds_the_formulas_multiple_of_tokens(executor):
    model = ["model=tiny"] if executor == "torch" else []
    budget = 0.05 if executor == "torch" else 2.0  # hundreds of blocks either way
    tokens = {}
    for quantizer in ("none", "fp8", "int4"):
        eng = Engine.from_overrides(
            [
                f"executor={executor}",
                *model,
                "progress=false",
                f"+quantizer={quantizer}",
                "quantizer.group_size=16" if quantizer == "int4" else "cache.block_size=16",
                f"cache.memory_gib={budget}",
            ]
        )
        assert eng.cache.pool.num_blocks * eng.kv_spec.bytes_per_block <= budget * GIB
        tokens[quantizer] = eng.cache.pool.num_blocks * eng.kv_spec.block_size
        formula = budget * GIB / eng.kv_spec.bytes_per_token
        assert tokens[quantizer] == pytest.approx(formula, rel=0.01)
    bits = 32 if executor == "torch" else 16  # tiny runs in float32, llama-3-8b in bfloat16
    assert tokens["fp8"] / tokens["none"] == pytest.approx(bits / 8, rel=0.01)
    assert tokens["int4"] / tokens["none"] == pytest.approx(bits / (4 + 32 / 16), rel=0.01)


# -- fp8 scales -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    return folder, model


def with_kv_scales(folder, target, scales: torch.Tensor):
    """A copy of ``folder`` in ``target`` whose safetensors carry ``scales`` [layers, 2,
    kv_heads or 1] as fp8 k_scale/v_scale."""
    target.mkdir()
    for file in folder.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    [weights] = list(target.glob("*.safetensors"))
    tensors = load_file(str(weights))
    for i, (k_scale, v_scale) in enumerate(scales):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = k_scale.clone()
        tensors[f"model.layers.{i}.self_attn.v_scale"] = v_scale.clone()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return target


def run_prompts(eng: Engine, batch: list[list[int]], max_tokens: int = NEW_TOKENS, **kw):
    first = len(eng.outputs())
    ids = [
        eng.add_request(p, SamplingParams(max_tokens=max_tokens, **kw), request_id=str(first + i))
        for i, p in enumerate(batch)
    ]
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    return [eng.output(r) for r in ids]


@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_scales_come_from_the_checkpoint_when_it_has_them(saved_model, tmp_path, per_head):
    folder, _ = saved_model
    config = hf_config("tiny")
    heads = config.num_key_value_heads if per_head else 1
    scales = torch.tensor([[0.01, 0.02], [0.02, 0.04]])[:, :, None].expand(-1, -1, heads)
    eng = saved_engine(with_kv_scales(folder, tmp_path / "scaled", scales), "+quantizer=fp8")
    scales = eng.executor.kv_tensors.on_device.fp8_scales
    assert scales is not None
    torch.testing.assert_close(scales[1, 0], torch.full((scales.shape[2],), 0.02))
    torch.testing.assert_close(scales[0, 1], torch.full((scales.shape[2],), 0.02))
    run_prompts(eng, prompts(256, 5, seed=1, n=2))
    assert eng.describe()["fp8_scales"] == "from the checkpoint"
    torch.testing.assert_close(scales[1, 1], torch.full((scales.shape[2],), 0.04))


def test_fp8_calibrates_on_the_first_prefill_and_says_so(saved_model):
    folder, _ = saved_model
    eng = saved_engine(folder, "+quantizer=fp8", "+prefix=none")
    assert "not calibrated" in eng.describe()["fp8_scales"]
    batch = prompts(256, 5, seed=1, n=2)
    run_prompts(eng, batch)
    scales = eng.executor.kv_tensors.on_device.fp8_scales
    assert bool(torch.isfinite(scales).all()) and bool((scales > 0).all())
    described = eng.describe()["fp8_scales"]
    first_step_tokens = sum(len(p) for p in batch)
    assert described == (
        f"calibrated on the first prefill ({first_step_tokens} tokens, max-abs x 2)"
    )


def test_fp8_checkpoint_scales_required_but_absent_is_an_error(saved_model):
    folder, _ = saved_model
    with pytest.raises(ConfigError, match="no k_scale/v_scale"):
        saved_engine(folder, "+quantizer=fp8", "quantizer.scales=checkpoint")


def test_fp8_bad_scale_source_names_the_key(saved_model):
    folder, _ = saved_model
    with pytest.raises(ConfigError, match="quantizer.scales='guess'"):
        saved_engine(folder, "+quantizer=fp8", "quantizer.scales=guess")


# -- every other plugin ----------------------------------------------------------------------


def quantized_outputs(folder, quantizer: str, *overrides: str) -> list[list[int]]:
    """Two waves of prompts sharing a prefix (the second hits the first's blocks). With
    the swap plugin, swapping is made cheap so that it always swaps."""
    eng = saved_engine(folder, f"+quantizer={quantizer}", "quantizer.group_size=4"
                 if quantizer == "int4" else "cache.watermark=0", *overrides)  # fmt: skip
    if "+preemption=swap" in overrides:
        policy = eng.scheduler.preemption
        policy.costs = dataclasses.replace(policy.costs, swap_s_per_block=1e-12)
    vocab = 256
    out = []
    for wave in (prompts(vocab, 13, seed=1), prompts(vocab, 13, seed=1)[::-1]):
        out += [o.output_token_ids for o in run_prompts(eng, wave)]
    return out


@pytest.fixture(scope="module")
def folders(saved_model, tmp_path_factory):
    """Per quantizer, the model folder its runs load. fp8's carries the scales a
    calibration found: scales calibrated by each run on its own first step would differ
    between runs whose first steps differ, and so would their tokens."""
    folder, _ = saved_model
    eng = saved_engine(folder, "+quantizer=fp8", "+prefix=none")
    run_prompts(eng, prompts(256, 13, seed=1))
    scales = eng.executor.kv_tensors.on_device.fp8_scales.clone()
    return {
        "int4": folder,
        "fp8": with_kv_scales(folder, tmp_path_factory.mktemp("fp8") / "m", scales),
    }


@pytest.fixture(scope="module")
def oracles(folders):
    """Per quantizer: outputs on an unconstrained pool without a prefix cache."""
    return {
        q: quantized_outputs(folders[q], q, "+prefix=none", "cache.num_blocks=512")
        for q in ("fp8", "int4")
    }


def agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """Share of output positions with equal tokens."""
    pairs = [(a, b) for x, y in zip(got, want, strict=True) for a, b in zip(x, y, strict=False)]
    return sum(a == b for a, b in pairs) / len(pairs)


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
@pytest.mark.parametrize(
    "overrides",
    [
        ("+prefix=block_hash", "cache.num_blocks=512"),
        ("+allocator=contiguous", "+prefix=none", "cache.num_blocks=512",
         "model.max_model_len=64"),
    ],
    ids=["block_hash", "contiguous"],
)  # fmt: skip
def test_shared_or_slab_blocks_change_no_token(folders, oracles, quantizer, overrides):
    """Prefix hits reuse the stored bytes with their scales; slabs store them alike."""
    assert quantized_outputs(folders[quantizer], quantizer, *overrides) == oracles[quantizer]


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
@pytest.mark.parametrize(
    "overrides",
    [
        ("+prefix=none", "cache.num_blocks=24", "cache.watermark=0"),
        ("+prefix=block_hash", "+preemption=swap", "preemption.swap_space_gib=0.01",
         "cache.num_blocks=24", "cache.watermark=0"),
        ("+prefix=radix", "cache.num_blocks=512"),
    ],
    ids=["recompute", "swap", "radix"],
)  # fmt: skip
def test_preempted_or_requantized_runs_keep_nearly_every_token(
    folders, oracles, quantizer, overrides
):
    """A tight pool changes the batches (their K/V differ from the roomy run's in the
    last float bits, enough to move a rounding of the quantizer), recompute prefills
    generated tokens again, and a radix hit inside a block re-quantizes its int4 key
    groups: not bit-identical, but nearly every token. (Swapped blocks come back bit for
    bit: ``test_swaps_then_copies_in_contract_order``.) A lost scale would leave almost
    none."""
    got = quantized_outputs(folders[quantizer], quantizer, *overrides)
    assert agreement(got, oracles[quantizer]) >= 0.9


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
def test_quantized_greedy_samples_fork_by_copy_on_write(saved_model, quantizer):
    """n greedy samples share the prompt's quantized blocks and copy the partial one: each
    equals the single-sample output."""
    folder, _ = saved_model
    batch = prompts(256, 7, seed=2, n=3)
    single = run_prompts(saved_engine(folder, f"+quantizer={quantizer}"), batch)
    eng = saved_engine(folder, f"+quantizer={quantizer}")
    forked = run_prompts(eng, batch, n=3)
    for one, many in zip(single, forked, strict=True):
        assert many.samples == [one.output_token_ids] * 3


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
def test_quantized_beam_search_runs_with_a_tight_pool(saved_model, quantizer):
    folder, _ = saved_model
    batch = prompts(256, 7, seed=5, n=2)
    roomy = run_prompts(saved_engine(folder, f"+quantizer={quantizer}", "cache.num_blocks=512"),
                        batch, beam_width=3, n=2)  # fmt: skip
    tight = run_prompts(saved_engine(folder, f"+quantizer={quantizer}", "cache.num_blocks=40",
                               "cache.watermark=0"), batch, beam_width=3, n=2)  # fmt: skip
    assert (
        agreement([s for o in tight for s in o.samples], [s for o in roomy for s in o.samples])
        >= 0.9
    )


def test_fp8_logits_stay_close_to_the_unquantized_cache(saved_model):
    """Teacher-forced next-token distributions of the tiny model: fp8 KL < 1e-3."""
    folder, _ = saved_model
    batch = prompts(256, 0, seed=9, n=4)
    logprobs = {}
    for quantizer in ("none", "fp8", "int4"):
        eng = saved_engine(folder, f"+quantizer={quantizer}", "quantizer.group_size=4"
                     if quantizer == "int4" else "cache.watermark=0")  # fmt: skip
        logprobs[quantizer] = [eng.executor.prompt_logprobs(p, chunk_tokens=7) for p in batch]
    for quantizer, bound in (("fp8", 1e-3), ("int4", 2e-2)):
        kl = torch.cat(
            [
                torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1)
                for p, q in zip(logprobs["none"], logprobs[quantizer], strict=True)
            ]
        )
        assert float(kl.mean()) < bound, (quantizer, float(kl.mean()))


# -- the simulator ---------------------------------------------------------------------------


def _valid_combinations() -> list[tuple[str, ...]]:
    from test_engine import ALL_PLUGINS, _is_refused

    combinations = [
        dict(zip(ALL_PLUGINS, names, strict=True))
        for names in itertools.product(*ALL_PLUGINS.values())
    ]
    return [tuple(c.values()) for c in combinations if not _is_refused(c)]


@pytest.mark.parametrize("quantizer", ["fp8", "int4"])
def test_simulated_quantized_caches_run_with_every_plugin_combination(quantizer):
    """Each of the valid allocator × prefix × eviction × preemption combinations runs a
    tight-pool workload to the end with a quantized cache, integrity checked every step."""
    num_preemptions = 0
    for allocator, prefix, eviction, preemption in _valid_combinations():
        eng = Engine.from_overrides(
            [
                "progress=false",
                f"+quantizer={quantizer}",
                f"+allocator={allocator}",
                f"+prefix={prefix}",
                f"+eviction={eviction}",
                f"+preemption={preemption}",
                *(["eviction.window=48"] if eviction == "sliding_window" else []),
                "model.max_model_len=240",
                "workload=unique",
                "workload.num_requests=12",
                "cache.num_blocks=40",
                "cache.watermark=0",
            ]
        )
        driver = WorkloadDriver(eng)
        driver.add_workload()
        while eng.has_unfinished_requests():
            eng.step()
            eng.check_integrity()
        summary = eng.summary()
        assert summary["num_requests_finished"] == 12, (allocator, prefix, eviction, preemption)
        assert eng.describe()["kv_bytes_per_token"] == eng.kv_spec.bytes_per_token
        num_preemptions += summary["num_preemptions_total"]
    assert num_preemptions > 0  # the pool is tight enough to matter

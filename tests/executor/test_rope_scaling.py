"""Llama 3.1's rope scaling on the torch executor: a model folder whose config.json spells
it as Meta's does (``rope_scaling`` of type ``llama3`` beside ``rope_theta``) runs with
greedy tokens equal to transformers' on the same folder; its frequencies at the preset's
full size are transformers' to the bit; a rope type enginekit does not implement is
refused naming it, never run as plain rope."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch_helpers import hf_generate, prompts, saved_engine

from enginekit import SamplingParams
from enginekit.errors import ConfigError
from enginekit.models.arch import ModelArch, RopeConfig
from enginekit.models.rope import inverse_frequencies
from enginekit.models.tiny import llama_config, random_state_dict
from enginekit.spec.model import LLAMA_3_1_ROPE_SCALING, PRESET_ROPE, ModelShape, model_preset

NEW_TOKENS = 16

SMALL = ModelShape(
    name="small-llama-3.1",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=96,
    vocab_size=256,
    max_model_len=512,
    dtype="float32",
)

# Llama 3.1's scaling with an original context of 16 positions instead of 8,192, so that
# it changes most frequencies of a 32-wide head (every wavelength above 16 positions is
# stretched 8x, those between 4 and 16 blended) and matters for prompts of a few dozen
# tokens.
SCALING = {**LLAMA_3_1_ROPE_SCALING, "original_max_position_embeddings": 16}


def small_config(**rope: Any) -> dict[str, Any]:
    """config.json of SMALL as Meta writes Llama 3.1's (transformers 4 spelling)."""
    settings = {"rope_theta": 500000.0, "rope_scaling": SCALING, **rope}
    return llama_config(SMALL, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, **settings)


def write_folder(folder: Path, config: dict[str, Any], seed: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(random_state_dict(config, seed), str(folder / "model.safetensors"))
    return folder


def transformers_greedy(folder: Path, prompt: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    return hf_generate(model, prompt, NEW_TOKENS)


@pytest.fixture(scope="module")
def scaled_folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("llama31") / "small-llama-3.1", small_config())


@pytest.fixture(scope="module")
def batch() -> list[list[int]]:
    """Six prompts of 31 to 59 tokens sharing 30: past 16 positions, where the scaling
    stretches every low frequency."""
    return prompts(SMALL.vocab_size, shared=30, seed=7)


@pytest.fixture(scope="module")
def expected(scaled_folder, batch) -> list[list[int]]:
    return [transformers_greedy(scaled_folder, p) for p in batch]


def test_the_folder_reads_as_llama3_scaling():
    config = json.loads(json.dumps(small_config()))
    assert ModelArch.from_hf_config(config).rope == RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
    )


@pytest.mark.parametrize("prefix", ["none", "radix"])
def test_greedy_tokens_equal_transformers_on_the_same_folder(
    scaled_folder, batch, expected, prefix
):
    engine = saved_engine(scaled_folder, f"+prefix={prefix}")
    assert engine.executor.model.arch.rope.rope_type == "llama3"
    ids = [
        engine.add_request(p, SamplingParams(max_tokens=NEW_TOKENS), request_id=str(i))
        for i, p in enumerate(batch)
    ]
    while engine.has_unfinished_requests():
        engine.step()
    assert [engine.output(r).output_token_ids for r in ids] == expected


def test_the_scaling_changes_the_tokens(tmp_path, batch, expected):
    """The same weights under plain rope at the same theta generate other tokens, so the
    equality above would catch a scaling read but not applied."""
    plain = small_config(rope_scaling=None)
    folder = write_folder(tmp_path / "plain", plain)
    unscaled = [transformers_greedy(folder, p) for p in batch]
    assert unscaled != expected


def test_the_preset_frequencies_are_transformers_own():
    """Llama 3.1's config at the preset's full size (head_dim 128, theta 500000, factor 8
    from 8,192 positions): inverse frequencies equal to transformers' bit for bit."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    shape = model_preset("llama-3.1-8b")
    config = llama_config(shape, **PRESET_ROPE["llama-3.1-8b"])
    arch = ModelArch.from_hf_config(config)
    settings = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype")}
    hf_inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**settings), "cpu")
    ours = inverse_frequencies(arch.rope, shape.head_dim)
    assert attention_factor == 1.0
    assert torch.equal(ours, hf_inv_freq)
    # Scaled indeed: the lowest frequency is 8x below plain rope's, the highest unchanged.
    plain = inverse_frequencies(RopeConfig(theta=500000.0), shape.head_dim)
    assert ours[0] == plain[0]
    assert ours[-1] == plain[-1] / 8


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 32}},
            "config.json's rope_scaling has rope type 'yarn', which enginekit does not "
            "implement (it implements default, linear, llama3)",
        ),
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "config.json's rope_scaling has rope type 'dynamic', which enginekit does not "
            "implement (it implements default, linear, llama3)",
        ),
        (
            {"rope_scaling": None,
             "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}},
            "config.json's rope_parameters has rope type 'longrope', which enginekit does "
            "not implement (it implements default, linear, llama3)",
        ),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "config.json's rope_scaling of rope type 'llama3' lacks low_freq_factor, "
            "high_freq_factor, original_max_position_embeddings",
        ),
        (
            {"rope_scaling": "llama3"},
            "config.json's rope_scaling must be an object, got 'llama3'",
        ),
        (
            {"partial_rotary_factor": 0.5},
            "config.json's partial_rotary_factor 0.5 is not implemented (enginekit rotates "
            "the whole head)",
        ),
    ],
    ids=["yarn", "dynamic", "longrope-v5-spelling", "llama3-incomplete", "not-an-object",
         "partial-rotary"],
)  # fmt: skip
def test_a_rope_enginekit_does_not_implement_is_refused_naming_it(tmp_path, rope, message):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(small_config(**rope)))
    with pytest.raises(ConfigError) as info:
        saved_engine(folder)
    assert str(info.value) == f"model.path={str(folder)!r}: {message}"

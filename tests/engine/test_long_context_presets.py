"""The 128K-context presets llama-3.1-8b and llama-3.1-70b: Llama 3's shapes with Llama
3.1's context and rotary settings; the simulator serves a prompt that fills the context,
and a context above a model's own is refused naming the preset that has it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from enginekit import Engine, SamplingParams
from enginekit.errors import ConfigError, RequestRejectedError
from enginekit.spec.model import LLAMA_3_1_ROPE_SCALING, MODEL_PRESETS, PRESET_ROPE, model_preset


@pytest.mark.parametrize(("name", "base"), [("llama-3.1-8b", "llama-3-8b"),
                                            ("llama-3.1-70b", "llama-3-70b")])  # fmt: skip
def test_llama_3_1_is_llama_3_at_a_128k_context(name, base):
    preset = model_preset(name)
    assert preset.max_model_len == 131072
    assert preset == dataclasses.replace(model_preset(base), name=name, max_model_len=131072)
    assert PRESET_ROPE[name] == {"rope_theta": 500000.0, "rope_scaling": LLAMA_3_1_ROPE_SCALING}
    assert PRESET_ROPE[base] == {"rope_theta": 500000.0}


def test_llama_3_1_rope_scaling_is_meta_s():
    assert LLAMA_3_1_ROPE_SCALING == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def test_every_preset_has_its_rotary_settings():
    assert set(PRESET_ROPE) == set(MODEL_PRESETS)


def test_the_whole_context_is_served():
    """A 131,000-token prompt and 72 tokens of output fill the 131,072-token context
    exactly; one token more is refused."""
    engine = Engine.from_overrides(
        ["model=llama-3.1-8b", "model.max_model_len=131072", "progress=false"]
    )
    assert engine.max_model_len == 131072
    prompt = np.arange(131000, dtype=np.int32) % 128000
    with pytest.raises(RequestRejectedError, match=r"= 131073 exceeds the model's context"):
        engine.add_request(prompt, SamplingParams(max_tokens=73))
    request_id = engine.add_request(prompt, SamplingParams(max_tokens=72))
    while engine.has_unfinished_requests():
        engine.step()
    output = engine.output(request_id)
    assert len(output.output_token_ids) == 72
    assert output.finish_reason == "length"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model=llama-3-8b", "model.max_model_len=131072"],
            "model.max_model_len=131072 is more than llama-3-8b's own context of 8192 tokens "
            "(model.max_model_len must be in [1, 8192]); for this shape with a longer "
            "context choose model=llama-3.1-8b",
        ),
        (
            ["model=llama-3-70b", "model.max_model_len=16384"],
            "model.max_model_len=16384 is more than llama-3-70b's own context of 8192 tokens "
            "(model.max_model_len must be in [1, 8192]); for this shape with a longer "
            "context choose model=llama-3.1-70b",
        ),
        (
            ["model=llama-3.1-8b", "model.max_model_len=131073"],
            "model.max_model_len=131073 is more than llama-3.1-8b's own context of 131072 "
            "tokens (model.max_model_len must be in [1, 131072])",
        ),
        (
            ["model=llama-3.1-8b", "model.max_model_len=0"],
            "model.max_model_len must be >= 1, got 0",
        ),
    ],
    ids=["llama-3-8b", "llama-3-70b", "llama-3.1-8b", "zero"],
)
def test_a_context_above_the_model_s_own_is_refused_naming_the_way_out(overrides, message):
    with pytest.raises(ConfigError) as info:
        Engine.from_overrides([*overrides, "progress=false"])
    assert str(info.value) == message

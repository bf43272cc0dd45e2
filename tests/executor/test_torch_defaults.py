"""What a run chooses when the config leaves it to the run: the model's dtype
(``model.dtype=auto``: the folder's config.json, the preset's) and the CPU threads
(``threads=auto``), and that the simulator counts the resolved dtype's bits."""

from __future__ import annotations

import json

import pytest
import torch
from torch_helpers import hf_config, hf_model

from enginekit import Engine
from enginekit.errors import ConfigError
from enginekit.models.tiny import random_state_dict

TINY = ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=16"]


@pytest.fixture(scope="module")
def folder_of(tmp_path_factory):
    """A saved tiny model whose config.json says ``torch_dtype`` (or ``dtype``) = the
    given name, or neither (None)."""
    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    base = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(base)

    def make(key: str | None, dtype: str | None):
        folder = tmp_path_factory.mktemp(f"tiny-{key}-{dtype}")
        for file in base.iterdir():
            (folder / file.name).write_bytes(file.read_bytes())
        settings = json.loads((base / "config.json").read_text())
        settings.pop("torch_dtype", None)
        settings.pop("dtype", None)
        if key is not None:
            settings[key] = dtype
        (folder / "config.json").write_text(json.dumps(settings))
        return folder

    return make


@pytest.mark.parametrize(
    ("key", "dtype", "expected"),
    [
        ("torch_dtype", "float32", "float32"),
        ("torch_dtype", "bfloat16", "bfloat16"),
        ("dtype", "float16", "float16"),
        (None, None, "float32"),  # what transformers loads a config without one in
    ],
)
def test_auto_runs_the_dtype_the_folder_says(folder_of, key, dtype, expected):
    folder = folder_of(key, dtype)
    eng = Engine.from_overrides(
        ["executor=torch", f"model.path={folder}", "progress=false", "cache.num_blocks=16"]
    )
    assert eng.describe()["dtype"] == expected
    assert eng.executor.kv_tensors.on_device.data.dtype == getattr(torch, expected)
    bits = 32 if expected == "float32" else 16
    assert eng.kv_spec.bytes_per_token == 2 * 2 * 2 * 16 * bits // 8  # layers, kv heads, dim


def test_an_explicit_dtype_overrides_the_folders(folder_of):
    folder = folder_of("torch_dtype", "float32")
    eng = Engine.from_overrides(
        ["executor=torch", f"model.path={folder}", "model.dtype=bfloat16", "progress=false",
         "cache.num_blocks=16"]
    )  # fmt: skip
    assert eng.describe()["dtype"] == "bfloat16"


def test_auto_refuses_a_folder_dtype_no_model_runs_in(folder_of):
    folder = folder_of("torch_dtype", "int8")
    with pytest.raises(ConfigError, match="model.dtype=auto.*'int8'"):
        Engine.from_overrides(["executor=torch", f"model.path={folder}", "progress=false"])
    with pytest.raises(ConfigError, match="model.dtype=float64"):
        Engine.from_overrides([*TINY, "model.dtype=float64"])


def test_tiny_runs_in_float32_by_default():
    eng = Engine.from_overrides(TINY)
    assert eng.config.model.dtype == "auto"
    assert eng.describe()["dtype"] == "float32"
    assert eng.kv_spec.bytes_per_token == 2 * 2 * 2 * 16 * 4


@pytest.mark.parametrize(
    ("model", "bits"),
    [("llama-3-8b", 16), ("llama-2-7b", 16), ("mistral-7b", 16), ("tiny", 32)],
)
def test_the_simulator_counts_the_presets_own_bits(model, bits):
    eng = Engine.from_overrides([f"model={model}", "progress=false", "cache.num_blocks=64"])
    shape = eng.shape
    assert eng.kv_spec.bytes_per_token == (
        2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * bits // 8
    )
    weight_gib = eng.describe()["weight_gib"]
    assert weight_gib == shape.num_params * (bits // 8) / (1 << 30)
    forced = Engine.from_overrides(
        [f"model={model}", "model.dtype=float32", "progress=false", "cache.num_blocks=64"]
    )
    assert forced.kv_spec.bytes_per_token == eng.kv_spec.bytes_per_token * 32 // bits


# -- threads --------------------------------------------------------------------------------


@pytest.fixture
def two_threads():
    """torch set to two intra-op threads, as a process starts on a machine with cores to
    spare; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_auto_threads_run_a_small_model_on_one_cpu_thread(two_threads):
    eng = Engine.from_overrides(TINY)
    assert eng.config.threads == "auto"
    assert torch.get_num_threads() == 1
    assert eng.describe()["threads"] == "1 (auto: hidden size 64 < 2048)"


def test_a_thread_count_is_taken_as_given(two_threads):
    torch.set_num_threads(1)
    eng = Engine.from_overrides([*TINY, "threads=2"])
    assert torch.get_num_threads() == 2
    assert eng.describe()["threads"] == "2"


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_thread_counts_are_refused(value, two_threads):
    with pytest.raises(ConfigError, match="threads must be auto or an integer >= 1"):
        Engine.from_overrides([*TINY, f"threads={value}"])

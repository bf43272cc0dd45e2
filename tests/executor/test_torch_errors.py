"""Configurations the torch side cannot run are refused up front with a message (a
ConfigError; the command line prints ``error: ...`` and exits 2), never a traceback from
deep inside a driver, a JSON parser or an allocator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from enginekit import Engine
from enginekit.errors import ConfigError

TINY = ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=16"]


def test_triton_kernels_on_a_cpu_are_refused_naming_the_way_out(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="kernels=triton needs a CUDA device") as info:
        Engine.from_overrides([*TINY, "kernels=triton"])
    assert "kernels=reference" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"model_type": "llama", ', "config.json cannot be read"),
        ("[1, 2]", "holds a list"),
        (
            json.dumps({"model_type": "llama", "num_attention_heads": "four",
                        "hidden_size": 64, "num_hidden_layers": 2}),
            "not a number",
        ),
    ],
    ids=["truncated", "not-an-object", "not-a-number"],
)  # fmt: skip
@pytest.mark.parametrize("executor", ["torch", "sim"])
def test_a_malformed_config_json_is_a_config_error(tmp_path, text, message, executor):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        Engine.from_overrides([f"executor={executor}", f"model.path={tmp_path}", "progress=false"])
    assert str(tmp_path) in str(info.value) or "config.json" in str(info.value)


def test_the_command_line_prints_the_error_and_exits_2(cli):
    result = cli("executor=torch", "model=tiny", "cache.num_blocks=1000000000", "progress=false")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: cache.num_blocks=1000000000 needs")
    assert "Traceback" not in result.stderr


def test_checking_the_stdlib_model_before_training_it_says_what_to_run(tmp_path):
    env = {**os.environ, "ENGINEKIT_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "train_stdlib_llama.py"), "--check"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "python3 tools/train_stdlib_llama.py" in result.stderr
    assert str(tmp_path) in result.stderr

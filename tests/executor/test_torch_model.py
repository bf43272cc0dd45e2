"""Our Llama-family forward against transformers on the same weights (fp32): every logit
of every position, with prompts split into chunks over a paged cache and decodes mixed in.

Tolerance: |ours - transformers| <= FP32_ATOL (2e-5) on logits of magnitude O(1)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch
from torch_helpers import FP32_ATOL, PagedSequences, hf_config, models

from enginekit.kernels.ops import REFERENCE_OPS


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("kind", ["tiny", "llama3", "llama_mqa", "qwen2", "mistral"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_chunked_paged_forward_matches_transformers(kind, block_size):
    hf, ours = models(kind)
    vocab = ours.arch.shape.vocab_size
    rng = random.Random(1)
    lens = [23, 7, 40, 9]
    prompts = {i: [rng.randrange(vocab) for _ in range(n)] for i, n in enumerate(lens)}
    expected = {i: hf_logits(hf, p) for i, p in prompts.items()}
    paged = PagedSequences(ours, block_size, num_blocks=64, seed=block_size)
    ops = REFERENCE_OPS

    def run(prefills, decodes):
        scheduled = paged.step(prefills, decodes)
        batch = paged.batch(scheduled, prompts, all_rows=True)
        logits = ours.forward(batch, paged.pool, ops)
        row = 0
        for seq_id, start, length in prefills:
            got = logits[row : row + length]
            want = expected[seq_id][start : start + length]
            torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0)
            row += length
        for seq_id, context_len in decodes:
            want = expected[seq_id][context_len - 1]
            torch.testing.assert_close(logits[row], want, atol=FP32_ATOL, rtol=0)
            row += 1

    # First chunks, some ending mid-block.
    run([(0, 0, 10), (2, 0, 13), (3, 0, 1)], [])
    # Chunks after a cached prefix, a new prompt, and decodes in the same step (the
    # "decoded" token is the next prompt token, so transformers' logits still apply).
    run([(0, 10, 13), (1, 0, 7)], [(2, 14), (3, 2)])
    run([(2, 14, 20)], [(3, 3)])
    for step in range(6):
        run([], [(2, 35 + step), (3, 4 + step)])


@pytest.mark.parametrize("kind", ["tiny", "llama3", "llama_mqa", "qwen2", "mistral", "biased"])
def test_parameter_names_and_shapes_are_transformers_own(kind):
    """The seeded weights are drawn by name and shape without transformers: those are
    exactly what transformers' model of the config holds (so the tiny model's weights are
    what they were when a transformers skeleton listed them)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from enginekit.models.tiny import llama_parameter_shapes

    if kind == "biased":
        config = LlamaConfig(
            **{**hf_config("llama_mqa").to_dict(), "attention_bias": True, "mlp_bias": True}
        )
    else:
        config = hf_config(kind)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    assert llama_parameter_shapes(config.to_dict()) == expected


def test_the_tiny_model_loads_without_importing_transformers():
    code = (
        "import sys\n"
        "from enginekit import Engine\n"
        "Engine.from_overrides(['executor=torch', 'model=tiny', 'progress=false',"
        " 'cache.num_blocks=8'])\n"
        "assert 'transformers' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_tiny_config_is_the_transformers_config():
    from enginekit.models.arch import ModelArch
    from enginekit.models.tiny import tiny_config, tiny_hf_config

    hf = ModelArch.from_hf_config(tiny_hf_config().to_dict(), name="tiny")
    assert ModelArch.from_hf_config(tiny_config(), name="tiny") == hf

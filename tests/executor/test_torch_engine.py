"""The torch executor end to end: greedy tokens equal transformers' ``generate`` on the same
weights loaded by path, across prefix-cache plugins, recompute preemption and prefix hits;
seeded sampling is reproducible; swaps and copies move whole blocks in contract order."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_helpers import hf_config, hf_generate, hf_model, prompts, saved_engine

from enginekit import Engine, SamplingParams
from enginekit.driver import WorkloadDriver
from enginekit.errors import ConfigError
from enginekit.executor.torch.kv_tensors import PagedKVTensors
from enginekit.kernels.ops import REFERENCE_OPS
from enginekit.models.tiny import random_state_dict
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.spec.quant import KVQuant
from enginekit.step import BlockCopy, BlockSwap

NEW_TOKENS = 20


@pytest.fixture(scope="module", params=["tiny", "qwen2"])
def saved_model(request, tmp_path_factory):
    """(folder, transformers model, memo of its greedy outputs) of a seeded model saved
    with save_pretrained."""
    config = hf_config(request.param)
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return folder, model, {}


def hf_greedy(model, prompt: list[int], memo: dict) -> list[int]:
    if tuple(prompt) not in memo:
        memo[tuple(prompt)] = hf_generate(model, prompt, NEW_TOKENS)
    return memo[tuple(prompt)]


@pytest.mark.parametrize(
    ("prefix", "preemption", "num_blocks"),
    [
        ("none", "recompute", 256),
        ("block_hash", "recompute", 256),
        ("radix", "recompute", 256),  # partial-block hits: copy-on-write block copies
        ("none", "recompute", 24),  # a pool this small forces preemptions
        ("block_hash", "recompute", 24),
        ("radix", "recompute", 24),
        # The swap plugin weighs PCIe time against recompute FLOPs; for a model this small
        # it recomputes, so this covers its path, not a swap (test_swaps_then_copies_...).
        ("block_hash", "swap", 24),
    ],
)
def test_greedy_tokens_equal_transformers_generate(saved_model, prefix, preemption, num_blocks):
    folder, model, memo = saved_model
    vocab = model.config.vocab_size
    eng = saved_engine(
        folder,
        f"+prefix={prefix}",
        f"+preemption={preemption}",
        *(["preemption.swap_space_gib=0.01"] if preemption == "swap" else []),
        f"cache.num_blocks={num_blocks}",
        "cache.watermark=0",
    )
    assert eng.executor.eos_token_id == 2
    # Two waves: the second finds the first's blocks of the shared prefix cached.
    waves = [prompts(vocab, shared=13, seed=1), prompts(vocab, shared=13, seed=1)[::-1]]
    outputs = []
    for wave, batch in enumerate(waves):
        ids = [
            eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS), request_id=f"{wave}-{i}")
            for i, p in enumerate(batch)
        ]
        while eng.has_unfinished_requests():
            eng.step()
            eng.check_integrity()
        outputs += [(eng.output(r), p) for r, p in zip(ids, batch, strict=True)]
    for out, prompt in outputs:
        assert out.output_token_ids == hf_greedy(model, prompt, memo), out.request_id
    preemptions = sum(out.num_preemptions for out, _ in outputs)
    cached = sum(out.num_cached_tokens for out, _ in outputs[len(waves[0]) :])
    assert (preemptions > 0) == (num_blocks == 24)
    assert (cached > 0) == (prefix != "none")


def test_tiny_default_path_runs_through_the_engine():
    eng = Engine.from_overrides(
        [
            "executor=torch",
            "model=tiny",
            "progress=false",
            "workload=unique",
            "workload.num_requests=4",
            "cache.num_blocks=512",
        ]
    )
    driver = WorkloadDriver(eng)
    driver.add_workload()
    result = driver.run()
    assert all(len(o.output_token_ids) >= 1 for o in result.outputs)
    assert eng.describe()["dtype"] == "float32"  # tiny's own (model.dtype=auto)


def test_torch_executor_needs_weights():
    with pytest.raises(ConfigError, match="model.path"):
        Engine.from_overrides(["executor=torch", "model=llama-2-7b", "cache.num_blocks=8"])


def run_sampled(seed_of) -> list[list[int]]:
    eng = Engine.from_overrides(
        [
            "executor=torch",
            "model=tiny",
            "progress=false",
            "model.dtype=float32",
            "cache.num_blocks=256",
        ]
    )
    for i, p in enumerate(prompts(512, shared=5, seed=4)):
        sampling = SamplingParams(
            max_tokens=12,
            temperature=0.9,
            top_k=40 * (i % 2),
            top_p=0.8 if i % 3 else 1.0,
            seed=seed_of(i),
            ignore_eos=True,
        )
        eng.add_request(p, sampling)
    return [o.output_token_ids for o in eng.run().outputs]


def test_seeded_sampling_is_reproducible():
    first = run_sampled(lambda i: 1000 + i if i % 2 else None)
    assert first == run_sampled(lambda i: 1000 + i if i % 2 else None)
    other = run_sampled(lambda i: 2000 + i if i % 2 else None)
    assert [o for i, o in enumerate(first) if i % 2] != [o for i, o in enumerate(other) if i % 2]
    assert [o for i, o in enumerate(first) if not i % 2] == [
        o for i, o in enumerate(other) if not i % 2
    ]


@pytest.mark.parametrize("quant", [KVQuant(), KVQuant("fp8"), KVQuant.int4(4, 4, 16)])
def test_swaps_then_copies_in_contract_order(quant):
    """Whole blocks move, int4 scales and zero points with them."""
    spec = KVSpec.of(model_preset("tiny"), bits_per_element=32, block_size=4, quant=quant)
    tensors = PagedKVTensors(spec, 8, 4, torch.float32, torch.device("cpu"), REFERENCE_OPS)
    for t in tensors.on_device.block_tensors:
        t.copy_(torch.randint(0, 100, t.shape).to(t.dtype))
    before = [t.clone() for t in tensors.on_device.block_tensors]
    tensors.apply([BlockSwap(3, 0), BlockSwap(5, 1)], [], [])
    # Device block 3 is reused at once: host 1 (old block 5) comes back into it.
    tensors.apply([BlockSwap(3, 2)], [BlockSwap(3, 1), BlockSwap(6, 0)], [BlockCopy(6, 7)])
    assert tensors.on_host is not None
    assert len(tensors.on_host.block_tensors) == len(before)
    for host, device, old in zip(
        tensors.on_host.block_tensors, tensors.on_device.block_tensors, before, strict=True
    ):
        assert torch.equal(host[2].float(), old[3].float())
        assert torch.equal(device[3].float(), old[5].float())
        assert torch.equal(device[6].float(), old[3].float())
        assert torch.equal(device[7].float(), old[3].float())


@pytest.mark.parametrize("prefix", ["none", "block_hash"])
def test_greedy_parallel_samples_all_equal_transformers_through_copy_on_write(saved_model, prefix):
    """n = 3 greedy samples fork from one prefill and share its blocks; each copies the
    partly filled last block before writing into it. Every sample must still produce
    transformers' greedy tokens, so the copies carried the right KV."""
    folder, model, memo = saved_model
    eng = saved_engine(folder, f"+prefix={prefix}", "cache.num_blocks=256")
    batch = [p for p in prompts(model.config.vocab_size, shared=6, seed=5, n=8) if len(p) % 4]
    assert len(batch) >= 3  # prompts that end inside a block
    for p in batch:
        eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS, n=3))
    outputs = eng.run().outputs
    for p, out in zip(batch, outputs, strict=True):
        assert out.samples == [hf_greedy(model, p, memo)] * 3


def test_seeded_parallel_samples_differ_and_reproduce():
    def run() -> list[list[int]]:
        eng = Engine.from_overrides(
            ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=256"]
        )
        sampling = SamplingParams(max_tokens=12, n=3, temperature=1.0, seed=7, ignore_eos=True)
        eng.add_request(prompts(512, 3, seed=6, n=1)[0], sampling)
        return eng.run().outputs[0].samples

    first = run()
    assert first == run()
    assert len({tuple(s) for s in first}) == 3


def hf_beam_search(model, prompt: list[int], width: int, steps: int) -> list[list[int]]:
    """Beam search on transformers' forward with no cache at all (every step recomputes
    every beam from its first token), by enginekit's rule: keep the ``width`` continuations
    of highest total log-probability (ties: earlier beam, then likelier token). Returns the
    beams' outputs, best first."""
    beams = [(0.0, list(prompt))]
    with torch.no_grad():
        for _ in range(steps):
            options = []
            for b, (score, seq) in enumerate(beams):
                logits = model(torch.tensor([seq])).logits[0, -1].float()
                top = torch.topk(torch.log_softmax(logits, dim=-1), 2 * width)
                for c, (tok, lp) in enumerate(
                    zip(top.indices.tolist(), top.values.tolist(), strict=True)
                ):
                    options.append((score + lp, b, c, [*seq, tok]))
            options.sort(key=lambda o: (-o[0], o[1], o[2]))
            beams = [(o[0], o[3]) for o in options[:width]]
    return [seq[len(prompt) :] for _, seq in beams]


@pytest.mark.parametrize("num_blocks", [256, 40])  # 40 blocks force the beams out and back
def test_beam_search_equals_a_cacheless_beam_search_on_transformers(saved_model, num_blocks):
    folder, model, _ = saved_model
    eng = saved_engine(folder, "+prefix=block_hash", f"cache.num_blocks={num_blocks}")
    batch = prompts(model.config.vocab_size, shared=5, seed=8, n=3)
    for p in batch:
        eng.add_request(p, SamplingParams(max_tokens=10, beam_width=3, n=3, ignore_eos=True))
    outputs = eng.run().outputs
    for p, out in zip(batch, outputs, strict=True):
        assert out.samples == hf_beam_search(model, p, width=3, steps=10)


def test_a_beam_whose_parent_finishes_in_the_step_that_forks_it_runs_on():
    """A beam search of two tokens beside a longer request: the step that forks the beams
    also lists their parent as finished; the executor forks before it forgets."""
    eng = Engine.from_overrides(
        ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=256"]
    )
    beam = SamplingParams(max_tokens=2, ignore_eos=True, beam_width=2)
    eng.add_request([133, 378, 485, 67, 13, 480, 265, 239, 196], beam)
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))
    outputs = eng.run().outputs
    assert [len(o.output_token_ids) for o in outputs] == [2, 8]


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_swapped_out_and_back_sequences_continue_as_if_never_preempted(saved_model, allocator):
    """Swap made cheap so the swap plugin always swaps (for a model this small its cost
    model would recompute): every preempted sequence's KV goes to the host pool and back,
    and the tokens still equal transformers' greedy ones. (A contiguous slab is reserved
    whole at admission, so that allocator never preempts: there it checks the tokens.)"""
    folder, model, memo = saved_model
    eng = saved_engine(
        folder,
        f"+allocator={allocator}",
        "+prefix=none",
        "+preemption=swap",
        "preemption.swap_space_gib=0.01",
        "model.max_model_len=64",  # contiguous slabs of 16 blocks: 3 fit the pool
        "cache.num_blocks=48" if allocator == "contiguous" else "cache.num_blocks=24",
        "cache.watermark=0",
    )
    policy = eng.scheduler.preemption
    policy.costs = dataclasses.replace(policy.costs, swap_s_per_block=1e-12)
    batch = prompts(model.config.vocab_size, shared=13, seed=1)
    ids = [eng.add_request(p, SamplingParams(max_tokens=NEW_TOKENS)) for p in batch]
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    summary = eng.summary()
    if allocator == "paged":
        assert summary["num_preemptions_by_kind"].get("swap", 0) > 0
        assert summary["swap_in_bytes_total"] == summary["swap_out_bytes_total"] > 0
    for request_id, prompt in zip(ids, batch, strict=True):
        assert eng.output(request_id).output_token_ids == hf_greedy(model, prompt, memo)


def _save_word_tokenizer(folder, vocab_size: int):
    """A word-level tokenizer ("w<id>" is token id), built offline and saved beside the
    weights as a Hugging Face folder holds one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)


def test_text_prompts_use_the_tokenizer_of_the_model_folder(tmp_path):
    config = hf_config("tiny")
    model = hf_model(config, random_state_dict(config, seed=3))
    folder, memo = tmp_path / "llama", {}
    model.save_pretrained(folder)
    _save_word_tokenizer(folder, model.config.vocab_size)
    eng = saved_engine(folder, "cache.num_blocks=64")
    text = "w5 w17 w3 w300 w41 w41 w9"
    request_id = eng.add_request(text, SamplingParams(max_tokens=NEW_TOKENS))
    eng.run()
    out = eng.output(request_id)
    assert out.prompt_token_ids == [5, 17, 3, 300, 41, 41, 9]
    assert out.output_token_ids == hf_greedy(model, out.prompt_token_ids, memo)
    words = [f"w{t}" for t in out.output_token_ids if t > 2]
    assert eng.decode(out.output_token_ids).split() == words


def test_tiny_takes_text_through_its_sentencepiece_vocabulary_other_folderless_models_refuse():
    from enginekit.tokenizer import SentencePieceTokenizer

    eng = Engine.from_overrides(
        ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=16"]
    )
    request_id = eng.add_request("hello world", SamplingParams(max_tokens=2))
    expected = SentencePieceTokenizer().encode("hello world")
    assert eng.output(request_id).prompt_token_ids == expected and expected[0] == 1  # BOS
    sim = Engine.from_overrides(["model=llama-3-8b", "progress=false"])
    with pytest.raises(ConfigError, match="128256 ids are not the SentencePiece"):
        sim.add_request("hello", SamplingParams(max_tokens=2))

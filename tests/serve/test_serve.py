"""The HTTP server on the torch executor, through the real ``openai`` client on loopback:
completions and chat, streaming and not, ``n=2``, stop strings and stop tokens, greedy
tokens equal to the offline ``Engine`` API's, 64 concurrent streams, disconnects that
release their blocks, OpenAI-shaped errors, and ``/metrics`` counters that equal the
engine's summary.

The model is the tiny Llama saved as a Hugging Face folder with a word-level tokenizer
("w<id>" is token id) and a chat template, so that text, chat and token ids all apply.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enginekit import Engine, SamplingParams
from enginekit.app import compose_config
from enginekit.config import PLUGIN_GROUPS
from enginekit.serve import BackgroundServer, Server

MAX_TOKENS = 12
# Roles as words of the vocabulary; the reply starts after "w5" (the assistant's).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'w3', 'user': 'w4', 'assistant': 'w5'}[m['role']] }}"
    " {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w5{% endif %}"
)


def save_model_folder(folder: Path, *, weights: bool = True, chat_template: bool = True) -> Path:
    """The tiny Llama as a Hugging Face folder: config.json, seeded weights (for the
    torch executor; the simulator reads the config only) and a word-level tokenizer
    whose "w<id>" is token id <id> (0-2 are <unk>, <s>, </s>), with or without a chat
    template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from enginekit.models.tiny import tiny_config

    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        from safetensors.torch import save_file

        from enginekit.models.tiny import random_state_dict

        save_file(random_state_dict(config, seed=3), str(folder / "model.safetensors"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, config["vocab_size"])})
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def words(token_ids: list[int]) -> list[str]:
    """The words the tokenizer decodes ``token_ids`` to (special tokens skipped)."""
    return [f"w{t}" for t in token_ids if t > 2]


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` parsed by prometheus-client's parser: sample name with its labels
    (``name{k="v"}``) -> value. Every sample has the ``model_name`` label, and vLLM's
    theirs and ``engine="0"``; the key leaves them out."""
    text = httpx.get(f"{url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("model_name"), sample
            if sample.name.startswith("vllm:"):
                assert labels.pop("engine") == "0", sample
            shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            values[f"{sample.name}{{{shown}}}" if shown else sample.name] = sample.value
    return values


def wait_until_idle(url: str, timeout_s: float = 20.0) -> dict[str, float]:
    """The metrics once no request runs or waits (the engine loop has caught up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape(url)
        idle = metrics["vllm:num_requests_running"] == 0
        if idle and metrics["vllm:num_requests_waiting"] == 0:
            return metrics
        assert time.monotonic() < deadline, metrics
        time.sleep(0.02)


OVERRIDES = [
    "executor=torch",
    "model.dtype=float32",
    "cache.block_size=4",
    "cache.num_blocks=400",
    "+prefix=radix",
    "progress=false",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_model_folder(tmp_path_factory.mktemp("tiny-served"))


@pytest.fixture(scope="module")
def served(folder):
    """(base URL, the Server) of the torch executor on the saved folder."""
    server = Server(compose_config([*OVERRIDES, f"model.path={folder}", "serve.port=0"]))
    with BackgroundServer(server) as running:
        yield running.url, server


@pytest.fixture(scope="module")
def offline(folder) -> Engine:
    """An engine of the same config, driven through the Python API."""
    return Engine.from_overrides([*OVERRIDES, f"model.path={folder}"])


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(served) -> str:
    return served[1].model_name


def run_offline(engine: Engine, prompt: list[int], **sampling: Any) -> list[list[int]]:
    """The samples the offline engine generates for ``prompt``."""
    request_id = engine.add_request(prompt, SamplingParams(**sampling))
    while engine.has_unfinished_requests():
        engine.step()
    return engine.output(request_id).samples


def test_models_and_health(served, client, model):
    url, _ = served
    assert [m.id for m in client.models.list().data] == [model]
    assert httpx.get(f"{url}/health").status_code == 200


def test_greedy_completions_equal_the_offline_engine(client, model, offline):
    texts = ["w5 w17 w3 w300 w41 w41 w9", "w8 w8 w8 w100"]
    ids = [[7, 9, 11, 13, 15, 17, 19], [400, 401, 402]]
    result = client.completions.create(
        model=model,
        prompt=texts,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in result.choices] == [0, 1]
    for choice, text in zip(result.choices, texts, strict=True):
        prompt = [int(w[1:]) for w in text.split()]  # this tokenizer adds no BOS
        assert choice.prompt_token_ids == prompt
        expected = run_offline(offline, prompt, max_tokens=MAX_TOKENS)[0]
        assert choice.token_ids == expected
        assert choice.text.split() == words(expected)
        assert choice.finish_reason == ("length" if len(expected) == MAX_TOKENS else "stop")
    for prompt in ids:  # token-id prompts, one per request
        choice = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"return_token_ids": True},
        ).choices[0]
        assert choice.token_ids == run_offline(offline, prompt, max_tokens=MAX_TOKENS)[0]
    usage = result.usage
    assert usage.prompt_tokens == sum(len(t.split()) for t in texts)
    assert usage.completion_tokens == sum(len(c.token_ids) for c in result.choices)


def test_streaming_completion_is_the_non_streaming_one_in_chunks(served, client, model):
    args = dict(model=model, prompt="w9 w10 w11", max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert sum((c.choices[0].token_ids for c in chunks), []) == whole.token_ids
    assert len(whole.token_ids) == MAX_TOKENS and len(chunks) == MAX_TOKENS  # one per step
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "length"]

    # the wire format: server-sent events, a usage chunk when asked, then [DONE]
    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    lines = httpx.post(f"{served[0]}/v1/completions", json=body).text.split("\n\n")
    events = [line for line in lines if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][len("data: ") :])
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 3
    assert usage["usage"]["completion_tokens"] == len(events) - 2


def test_chat_through_the_template_streaming_and_not(client, model, offline):
    messages = [
        {"role": "system", "content": "w40 w41"},
        {"role": "user", "content": "w50 w51 w52"},
    ]
    reply = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    choice = reply.choices[0]
    # the template's words, no BOS (the template writes what it needs)
    prompt = [3, 40, 41, 4, 50, 51, 52, 5]
    assert choice.prompt_token_ids == prompt
    expected = run_offline(offline, prompt, max_tokens=MAX_TOKENS)[0]
    assert choice.token_ids == expected
    assert choice.message.role == "assistant"
    assert choice.message.content.split() == words(expected)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(expected)

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_n_2_returns_the_offline_engines_seeded_samples(client, model, offline):
    prompt = [20, 21, 22, 23]
    sampling = dict(max_tokens=MAX_TOKENS, temperature=0.8, seed=7, n=2, ignore_eos=True)
    result = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0.8,
        seed=7,
        n=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    assert [c.index for c in result.choices] == [0, 1]
    samples = run_offline(offline, prompt, **sampling)
    assert [c.token_ids for c in result.choices] == samples
    assert samples[0] != samples[1]
    assert all(c.finish_reason == "length" for c in result.choices)
    assert result.usage.prompt_tokens == len(prompt)
    assert result.usage.completion_tokens == 2 * MAX_TOKENS

    streamed: dict[int, list[int]] = {0: [], 1: []}
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.8, seed=7, n=2,
        stream=True, extra_body={"return_token_ids": True, "ignore_eos": True},
    ):  # fmt: skip
        for choice in chunk.choices:
            streamed[choice.index] += choice.token_ids
    assert [streamed[0], streamed[1]] == samples


def test_stop_strings_and_stop_tokens_end_the_output(served, client, model):
    prompt = "w70 w71 w72"
    base = dict(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    extra = {"return_token_ids": True, "ignore_eos": True}
    full = client.completions.create(**base, extra_body=extra).choices[0]
    tokens = [t for t in full.token_ids]
    later = [t for t in tokens[4:] if t > 2 and f"w{t}" not in " ".join(words(tokens[:4]))]
    stop = f"w{later[0]}"
    before = scrape(served[0]).get('vllm:request_success_total{finished_reason="stop"}', 0)

    cut = client.completions.create(**base, stop=[stop, "never"], extra_body=extra).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    n = len(cut.token_ids)
    assert cut.token_ids == tokens[:n]
    assert stop in " ".join(words(tokens[:n])) and stop not in " ".join(words(tokens[: n - 1]))

    streamed = list(client.completions.create(**base, stop=stop, stream=True, extra_body=extra))
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    assert streamed[-1].choices[0].finish_reason == "stop"

    # the engine requests ended as finished, not aborted
    wait_until_idle(served[0])
    after = scrape(served[0])['vllm:request_success_total{finished_reason="stop"}']
    assert after >= before + 2

    by_token = client.completions.create(
        **base, extra_body={**extra, "stop_token_ids": [tokens[3]]}
    ).choices[0]
    first = tokens.index(tokens[3])
    assert by_token.token_ids == tokens[: first + 1] and by_token.finish_reason == "stop"


def test_errors_are_openai_shaped(served, client, model):
    def refused(status: int, **fields: Any) -> dict[str, Any]:
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(**{"model": model, "prompt": [5, 6], **fields})
        assert caught.value.status_code == status
        return caught.value.body

    error = refused(400, max_tokens=0)
    assert error["param"] == "max_tokens" and "max_tokens must be >= 1" in error["message"]
    assert refused(400, max_tokens=4, top_p=1.5)["param"] == "top_p"
    assert refused(400, max_tokens=4, extra_body={"top_k": -2})["param"] == "top_k"
    assert refused(400, max_tokens="8")["param"] == "max_tokens"  # strict: no strings
    assert refused(400, max_tokens=4, logit_bias={"5": 1.0})["param"] == "logit_bias"
    error = refused(404, model="another-model")
    assert error["code"] == "model_not_found" and error["param"] == "model"
    error = refused(400, prompt=[5] * 2040, max_tokens=16)
    assert "exceeds the model's context of 2048 tokens" in error["message"]
    error = refused(400, prompt=[5] * 1000, max_tokens=1000)
    assert "the whole cache has 400" in error["message"]
    error = refused(400, prompt=[5, 32000], max_tokens=4)
    assert "token ids must be in [0, 32000)" in error["message"] and error["param"] == "prompt"
    response = httpx.post(f"{served[0]}/v1/completions", content=b"{not json")
    assert response.status_code == 400 and "error" in response.json()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[], max_tokens=2)
    assert caught.value.body["param"] == "messages"
    rejected = scrape(served[0])
    assert rejected['enginekit:request_rejected_total{reason="unservable"}'] >= 3


def test_64_concurrent_streams_complete_and_leave_the_cache_empty(served, model, offline):
    url, _ = served
    prompts = [[30, 31, 32, 33, 34, 35, 36, 37, 38] + [40 + i, 41 + i] for i in range(64)]

    async def one(client: openai.AsyncOpenAI, prompt: list[int]) -> list[int]:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True,
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        tokens: list[int] = []
        async for chunk in stream:
            tokens += chunk.choices[0].token_ids
        return tokens

    async def all_of_them() -> list[list[int]]:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
            ),
        ) as client:  # fmt: skip
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(all_of_them())
    ids = [offline.add_request(p, SamplingParams(max_tokens=8)) for p in prompts]
    while offline.has_unfinished_requests():
        offline.step()
    assert results == [offline.output(i).output_token_ids for i in ids]
    metrics = wait_until_idle(url)
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics["vllm:num_requests_running"] == 0


def test_a_client_that_disconnects_leaves_no_block_held(served, model):
    url, server = served
    before = scrape(url).get('vllm:request_success_total{finished_reason="abort"}', 0)
    body = {"model": model, "prompt": [60, 61, 62], "max_tokens": 1500, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
        lines = response.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert len(got) == 3  # three chunks, then the client leaves
        running = scrape(url)
        assert running["vllm:num_requests_running"] == 1
        assert running["vllm:kv_cache_usage_perc"] > 0
    metrics = wait_until_idle(url)
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics['vllm:request_success_total{finished_reason="abort"}'] == before + 1

    # not streaming: the client gives up waiting
    body = {**body, "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
    metrics = wait_until_idle(url)
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics['vllm:request_success_total{finished_reason="abort"}'] == before + 2
    assert server.loop is not None
    server.loop.call(lambda engine: engine.check_integrity()).result(timeout=10)


def test_metrics_parse_and_their_counters_equal_the_engines_summary(served, client, model):
    url, _ = served
    metrics_before = wait_until_idle(url)
    summary_before = httpx.get(f"{url}/summary").json()["summary"]
    client.completions.create(model=model, prompt=[80, 81, 82, 83, 84, 85], max_tokens=4)
    client.completions.create(model=model, prompt=[80, 81, 82, 83, 84, 86], max_tokens=4)
    metrics = wait_until_idle(url)
    summary = httpx.get(f"{url}/summary").json()["summary"]
    pairs = {
        "vllm:prefix_cache_queries_total": "prefix_cache_queries",
        "vllm:prefix_cache_hits_total": "prefix_cache_hits",
        "vllm:num_preemptions_total": "num_preemptions_total",
        "enginekit:recomputed_tokens_total": "recomputed_tokens_total",
        "enginekit:swap_out_bytes_total": "swap_out_bytes_total",
    }
    assert {m: metrics[m] for m in pairs} == {m: summary[k] for m, k in pairs.items()}
    # Token counters count aborted requests' tokens too (the summary leaves those
    # requests out): over requests that finished, they move as the summary's do.
    for name, key in (("vllm:prompt_tokens_total", "prompt_tokens_total"),
                      ("vllm:generation_tokens_total", "generation_tokens_total")):  # fmt: skip
        assert metrics[name] - metrics_before[name] == summary[key] - summary_before[key] > 0
    assert metrics["vllm:prefix_cache_hits_total"] > 0  # the shared prefix hit
    finished = sum(v for k, v in metrics.items() if k.startswith("vllm:request_success"))
    aborted = metrics['vllm:request_success_total{finished_reason="abort"}']
    assert finished - aborted == summary["num_requests_finished"]
    assert metrics["vllm:e2e_request_latency_seconds_count"] == finished - aborted
    assert metrics["vllm:request_generation_tokens_sum"] == summary["generation_tokens_total"]
    assert metrics["enginekit:kv_cache_num_blocks"] == 400
    plugins = {k: v for k, v in metrics.items() if k.startswith("enginekit:plugin_info")}
    assert any('group="prefix"' in k and 'name="radix"' in k for k in plugins)
    assert len(plugins) == len(PLUGIN_GROUPS) and all(v == 1 for v in plugins.values())
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "request_prompt_tokens"):  # fmt: skip
        assert metrics[f"vllm:{name}_count"] > 0

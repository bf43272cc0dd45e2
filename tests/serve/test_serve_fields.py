"""Every field of vLLM's completions and chat requests, sent one at a time: the ones
enginekit serves answer 200 and do what they say, the others are refused with a 400 that
names them (never ignored); README's field table lists exactly these fields. Then what
the served fields do, exactly: logprobs and echoed prompt logprobs against transformers'
own log-softmax on the same weights, stop strings kept, min_tokens, truncation, beams,
request ids, usage in every chunk, and the tokenizer endpoints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_serve import OVERRIDES, save_model_folder

from enginekit import Engine, SamplingParams
from enginekit.app import compose_config
from enginekit.serve import BackgroundServer, Server
from enginekit.serve import fields as field_rules
from enginekit.serve.protocol import ChatCompletionRequest, CompletionRequest

README = Path(__file__).resolve().parents[2] / "README.md"
PROMPT = [5, 6, 7, 8, 9, 10]
MESSAGES = [{"role": "user", "content": "w7 w8"}]

# A value of each served field that asks for something (not its default), per endpoint.
SERVED_EXAMPLES: dict[str, Any] = {
    "model": None,  # filled in with the served name
    "prompt": "w5 w6 w7",
    "messages": [{"role": "user", "content": "w9"}],
    "max_tokens": 3,
    "max_completion_tokens": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.2,
    "n": 2,
    "stop": ["w11"],
    "stop_token_ids": [11],
    "include_stop_str_in_output": True,
    "min_tokens": 2,
    "seed": 7,
    "ignore_eos": True,
    "skip_special_tokens": False,
    "use_beam_search": True,
    "prompt_logprobs": 2,
    "truncate_prompt_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "request_id": "abc",
    "cache_salt": "salt",
    "user": "alice",
    "priority": 0,  # any other is refused under +queue=fcfs: test_serve_queue
    "echo": True,
    "logprobs": 2,  # chat: True (below)
    "top_logprobs": 2,
    "add_special_tokens": False,
    "add_generation_prompt": False,
    "continue_final_message": True,
    "chat_template_kwargs": {"unused": 1},
    "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "[0-9]{2}"},
    "guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "guided_regex": "[0-9]{2}",
    "guided_choice": ["yes", "no"],
    "guided_grammar": 'root ::= "yes" | "no"',
    "guided_decoding_backend": "xgrammar",
}
# Fields that need another alongside them to mean something.
COMPANIONS: dict[str, dict[str, Any]] = {
    "stream_options": {"stream": True},
    "top_logprobs": {"logprobs": True},
    "continue_final_message": {
        "add_generation_prompt": False,
        "messages": [*MESSAGES, {"role": "assistant", "content": "w12"}],
    },
    "use_beam_search": {"n": 2, "temperature": 0.0},
    "guided_decoding_backend": {"guided_regex": "[0-9]{2}"},
    # a grammar needs its stop token: min_tokens holds it off (refused together)
    **{
        name: {"max_tokens": 24}
        for name in (
            "response_format",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        )
    },
}
# A value of each refused field that asks for something.
REFUSED_EXAMPLES: dict[str, Any] = {
    "logit_bias": {"5": 10.0},
    "suffix": "w9",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "required",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "parallel_tool_calls": True,
    "reasoning_effort": "low",
    "include_reasoning": False,
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "w5"},
    "web_search_options": {},
    "metadata": {"k": "v"},
    "store": True,
    "service_tier": "flex",
    "best_of": 3,
    "prompt_embeds": "AAAA",
    "length_penalty": 0.5,
    "spaces_between_special_tokens": False,
    "allowed_token_ids": [5, 6],
    "bad_words": ["w5"],
    "logits_processors": ["my.Processor"],
    "guided_whitespace_pattern": " ",
    "structural_tag": "{}",
    "documents": [{"title": "t", "text": "w5"}],
    "chat_template": "{{ messages }}",
    "mm_processor_kwargs": {"k": 1},
    "media_io_kwargs": {"k": 1},
    "kv_transfer_params": {"k": 1},
    "vllm_xargs": {"k": 1},
    "thinking_token_budget": 10,
}


def served_fields(model: type[CompletionRequest] | type[ChatCompletionRequest]) -> set[str]:
    return set(model.model_fields)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_model_folder(tmp_path_factory.mktemp("tiny-fields"))


@pytest.fixture(scope="module")
def served(folder):
    """The tiny Llama's folder with a word-level tokenizer ("w<id>" is id <id>)."""
    server = Server(compose_config([*OVERRIDES, f"model.path={folder}", "serve.port=0"]))
    with BackgroundServer(server) as running:
        yield running.url, server


@pytest.fixture(scope="module")
def tiny_served():
    """The embedded tiny Llama, whose tokenizer is Mistral-7B's SentencePiece vocabulary
    (so that JSON, digits and words can be spelt)."""
    overrides = [*OVERRIDES, "model=tiny", "serve.port=0"]
    with BackgroundServer(Server(compose_config(overrides))) as running:
        yield running.url, running.server


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json=body, timeout=60)


def base_body(endpoint: str, model: str) -> dict[str, Any]:
    if endpoint == field_rules.COMPLETIONS:
        return {"model": model, "prompt": PROMPT, "max_tokens": 3}
    return {"model": model, "messages": MESSAGES, "max_tokens": 3}


ENDPOINTS = {
    field_rules.COMPLETIONS: ("completions", CompletionRequest),
    field_rules.CHAT: ("chat/completions", ChatCompletionRequest),
}


def test_every_field_has_an_example_and_no_field_is_both_served_and_refused():
    served = served_fields(CompletionRequest) | served_fields(ChatCompletionRequest)
    assert served == set(SERVED_EXAMPLES)
    assert set(field_rules.REFUSED) == set(REFUSED_EXAMPLES)
    assert not served & set(field_rules.REFUSED)


def test_readme_field_table_lists_exactly_the_fields():
    text = README.read_text()
    start = text.index("| fields | enginekit |")
    table = text[start : text.index("\n\n", start)]
    listed = set(re.findall(r"`([a-z_]+)`", table))
    served = served_fields(CompletionRequest) | served_fields(ChatCompletionRequest)
    assert listed == served | set(field_rules.REFUSED)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_each_served_field_answers_200(tiny_served, endpoint):
    url, server = tiny_served
    path, request_model = ENDPOINTS[endpoint]
    for name in sorted(served_fields(request_model)):
        body = base_body(endpoint, server.model_name)
        value = SERVED_EXAMPLES[name]
        if name == "model":
            value = server.model_name
        if name == "logprobs" and endpoint == field_rules.CHAT:
            value = True
        if name == "prompt_logprobs" or name == "echo":
            body["stream"] = False
        body.update(COMPANIONS.get(name, {}))
        body[name] = value
        reply = post(url, path, body)
        assert reply.status_code == 200, (name, reply.text)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_each_refused_field_is_a_400_naming_it(tiny_served, endpoint):
    url, server = tiny_served
    path, _ = ENDPOINTS[endpoint]
    for name, rule in sorted(field_rules.REFUSED.items()):
        body = {**base_body(endpoint, server.model_name), name: REFUSED_EXAMPLES[name]}
        reply = post(url, path, body)
        if endpoint not in rule.endpoints:  # another endpoint's field: ignored here
            assert reply.status_code == 200, (name, reply.text)
            continue
        assert reply.status_code == 400, (name, reply.text)
        error = reply.json()["error"]
        assert error["param"] == name and error["message"].startswith(name), error
        # its neutral values are taken
        for neutral in rule.neutral:
            reply = post(url, path, {**base_body(endpoint, server.model_name), name: neutral})
            assert reply.status_code == 200, (name, neutral, reply.text)


def test_a_misspelt_field_is_refused_naming_the_field_it_meant(served):
    url, server = served
    body = {**base_body("completions", server.model_name), "temprature": 0.5}
    error = post(url, "completions", body).json()["error"]
    assert error["param"] == "temprature" and "'temperature'" in error["message"]
    body = {**base_body("completions", server.model_name), "my_router_tag": "x"}
    assert post(url, "completions", body).status_code == 200  # a client's own key


def test_an_invalid_json_body_names_no_field(served):
    url = f"{served[0]}/v1/completions"
    headers = {"content-type": "application/json"}
    reply = httpx.post(url, content=b"{not json", headers=headers, timeout=30)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] is None
    assert "not valid JSON" in error["message"]
    for body in (b"{not json", b"[1, 2]"):  # not JSON, or not a JSON object
        error = httpx.post(url, content=body, timeout=30).json()["error"]
        assert error["param"] is None and "a JSON object" in error["message"], error


def test_model_may_be_left_out(served):
    url, server = served
    body = base_body("completions", server.model_name)
    del body["model"]
    reply = post(url, "completions", body)
    assert reply.status_code == 200 and reply.json()["model"] == server.model_name


# ---- what the served fields do --------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()


def hf_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax of every position's next-token logits [T, V]."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_completion_logprobs_and_echoed_prompt_logprobs_equal_transformers(served, hf_model):
    url, server = served
    body = {
        "model": server.model_name,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": 3,
        "echo": True,
        "return_token_ids": True,
    }
    choice = post(url, "completions", body).json()["choices"][0]
    output = choice["token_ids"]
    reference = hf_logprobs(hf_model, PROMPT + output)
    logprobs = choice["logprobs"]
    everything = PROMPT + output
    assert len(logprobs["tokens"]) == len(everything)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(everything)):
        expected = float(reference[position - 1, everything[position]])
        assert logprobs["token_logprobs"][position] == pytest.approx(expected, abs=1e-4)
        top = logprobs["top_logprobs"][position]
        best = torch.topk(reference[position - 1], 3)
        for token_id, value in zip(best.indices.tolist(), best.values.tolist(), strict=True):
            assert top[f"w{token_id}"] == pytest.approx(value, abs=1e-4)
        assert len(top) in (3, 4)  # the 3 most likely, and the token if it is not one
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_echo_with_max_tokens_0_scores_the_prompt_alone(served, hf_model):
    """lm-eval's loglikelihood request: the prompt's logprobs, nothing generated."""
    url, server = served
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 0, "echo": True,
            "logprobs": 1, "temperature": 0.0}  # fmt: skip
    reply = post(url, "completions", body).json()
    choice = reply["choices"][0]
    assert choice["text"].split() == [f"w{t}" for t in PROMPT]
    assert reply["usage"]["completion_tokens"] == 0
    reference = hf_logprobs(hf_model, PROMPT)
    expected = [None] + [float(reference[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(expected[1:], abs=1e-4)


def test_chat_logprobs_list_the_top_alternatives(served, hf_model):
    url, server = served
    body = {"model": server.model_name, "messages": MESSAGES, "max_tokens": 3,
            "temperature": 0.0, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True}  # fmt: skip
    choice = post(url, "chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    prompt = choice["prompt_token_ids"]
    reference = hf_logprobs(hf_model, prompt + choice["token_ids"])
    assert [c["token"] for c in content] == [f"w{t}" for t in choice["token_ids"]]
    for i, item in enumerate(content):
        row = reference[len(prompt) + i - 1]
        assert item["logprob"] == pytest.approx(float(row[choice["token_ids"][i]]), abs=1e-4)
        best = torch.topk(row, 2)
        assert [t["token"] for t in item["top_logprobs"]] == [
            f"w{t}" for t in best.indices.tolist()
        ]
        assert item["bytes"] == list(item["token"].encode())


def test_stop_strings_kept_deferred_by_min_tokens_and_prompts_truncated(served, folder):
    url, server = served
    offline = Engine.from_overrides([*OVERRIDES, f"model.path={folder}"])
    request_id = offline.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
    while offline.has_unfinished_requests():
        offline.step()
    words = [f"w{t}" for t in offline.output(request_id).samples[0]]
    # a stop string the whole output holds once ("w12" is also in "w123")
    index = next(i for i in (1, 2, 3) if " ".join(words).count(words[i]) == 1)
    stop = words[index]
    base = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 6,
            "temperature": 0.0, "ignore_eos": True, "stop": [stop]}  # fmt: skip
    cut = post(url, "completions", base).json()["choices"][0]
    assert cut["text"].split() == words[:index] and cut["finish_reason"] == "stop"
    kept = post(url, "completions", {**base, "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == cut["text"] + stop
    # min_tokens past the stop string: it is not looked for until then, so not met
    late = post(url, "completions", {**base, "min_tokens": index + 2}).json()["choices"][0]
    assert late["finish_reason"] == "length" and late["text"].split() == words
    truncated = post(url, "completions", {**base, "truncate_prompt_tokens": 2}).json()
    assert truncated["usage"]["prompt_tokens"] == 2


def test_beams_request_ids_and_usage_in_every_chunk(served, folder):
    url, server = served
    offline = Engine.from_overrides([*OVERRIDES, f"model.path={folder}"])
    request_id = offline.add_request(PROMPT, SamplingParams(max_tokens=3, n=2, beam_width=2))
    while offline.has_unfinished_requests():
        offline.step()
    beams = offline.output(request_id).samples
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 3, "n": 2,
            "use_beam_search": True, "return_token_ids": True, "request_id": "r-1"}  # fmt: skip
    reply = post(url, "completions", body).json()
    assert [c["token_ids"] for c in reply["choices"]] == beams
    assert reply["id"] == "cmpl-r-1"
    usage = {"include_usage": True, "continuous_usage_stats": True}
    stream = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 3, "stream": True,
              "stream_options": usage}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=stream, timeout=60) as response:
        chunks = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
        ]
    assert all("usage" in c for c in chunks)
    completion_tokens = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion_tokens == sorted(completion_tokens) and completion_tokens[-1] == 3


def test_tokenizer_endpoints_and_version(served):
    url, server = served
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": "w5 w6", "return_token_strs": True})
    assert tokens.json()["tokens"][-2:] == [5, 6] and tokens.json()["token_strs"][-1] == "w6"
    assert tokens.json()["count"] == len(tokens.json()["tokens"])
    chat = httpx.post(f"{url}/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == server.chat_prompt_ids(MESSAGES)
    text = httpx.post(f"{url}/detokenize", json={"tokens": [5, 6]}).json()["prompt"]
    assert text == "w5 w6"
    bad = httpx.post(f"{url}/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    info = httpx.get(f"{url}/tokenizer_info").json()
    assert info["eos_token"] == "</s>"
    assert httpx.get(f"{url}/version").json()["version"]
    head = httpx.head(f"{url}/metrics")
    assert head.status_code == 200 and head.content == b""


def test_structured_outputs_hold_through_every_spelling(tiny_served):
    """The random-weight model's free text is gibberish: outputs that match prove the
    constraint. Each field of vLLM's and OpenAI's spellings reaches the same grammar."""
    url, server = tiny_served
    base = {"model": server.model_name, "prompt": "Answer:", "max_tokens": 40}
    # a boolean: the random model would write an integer's digits until max_tokens
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    as_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    spellings = [
        ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, "regex"),
        ({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}, "regex"),
        ({"guided_choice": ["yes", "no"]}, "choice"),
        ({"guided_json": schema}, "schema"),
        ({"structured_outputs": {"json": schema}}, "schema"),
        ({"response_format": as_format}, "schema"),
        ({"response_format": {"type": "json_object"}}, "object"),
    ]  # fmt: skip
    for extra, kind in spellings:
        for path in ("completions", "chat/completions"):
            body = {**base, **extra}
            if path == "chat/completions":
                body = {**extra, "model": server.model_name, "max_tokens": 40,
                        "messages": [{"role": "user", "content": "Answer"}]}  # fmt: skip
            reply = post(url, path, body)
            assert reply.status_code == 200, (extra, reply.text)
            choice = reply.json()["choices"][0]
            text = choice["text"] if path == "completions" else choice["message"]["content"]
            if kind == "object":  # any keys: the random model may write one until cut
                assert text.startswith('{"'), text
                if choice["finish_reason"] == "stop":
                    assert isinstance(json.loads(text), dict)
                continue
            assert choice["finish_reason"] == "stop", (extra, text)
            if kind == "regex":
                assert re.fullmatch("[0-9]{3}-[a-z]{2}", text), text
            elif kind == "choice":
                assert text in ("yes", "no")
            else:
                value = json.loads(text)
                assert set(value) == {"a"} and isinstance(value["a"], bool)


def test_structured_output_errors_name_the_request_field(tiny_served, served):
    url, server = tiny_served
    base = {"model": server.model_name, "prompt": "Answer:", "max_tokens": 8}
    cases = [
        ({"guided_regex": "[0-9"}, "guided_regex"),  # does not compile
        ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),  # two at once
        ({"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        ({"guided_regex": "a", "min_tokens": 2}, "min_tokens"),
    ]
    for extra, param in cases:
        reply = post(url, "completions", {**base, **extra})
        assert reply.status_code == 400, (extra, reply.text)
        error = reply.json()["error"]
        assert error["param"] == param, (extra, error)
        assert "structured." not in error["message"], error  # the request's words


def test_logprobs_0_gives_each_token_its_own_logprob_and_no_alternatives(served):
    url, server = served
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 3, "logprobs": 0}
    logprobs = post(url, "completions", body).json()["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == 3
    assert all(isinstance(value, float) for value in logprobs["token_logprobs"])
    assert [list(top) for top in logprobs["top_logprobs"]] == [[t] for t in logprobs["tokens"]]

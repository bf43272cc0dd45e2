"""``/metrics`` as vLLM's dashboards and scrapers read it, parsed with prometheus-client's
text parser: vLLM's metrics under vLLM's names, types, labels and buckets, enginekit's
own under ``enginekit:``, ``model_name`` on every series, no NaN idle or busy, token
counters that move while a request streams, and histograms whose counts and sums are
those of the requests served (and of the engine's steps, as its summary counts them)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import scrape, wait_until_idle
from test_serve_sim import serve

MODEL = "tiny"

VLLM_GAUGES = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
               "cache_config_info"}  # fmt: skip
VLLM_COUNTERS = {"prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
                 "generation_tokens", "request_success"}  # fmt: skip
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)  # 1-2-5 up to tiny's context, 2048
VLLM_HISTOGRAMS = {
    "time_to_first_token_seconds": TTFT,
    "inter_token_latency_seconds": PER_TOKEN,
    "request_time_per_output_token_seconds": PER_TOKEN,
    "e2e_request_latency_seconds": REQUEST,
    "request_queue_time_seconds": REQUEST,
    "request_inference_time_seconds": REQUEST,
    "request_prefill_time_seconds": REQUEST,
    "request_decode_time_seconds": REQUEST,
    "request_prompt_tokens": TOKENS,
    "request_generation_tokens": TOKENS,
    "request_max_num_generation_tokens": TOKENS,
    "request_params_n": (1, 2, 5, 10, 20),
    "request_params_max_tokens": TOKENS,
    "iteration_tokens_total": (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
}


def families(url: str, created: bool = False) -> dict[str, Any]:
    """The metric families of ``/metrics`` by name (counters without ``_total``); with
    ``created``, also the ``_created`` timestamps prometheus-client writes beside each
    counter and histogram it keeps (vLLM's have them too), which the text format's
    parser reads as families of their own."""
    text = httpx.get(f"{url}/metrics").text
    found = {family.name: family for family in text_string_to_metric_families(text)}
    return {k: v for k, v in found.items() if created or not k.endswith("_created")}


def samples(url: str) -> list[Any]:
    return [s for family in families(url, created=True).values() for s in family.samples]


def check_every_series(url: str) -> None:
    """Every sample has the served model's name and a number."""
    for sample in samples(url):
        assert sample.labels.get("model_name") == MODEL, sample
        assert not math.isnan(sample.value), sample


def test_names_types_labels_and_buckets_are_vllms():
    with serve() as running:
        found = families(running.url)
        for name in VLLM_GAUGES:
            assert found[f"vllm:{name}"].type == "gauge", name
        for name in VLLM_COUNTERS:
            assert found[f"vllm:{name}"].type == "counter", name
        for name, buckets in VLLM_HISTOGRAMS.items():
            family = found[f"vllm:{name}"]
            assert family.type == "histogram", name
            bounds = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
            assert bounds == [*map(str, map(float, buckets)), "+Inf"], name
        vllm = {name for name in found if name.startswith("vllm:")}
        assert vllm == {f"vllm:{n}" for n in (*VLLM_GAUGES, *VLLM_COUNTERS, *VLLM_HISTOGRAMS)}
        assert all(name.startswith(("vllm:", "enginekit:")) for name in found)
        ours = {name.removeprefix("enginekit:") for name in found if name not in vllm}
        assert not ours & {name.removeprefix("vllm:") for name in vllm}  # one name each
        for sample in samples(running.url):
            if sample.name.startswith("vllm:"):
                assert sample.labels["engine"] == "0", sample
        reasons = [s.labels["finished_reason"] for s in found["vllm:request_success"].samples]
        assert reasons == ["abort", "length", "stop"]
        (info,) = found["vllm:cache_config_info"].samples
        assert info.value == 1
        assert {k: info.labels[k] for k in ("block_size", "num_gpu_blocks", "cache_dtype",
                                             "enable_prefix_caching")} == {
            "block_size": "16", "num_gpu_blocks": "4096", "cache_dtype": "auto",
            "enable_prefix_caching": "True",  # the default prefix cache
        }  # fmt: skip


def test_idle_every_series_has_the_model_name_and_no_nan():
    with serve() as running:
        check_every_series(running.url)
        metrics = scrape(running.url)
        assert metrics["enginekit:kv_cache_slot_utilization"] == 0  # no slot held
        assert metrics["vllm:kv_cache_usage_perc"] == 0


def test_token_counters_move_while_a_request_streams_and_count_it_once_aborted():
    # ~30 ms a step (tiny's 0.03 simulated ms, time_scale 0.001): the stream outlives the
    # scrapes by far, and closing it aborts the request
    with serve("serve.time_scale=0.001") as running:
        url = running.url
        before = scrape(url)
        prompt = list(range(10, 50))
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1500, "ignore_eos": True,
                "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = (line for line in response.iter_lines() if line)
            chunks = [next(lines) for _ in range(3)]
            assert all(chunk.startswith("data: {") for chunk in chunks)
            busy = scrape(url)
            check_every_series(url)
        assert busy["vllm:num_requests_running"] == 1
        assert busy["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == len(prompt)
        # the client read the third step's tokens: the second step's release is counted
        generated = busy["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        assert 2 <= generated < 1500
        assert busy["vllm:time_to_first_token_seconds_count"] == 1
        assert busy["vllm:inter_token_latency_seconds_count"] >= 1
        assert busy["vllm:iteration_tokens_total_count"] >= 2
        assert busy['vllm:request_success_total{finished_reason="abort"}'] == 0
        assert busy["enginekit:kv_cache_slot_utilization"] > 0
        done = wait_until_idle(url)
        assert done['vllm:request_success_total{finished_reason="abort"}'] == 1
        assert done["vllm:prompt_tokens_total"] == len(prompt)
        assert generated <= done["vllm:generation_tokens_total"] < 1500  # counted as produced
        assert done["vllm:e2e_request_latency_seconds_count"] == 0  # an abort is no finish
        check_every_series(url)


@pytest.mark.parametrize("prefix", ["none", "block_hash"])
def test_histograms_count_the_requests_served_and_the_counters_equal_the_summary(prefix):
    asked = [  # (prompt, n, max_tokens), one after the other
        ([5, 6, 7], 1, 1),
        ([5, 6, 7, 8, 9], 1, 12),
        (list(range(100, 140)), 2, 7),
        (list(range(100, 140)) + [3], 3, 30),  # the first 32 tokens are a prefix hit
    ]
    with serve(f"+prefix={prefix}", "serve.time_scale=100") as running:
        url = running.url
        for prompt, n, max_tokens in asked:
            body = {"model": MODEL, "prompt": prompt, "n": n, "max_tokens": max_tokens,
                    "ignore_eos": True}  # fmt: skip
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
            assert reply["usage"]["completion_tokens"] == n * max_tokens
        metrics = wait_until_idle(url)
        summary = httpx.get(f"{url}/summary").json()["summary"]
        check_every_series(url)
    num_prompt = sum(len(prompt) for prompt, _, _ in asked)
    num_generated = sum(n * max_tokens for _, n, max_tokens in asked)
    assert metrics["vllm:prompt_tokens_total"] == summary["prompt_tokens_total"] == num_prompt
    assert metrics["vllm:generation_tokens_total"] == summary["generation_tokens_total"]
    assert summary["generation_tokens_total"] == num_generated
    for name, key in (("prefix_cache_queries", "prefix_cache_queries"),
                      ("prefix_cache_hits", "prefix_cache_hits"),
                      ("num_preemptions", "num_preemptions_total")):  # fmt: skip
        assert metrics[f"vllm:{name}_total"] == summary[key], name
    assert metrics["vllm:prefix_cache_hits_total"] == (32 if prefix == "block_hash" else 0)
    assert metrics['vllm:request_success_total{finished_reason="length"}'] == len(asked)

    def histogram(name: str) -> tuple[float, float]:
        return metrics[f"vllm:{name}_count"], metrics[f"vllm:{name}_sum"]

    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "time_to_first_token_seconds"):  # fmt: skip
        assert histogram(name)[0] == len(asked), name
    assert histogram("request_prompt_tokens") == (len(asked), num_prompt)
    assert histogram("request_generation_tokens") == (len(asked), num_generated)
    longest = sum(max_tokens for _, _, max_tokens in asked)
    assert histogram("request_max_num_generation_tokens") == (len(asked), longest)
    assert histogram("request_params_n") == (len(asked), sum(n for _, n, _ in asked))
    assert histogram("request_params_max_tokens") == (len(asked), longest)
    # a release per step per request: every token of a sample but its first is one ITL
    assert histogram("inter_token_latency_seconds")[0] == longest - len(asked)
    assert histogram("request_time_per_output_token_seconds")[0] == len(asked) - 1
    computed = summary["prefill_tokens_computed"] + summary["decode_tokens_computed"]
    assert histogram("iteration_tokens_total") == (summary["num_steps"], computed)
    # the phases add up: TTFT = queue + prefill, inference = prefill + decode, and e2e =
    # queue + inference (a request that finishes in a step ends at its last token)
    ttft = histogram("time_to_first_token_seconds")[1]
    queue = histogram("request_queue_time_seconds")[1]
    prefill = histogram("request_prefill_time_seconds")[1]
    decode = histogram("request_decode_time_seconds")[1]
    inference = histogram("request_inference_time_seconds")[1]
    e2e = histogram("e2e_request_latency_seconds")[1]
    assert ttft == pytest.approx(queue + prefill, abs=1e-9)
    assert inference == pytest.approx(prefill + decode, abs=1e-9)
    assert e2e == pytest.approx(queue + inference, abs=1e-9)
    assert min(queue, prefill, decode) > 0

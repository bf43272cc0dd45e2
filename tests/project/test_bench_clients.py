"""``benchmarks/bench_clients.py``: each client's result file read into the same figures, the
server's ``/metrics`` read in both of its spellings, a client without an environment
reported as skipped, and a server subprocess whose counters and access log match what was
sent to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_clients  # noqa: E402
from bench_clients import AIPerf, GuideLLM, Stat, VllmBench  # noqa: E402

HISTOGRAM = """\
# TYPE {p}time_to_first_token_seconds histogram
{p}time_to_first_token_seconds_bucket{{{labels}le="0.01"}} 50.0
{p}time_to_first_token_seconds_bucket{{{labels}le="0.025"}} 99.0
{p}time_to_first_token_seconds_bucket{{{labels}le="0.05"}} 100.0
{p}time_to_first_token_seconds_bucket{{{labels}le="+Inf"}} 100.0
{p}time_to_first_token_seconds_sum{{{labels}}} 1.0
{p}time_to_first_token_seconds_count{{{labels}}} 100.0
# HELP {p}generation_tokens_total Output tokens of finished requests.
# TYPE {p}generation_tokens_total counter
{p}generation_tokens_total{{{labels}}} 640.0
"""


@pytest.mark.parametrize("prefix", ["enginekit:", "vllm:"])
def test_histogram_mean_is_sum_over_count_and_p99_interpolates_in_its_bucket(prefix):
    text = HISTOGRAM.format(p=prefix, labels="")
    families = bench_clients.metric_samples(text, served_model_name="llama-3-8b")
    stat = bench_clients.histogram_stat(families["time_to_first_token_seconds"])
    # mean 1.0 s / 100; the 99th of 100 samples is the last of the (10, 25] ms bucket's 49
    assert stat == Stat(pytest.approx(10.0), pytest.approx(25.0))
    assert bench_clients.counter_total(families["generation_tokens"]) == 640.0


def test_series_of_another_model_name_are_left_out():
    text = """\
# HELP vllm:e2e_request_latency_seconds Time from arrival to finish.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="llama-3-8b"} 4.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="llama-3-8b"} 4.0
vllm:e2e_request_latency_seconds_sum{model_name="llama-3-8b"} 2.0
vllm:e2e_request_latency_seconds_count{model_name="llama-3-8b"} 4.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="other"} 0.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="other"} 6.0
vllm:e2e_request_latency_seconds_sum{model_name="other"} 60.0
vllm:e2e_request_latency_seconds_count{model_name="other"} 6.0
# HELP vllm:request_success_total Requests ended.
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="length",model_name="llama-3-8b"} 4.0
vllm:request_success_total{finished_reason="abort",model_name="llama-3-8b"} 1.0
vllm:request_success_total{finished_reason="length",model_name="other"} 6.0
"""
    families = bench_clients.metric_samples(text, served_model_name="llama-3-8b")
    stat = bench_clients.histogram_stat(families["e2e_request_latency_seconds"])
    assert stat == Stat(pytest.approx(500.0), pytest.approx(990.0))  # 99% of (0, 1] s
    success = families["request_success"]
    assert bench_clients.counter_total(success, "finished_reason", ("stop", "length")) == 4.0


def test_bucket_quantile_beyond_the_last_finite_bound_is_that_bound():
    assert bench_clients._bucket_quantile(0.99, {0.1: 10.0, float("inf"): 100.0}, 100) == 0.1


def test_vllm_result_file(tmp_path):
    result = {
        "completed": 48, "total_input_tokens": 48000, "total_output_tokens": 6144,
        "duration": 12.5, "output_throughput": 491.52,
        "mean_ttft_ms": 30.0, "p99_ttft_ms": 41.0, "mean_itl_ms": 5.0, "p99_itl_ms": 9.0,
        "mean_tpot_ms": 5.1, "p99_tpot_ms": 5.5, "mean_e2el_ms": 670.0, "p99_e2el_ms": 700.0,
    }  # fmt: skip
    (tmp_path / VllmBench.result_file).write_text(json.dumps(result))
    figures = VllmBench().read(tmp_path)
    assert (figures.requests, figures.input_tokens, figures.output_tokens) == (48, 48000, 6144)
    assert figures.ttft_ms == Stat(30.0, 41.0)
    assert figures.itl_ms == Stat(5.0, 9.0)
    assert figures.e2e_ms == Stat(670.0, 700.0)
    assert figures.output_throughput == 491.52
    assert figures.notes == {"tpot_ms": {"mean": 5.1, "p99": 5.5}, "duration_s": 12.5}


def _guidellm_stat(mean, p99, count, total):
    return {"successful": {"mean": mean, "count": count, "total_sum": total,
                           "percentiles": {"p50": mean, "p99": p99}}}  # fmt: skip


def test_guidellm_result_file_gives_seconds_of_latency_in_milliseconds(tmp_path):
    metrics = {
        "request_latency": _guidellm_stat(0.75, 0.9, 8, 6.0),
        "prompt_token_count": _guidellm_stat(1000, 1000, 8, 8000),
        "output_token_count": _guidellm_stat(128, 128, 8, 1024),
        "time_to_first_token_ms": _guidellm_stat(90.0, 120.0, 8, 720.0),
        "inter_token_latency_ms": _guidellm_stat(5.5, 6.5, 1016, 5588.0),
        "time_per_output_token_ms": _guidellm_stat(6.2, 7.0, 1024, 6348.8),
        "output_tokens_per_second": _guidellm_stat(620.0, 2000.0, 1021, 0.0),
    }
    report = {"benchmarks": [{"metrics": metrics, "duration": 1.6}]}
    (tmp_path / GuideLLM.result_file).write_text(json.dumps(report))
    figures = GuideLLM().read(tmp_path)
    assert (figures.requests, figures.input_tokens, figures.output_tokens) == (8, 8000, 1024)
    assert figures.ttft_ms == Stat(90.0, 120.0)
    assert figures.itl_ms == Stat(5.5, 6.5)
    assert figures.e2e_ms == Stat(750.0, 900.0)
    assert figures.output_throughput == 620.0
    assert figures.notes == {"tpot_ms": {"mean": 6.2, "p99": 7.0}, "duration_s": 1.6}


def test_aiperf_result_file_is_found_under_the_artifact_folder(tmp_path):
    def stat(avg, p99=None, total=None):
        return {"unit": "ms", "avg": avg, "p99": p99, "sum": total}

    report = {
        "request_count": {"avg": 8.0}, "total_isl": {"avg": 7992.0}, "total_osl": {"avg": 1075.0},
        "time_to_first_token": stat(186.0, 225.0), "inter_token_latency": stat(6.7, 8.5),
        "request_latency": stat(1080.0, 1297.0), "output_token_throughput": {"avg": 463.5},
        "request_throughput": {"avg": 3.45}, "benchmark_duration": {"avg": 2.27},
        "usage_total_tokens": stat(1128.0, total=9024.0),
        "usage_prompt_tokens": stat(1000.0, total=8000.0),
        "inter_chunk_latency": stat(7.1, 41.4),
    }  # fmt: skip
    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-1" / AIPerf.result_file).write_text(json.dumps(report))
    figures = AIPerf().read(tmp_path)
    assert (figures.requests, figures.input_tokens, figures.output_tokens) == (8, 7992, 1075)
    assert figures.ttft_ms == Stat(186.0, 225.0)
    assert figures.itl_ms == Stat(6.7, 8.5)
    assert figures.e2e_ms == Stat(1080.0, 1297.0)
    assert figures.output_throughput == 463.5
    assert figures.notes["usage_prompt_tokens"] == 8000.0
    assert figures.notes["usage_completion_tokens"] == 1024.0


def _word_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A tokenizer folder whose "w<id>" is token id <id> (0-2: <unk>, <s>, </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    return folder


def test_served_folder_has_the_presets_shape_with_the_tokenizers_vocabulary(tmp_path):
    tokenizer = _word_tokenizer(tmp_path / "tokenizer", 600)
    folder = bench_clients.serving_model_folder(tokenizer, "llama-3-8b", tmp_path / "served")
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == 600
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (32, 8)
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert (folder / "tokenizer.json").exists()


def test_a_client_without_an_environment_is_reported_as_skipped(tmp_path, monkeypatch):
    monkeypatch.delenv("ENGINEKIT_VLLM_VENV", raising=False)
    tokenizer = _word_tokenizer(tmp_path / "tokenizer", 600)
    out, markdown = tmp_path / "clients.json", tmp_path / "clients.md"
    code = bench_clients.main([
        "--only", "vllm", "--tokenizer-folder", str(tokenizer), "--out", str(out),
        "--markdown", str(markdown), "--work-dir", str(tmp_path / "work"),
    ])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert report["clients"] == {
        "vllm bench serve": {"version": None, "skipped": "no environment given"}
    }
    assert [(r["concurrency"], r["skipped"]) for r in report["runs"]] == [
        (1, "no environment given"), (8, "no environment given"),
    ]  # fmt: skip
    assert "| vllm bench serve | 8 | – | no environment given |" in markdown.read_text()


def test_server_figures_count_what_was_sent_and_the_access_log_what_was_refused(tmp_path):
    overrides = ["executor=sim", "model=tiny", "serve.time_scale=1000"]
    server = bench_clients.ServerProcess(
        overrides, tmp_path / "server.log", dict(__import__("os").environ)
    )
    with server:
        prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
        for prompt in prompts:
            answer = httpx.post(f"{server.url}/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": 5, "ignore_eos": True,
            }, timeout=60)  # fmt: skip
            assert answer.status_code == 200, answer.text
        assert httpx.get(f"{server.url}/v1/nothing_here", timeout=10).status_code == 404
        figures = bench_clients.server_figures(server.url, "tiny")
    assert (figures.requests, figures.input_tokens, figures.output_tokens) == (3, 9, 15)
    assert figures.ttft_ms.mean is not None and figures.e2e_ms.mean is not None
    assert figures.notes["engine"]["ttft_ms"]["mean"] is not None
    assert server.refused() == {"GET /v1/nothing_here 404": 1}


def test_a_name_both_prefixes_spell_is_read_from_vllms():
    text = HISTOGRAM.format(p="vllm:", labels="") + HISTOGRAM.format(
        p="enginekit:", labels=""
    ).replace("640.0", "1.0")
    families = bench_clients.metric_samples(text, served_model_name="llama-3-8b")
    assert bench_clients.counter_total(families["generation_tokens"]) == 640.0

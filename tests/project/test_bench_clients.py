"""``benchmarks/bench_clients.py``: each client's result file read into the same figures, the
server's ``/metrics`` read in both of its spellings, a client without an environment
reported as skipped, and a server subprocess whose counters and access log match what was
sent to it."""

from __future__ import annotations

import json
import os
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
    assert stat == Stat(pytest.approx(10.0), pytest.approx(25.0), (10.0, 25.0))
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
    # 99% of the way through (0, 1] s
    assert stat == Stat(pytest.approx(500.0), pytest.approx(990.0), (0.0, 1000.0))
    success = families["request_success"]
    assert bench_clients.counter_total(success, "finished_reason", ("stop", "length")) == 4.0


def test_bucket_quantile_beyond_the_last_finite_bound_is_that_bound():
    buckets = {0.1: 10.0, float("inf"): 100.0}
    assert bench_clients._bucket_quantile(0.99, buckets, 100) == 0.1
    assert bench_clients._bucket_of(0.99, buckets, 100) == (0.1, float("inf"))


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
    assert figures.tpot_ms == Stat(5.1, 5.5)
    assert figures.e2e_ms == Stat(670.0, 700.0)
    assert figures.output_throughput == 491.52
    assert figures.notes == {"duration_s": 12.5}


def _guidellm_stat(mean, p99, count, total):
    return {"successful": {"mean": mean, "count": count, "total_sum": total,
                           "percentiles": {"p50": mean, "p99": p99}}}  # fmt: skip


def test_guidellm_result_file_gives_seconds_of_latency_in_milliseconds_and_its_itl_as_tpot(
    tmp_path,
):
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
    assert figures.itl_ms == Stat()  # guidellm reports no gap between chunks
    assert figures.tpot_ms == Stat(5.5, 6.5)  # its per-request inter-token latency
    assert figures.e2e_ms == Stat(750.0, 900.0)
    assert figures.output_throughput == 620.0
    assert figures.notes == {
        "latency_per_output_token_ms": {"mean": 6.2, "p99": 7.0, "p99_bucket": None},
        "duration_s": 1.6,
    }


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
    assert figures.itl_ms == Stat(7.1, 41.4)  # inter_chunk_latency: every gap
    assert figures.tpot_ms == Stat(6.7, 8.5)  # inter_token_latency: per request
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
    assert figures.tpot_ms.mean is not None
    # throughput: the server's wall rate, not the engine's per second of simulated time
    wall = figures.notes["wall"]
    assert figures.output_throughput == wall["output_tokens_per_s"] == 15 / wall["duration_s"]
    assert figures.notes["engine"]["ttft_ms"]["mean"] is not None
    assert server.refused() == {"GET /v1/nothing_here 404": 1}


def test_a_name_both_prefixes_spell_is_read_from_vllms():
    text = HISTOGRAM.format(p="vllm:", labels="") + HISTOGRAM.format(
        p="enginekit:", labels=""
    ).replace("640.0", "1.0")
    families = bench_clients.metric_samples(text, served_model_name="llama-3-8b")
    assert bench_clients.counter_total(families["generation_tokens"]) == 640.0


def test_aiperf_counts_output_tokens_by_the_servers_usage(tmp_path):
    load = bench_clients.Load(num_requests=4, concurrency=2, input_len=10, output_len=3)
    command = AIPerf().command(Path("aiperf"), "http://x", "m", tmp_path, load, tmp_path)
    assert "--use-server-token-count" in command


def _run(client: dict, server: dict) -> dict:
    engine = {"ttft_ms": {"mean": 20.0, "p99": 21.0}, "tpot_ms": {"mean": 3.0, "p99": 3.5},
              "e2e_ms": {"mean": 400.0, "p99": 410.0}, "output_tokens_per_s": 300.0}  # fmt: skip
    return {"client": "c", "concurrency": 1, "client_figures": client,
            "server": {**server, "engine": engine}}  # fmt: skip


def _figures(ttft: float, ttft_p99: float, itl: float | None, throughput: float, bucket=None):
    return {
        "ttft_ms": {"mean": ttft, "p99": ttft_p99, "p99_bucket": bucket},
        "itl_ms": {"mean": itl, "p99": None, "p99_bucket": None},
        "tpot_ms": {"mean": 4.0, "p99": None, "p99_bucket": None},
        "e2e_ms": {"mean": None, "p99": None, "p99_bucket": None},
        "output_throughput": throughput, "requests": 2, "input_tokens": 20,
        "output_tokens": 6,
    }  # fmt: skip


def test_the_table_compares_means_by_ratio_and_a_p99_with_the_servers_bucket():
    server = _figures(25.0, 30.0, 5.0, 250.0, bucket=(20.0, 40.0))
    table = bench_clients.markdown_table([
        _run(_figures(30.0, 45.0, 5.5, 200.0), server),
        _run(_figures(30.0, 35.0, 5.5, 200.0), server),
        _run(_figures(30.0, 20.0, 5.5, 200.0), server),
    ])  # fmt: skip
    rows = [line for line in table.splitlines() if line.startswith("| c | 1 |")]
    assert "| c | 1 | TTFT mean (ms) | 30.00 | 25.00 | 1.20 | 20.00 |" in rows
    p99s = [row for row in rows if row.startswith("| c | 1 | TTFT p99")]
    assert p99s == [
        "| c | 1 | TTFT p99 (ms) | 45.00 | (20, 40] | above | 21.00 |",
        "| c | 1 | TTFT p99 (ms) | 35.00 | (20, 40] | within | 21.00 |",
        "| c | 1 | TTFT p99 (ms) | 20.00 | (20, 40] | below | 21.00 |",
    ]
    assert "| c | 1 | output tok/s | 200 | 250 | 0.80 | 300 |" in rows


def test_ratio_ranges_take_the_chunk_itl_or_else_the_tpot():
    server = _figures(25.0, 30.0, 5.0, 250.0)
    runs = [
        _run(_figures(30.0, 0.0, 5.5, 200.0), server),
        _run(_figures(27.5, 0.0, None, 225.0), server),  # no chunk ITL: TPOT 4.0 / 4.0
        {"client": "c", "concurrency": 8, "skipped": "no environment given"},
    ]
    ranges = bench_clients.ratio_ranges(runs)
    assert ranges == {
        "ttft": (pytest.approx(1.1), pytest.approx(1.2)),
        "itl": (pytest.approx(1.0), pytest.approx(1.1)),
        "throughput": (pytest.approx(0.8), pytest.approx(0.9)),
    }


def test_split_context_moves_trailing_spaces_to_the_continuation(tmp_path):
    from transformers import AutoTokenizer

    folder = _word_tokenizer(tmp_path / "tokenizer", 600)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert bench_clients.split_context(tokenizer, "w5 w6 ", "w7 w8") == ([5, 6], [7, 8])


def test_lm_eval_check_agrees_with_the_torch_servers_echoed_logprobs_and_greedy_text(tmp_path):
    """The check lm-eval's answers get, fed what the torch server answers to lm-eval's
    requests (echo with logprobs, scored from the context on; greedy until a stop): the
    loglikelihoods equal transformers' on the same weights, and so do the generations."""
    tokenizer = _word_tokenizer(tmp_path / "tokenizer", 600)
    model = bench_clients.scoring_model_folder(tokenizer, tmp_path / "model")
    pairs = [("w5 w6 w7", " w8"), ("w9 w10", " w11 w12")]
    overrides = ["executor=torch", f"model.path={model}", "serve.served_model_name=m"]
    out = tmp_path / "lm_eval"
    out.mkdir()
    with bench_clients.ServerProcess(overrides, tmp_path / "server.log", dict(os.environ)) as s:
        choice_lines, generate_lines = [], []
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(tokenizer))
        responses = []
        for context, continuation in pairs:
            ids, rest = bench_clients.split_context(hf, context, continuation)
            answer = httpx.post(f"{s.url}/v1/completions", json={
                "model": "m", "prompt": ids + rest, "max_tokens": 1, "echo": True,
                "logprobs": 1, "temperature": 0,
            }, timeout=120).json()  # fmt: skip
            logprobs = answer["choices"][0]["logprobs"]["token_logprobs"][len(ids) : -1]
            responses.append([[str(sum(logprobs)), "False"]])
        choice_lines.append({
            "doc": {"answer": 0}, "resps": responses,
            "arguments": {f"gen_args_{i}": {"arg_0": c, "arg_1": r}
                          for i, (c, r) in enumerate(pairs)},
        })  # fmt: skip
        settings = {"until": ["\n"], "max_gen_toks": 4}
        for prompt in ("w20 w21", "w30"):
            answer = httpx.post(f"{s.url}/v1/completions", json={
                "model": "m", "prompt": hf(prompt, add_special_tokens=False).input_ids,
                "max_tokens": 4, "temperature": 0, "stop": ["\n"],
            }, timeout=120).json()  # fmt: skip
            assert answer["choices"][0]["text"].count(" w") == 4  # four words: no stop met
            generate_lines.append({
                "resps": [[answer["choices"][0]["text"]]],
                "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": settings}},
            })  # fmt: skip
    for task, lines in (("enginekit_choice", choice_lines), ("enginekit_generate", generate_lines)):
        (out / f"samples_{task}_1.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    check = bench_clients.lm_eval_check(model, tokenizer, out)
    assert check["choice"]["num_loglikelihoods"] == 2
    assert check["choice"]["max_abs_diff"] < 1e-4
    assert check["choice"]["num_greedy_equal"] == 2
    assert check["generate"] == {"num_docs": 2, "num_equal": 2}


def test_the_results_section_tabulates_the_report_and_is_carried_without_one(tmp_path, monkeypatch):
    """``results.py --clients FILE``: the section holds the table, lm-eval's metrics and
    their check, each command; its README row the ratio ranges. Without a report, the last
    results file's section is carried over whole, with the same row."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("results", None)
    import results

    server = _figures(25.0, 30.0, 5.0, 250.0)
    runs = [
        {**_run(_figures(30.0, 0.0, 5.5, 200.0), server), "command": "vllm bench serve"},
        {**_run(_figures(27.5, 0.0, None, 225.0), server), "concurrency": 8, "command": "x"},
    ]
    lm_eval = {
        "command": "lm_eval --model local-completions",
        "results": {"enginekit_choice": {"acc,none": 0.4},
                    "enginekit_generate": {"exact_match,none": 0.0}},
        "check": {"choice": {"num_loglikelihoods": 20, "max_abs_diff": 2e-6,
                             "num_greedy_equal": 20, "acc_transformers": 0.4},
                  "generate": {"num_docs": 5, "num_equal": 5}},
    }  # fmt: skip
    report = {
        "server_overrides": ["executor=sim"], "runs": runs, "lm_eval": lm_eval,
        "clients": {"vllm bench serve": {"version": "0.33.0"}, "lm-eval": {"version": None}},
        "load": {"num_requests": 2, "concurrency": [1, 8], "input_len": 10, "output_len": 3},
        "engine_commit": "0123456789abcdef", "machine": "2 CPU cores",
    }  # fmt: skip
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(report))
    text, (headline,) = results.clients_section(path)
    assert text.startswith(results.CLIENTS_HEADING + "\n")
    assert "| c | 1 | TTFT mean (ms) | 30.00 | 25.00 | 1.20 | 20.00 |" in text
    assert "| enginekit_choice | acc,none | 0.4 |" in text
    assert "- c at concurrency 8: `x`" in text and "- lm-eval: `lm_eval" in text
    assert "vllm bench serve 0.33.0, each unmodified" in text
    assert headline.figure == (
        "client / server, mean TTFT 1.10–1.20×, ITL 1.00–1.10×, output tok/s 0.80–0.90× "
        "(vLLM, guidellm, aiperf; concurrency 1, 8); lm-eval on a random small Llama: acc "
        "0.40, exact match 0.00 (loglikelihoods within 2e-06 of transformers', 5/5 "
        "generations the same)"
    )
    previous = f"# Results\n\n{text}\n## Next\n\nother\n"
    assert results.clients_section(None, previous) == (text, [headline])
    carried, rows = results.clients_section(None, "# Results\n")
    assert carried.startswith(results.CLIENTS_HEADING + "\n\nNot measured here") and rows == []


def test_the_report_names_no_folder_of_the_machine_that_ran_it():
    roots = {"/tmp/w": "WORK", "/tmp/w/venvs": "CLIENTS", "/repo/": ""}
    report = {"runs": [{"command": "/tmp/w/venvs/vllm/bin/vllm --dir /tmp/w/vllm-c1",
                        "include": "/repo/benchmarks/clients/lm_eval", "n": 3}]}  # fmt: skip
    assert bench_clients.portable(report, roots) == {"runs": [{
        "command": "CLIENTS/vllm/bin/vllm --dir WORK/vllm-c1",
        "include": "benchmarks/clients/lm_eval", "n": 3,
    }]}  # fmt: skip

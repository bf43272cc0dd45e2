"""The serving benchmarks inference engineers already use, run unmodified against enginekit's
server, their figures side by side with the server's own.

    python3 benchmarks/bench_clients.py --vllm VENV --guidellm VENV --aiperf VENV \\
        --lm-eval VENV --tokenizer-folder FOLDER

Each client runs through its own command line from a virtual environment of its own
(``--vllm``, ``--guidellm``, ``--aiperf``, ``--lm-eval``, or the environment variables
``ENGINEKIT_VLLM_VENV``, ... of ``VENV_VARIABLES``): ``vllm bench serve``, ``guidellm
run``, ``aiperf profile`` and ``lm_eval``. A client whose environment is not given or
lacks its command is reported as skipped. ``benchmarks/clients/README.md`` installs them.

The load generators (vLLM, guidellm, aiperf) each send ``--num-requests`` streaming
completions of random prompts (``--input-len`` tokens, ``--output-len`` tokens out,
``ignore_eos``) at each ``--concurrency``, to a fresh ``python3 -m enginekit.serve``
per run (by default the simulator: Llama-3-8B's shape on an H200, in real time). Each
client's own result file gives its TTFT, ITL (every gap between chunks) and TPOT (per
request) as the tool defines them, end-to-end latency (mean, p99) and throughput; the
server's ``/metrics`` after the run gives its histograms (mean = sum / count; p99 as the
bucket that holds it, and interpolated within it as Prometheus' ``histogram_quantile``
does) and its request and token counters, ``/summary``'s ``wall`` its output rate over
the wall-clock span from the first arrival to the last end (what a client divides by),
and ``/summary`` the engine's own figures (in the engine's time). lm-evaluation-harness's
``local-completions`` model runs the tasks of ``benchmarks/clients/lm_eval/`` (one
multiple-choice, scored by loglikelihoods; one ``generate_until``) against a torch server
of a small seeded random Llama with the same tokenizer (``--lm-eval-model``: another
folder); its logged answers are then checked against transformers on the same weights
(``lm_eval_check``).

The served model's folder is made from ``--tokenizer-folder`` (a Hugging Face tokenizer
folder; by default ``python3 -m enginekit.tokenizer_folder`` writes one): its files and
a config.json of the preset's shape with the tokenizer's vocabulary size, since the
simulator draws output ids below the model's vocabulary size and the client decodes them.

Writes ``--out`` (JSON: every figure, each client's command and version, each server's
non-2xx answers from its access log, lm-eval's metrics and their check) and
``--markdown`` (the table: client figure, server figure, how they compare).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from enginekit.extras import exit_if_missing

exit_if_missing("benchmarks/bench_clients.py", modules=["httpx", "prometheus_client"])

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LM_EVAL_TASKS_DIR = REPO / "benchmarks" / "clients" / "lm_eval"
LM_EVAL_TASKS = ("enginekit_choice", "enginekit_generate")
SERVED_MODEL_NAME = "llama-3-8b"
SERVER_START_TIMEOUT_S = 300.0
SERVER_STOP_TIMEOUT_S = 60.0
DEFAULT_SERVER_OVERRIDES = ("executor=sim", "hardware=h200", "serve.time_scale=1")
# Llama 3's rope base: the config.json of the served shape says so, as Meta's does.
LLAMA_3_ROPE_THETA = 500000.0
METRIC_PREFIXES = ("vllm:", "enginekit:")  # the server's spellings: vLLM's, its own
VENV_VARIABLES = {
    "vllm": "ENGINEKIT_VLLM_VENV",
    "guidellm": "ENGINEKIT_GUIDELLM_VENV",
    "aiperf": "ENGINEKIT_AIPERF_VENV",
    "lm_eval": "ENGINEKIT_LM_EVAL_VENV",
}


# ---- what a run measured -------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """A latency in milliseconds: its mean and 99th percentile (None where not given). A
    histogram's p99 is interpolated within its bucket, ``p99_bucket`` (lower, upper]: only
    the bucket is measured."""

    mean: float | None = None
    p99: float | None = None
    p99_bucket: tuple[float, float] | None = None


@dataclass
class Figures:
    """What one side (a client, or the server) measured over one run. ``itl_ms``: every
    gap between two streamed chunks of a request, over all gaps; ``tpot_ms``: each
    request's (latency - TTFT) / (output tokens - 1), over requests (the tools call one or
    the other ITL); ``output_throughput``: output tokens over the run's wall-clock span."""

    requests: float | None = None
    input_tokens: float | None = None
    output_tokens: float | None = None
    ttft_ms: Stat = field(default_factory=Stat)
    itl_ms: Stat = field(default_factory=Stat)
    tpot_ms: Stat = field(default_factory=Stat)
    e2e_ms: Stat = field(default_factory=Stat)
    output_throughput: float | None = None  # tokens per second
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": vars(self.ttft_ms),
            "itl_ms": vars(self.itl_ms),
            "tpot_ms": vars(self.tpot_ms),
            "e2e_ms": vars(self.e2e_ms),
            "output_throughput": self.output_throughput,
            **self.notes,
        }


@dataclass(frozen=True)
class Load:
    """One load point: how many requests, at what concurrency, of what lengths."""

    num_requests: int
    concurrency: int
    input_len: int
    output_len: int


# ---- the clients ---------------------------------------------------------------------------


class LoadClient:
    """A load generator run through its own command line; ``read`` parses the result
    files it wrote under ``out_dir`` into Figures."""

    name = ""
    distribution = ""  # the package that carries the command
    executable = ""  # the command under the environment's bin/

    def command(
        self, exe: Path, url: str, model: str, tokenizer: Path, load: Load, out_dir: Path
    ) -> list[str]:
        raise NotImplementedError

    def read(self, out_dir: Path) -> Figures:
        raise NotImplementedError


class VllmBench(LoadClient):
    """``vllm bench serve`` on its random dataset, against ``/v1/completions``. Its ITL is
    every gap between chunks, its TPOT each request's; its throughput divides by the run's
    duration."""

    name = "vllm bench serve"
    distribution = "vllm"
    executable = "vllm"
    result_file = "vllm_bench_serve.json"

    def command(
        self, exe: Path, url: str, model: str, tokenizer: Path, load: Load, out_dir: Path
    ) -> list[str]:
        return [
            str(exe), "bench", "serve",
            "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random",
            "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len),
            "--random-range-ratio", "0",
            "--num-prompts", str(load.num_requests),
            "--max-concurrency", str(load.concurrency), "--request-rate", "inf",
            "--ignore-eos", "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out_dir), "--result-filename", self.result_file,
        ]  # fmt: skip

    def read(self, out_dir: Path) -> Figures:
        result = json.loads((out_dir / self.result_file).read_text())

        def stat(key: str) -> Stat:
            return Stat(result.get(f"mean_{key}_ms"), result.get(f"p99_{key}_ms"))

        return Figures(
            requests=result.get("completed"),
            input_tokens=result.get("total_input_tokens"),
            output_tokens=result.get("total_output_tokens"),
            ttft_ms=stat("ttft"),
            itl_ms=stat("itl"),
            tpot_ms=stat("tpot"),
            e2e_ms=stat("e2el"),
            output_throughput=result.get("output_throughput"),
            notes={"duration_s": result.get("duration")},
        )


class GuideLLM(LoadClient):
    """``guidellm run``: a concurrent profile on its synthetic text, with a request cap.
    Its ``inter_token_latency_ms`` is each request's (latency - TTFT) / (output tokens - 1),
    its percentiles over requests: our TPOT (it reports no gap between chunks); its
    ``time_per_output_token_ms`` (latency / output tokens, TTFT included) goes in the
    notes. Its output tokens per second divide by the run's duration."""

    name = "guidellm"
    distribution = "guidellm"
    executable = "guidellm"
    result_file = "benchmarks.json"

    def command(
        self, exe: Path, url: str, model: str, tokenizer: Path, load: Load, out_dir: Path
    ) -> list[str]:
        return [
            str(exe), "run",
            "--backend",
            f"kind=openai_http,target={url},model={model},request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={load.concurrency}",
            "--constraint", f"kind=max_requests,count={load.num_requests}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={load.input_len},output_tokens={load.output_len}",
            "--tokenizer", f"kind=hf_auto,model={tokenizer}",
            "--output", f"kind=json,path={out_dir / self.result_file}",
            "--disable-console-interactive",
        ]  # fmt: skip

    def read(self, out_dir: Path) -> Figures:
        report = json.loads((out_dir / self.result_file).read_text())
        benchmark = report["benchmarks"][0]
        metrics = benchmark["metrics"]

        def successful(key: str) -> dict[str, Any]:
            return dict(metrics[key]["successful"])

        def stat(key: str, scale: float = 1.0) -> Stat:
            values = successful(key)
            p99 = values.get("percentiles", {}).get("p99")
            return Stat(values["mean"] * scale, None if p99 is None else p99 * scale)

        return Figures(
            requests=successful("request_latency")["count"],
            input_tokens=successful("prompt_token_count")["total_sum"],
            output_tokens=successful("output_token_count")["total_sum"],
            ttft_ms=stat("time_to_first_token_ms"),
            tpot_ms=stat("inter_token_latency_ms"),
            e2e_ms=stat("request_latency", scale=1000.0),
            output_throughput=successful("output_tokens_per_second")["mean"],
            notes={
                "latency_per_output_token_ms": vars(stat("time_per_output_token_ms")),
                "duration_s": benchmark.get("duration"),
            },
        )


class AIPerf(LoadClient):
    """``aiperf profile``: streaming completions of its synthetic prompts at a fixed
    concurrency, ``ignore_eos`` through ``--extra-inputs``, and ``--use-server-token-count``:
    its output token counts (and so its ITL and throughput) are the server's usage, not
    its own tokenization of the text it received. Its ``inter_chunk_latency`` is every gap
    between chunks (our ITL), its ``inter_token_latency`` each request's (our TPOT)."""

    name = "aiperf"
    distribution = "aiperf"
    executable = "aiperf"
    result_file = "profile_export_aiperf.json"

    def command(
        self, exe: Path, url: str, model: str, tokenizer: Path, load: Load, out_dir: Path
    ) -> list[str]:
        return [
            str(exe), "profile",
            "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--tokenizer", str(tokenizer),
            "--synthetic-input-tokens-mean", str(load.input_len),
            "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(load.output_len), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--concurrency", str(load.concurrency), "--request-count", str(load.num_requests),
            "--random-seed", "0", "--artifact-dir", str(out_dir), "--ui-type", "none",
        ]  # fmt: skip

    def read(self, out_dir: Path) -> Figures:
        found = sorted(out_dir.rglob(self.result_file))
        if not found:
            raise FileNotFoundError(f"no {self.result_file} under {out_dir}")
        report = json.loads(found[0].read_text())

        def metric(key: str) -> dict[str, Any]:
            value = report.get(key) or report.get("records", {}).get(key) or {}
            return dict(value)

        def stat(key: str, scale: float = 1.0) -> Stat:
            values = metric(key)
            mean, p99 = values.get("avg"), values.get("p99")
            return Stat(
                None if mean is None else mean * scale, None if p99 is None else p99 * scale
            )

        usage_total, usage_prompt = metric("usage_total_tokens"), metric("usage_prompt_tokens")
        usage_output = None
        if "sum" in usage_total and "sum" in usage_prompt:
            usage_output = usage_total["sum"] - usage_prompt["sum"]
        return Figures(
            requests=metric("request_count").get("avg"),
            input_tokens=metric("total_isl").get("avg"),
            output_tokens=metric("total_osl").get("avg"),
            ttft_ms=stat("time_to_first_token"),
            itl_ms=stat("inter_chunk_latency"),
            tpot_ms=stat("inter_token_latency"),
            e2e_ms=stat("request_latency"),
            output_throughput=metric("output_token_throughput").get("avg"),
            notes={
                "request_throughput": metric("request_throughput").get("avg"),
                "duration_s": metric("benchmark_duration").get("avg"),
                # what the server's usage chunks said, beside aiperf's own token counts
                "usage_prompt_tokens": usage_prompt.get("sum"),
                "usage_completion_tokens": usage_output,
            },
        )


LOAD_CLIENTS: dict[str, LoadClient] = {
    "vllm": VllmBench(),
    "guidellm": GuideLLM(),
    "aiperf": AIPerf(),
}


def client_executable(venv: str | None, executable: str) -> tuple[Path | None, str | None]:
    """The client's command under ``venv``'s bin/, or None with why it is skipped."""
    if not venv:
        return None, "no environment given"
    exe = Path(venv) / "bin" / executable
    if not exe.exists():
        return None, f"{exe} does not exist"
    return exe, None


def distribution_version(venv: str, distribution: str) -> str | None:
    """The installed version of ``distribution`` in ``venv`` (None if it is not there)."""
    script = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run(
        [str(Path(venv) / "bin" / "python"), "-c", script], capture_output=True, text=True
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


# ---- the model folders ---------------------------------------------------------------------


def tokenizer_vocab_size(folder: Path) -> tuple[int, int | None, int | None]:
    """(vocabulary size, BOS id, EOS id) of the Hugging Face tokenizer in ``folder``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id


def copy_tokenizer(tokenizer_folder: Path, dest: Path) -> None:
    """Copies the tokenizer's files (every file but a config.json and weights)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in tokenizer_folder.iterdir():
        if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy2(path, dest / path.name)


def serving_model_folder(tokenizer_folder: Path, preset: str, dest: Path) -> Path:
    """A folder the simulator serves: a config.json of ``preset``'s shape with the
    tokenizer's vocabulary size (its output ids must decode), and the tokenizer."""
    from enginekit.models.tiny import llama_config
    from enginekit.spec.model import model_preset

    vocab_size, bos, eos = tokenizer_vocab_size(tokenizer_folder)
    shape = replace(model_preset(preset), vocab_size=vocab_size)
    config = llama_config(
        shape, rope_theta=LLAMA_3_ROPE_THETA, rms_norm_eps=1e-5, bos_token_id=bos,
        eos_token_id=eos,
    )  # fmt: skip
    copy_tokenizer(tokenizer_folder, dest)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def scoring_model_folder(tokenizer_folder: Path, dest: Path, seed: int = 0) -> Path:
    """A small Llama (the ``tiny`` shape with the tokenizer's vocabulary) with seeded
    random weights and the tokenizer: what the torch executor serves lm-eval."""
    from safetensors.torch import save_file

    from enginekit.models.tiny import llama_config, random_state_dict
    from enginekit.spec.model import model_preset

    vocab_size, bos, eos = tokenizer_vocab_size(tokenizer_folder)
    shape = replace(model_preset("tiny"), vocab_size=vocab_size)
    config = llama_config(
        shape, rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=bos, eos_token_id=eos
    )
    copy_tokenizer(tokenizer_folder, dest)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    save_file(random_state_dict(config, seed=seed), str(dest / "model.safetensors"))
    return dest


def default_tokenizer_folder(dest: Path) -> Path:
    """Mistral-7B's SentencePiece vocabulary as a tokenizer folder, written by
    ``python3 -m enginekit.tokenizer_folder``. Exits when that cannot be done."""
    done = subprocess.run(
        [sys.executable, "-m", "enginekit.tokenizer_folder", str(dest)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            "error: --tokenizer-folder not given and `python3 -m enginekit.tokenizer_folder` "
            f"failed: {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return dest


# ---- the server ----------------------------------------------------------------------------


class ServerProcess:
    """``python3 -m enginekit.serve`` in a process of its own, on a free port, its access
    log (every request's status) in ``log_path``. ``start`` returns its URL once
    ``/health`` answers 200; ``stop`` ends it as SIGTERM does (live requests drain)."""

    def __init__(self, overrides: Sequence[str], log_path: Path, env: dict[str, str]) -> None:
        self.overrides = [*overrides, "serve.port=0", "serve.log_level=debug"]
        self.log_path = log_path
        self.env = env
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "enginekit.serve", *self.overrides],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log_tail()}")
            found = re.search(r"serving \S+ at (http://\S+)", self.log_text())
            if found and self._healthy(found.group(1)):
                self.url = found.group(1)
                return self.url
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start in {SERVER_START_TIMEOUT_S:.0f} s")

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_text()[-chars:]

    def refused(self) -> dict[str, int]:
        """``"METHOD PATH STATUS" -> count`` for every answer of 400 and above that the
        access log records."""
        lines = re.findall(r'"(\w+) (\S+) HTTP/[\d.]+" (\d{3})', self.log_text())
        return dict(Counter(f"{m} {p} {s}" for m, p, s in lines if int(s) >= 400))

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metric_samples(text: str, served_model_name: str | None) -> dict[str, list[Any]]:
    """The samples of a Prometheus exposition by family name without its prefix
    (``vllm:``, else ``enginekit:``: a name both spell is read from vLLM's) and a
    counter's ``_total``; series labelled with another ``model_name`` are left out."""
    by_prefix: dict[str, dict[str, list[Any]]] = {prefix: {} for prefix in METRIC_PREFIXES}
    for family in text_string_to_metric_families(text):
        prefix = next((p for p in METRIC_PREFIXES if family.name.startswith(p)), None)
        if prefix is None:
            continue
        samples = [
            s
            for s in family.samples
            if served_model_name is None
            or s.labels.get("model_name", served_model_name) == served_model_name
        ]
        # a counter's family is named without ``_total`` or, parsed from an exposition
        # whose TYPE line names the sample, with it: both are read as the former
        name = family.name[len(prefix) :].removesuffix("_total")
        by_prefix[prefix].setdefault(name, []).extend(samples)
    families: dict[str, list[Any]] = {}
    for prefix in METRIC_PREFIXES:  # vLLM's spelling first
        for name, samples in by_prefix[prefix].items():
            families.setdefault(name, samples)
    return families


def histogram_stat(samples: list[Any], scale: float = 1000.0) -> Stat:
    """Mean (sum / count) and p99 (linear within its bucket, as ``histogram_quantile``,
    and that bucket's bounds) of a histogram's samples, times ``scale``."""
    total = sum(s.value for s in samples if s.name.endswith("_sum"))
    count = sum(s.value for s in samples if s.name.endswith("_count"))
    if not count:
        return Stat()
    buckets: dict[float, float] = {}
    for sample in samples:
        if sample.name.endswith("_bucket"):
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    lower, upper = _bucket_of(0.99, buckets, count)
    return Stat(
        total / count * scale,
        _bucket_quantile(0.99, buckets, count) * scale,
        (lower * scale, upper * scale),
    )


def _bucket_of(q: float, buckets: dict[float, float], count: float) -> tuple[float, float]:
    """The bounds (lower, upper] of the bucket that holds the ``q`` quantile."""
    rank, lower = q * count, 0.0
    for bound in sorted(buckets):
        if buckets[bound] >= rank:
            return lower, bound
        lower = bound
    return lower, float("inf")


def _bucket_quantile(q: float, buckets: dict[float, float], count: float) -> float:
    rank = q * count
    lower, below = 0.0, 0.0
    for bound in sorted(buckets):
        cumulative = buckets[bound]
        if cumulative >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bound: that bound, as Prometheus
            width = cumulative - below
            return lower + (bound - lower) * ((rank - below) / width if width else 1.0)
        lower, below = bound, cumulative
    return lower


def counter_total(
    samples: list[Any], label: str | None = None, values: Sequence[str] = ()
) -> float:
    """The sum of a counter's ``_total`` samples (those whose ``label`` is in ``values``)."""
    return sum(
        s.value
        for s in samples
        if not s.name.endswith("_created") and (label is None or s.labels.get(label) in values)
    )


def server_figures(url: str, served_model_name: str) -> Figures:
    """The server's own figures: latency histograms, request and token counters from
    ``/metrics`` (wall-clock, from each request's arrival), its output rate over the
    wall-clock span from the first arrival to the last end (``/summary``'s ``wall``), and
    the engine's summary (``/summary``, in the engine's time) in ``notes["engine"]``."""
    families = metric_samples(httpx.get(f"{url}/metrics", timeout=30).text, served_model_name)
    itl_family = "inter_token_latency_seconds"
    if itl_family not in families:  # vLLM's older name for the same histogram
        itl_family = "time_per_output_token_seconds"
    answer = httpx.get(f"{url}/summary", timeout=60).json()
    summary, wall = answer["summary"], answer.get("wall") or {}

    def engine_stat(key: str) -> dict[str, float | None]:
        values = summary.get(key) or {}
        mean, p99 = values.get("mean"), values.get("p99")
        return {
            "mean": None if mean is None else mean * 1000.0,
            "p99": None if p99 is None else p99 * 1000.0,
        }

    engine = {
        "duration_s": summary.get("duration_s"),
        "output_tokens_per_s": summary.get("output_tokens_per_s"),
        "ttft_ms": engine_stat("time_to_first_token_seconds"),
        "tpot_ms": engine_stat("time_per_output_token_seconds"),
        "e2e_ms": engine_stat("e2e_request_latency_seconds"),
    }
    wall_notes = {key: wall.get(key) for key in ("duration_s", "output_tokens_per_s")}
    return Figures(
        requests=counter_total(
            families.get("request_success", []), "finished_reason", ("stop", "length")
        ),
        input_tokens=counter_total(families.get("prompt_tokens", [])),
        output_tokens=counter_total(families.get("generation_tokens", [])),
        ttft_ms=histogram_stat(families.get("time_to_first_token_seconds", [])),
        itl_ms=histogram_stat(families.get(itl_family, [])),
        tpot_ms=histogram_stat(families.get("request_time_per_output_token_seconds", [])),
        e2e_ms=histogram_stat(families.get("e2e_request_latency_seconds", [])),
        output_throughput=wall.get("output_tokens_per_s"),
        notes={"wall": wall_notes, "engine": engine},
    )


# ---- lm-evaluation-harness -----------------------------------------------------------------


def lm_eval_command(exe: Path, url: str, model: str, tokenizer: Path, out_dir: Path) -> list[str]:
    """``lm_eval`` with its ``local-completions`` model on the server's completions, the
    tasks of LM_EVAL_TASKS_DIR, one request at a time."""
    model_args = ",".join([
        f"model={model}", f"base_url={url}/v1/completions", f"tokenizer={tokenizer}",
        "tokenizer_backend=huggingface", "num_concurrent=1",
        "max_retries=1",
    ])  # fmt: skip
    return [
        str(exe), "--model", "local-completions", "--model_args", model_args,
        "--tasks", ",".join(LM_EVAL_TASKS), "--include_path", str(LM_EVAL_TASKS_DIR),
        "--batch_size", "1", "--seed", "0", "--output_path", str(out_dir), "--log_samples",
    ]  # fmt: skip


def lm_eval_results(out_dir: Path) -> dict[str, Any]:
    """Each task's metrics from lm-eval's newest results file under ``out_dir``."""
    results = json.loads(_newest(out_dir, "results_*.json").read_text())["results"]
    return {task: dict(results[task]) for task in LM_EVAL_TASKS if task in results}


def _newest(out_dir: Path, pattern: str) -> Path:
    found = sorted(out_dir.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no {pattern} under {out_dir}")
    return found[-1]


def _samples(out_dir: Path, task: str) -> list[dict[str, Any]]:
    """The documents lm-eval logged for ``task`` (``--log_samples``)."""
    path = _newest(out_dir, f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_context(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The (context, continuation) token ids lm-eval's API models score: the context's
    trailing spaces move to the continuation, the whole text is tokenized without special
    tokens and cut after the context's own tokens."""
    num_spaces = len(context) - len(context.rstrip())
    if num_spaces:
        context, continuation = context[:-num_spaces], context[-num_spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    num_context = len(tokenizer(context, add_special_tokens=False).input_ids)
    return whole[:num_context], whole[num_context:]


def lm_eval_check(model_folder: Path, tokenizer_folder: Path, out_dir: Path) -> dict[str, Any]:
    """lm-eval's logged answers against transformers on the same model and tokenizer: each
    choice's loglikelihood (the sum of the continuation tokens' log-softmax after the
    context) and is_greedy flag, the accuracy those loglikelihoods give, and each greedy
    generation (up to the task's ``max_gen_toks``, cut at its first ``until`` string; the
    text decoded after the prompt's, as a completion continues it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_folder), dtype=torch.float32, local_files_only=True
    ).eval()
    diffs: list[float] = []
    num_greedy_equal, num_correct = 0, 0
    choice_docs = _samples(out_dir, "enginekit_choice")
    for sample in choice_docs:
        scores = []
        for argument, response in zip(sample["arguments"].values(), sample["resps"], strict=True):
            context, continuation = split_context(tokenizer, argument["arg_0"], argument["arg_1"])
            ids = context + continuation
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            positions = range(len(context), len(ids))
            score = sum(float(logprobs[i - 1, ids[i]]) for i in positions)
            greedy = all(int(logprobs[i - 1].argmax()) == ids[i] for i in positions)
            logged, logged_greedy = response[0]
            diffs.append(abs(score - float(logged)))
            num_greedy_equal += greedy == (str(logged_greedy) == "True")
            scores.append(score)
        num_correct += max(range(len(scores)), key=scores.__getitem__) == int(
            sample["doc"]["answer"]
        )
    num_equal, generate_docs = 0, _samples(out_dir, "enginekit_generate")
    for sample in generate_docs:
        argument = sample["arguments"]["gen_args_0"]
        prompt, settings = argument["arg_0"], argument["arg_1"]
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=int(settings["max_gen_toks"]),
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )[0].tolist()
        prefix = tokenizer.decode(ids, skip_special_tokens=True)
        text = tokenizer.decode(out, skip_special_tokens=True)[len(prefix) :]
        for stop in settings.get("until", []):
            text = text.split(stop)[0]
        num_equal += text == sample["resps"][0][0]
    return {
        "choice": {
            "num_loglikelihoods": len(diffs),
            "max_abs_diff": max(diffs, default=0.0),
            "num_greedy_equal": num_greedy_equal,
            "acc_transformers": num_correct / len(choice_docs) if choice_docs else None,
        },
        "generate": {"num_docs": len(generate_docs), "num_equal": num_equal},
    }


# ---- running -------------------------------------------------------------------------------


def run_logged(command: list[str], log_path: Path, timeout_s: float, cwd: Path) -> int:
    """Runs ``command`` with its output in ``log_path``; its exit code (124 past
    ``timeout_s``, as ``timeout`` answers). ``HF_HUB_OFFLINE`` is not set for it: every
    file it loads is local, and aiperf takes a tokenizer path for a hub name under it."""
    with log_path.open("wb") as log:
        try:
            return subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=cwd
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def server_environment() -> dict[str, str]:
    """The environment for the server: this one (it imports the enginekit this script
    imports)."""
    return dict(os.environ)


def run_load_client(
    key: str,
    client: LoadClient,
    exe: Path,
    load: Load,
    overrides: list[str],
    tokenizer: Path,
    work: Path,
    timeout_s: float,
) -> dict[str, Any]:
    """One client at one load point against a fresh server: the client's figures, the
    server's, the command and what the server refused."""
    out_dir = work / f"{key}-c{load.concurrency}"
    out_dir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "client": client.name, "concurrency": load.concurrency,
        "load_average": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 minutes
    }  # fmt: skip
    with ServerProcess(overrides, out_dir / "server.log", server_environment()) as server:
        command = client.command(exe, server.url, SERVED_MODEL_NAME, tokenizer, load, out_dir)
        entry["command"] = " ".join(command)
        started = time.monotonic()
        code = run_logged(command, out_dir / "client.log", timeout_s, cwd=out_dir)
        entry["wall_s"] = round(time.monotonic() - started, 1)
        entry["exit_code"] = code
        entry["server"] = server_figures(server.url, SERVED_MODEL_NAME).as_dict()
    entry["server_refused"] = server.refused()
    try:
        entry["client_figures"] = client.read(out_dir).as_dict()
    except (OSError, KeyError, IndexError, ValueError, TypeError) as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["client_log_tail"] = (out_dir / "client.log").read_text(errors="replace")[-3000:]
    return entry


def run_lm_eval(
    exe: Path, model_folder: Path, tokenizer: Path, work: Path, timeout_s: float
) -> dict[str, Any]:
    """lm-eval's tasks against a torch server of ``model_folder``, then its answers against
    transformers on the same model (``lm_eval_check``)."""
    out_dir = work / "lm_eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = [
        "executor=torch", f"model.path={model_folder}",
        f"serve.served_model_name={SERVED_MODEL_NAME}",
    ]  # fmt: skip
    entry: dict[str, Any] = {"client": "lm-eval", "tasks": list(LM_EVAL_TASKS)}
    with ServerProcess(overrides, out_dir / "server.log", server_environment()) as server:
        command = lm_eval_command(exe, server.url, SERVED_MODEL_NAME, tokenizer, out_dir)
        entry["command"] = " ".join(command)
        started = time.monotonic()
        code = run_logged(command, out_dir / "client.log", timeout_s, cwd=REPO)
        entry["wall_s"] = round(time.monotonic() - started, 1)
        entry["exit_code"] = code
        entry["server"] = server_figures(server.url, SERVED_MODEL_NAME).as_dict()
    entry["server_refused"] = server.refused()
    try:
        entry["results"] = lm_eval_results(out_dir)
        entry["check"] = lm_eval_check(model_folder, tokenizer, out_dir)
    except (OSError, KeyError, ValueError) as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["client_log_tail"] = (out_dir / "client.log").read_text(errors="replace")[-3000:]
    return entry


# ---- the table -----------------------------------------------------------------------------

# (title, the figure's key in Figures.as_dict, "mean"/"p99" of a Stat or None for a number,
# the engine's figure in its summary)
EnginePick = Callable[[dict[str, Any]], float | None]
ROWS: tuple[tuple[str, str, str | None, EnginePick], ...] = (
    ("TTFT mean (ms)", "ttft_ms", "mean", lambda e: e["ttft_ms"]["mean"]),
    ("TTFT p99 (ms)", "ttft_ms", "p99", lambda e: e["ttft_ms"]["p99"]),
    ("ITL mean (ms), every chunk gap", "itl_ms", "mean", lambda e: None),
    ("ITL p99 (ms), every chunk gap", "itl_ms", "p99", lambda e: None),
    ("TPOT mean (ms), per request", "tpot_ms", "mean", lambda e: e["tpot_ms"]["mean"]),
    ("TPOT p99 (ms), per request", "tpot_ms", "p99", lambda e: e["tpot_ms"]["p99"]),
    ("E2E mean (ms)", "e2e_ms", "mean", lambda e: e["e2e_ms"]["mean"]),
    ("E2E p99 (ms)", "e2e_ms", "p99", lambda e: e["e2e_ms"]["p99"]),
    ("output tok/s", "output_throughput", None, lambda e: e["output_tokens_per_s"]),
    ("requests", "requests", None, lambda e: None),
    ("input tokens", "input_tokens", None, lambda e: None),
    ("output tokens", "output_tokens", None, lambda e: None),
)
TABLE_NOTE = (
    "client: the tool's own result file. ITL, every chunk gap: each gap between two streamed "
    "chunks of a request, over all gaps (vLLM's ITL, aiperf's inter_chunk_latency; guidellm "
    "reports none); TPOT, per request: each request's (latency − TTFT) / (output tokens − "
    "1), the mean and p99 over requests (vLLM's TPOT, guidellm's and aiperf's ITL); output "
    "tok/s: output tokens over the run's wall-clock duration. server: its /metrics after "
    "the run, wall-clock from the moment the server started on each request (its ASGI "
    "app called, before the body is read and tokenized): mean = sum / count of "
    "vllm:time_to_first_token_seconds, "
    "vllm:inter_token_latency_seconds (every gap between two releases of a request's "
    "tokens), vllm:request_time_per_output_token_seconds (per request) and "
    "vllm:e2e_request_latency_seconds; a p99 is the histogram's bucket (lower, upper] that "
    "holds it (vLLM's buckets: 10 ms wide at the bottom for ITL, 20 ms for TTFT), against "
    "which the client's p99 is within, below or above; output tok/s: /summary's wall "
    "rate, its output tokens over the wall-clock span from the first request's arrival "
    "to the last one's end. engine: its /summary in the engine's own (simulated) time: "
    "its TPOT per request, and its output tokens per second of simulated time."
)


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _bound(value: float) -> str:
    return "∞" if value == float("inf") else f"{value:,.4g}"


def compare(ours: float | None, stat: dict[str, Any] | float | None, part: str | None) -> str:
    """The client's figure against the server's: their ratio, or for a p99 the server
    measures as a histogram's bucket, whether the client's is within, below or above it."""
    if ours is None or stat is None:
        return "–"
    if isinstance(stat, dict):
        bucket = stat.get("p99_bucket") if part == "p99" else None
        if bucket is not None:
            lower, upper = bucket
            return "below" if ours <= lower else "above" if ours > upper else "within"
        theirs = stat.get(part or "")
    else:
        theirs = stat
    return f"{ours / theirs:.2f}" if theirs else "–"


def _cell(figures: dict[str, Any], key: str, part: str | None) -> tuple[float | None, Any]:
    """(the figure, what compare reads: the Stat's dict or the number)."""
    value = figures.get(key)
    if part is None:
        return value, value
    value = value or {}
    return value.get(part), value


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """One row per (client, concurrency, figure): the client's figure, the server's (a
    p99: its bucket), how they compare, and the engine's own (see TABLE_NOTE)."""
    lines = [
        "| client | concurrency | figure | client | server | client / server | engine |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        client, server = run.get("client_figures"), run.get("server")
        if client is None or server is None:
            reason = run.get("skipped") or run.get("error") or "no figures"
            lines.append(
                f"| {run['client']} | {run.get('concurrency', '–')} | – | {reason} | | | |"
            )
            continue
        for title, key, part, pick_engine in ROWS:
            ours, _ = _cell(client, key, part)
            theirs, stat = _cell(server, key, part)
            shown = _number(theirs)
            bucket = stat.get("p99_bucket") if isinstance(stat, dict) and part == "p99" else None
            if bucket is not None:
                shown = f"({_bound(bucket[0])}, {_bound(bucket[1])}]"
            lines.append(
                f"| {run['client']} | {run['concurrency']} | {title} | {_number(ours)} | "
                f"{shown} | {compare(ours, stat, part)} | "
                f"{_number(pick_engine(server['engine']))} |"
            )
    return "\n".join(lines) + "\n\n" + TABLE_NOTE + "\n"


def ratio_ranges(runs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """The lowest and highest client / server ratio over the runs with figures, of the
    TTFT mean, the ITL mean (every chunk gap where the tool reports it, else its
    per-request TPOT) and the output throughput."""
    ratios: dict[str, list[float]] = {"ttft": [], "itl": [], "throughput": []}
    for run in runs:
        client, server = run.get("client_figures"), run.get("server")
        if client is None or server is None:
            continue
        itl_key = "itl_ms" if (client.get("itl_ms") or {}).get("mean") is not None else "tpot_ms"
        for name, key, part in (
            ("ttft", "ttft_ms", "mean"),
            ("itl", itl_key, "mean"),
            ("throughput", "output_throughput", None),
        ):
            ours, _ = _cell(client, key, part)
            theirs, _ = _cell(server, key, part)
            if ours is not None and theirs:
                ratios[name].append(ours / theirs)
    return {name: (min(values), max(values)) for name, values in ratios.items() if values}


def lm_eval_table(entry: dict[str, Any]) -> str:
    """lm-eval's metrics, then what the same model computes directly (``check``)."""
    if "results" not in entry:
        reason = entry.get("skipped") or entry.get("error") or "no results"
        return f"lm-eval: {reason}\n"
    lines = ["| task | metric | value |", "| --- | --- | --- |"]
    for task, metrics in entry["results"].items():
        for name, value in metrics.items():
            if isinstance(value, int | float) and not name.endswith("_stderr,none"):
                lines.append(f"| {task} | {name} | {value:.4g} |")
    check = entry.get("check")
    if check:
        choice, generate = check["choice"], check["generate"]
        lines += [
            f"| enginekit_choice | acc from transformers' loglikelihoods | "
            f"{choice['acc_transformers']:.4g} |",
            f"| enginekit_choice | largest abs. difference of the {choice['num_loglikelihoods']} "
            f"loglikelihoods from transformers' | {choice['max_abs_diff']:.2g} |",
            f"| enginekit_choice | is_greedy flags equal to transformers' | "
            f"{choice['num_greedy_equal']} of {choice['num_loglikelihoods']} |",
            f"| enginekit_generate | generations equal to transformers' greedy ones | "
            f"{generate['num_equal']} of {generate['num_docs']} |",
        ]
    return "\n".join(lines) + "\n"


# ---- the command line ----------------------------------------------------------------------


def portable(value: Any, roots: dict[str, str]) -> Any:
    """``value`` (the report: dicts, lists, strings) with each path of ``roots`` in its
    strings replaced by its name there (``WORK``, ``CLIENTS``; the repository's root,
    given with its trailing slash, by nothing), the longest first: the report names no
    folder of the machine that ran it."""
    if isinstance(value, dict):
        return {key: portable(item, roots) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable(item, roots) for item in value]
    if isinstance(value, str):
        for root in sorted(roots, key=len, reverse=True):
            value = value.replace(root, roots[root])
    return value


def engine_commit() -> str | None:
    """The repository's HEAD commit (None outside a git checkout)."""
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=False
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


@contextmanager
def work_folder(keep: str | None) -> Iterator[Path]:
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix="bench_clients-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    cut = args_in.index("--") if "--" in args_in else len(args_in)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, variable in VENV_VARIABLES.items():
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            dest=key,
            default=os.environ.get(variable),
            help=f"the client's virtual environment (default: ${variable})",
        )
    parser.add_argument("--tokenizer-folder", default=None)
    parser.add_argument("--lm-eval-model", default=None, help="default: a seeded tiny Llama")
    parser.add_argument("--preset", default="llama-3-8b", help="the served model's shape")
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--client-timeout-s", type=float, default=900.0)
    parser.add_argument("--only", nargs="+", choices=[*LOAD_CLIENTS, "lm_eval"], default=None)
    parser.add_argument("--work-dir", default=None, help="keep every log and result file here")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/clients.json"))
    parser.add_argument("--markdown", default=str(REPO / "benchmarks/results/clients.md"))
    args = parser.parse_args(args_in[:cut])
    overrides = list(args_in[cut + 1 :] or DEFAULT_SERVER_OVERRIDES)
    if args.num_requests < 1 or any(c < 1 for c in args.concurrency):
        parser.error("--num-requests and --concurrency must be positive")
    chosen = set(args.only or [*LOAD_CLIENTS, "lm_eval"])
    load_1m = os.getloadavg()[0]
    report: dict[str, Any] = {
        "server_overrides": overrides, "clients": {}, "runs": [],
        "engine_commit": engine_commit(),
        "machine": f"{os.cpu_count()} CPU cores, load average {load_1m:.2f} at the start",
        "load": {
            "num_requests": args.num_requests, "concurrency": args.concurrency,
            "input_len": args.input_len, "output_len": args.output_len,
        },
    }  # fmt: skip
    with work_folder(args.work_dir) as work:
        roots = {str(work.resolve()): "WORK", f"{REPO}/": ""}
        for key in VENV_VARIABLES:
            venv = getattr(args, key)
            if venv and Path(venv).resolve().parent != Path("/"):
                roots[str(Path(venv).resolve().parent)] = "CLIENTS"
        tokenizer = (
            Path(args.tokenizer_folder).resolve()
            if args.tokenizer_folder
            else default_tokenizer_folder(work / "tokenizer")
        )
        served = serving_model_folder(tokenizer, args.preset, work / "served_model")
        tokenizer = served  # the clients load the served folder's tokenizer
        served_overrides = [
            *overrides, f"model.path={served}", f"serve.served_model_name={SERVED_MODEL_NAME}",
        ]  # fmt: skip
        report["served_model"] = {
            "preset": args.preset, "config": json.loads((served / "config.json").read_text()),
        }  # fmt: skip
        for key, client in LOAD_CLIENTS.items():
            if key not in chosen:
                continue
            venv = getattr(args, key)
            exe, why = client_executable(venv, client.executable)
            report["clients"][client.name] = {
                "version": distribution_version(venv, client.distribution) if exe else None,
                "skipped": why,
            }
            for concurrency in args.concurrency:
                if exe is None:
                    report["runs"].append(
                        {"client": client.name, "concurrency": concurrency, "skipped": why}
                    )
                    continue
                load = Load(args.num_requests, concurrency, args.input_len, args.output_len)
                print(f"{client.name} at concurrency {concurrency} ...", flush=True)
                report["runs"].append(
                    run_load_client(
                        key, client, exe, load, served_overrides, tokenizer, work,
                        args.client_timeout_s,
                    )
                )  # fmt: skip
        if "lm_eval" in chosen:
            exe, why = client_executable(args.lm_eval, "lm_eval")
            report["clients"]["lm-eval"] = {
                "version": distribution_version(args.lm_eval, "lm_eval") if exe else None,
                "skipped": why,
            }
            if exe is None:
                report["lm_eval"] = {"client": "lm-eval", "skipped": why}
            else:
                print("lm-eval ...", flush=True)
                model = (
                    Path(args.lm_eval_model).resolve()
                    if args.lm_eval_model
                    else scoring_model_folder(tokenizer, work / "scoring_model")
                )
                report["lm_eval"] = run_lm_eval(exe, model, tokenizer, work, args.client_timeout_s)
        report = portable(report, roots)
    table = markdown_table(report["runs"])
    lm_eval = lm_eval_table(report["lm_eval"]) if "lm_eval" in report else ""
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    Path(args.markdown).write_text(table + ("\n" + lm_eval if lm_eval else ""))
    print(table)
    print(lm_eval)
    return 0


if __name__ == "__main__":
    sys.exit(main())

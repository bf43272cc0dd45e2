"""``python -m enginekit.serve`` as a user runs it: it prints where it serves, answers the
``openai`` client and ``benchmarks/bench_serving.py``, and on SIGTERM lets a short request
finish, aborts a long one after ``serve.shutdown_timeout_s``, and exits with 0. A bad
override is refused before any port is bound."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
from conftest import REPO_ROOT
from test_serve import scrape

from enginekit.serve.__main__ import main

SERVER = [
    "executor=sim",
    "model=tiny",
    "serve.port=0",
    "cache.num_blocks=4096",
    "serve.time_scale=0.01",  # ~3 ms a step: a 1500-token stream outlives the drain
    "serve.shutdown_timeout_s=3",
    "serve.log_level=warning",
]


def test_the_command_line_serves_benchmarks_and_shuts_down_cleanly(tmp_path):
    errors = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "enginekit.serve", *SERVER],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        cwd=tmp_path,
    )
    try:
        banner = proc.stdout.readline()
        found = re.search(r"serving tiny at (http://127\.0\.0\.1:\d+) \(executor=sim", banner)
        assert found, banner
        url = found.group(1)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        done = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4)
        assert done.usage.completion_tokens == 4 and done.choices[0].finish_reason == "length"

        bench = subprocess.run(
            [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_serving.py"),
             "--base-url", url, "--num-prompts", "12", "--max-concurrency", "4",
             "--request-rate", "200", "--time-limit-s", "60", "--", "model=tiny",
             "workload.shared_prefix_len=32", "workload.unique_prompt_len=8",
             "workload.min_output_len=4", "workload.max_output_len=8"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr
        assert re.search(r"Successful requests:\s+12\b", bench.stdout), bench.stdout
        assert re.search(r"Failed requests:\s+0\b", bench.stdout)
        for line in ("Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):", "Hit rate"):
            assert line in bench.stdout

        # Shutdown: the long stream is cut, the short request drains.
        long_chunks: list[str | None] = []

        def read_long() -> None:
            try:
                for chunk in client.completions.create(
                    model="tiny", prompt=[8, 9], max_tokens=1500, stream=True
                ):
                    long_chunks.append(chunk.choices[0].finish_reason)
            except openai.APIError:
                long_chunks.append("cut")

        reader = threading.Thread(target=read_long)
        reader.start()
        while len(long_chunks) < 3:
            time.sleep(0.01)
        short: list[openai.types.Completion] = []
        asker = threading.Thread(
            target=lambda: short.append(
                client.completions.create(model="tiny", prompt=[10, 11], max_tokens=100)
            )
        )
        asker.start()
        deadline = time.monotonic() + 10
        while scrape(url)["vllm:num_requests_running"] != 2:
            assert time.monotonic() < deadline and not short
            time.sleep(0.01)  # until the short request runs beside the long one
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        asker.join(timeout=10)
        reader.join(timeout=10)
        assert short and short[0].usage.completion_tokens == 100
        assert "length" not in long_chunks  # it did not run to its end
        errors.seek(0)
        assert "Traceback" not in errors.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        errors.close()


def test_a_bad_override_is_refused_before_serving(capsys):
    assert main(["model=tiny", "cache.num_blocks=64", "serve.prot=8000"]) == 2
    assert "did you mean 'serve.port'?" in capsys.readouterr().err
    assert main(["model=tiny", "cache.num_blocks=64", "serve.max_waiting=0"]) == 2
    assert "serve.max_waiting must be >= 1" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "serve.time_scale" in capsys.readouterr().out

"""Two replicas behind ``sglang-router`` with cache-aware routing, all on loopback: the
turns of one conversation land on the replica that holds their prefix (it serves them
from its prefix cache), and the other replica's prefix-cache queries do not grow.

The router (a Rust binary from PyPI) probes each worker's ``/health``, then reads
``/server_info`` and ``/model_info``, which the server answers for it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import openai
from test_serve import save_model_folder, scrape

from enginekit.app import compose_config
from enginekit.serve import BackgroundServer, Server

MODEL = "conversation-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_conversation_stays_on_the_replica_that_holds_its_prefix(tmp_path):
    folder = save_model_folder(tmp_path / "model", weights=False)
    overrides = ["executor=sim", f"model.path={folder}", "+prefix=radix", "progress=false",
                 "cache.num_blocks=4096", "serve.port=0",
                 f"serve.served_model_name={MODEL}"]  # fmt: skip
    replicas = [BackgroundServer(Server(compose_config(overrides))) for _ in range(2)]
    urls = [replica.start() for replica in replicas]
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router",
         "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--worker-urls", *urls, "--policy", "cache_aware", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:  # until the router has registered both workers' model
            try:
                models = httpx.get(f"{base}/v1/models", timeout=2).json()
                if [m["id"] for m in models.get("data", [])] == [MODEL]:
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert router.poll() is None, router.stderr.read() if router.stderr else ""
            assert time.monotonic() < deadline, "the router did not register the workers"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

        system = {"role": "system", "content": " ".join(f"w{i}" for i in range(10, 70))}
        messages = [system]
        queries = []
        cached = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"w{100 + turn} w{200 + turn}"})
            reply = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            queries.append([scrape(u)["vllm:prefix_cache_queries_total"] for u in urls])
        holder = 0 if queries[0][0] > 0 else 1
        other = 1 - holder
        assert [q[other] for q in queries] == [0, 0, 0]  # the other replica saw no turn
        assert queries[0][holder] < queries[1][holder] < queries[2][holder]
        assert cached[0] == 0 and cached[1] > 60 and cached[2] > cached[1]  # prefix hits
    finally:
        router.terminate()
        router.wait(timeout=20)
        for replica in replicas:
            replica.stop()

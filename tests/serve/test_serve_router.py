"""Two replicas behind ``sglang-router`` with cache-aware routing, all on loopback: the
turns of one conversation land on the replica that holds their prefix (it serves them
from its prefix cache), and the other replica's prefix-cache queries do not grow; two
``model=tiny`` replicas (no folder: the SentencePiece vocabulary) answer the text
prompts and chats the router forwards.

The router (a Rust binary from PyPI) probes each worker's ``/health``, then reads
``/server_info`` and ``/model_info``, which the server answers for it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
from test_serve import save_model_folder, scrape

from enginekit.app import compose_config
from enginekit.serve import BackgroundServer, Server
from enginekit.serve.codec import TextCodec

MODEL = "conversation-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def routed(overrides: list[str], model: str) -> Iterator[tuple[str, list[str]]]:
    """(the router's base URL, the replicas' URLs) of two replicas of ``overrides``
    serving ``model`` behind a cache-aware router, once it has registered them."""
    overrides = [*overrides, "serve.port=0", f"serve.served_model_name={model}"]
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
                if [m["id"] for m in models.get("data", [])] == [model]:
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert router.poll() is None, router.stderr.read() if router.stderr else ""
            assert time.monotonic() < deadline, "the router did not register the workers"
            time.sleep(0.2)
        yield base, urls
    finally:
        router.terminate()
        router.wait(timeout=20)
        for replica in replicas:
            replica.stop()


def test_a_conversation_stays_on_the_replica_that_holds_its_prefix(tmp_path):
    folder = save_model_folder(tmp_path / "model", weights=False)
    overrides = ["executor=sim", f"model.path={folder}", "+prefix=radix", "progress=false",
                 "cache.num_blocks=4096"]  # fmt: skip
    with routed(overrides, MODEL) as (base, urls):
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


def test_two_tiny_replicas_answer_the_text_the_router_forwards():
    """The router sends text, not ids: each ``model=tiny`` replica tokenizes it with the
    SentencePiece vocabulary, and the answers are those of a replica asked directly."""
    overrides = ["executor=torch", "model=tiny", "+prefix=radix", "progress=false",
                 "cache.block_size=4", "cache.num_blocks=400"]  # fmt: skip
    codec = TextCodec.of_model_path(None, 32000)
    assert codec is not None
    with routed(overrides, "tiny") as (base, urls):
        through = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        direct = openai.OpenAI(base_url=f"{urls[0]}/v1", api_key="unused", max_retries=0)
        prompt = "The quick brown fox jumps over"
        args = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                    extra_body={"return_token_ids": True})  # fmt: skip
        routed_choice = through.completions.create(**args).choices[0]
        direct_choice = direct.completions.create(**args).choices[0]
        assert routed_choice.prompt_token_ids == codec.encode(prompt)
        assert routed_choice.token_ids == direct_choice.token_ids
        assert routed_choice.text == direct_choice.text != ""

        chat = dict(model="tiny", messages=[{"role": "user", "content": prompt}],
                    max_tokens=8, temperature=0)  # fmt: skip
        routed_reply = through.chat.completions.create(**chat)
        direct_reply = direct.chat.completions.create(**chat)
        assert routed_reply.usage.prompt_tokens == len(codec.chat_prompt(chat["messages"]))
        content = routed_reply.choices[0].message.content
        assert content == direct_reply.choices[0].message.content != ""

"""Latency on the wire: every connection the server accepts has TCP_NODELAY, and a client
streaming one request at a time over a real socket never sees the first token before
the simulated prefill is over, and measures the TTFT the server's own histogram records
(plus what the HTTP layer adds, never less).

The model is the simulated Llama-3-8B on an H200 at ``serve.time_scale=1``: a
3,000-token prompt takes tens of simulated milliseconds to prefill, and as many wall
milliseconds to serve. Bounds below are strict; the upper ones leave a loaded machine a
second."""

from __future__ import annotations

import os
import socket
import time

import httpx
from test_serve import scrape
from test_serve_sim import serve

from enginekit.serve.run import bind

PROMPT_LEN = 3000
SLACK_S = 1.0  # what a loaded machine may add between the server's clock and the client's
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def accepted_socket_of(client: socket.socket) -> socket.socket:
    """The server's end of ``client``'s connection, found among this process's open
    sockets (the server runs on a thread of the test's process) by its peer address. The
    caller closes it (a duplicate: the server's own stays open)."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # not a socket, or already closed
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == client.getsockname():
                return sock
        except OSError:  # a listening or unconnected socket has no peer
            pass
        sock.close()
    raise AssertionError(f"no socket of this process is connected to {client.getsockname()}")


def test_the_listening_socket_and_what_it_accepts_have_tcp_nodelay():
    listener = bind("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()) as client:
        accepted, _ = listener.accept()
        with accepted:
            assert nodelay(listener) and nodelay(accepted)
            assert not nodelay(client)  # the client's end is the client's business


def test_every_connection_the_server_accepts_has_tcp_nodelay():
    with serve() as running:
        address = httpx.URL(running.url)
        client = socket.create_connection((address.host, address.port))
        with client:
            client.sendall(b"GET /health HTTP/1.1\r\nHost: enginekit\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            server_end = accepted_socket_of(client)  # the connection is kept alive
            with server_end:
                assert nodelay(server_end)


def test_a_client_sees_the_first_token_after_the_simulated_prefill_and_as_the_server_does():
    with serve("serve.time_scale=1", "model=llama-3-8b") as running:
        url, model = running.url, running.server.model_name
        transport = httpx.HTTPTransport(socket_options=NODELAY)  # the client's Nagle off too
        with httpx.Client(transport=transport, timeout=60) as client:
            assert client.get(f"{url}/health").status_code == 200  # connected
            for first in (100, 200, 300):  # one at a time; no prompt shares a block
                summary = client.get(f"{url}/summary").json()["summary"]
                before, sim_before = scrape(url), summary["time_to_first_token_seconds"]
                body = {"model": model, "prompt": [first] * PROMPT_LEN, "max_tokens": 4,
                        "ignore_eos": True, "stream": True}  # fmt: skip
                sent = time.monotonic()
                with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                    lines = (line for line in response.iter_lines() if line)
                    assert next(lines).startswith("data: {")  # the first token's chunk
                    client_ttft = time.monotonic() - sent
                    assert list(lines)[-1] == "data: [DONE]"
                after = scrape(url)
                sim_after = client.get(f"{url}/summary").json()["summary"]
                sim_after = sim_after["time_to_first_token_seconds"]
                # the engine's TTFT of this request: the simulated steps up to its first token
                prefill = (sim_after["mean"] * sim_after["count"]) - (
                    (sim_before["mean"] or 0.0) * sim_before["count"]
                )
                ttft = "vllm:time_to_first_token_seconds"
                assert after[f"{ttft}_count"] - before[f"{ttft}_count"] == 1
                server_ttft = after[f"{ttft}_sum"] - before[f"{ttft}_sum"]
                assert prefill > 0.02  # a long prefill: tens of milliseconds
                assert prefill <= server_ttft < prefill + SLACK_S
                assert server_ttft <= client_ttft < server_ttft + SLACK_S

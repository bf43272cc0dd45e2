"""``/summary``'s ``wall``: the server's output rate in wall-clock time, over the span from
the first request's arrival to the last one's end, as a client divides its own token count
by its own span. Requests sent one at a time: the server's span holds every request's
end-to-end latency, and lies within the client's (the client sends before the server
receives, and receives after the server ends)."""

from __future__ import annotations

import time

import httpx
from test_serve import scrape
from test_serve_sim import serve

NUM_REQUESTS, MAX_TOKENS = 3, 5


def test_wall_summary_is_empty_before_any_request_ends():
    with serve() as running:
        wall = httpx.get(f"{running.url}/summary").json()["wall"]
    assert wall == {"duration_s": None, "generation_tokens_total": 0, "output_tokens_per_s": None}


def test_wall_rate_is_the_released_tokens_over_first_arrival_to_last_end():
    with serve("serve.time_scale=1") as running:
        url = running.url
        with httpx.Client(timeout=60) as client:
            sent = time.monotonic()
            for first in range(NUM_REQUESTS):
                body = {"model": "tiny", "prompt": [first + 5, 6, 7], "max_tokens": MAX_TOKENS,
                        "ignore_eos": True}  # fmt: skip
                answer = client.post(f"{url}/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
            received = time.monotonic()
            wall = client.get(f"{url}/summary").json()["wall"]
        metrics = scrape(url)
    tokens = NUM_REQUESTS * MAX_TOKENS
    assert wall["generation_tokens_total"] == metrics["vllm:generation_tokens_total"] == tokens
    assert wall["output_tokens_per_s"] == tokens / wall["duration_s"]
    # one at a time: the span holds each request's latency, and the client's span holds it
    assert metrics["vllm:e2e_request_latency_seconds_count"] == NUM_REQUESTS
    assert metrics["vllm:e2e_request_latency_seconds_sum"] <= wall["duration_s"]
    assert wall["duration_s"] <= received - sent

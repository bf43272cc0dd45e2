"""The server's ``priority`` and ``user`` fields (as vLLM's OpenAI-compatible server takes
``priority``): under ``+queue=priority`` a request's priority reaches the engine, under any
other queue a priority other than 0 is refused with a 400 naming ``+queue=priority``, on
both endpoints; ``user`` becomes the request's tenant."""

from __future__ import annotations

import httpx
import pytest
from test_serve import save_model_folder
from test_serve_sim import serve

COMPLETION = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "w7 w8"}], "max_tokens": 2}


def test_a_priority_is_refused_with_400_unless_the_queue_orders_by_it(tmp_path):
    folder = save_model_folder(tmp_path / "model", weights=False)  # with a chat template
    with serve(f"model.path={folder}") as running:
        for path, body in (("completions", COMPLETION), ("chat/completions", CHAT)):
            body = {**body, "model": str(folder)}
            url = f"{running.url}/v1/{path}"
            reply = httpx.post(url, json={**body, "priority": 3}, timeout=30)
            assert reply.status_code == 400, path
            assert "+queue=priority" in reply.json()["error"]["message"]
            assert httpx.post(url, json={**body, "priority": 0}, timeout=30).is_success


@pytest.mark.parametrize("bad", [1.5, "1", True])
def test_a_priority_that_is_not_an_int_is_a_400(bad):
    with serve("+queue=priority") as running:
        body = {**COMPLETION, "priority": bad}
        reply = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 400


def test_priority_and_user_reach_the_engine():
    with serve("+queue=priority") as running:
        seen = []
        loop = running.server.loop
        add = loop.engine.add_request

        def spy(*args, **kwargs):
            seen.append((kwargs.get("priority"), kwargs.get("user")))
            return add(*args, **kwargs)

        loop.engine.add_request = spy
        body = {**COMPLETION, "priority": -2, "user": "alice"}
        reply = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
        assert reply.is_success
        assert seen == [(-2, "alice")]

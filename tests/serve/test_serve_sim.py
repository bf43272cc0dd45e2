"""The HTTP server on the simulator, through the real ``openai`` client on loopback: a full
queue answers 503 with Retry-After and the requests queued before it complete, steps are
paced in wall-clock time by the simulated step time (``serve.time_scale``), a chat
request to a tokenizer without a chat template gets a clear 400, a chat reply without
``max_tokens`` runs to what the whole cache holds, a failed engine loop answers 500 and
then 503 (its health too), and preemptions count in ``/metrics`` as in the summary."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from test_serve import save_model_folder, scrape, wait_until_idle

from enginekit.app import compose_config
from enginekit.serve import BackgroundServer, Server

SIM = ["executor=sim", "model=tiny", "progress=false", "serve.port=0"]
SMALL_POOL = "cache.num_blocks=4096"


def serve(*overrides: str) -> BackgroundServer:
    """A simulated server; 4,096 blocks unless an override says (tiny's default pool on a
    simulated H200 has 16 million, half a GB of bookkeeping per engine)."""
    pool = [] if any(o.startswith("cache.num_blocks=") for o in overrides) else [SMALL_POOL]
    return BackgroundServer(Server(compose_config([*SIM, *pool, *overrides])))


def test_a_full_queue_answers_503_and_what_was_queued_completes():
    # One sequence runs at a time; 2 may wait. Steps of ~1 ms wall (time_scale 0.03).
    with serve("scheduler.max_num_seqs=1", "serve.max_waiting=2", "serve.retry_after_s=3",
               "serve.time_scale=0.03") as running:  # fmt: skip
        url = running.url
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        long = client.completions.create(
            model="tiny", prompt=[5, 6, 7], max_tokens=2000, stream=True
        )
        first = next(iter(long))  # it runs: the one sequence is taken
        assert first.choices[0].finish_reason is None
        results: list[openai.types.Completion] = []
        queued = [
            threading.Thread(
                target=lambda p=p: results.append(
                    client.completions.create(model="tiny", prompt=p, max_tokens=5)
                )
            )
            for p in ([8, 9], [10, 11])
        ]
        for thread in queued:
            thread.start()
        deadline = time.monotonic() + 10
        while scrape(url)["vllm:num_requests_waiting"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="tiny", prompt=[12], max_tokens=5)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["Retry-After"] == "3"
        assert caught.value.body["code"] == "queue_full"
        long.close()  # the client leaves: its sequence is released, the queue moves
        for thread in queued:
            thread.join(timeout=20)
        assert sorted(len(r.choices) for r in results) == [1, 1]
        assert all(r.usage.completion_tokens == 5 for r in results)
        metrics = wait_until_idle(url)
        assert metrics['enginekit:request_rejected_total{reason="queue_full"}'] == 1
        assert metrics["vllm:kv_cache_usage_perc"] == 0


def test_simulated_steps_take_their_time_scaled_in_wall_clock():
    with serve("serve.time_scale=0.02") as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        started = time.monotonic()
        client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=40)
        wall = time.monotonic() - started
        busy = httpx.get(f"{running.url}/summary").json()["summary"]["busy_time_s"]
    assert busy > 0
    assert wall >= busy / 0.02  # each step slept out its simulated time, scaled


def test_chat_needs_a_template_and_fills_what_the_cache_holds(tmp_path):
    plain = save_model_folder(tmp_path / "plain", weights=False, chat_template=False)
    templated = save_model_folder(tmp_path / "templated", weights=False)
    messages = [{"role": "user", "content": "w7 w8 w9"}]
    with serve(f"model.path={plain}") as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=str(plain), messages=messages)
        assert caught.value.body["param"] == "messages"
        assert "no chat template" in caught.value.body["message"]
        # completions still take text there
        done = client.completions.create(model=str(plain), prompt="w7 w8", max_tokens=3)
        assert done.usage.prompt_tokens == 2
    # 24 blocks of 4 tokens: a reply fills the 96 tokens the cache can hold
    with serve(f"model.path={templated}", "cache.block_size=4", "cache.num_blocks=24",
               "cache.watermark=0", "serve.time_scale=1000") as running:  # fmt: skip
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model=str(templated), messages=messages)
        prompt = 5  # "w4 w7 w8 w9 w5": the user's role, the message, the assistant's role
        assert reply.usage.prompt_tokens == prompt
        assert reply.usage.completion_tokens == 96 - prompt
        assert reply.choices[0].finish_reason == "length"


def test_an_engine_failure_answers_500_and_turns_health_to_503():
    server = Server(compose_config(SIM))
    with BackgroundServer(server) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        assert client.completions.create(model="tiny", prompt=[5], max_tokens=2).choices

        def broken_step() -> list:
            raise RuntimeError("a step failed")

        server.engine.step = broken_step  # the loop is idle: its next step is this one
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model="tiny", prompt=[5], max_tokens=2)
        assert "a step failed" in caught.value.body["message"]
        assert httpx.get(f"{running.url}/health").status_code == 503
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="tiny", prompt=[5], max_tokens=2)
        assert caught.value.status_code == 503


def test_preemptions_under_a_small_pool_count_as_the_summary_counts_them():
    # 12 blocks of 16 tokens for 8 requests that grow to 100 tokens each: preemptions
    with serve("cache.num_blocks=12", "cache.watermark=0", "serve.time_scale=1000") as running:
        url = running.url
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        done: list[openai.types.Completion] = []
        threads = [
            threading.Thread(
                target=lambda i=i: done.append(
                    client.completions.create(model="tiny", prompt=[3 + i] * 40, max_tokens=60)
                )
            )
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(done) == 8 and all(d.usage.completion_tokens == 60 for d in done)
        metrics = wait_until_idle(url)
        summary = httpx.get(f"{url}/summary").json()["summary"]
    assert summary["num_preemptions_total"] > 0
    assert metrics["vllm:num_preemptions_total"] == summary["num_preemptions_total"]
    for kind, count in summary["num_preemptions_by_kind"].items():
        assert metrics[f'enginekit:preemptions_by_kind_total{{kind="{kind}"}}'] == count
    assert metrics["enginekit:recomputed_tokens_total"] == summary["recomputed_tokens_total"] > 0
    by_kind = {
        name.split('"')[1]: value
        for name, value in metrics.items()
        if name.startswith("enginekit:recomputed_tokens_by_kind_total{")
    }
    assert sum(by_kind.values()) == summary["recomputed_tokens_total"]
    assert metrics["vllm:generation_tokens_total"] == summary["generation_tokens_total"] == 480


def test_the_engine_calls_the_server_relies_on_finish_and_release():
    from enginekit import Engine, InvalidRequestError, SamplingParams

    engine = Engine.from_overrides(["model=tiny", "progress=false", "cache.num_blocks=64"])
    stopped = engine.add_request([5, 6, 7], SamplingParams(max_tokens=50, n=2))
    other = engine.add_request([8, 9], SamplingParams(max_tokens=3))
    for _ in range(4):
        engine.step()
    with pytest.raises(InvalidRequestError, match="has not finished"):
        engine.release_request(stopped)
    assert engine.finish_request(stopped)  # a stop string its caller saw
    assert not engine.finish_request(stopped)
    output = engine.release_request(stopped)
    assert output.finish_reason == "stop" and [len(s) for s in output.samples] == [4, 4]
    with pytest.raises(KeyError):
        engine.output(stopped)
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_integrity()
    summary = engine.summary()
    assert summary["num_requests_finished"] == 2  # the finished one counts, released or not
    assert summary["generation_tokens_total"] == 8 + 3
    assert engine.kv_usage().num_used_blocks == 0
    assert [o.request_id for o in engine.outputs()] == [other]


@pytest.mark.parametrize("n", [10**6, 2**64])
def test_a_huge_n_is_refused_before_anything_is_built_and_the_server_keeps_answering(n):
    """``n`` past the sequences the engine runs at once can never be served: 400 naming
    it before the request's generation (its per-sample state) is built, and /health
    answers."""
    with serve("scheduler.max_num_seqs=8") as running:
        server = running.server
        built = []
        build = server.generation
        server.generation = lambda *args: built.append(args) or build(*args)
        reply = httpx.post(
            f"{running.url}/v1/completions",
            json={"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "n": n},
            timeout=30,
        )
        assert built == []
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == "n"
        assert "scheduler.max_num_seqs" in error["message"]
        assert httpx.get(f"{running.url}/health", timeout=5).status_code == 200


def test_more_prompts_than_may_wait_are_refused_with_400_not_a_retry():
    with serve("serve.max_waiting=2") as running:
        body = {"model": "tiny", "prompt": [[5], [6], [7]], "max_tokens": 2}
        reply = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "prompt"
        assert "serve.max_waiting" in reply.json()["error"]["message"]
        body["prompt"] = [[5], [6]]
        assert httpx.post(f"{running.url}/v1/completions", json=body, timeout=30).is_success

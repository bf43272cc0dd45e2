"""The HTTP routes: OpenAI's completions, chat completions and models, vLLM's tokenizer
endpoints, health, Prometheus metrics, and the two endpoints SGLang's router reads from
its workers.

- ``POST /v1/completions``, ``POST /v1/chat/completions``: see ``protocol`` for the
  fields. ``stream: true`` answers server-sent events, one chunk per choice per engine
  step that gave it tokens, ending in ``data: [DONE]`` (a usage chunk before it with
  ``stream_options: {include_usage: true}``; usage in every chunk with
  ``continuous_usage_stats``). Logprobs come in OpenAI's shapes (``logprobs``). A client
  that disconnects, streaming or not, aborts its requests: their blocks are released at
  once.
- ``POST /tokenize`` (a prompt, or chat messages through the template: ``count``,
  ``max_model_len``, ``tokens``, ``token_strs`` on request), ``POST /detokenize``,
  ``GET /tokenizer_info`` (the tokenizer's config) and ``GET /version``, as vLLM answers
  them.
- ``GET /v1/models``, ``GET /health`` (200 while the engine loop runs, else 503; also
  ``HEAD``), ``GET /metrics`` (``prometheus``; ``HEAD`` answers 200 with no body),
  ``GET /summary`` (the engine's summary and ``describe()``, computed on the engine's
  thread, and ``wall``: the output rate over the wall-clock span from the first arrival
  to the last end, ``EngineLoop.wall_summary``).
- ``GET /model_info``, ``GET /server_info`` (also as ``/get_model_info``,
  ``/get_server_info``): what ``sglang-router`` asks each worker when it registers it.

Errors are OpenAI's JSON shape (``protocol.ApiError``): bad input 400 naming the field
(a body that is not JSON names none), an unknown model 404, a prompt that can never fit
400 with admission's reason, a full queue 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from enginekit.serve.generation import ChoiceUpdate, Generation
from enginekit.serve.logprobs import (
    CompletionLogprobs,
    chat_content,
    completion_delta,
    prompt_logprobs_of,
)
from enginekit.serve.protocol import (
    COMPLETIONS_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from enginekit.serve.server import Server

CLIENT_GONE = 499  # the status of a response nobody reads (the client disconnected)


def build_app(server: Server) -> FastAPI:
    """The FastAPI application of ``server`` (its lifespan starts and stops the loop)."""
    app = FastAPI(title="enginekit", lifespan=server.lifespan)
    app.add_middleware(ArrivalStamp)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _api_error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        if server.is_healthy:
            return Response(status_code=200)
        return Response(status_code=503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/summary")
    async def summary() -> dict[str, Any]:
        loop = server.loop
        return await server.on_engine(lambda engine: {
            "summary": engine.summary(), "describe": engine.describe(),
            "wall": loop.wall_summary() if loop is not None else None,
        })  # fmt: skip

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return server.model_info()

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return await server.on_engine(server.server_info)

    @app.api_route("/metrics", methods=["HEAD"], include_in_schema=False)
    async def metrics_head() -> Response:
        return Response(media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": server.version}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        server.check_model(body.model)
        if body.messages is not None:
            token_ids = server.chat_prompt_ids(
                [m.as_template_input() for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template_kwargs=body.chat_template_kwargs,
                add_special_tokens=bool(body.add_special_tokens),
            )
        elif body.prompt is not None:
            add_special = True if body.add_special_tokens is None else body.add_special_tokens
            token_ids = server.prompt_ids(body.prompt, add_special_tokens=add_special)
        else:
            raise ApiError(400, "tokenize needs a prompt or messages", param="prompt")
        answer: dict[str, Any] = {
            "count": len(token_ids),
            "max_model_len": server.engine.max_model_len,
            "tokens": token_ids,
        }
        if body.return_token_strs:
            answer["token_strs"] = [server.require_codec("prompt").token_text(t) for t in token_ids]
        return answer

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        server.check_model(body.model)
        codec = server.require_codec("tokens")
        vocab = server.engine.shape.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": codec.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return server.require_codec("model").info()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        received = arrival_of(request)
        server.check_request(body)
        add_special = body.add_special_tokens
        prompts = [body.truncated(server.prompt_ids(p, add_special)) for p in body.prompts()]
        max_tokens = COMPLETIONS_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        sampling = body.sampling(max(1, max_tokens))  # echo alone still runs one step
        generation = server.generation(prompts, sampling, body, "cmpl", request, received)
        await _start(server, generation, body)
        created = int(time.time())
        echoes = [server.echo_text(p) for p in prompts] if body.echo else None
        if body.stream:
            return EventStream(
                _completion_chunks(server, generation, body, created, echoes),
                on_close=generation.abort,
            )
        if not await _until_done(generation, request):
            return Response(status_code=CLIENT_GONE)
        choices = []
        for index, choice in generation.all_choices():
            prompt = generation.prompt_of(index)
            text, token_ids, entries = choice.text, choice.token_ids, generation.logprobs_of(index)
            if body.echo_only:
                text, token_ids, entries = "", [], []
            echo = echoes[index // body.n] if echoes is not None else ""
            item: dict[str, Any] = {
                "index": index,
                "text": echo + text,
                "logprobs": None,
                "finish_reason": "length" if body.echo_only else generation.finish_reason(index),
            }
            if body.logprobs is not None:
                logprobs = CompletionLogprobs(server.token_names(body).text, body.logprobs)
                if body.echo:
                    prompt_entries = generation.prompt_logprobs_of(index) or [None] * len(prompt)
                    completion_delta(logprobs, prompt, prompt_entries)
                completion_delta(logprobs, token_ids, entries)
                item["logprobs"] = logprobs.as_dict()
            if body.prompt_logprobs is not None:
                item["prompt_logprobs"] = _prompt_logprobs(server, body, generation, index)
            if body.return_token_ids:
                item["token_ids"] = token_ids
                item["prompt_token_ids"] = prompt
            choices.append(item)
        usage = generation.usage()
        if body.echo_only:
            usage = {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}
        return JSONResponse({
            "id": generation.id, "object": "text_completion", "created": created,
            "model": server.model_name, "choices": choices, "usage": usage,
        })  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        received = arrival_of(request)
        server.check_request(body)
        prompt = body.truncated(
            server.chat_prompt_ids(
                [m.as_template_input() for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template_kwargs=body.chat_template_kwargs,
                add_special_tokens=body.add_special_tokens,
            )
        )
        max_tokens = body.requested_max_tokens
        if max_tokens is None:  # the reply may fill the context (or what the cache holds)
            max_tokens = max(1, server.longest_servable - len(prompt))
        generation = server.generation(
            [prompt], body.sampling(max_tokens), body, "chatcmpl", request, received
        )
        await _start(server, generation, body)
        created = int(time.time())
        if body.stream:
            return EventStream(
                _chat_chunks(server, generation, body, created), on_close=generation.abort
            )
        if not await _until_done(generation, request):
            return Response(status_code=CLIENT_GONE)
        choices = []
        for index, choice in generation.all_choices():
            item: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": body.echoed_text + choice.text},
                "logprobs": None,
                "finish_reason": generation.finish_reason(index),
            }
            if body.output_logprobs is not None:
                content = chat_content(
                    server.token_names(body),
                    body.output_logprobs,
                    choice.token_ids,
                    generation.logprobs_of(index),
                )
                item["logprobs"] = {"content": content}
            if body.prompt_logprobs is not None:
                item["prompt_logprobs"] = _prompt_logprobs(server, body, generation, index)
            if body.return_token_ids:
                item["token_ids"] = choice.token_ids
                item["prompt_token_ids"] = prompt
            choices.append(item)
        return JSONResponse({
            "id": generation.id, "object": "chat.completion", "created": created,
            "model": server.model_name, "choices": choices, "usage": generation.usage(),
        })  # fmt: skip

    return app


async def _start(
    server: Server, generation: Generation, body: CompletionRequest | ChatCompletionRequest
) -> None:
    """Queues ``generation``; an engine refusal names the request's own field."""
    try:
        await generation.start(server.config.max_waiting, server.config.retry_after_s)
    except ApiError as error:
        raise body.named(error) from None


class ArrivalStamp:
    """ASGI middleware: stamps each HTTP request with ``time.monotonic()`` when the server
    starts on it, before its body is read and parsed, so that the latencies the server
    reports count the time a client waits for that too (``arrival_of``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVAL_KEY] = time.monotonic()
        await self.app(scope, receive, send)


ARRIVAL_KEY = "enginekit_arrival"


def arrival_of(request: Request) -> float:
    """When the server started on ``request`` (``ArrivalStamp``; now, without it)."""
    arrival = request.scope.get("state", {}).get(ARRIVAL_KEY)
    return time.monotonic() if arrival is None else float(arrival)


def _api_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _validation_error(exc: RequestValidationError) -> ApiError:
    """A 400 naming the first bad field (pydantic's location without ``body`` and the
    union member it tried)."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "the request body is invalid")
    first = errors[0]
    if first.get("type") == "json_invalid":  # its location is a character position
        return ApiError(400, f"the request body is not valid JSON: {first.get('msg', '')}")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if not loc:  # the body as a whole
        return ApiError(400, f"the request body must be a JSON object: {first.get('msg', '')}")
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "body"
    message = f"{where}: {first.get('msg', 'invalid')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return ApiError(400, message, param=param)


async def _until_done(generation: Generation, request: Request) -> bool:
    """Consumes ``generation`` to its end and returns True; if the client disconnects
    first, aborts it and returns False (nobody is left to answer). Raises ApiError if
    the engine failed, or (503, the generation aborted) if a shutdown cancels the wait."""

    async def consume() -> None:
        async for _ in generation.updates():
            pass

    work = asyncio.ensure_future(consume())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stops and its drain timed out
        raise ApiError(503, "the server shut down before the request finished") from None
    finally:
        if not work.done():
            work.cancel()
            generation.abort()
        gone.cancel()
    if not work.done() or work.cancelled():
        return False
    work.result()  # re-raises the engine's failure, if any
    return True


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body was read: the next ASGI message is the
    disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---- server-sent events ----------------------------------------------------------------


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _completion_chunks(
    server: Server,
    generation: Generation,
    body: CompletionRequest,
    created: int,
    echoes: list[str] | None,
) -> AsyncIterator[str]:
    """The chunks of a streamed completion: a choice's first chunk carries its echo (the
    prompt's text, and with ``logprobs`` the prompt tokens' logprobs)."""
    names = server.token_names(body)
    logprobs: dict[int, CompletionLogprobs] = {}

    def chunk(update: ChoiceUpdate) -> dict[str, Any]:
        text, token_ids, entries = update.text, update.token_ids, update.logprobs or []
        if body.echo_only:
            text, token_ids, entries = "", [], []
        choice: dict[str, Any] = {
            "index": update.index,
            "text": text,
            "logprobs": None,
            "finish_reason": update.finish_reason,
        }
        first = update.index not in logprobs
        if first:
            logprobs[update.index] = CompletionLogprobs(names.text, body.logprobs or 0)
            if echoes is not None:
                choice["text"] = echoes[update.index // body.n] + text
        if body.logprobs is not None:
            choice["logprobs"] = completion_delta(logprobs[update.index], token_ids, entries)
        if body.return_token_ids:
            choice["token_ids"] = token_ids
        return {
            "id": generation.id,
            "object": "text_completion",
            "created": created,
            "model": server.model_name,
            "choices": [choice],
        }

    async for event in _stream(
        generation, body, chunk, "text_completion", server.model_name, created
    ):
        yield event


async def _chat_chunks(
    server: Server, generation: Generation, body: ChatCompletionRequest, created: int
) -> AsyncIterator[str]:
    opened: set[int] = set()
    names = server.token_names(body)

    def chunk(update: ChoiceUpdate) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        text = update.text
        if update.index not in opened:  # the first chunk of a choice names the role
            opened.add(update.index)
            delta["role"] = "assistant"
            text = body.echoed_text + text
        if text or "role" in delta:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": update.index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": update.finish_reason,
        }
        if body.output_logprobs is not None:
            content = chat_content(
                names, body.output_logprobs, update.token_ids, update.logprobs or []
            )
            choice["logprobs"] = {"content": content}
        if body.return_token_ids:
            choice["token_ids"] = update.token_ids
        return {
            "id": generation.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": server.model_name,
            "choices": [choice],
        }

    async for event in _stream(
        generation, body, chunk, "chat.completion.chunk", server.model_name, created
    ):
        yield event


def _prompt_logprobs(
    server: Server,
    body: CompletionRequest | ChatCompletionRequest,
    generation: Generation,
    index: int,
) -> list[dict[str, dict[str, Any]] | None]:
    prompt = generation.prompt_of(index)
    entries = generation.prompt_logprobs_of(index) or [None] * len(prompt)
    return prompt_logprobs_of(server.token_names(body).text, prompt, entries)


async def _stream(
    generation: Generation,
    body: CompletionRequest | ChatCompletionRequest,
    chunk: Callable[[ChoiceUpdate], dict[str, Any]],
    kind: str,
    model: str,
    created: int,
) -> AsyncIterator[str]:
    """The events of a stream: the chunks, then the usage chunk (if asked), then
    ``[DONE]``. An engine failure mid-stream becomes an error event before ``[DONE]``."""
    try:
        async for updates in generation.updates():
            for update in updates:
                payload = chunk(update)
                if body.continuous_usage:
                    payload["usage"] = generation.usage()
                yield _sse(payload)
    except ApiError as exc:
        yield _sse(exc.body())
    else:
        if body.include_usage:
            yield _sse({
                "id": generation.id, "object": kind, "created": created, "model": model,
                "choices": [], "usage": generation.usage(),
            })  # fmt: skip
    yield "data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """A server-sent-event response that calls ``on_close`` however it ends: completed,
    cancelled by the client's disconnect, failed while sending, or cut by a shutdown.
    Disconnects are watched for the whole stream (not only when a chunk is written), so a
    request still waiting for its first token is aborted as soon as its client leaves. A
    shutdown whose drain timed out (uvicorn cancels the response) ends the stream with an
    error event and ``[DONE]``, so the client learns why."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        stream = asyncio.ensure_future(self.stream_response(tracked))
        gone = asyncio.ensure_future(self.listen_for_disconnect(receive))
        cut = False
        try:
            await asyncio.wait({stream, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cut = True
        finally:
            for task in (stream, gone):
                task.cancel()
            self._on_close()
            await asyncio.gather(stream, gone, return_exceptions=True)
        if cut:
            await self._end_cut(send, started)
            return
        exc = None if stream.cancelled() else stream.exception()
        if exc is not None and not isinstance(exc, OSError):  # OSError: the client left
            raise exc

    async def _end_cut(self, send: Send, started: bool) -> None:
        error = ApiError(503, "the server shut down before the request finished")
        body = (_sse(error.body()) + "data: [DONE]\n\n").encode()
        try:
            if not started:
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})  # fmt: skip
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:  # the client has gone too
            pass

"""The HTTP routes: OpenAI's completions, chat completions and models, health, Prometheus
metrics, and the two endpoints SGLang's router reads from its workers.

- ``POST /v1/completions``, ``POST /v1/chat/completions``: see ``protocol`` for the
  fields. ``stream: true`` answers server-sent events, one chunk per choice per engine
  step that gave it tokens, ending in ``data: [DONE]`` (a usage chunk before it with
  ``stream_options: {include_usage: true}``). A client that disconnects, streaming or
  not, aborts its requests: their blocks are released at once.
- ``GET /v1/models``, ``GET /health`` (200 while the engine loop runs, else 503),
  ``GET /metrics`` (``prometheus``), ``GET /summary`` (the engine's summary and
  ``describe()``, computed on the engine's thread).
- ``GET /model_info``, ``GET /server_info`` (also as ``/get_model_info``,
  ``/get_server_info``): what ``sglang-router`` asks each worker when it registers it.

Errors are OpenAI's JSON shape (``protocol.ApiError``): bad input 400 naming the field,
an unknown model 404, a prompt that can never fit 400 with admission's reason, a full
queue 503 with ``Retry-After``.
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
from starlette.types import Message, Receive, Scope, Send

from enginekit.serve.generation import ChoiceUpdate, Generation
from enginekit.serve.protocol import (
    COMPLETIONS_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
)
from enginekit.serve.server import Server

CLIENT_GONE = 499  # the status of a response nobody reads (the client disconnected)


def build_app(server: Server) -> FastAPI:
    """The FastAPI application of ``server`` (its lifespan starts and stops the loop)."""
    app = FastAPI(title="enginekit", lifespan=server.lifespan)

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

    @app.get("/health")
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
        return await server.on_engine(lambda engine: {
            "summary": engine.summary(), "describe": engine.describe()
        })  # fmt: skip

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return server.model_info()

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return await server.on_engine(server.server_info)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        server.check_request(body)
        prompts = [server.prompt_ids(p) for p in body.prompts()]
        max_tokens = COMPLETIONS_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        generation = server.generation(prompts, body.sampling(max_tokens), body, "cmpl")
        await generation.start(server.config.max_waiting, server.config.retry_after_s)
        created = int(time.time())
        if body.stream:
            return EventStream(
                _completion_chunks(generation, body, server.model_name, created),
                on_close=generation.abort,
            )
        if not await _until_done(generation, request):
            return Response(status_code=CLIENT_GONE)
        choices = []
        for index, choice in generation.all_choices():
            item: dict[str, Any] = {
                "index": index,
                "text": choice.text,
                "logprobs": None,
                "finish_reason": generation.finish_reason(index),
            }
            if body.return_token_ids:
                item["token_ids"] = choice.token_ids
                item["prompt_token_ids"] = generation.prompt_of(index)
            choices.append(item)
        return JSONResponse({
            "id": generation.id, "object": "text_completion", "created": created,
            "model": server.model_name, "choices": choices, "usage": generation.usage(),
        })  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        server.check_request(body)
        prompt = server.chat_prompt_ids([m.as_template_input() for m in body.messages])
        max_tokens = body.requested_max_tokens
        if max_tokens is None:  # the reply may fill the context (or what the cache holds)
            max_tokens = max(1, server.longest_servable - len(prompt))
        generation = server.generation([prompt], body.sampling(max_tokens), body, "chatcmpl")
        await generation.start(server.config.max_waiting, server.config.retry_after_s)
        created = int(time.time())
        if body.stream:
            return EventStream(
                _chat_chunks(generation, body, server.model_name, created),
                on_close=generation.abort,
            )
        if not await _until_done(generation, request):
            return Response(status_code=CLIENT_GONE)
        choices = []
        for index, choice in generation.all_choices():
            item: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": None,
                "finish_reason": generation.finish_reason(index),
            }
            if body.return_token_ids:
                item["token_ids"] = choice.token_ids
                item["prompt_token_ids"] = prompt
            choices.append(item)
        return JSONResponse({
            "id": generation.id, "object": "chat.completion", "created": created,
            "model": server.model_name, "choices": choices, "usage": generation.usage(),
        })  # fmt: skip

    return app


def _api_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _validation_error(exc: RequestValidationError) -> ApiError:
    """A 400 naming the first bad field (pydantic's location without ``body`` and the
    union member it tried)."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "the request body is invalid")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
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
    generation: Generation, body: CompletionRequest, model: str, created: int
) -> AsyncIterator[str]:
    def chunk(update: ChoiceUpdate) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": update.index,
            "text": update.text,
            "logprobs": None,
            "finish_reason": update.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = update.token_ids
        return {
            "id": generation.id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    async for event in _stream(generation, body, chunk, "text_completion", model, created):
        yield event


async def _chat_chunks(
    generation: Generation, body: ChatCompletionRequest, model: str, created: int
) -> AsyncIterator[str]:
    opened: set[int] = set()

    def chunk(update: ChoiceUpdate) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if update.index not in opened:  # the first chunk of a choice names the role
            opened.add(update.index)
            delta["role"] = "assistant"
        if update.text or "role" in delta:
            delta["content"] = update.text
        choice: dict[str, Any] = {
            "index": update.index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": update.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = update.token_ids
        return {
            "id": generation.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    async for event in _stream(generation, body, chunk, "chat.completion.chunk", model, created):
        yield event


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
                yield _sse(chunk(update))
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

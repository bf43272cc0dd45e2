"""Server: one engine, its tokenizer, its engine loop and its metrics, as the HTTP routes
(``enginekit.serve.api``) use them.

The engine is built when the server is (so a bad config fails before any port is bound);
the engine loop starts with the application's lifespan, on the event loop uvicorn runs,
and stops with it: by then uvicorn has let live requests finish for
``serve.shutdown_timeout_s`` and cancelled the rest, and the loop aborts whatever is left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from starlette.requests import Request

from enginekit.config import EngineConfig
from enginekit.engine import Engine
from enginekit.errors import ConfigError, InvalidRequestError
from enginekit.request import SamplingParams
from enginekit.serve.codec import TextCodec
from enginekit.serve.generation import Generation
from enginekit.serve.logprobs import TokenNames, token_names
from enginekit.serve.loop import Backlog, EngineLoop
from enginekit.serve.prometheus import ServeMetrics, Snapshot
from enginekit.serve.protocol import ApiError, ChatCompletionRequest, CompletionRequest
from enginekit.serve.text import TextOptions

if TYPE_CHECKING:
    from enginekit.serve.kv_events import KVEventPublisher

LOOP_STOP_TIMEOUT_S = 30.0  # the engine loop ends within one step of being told to
_T = TypeVar("_T")


class Server:
    """What the routes serve: ``engine`` (touched only by ``loop``'s thread), ``codec``
    (None for a model without a tokenizer), ``metrics``, and the ``serve`` config."""

    def __init__(self, config: EngineConfig | DictConfig | None = None) -> None:
        self.engine = Engine(config)
        cfg = self.engine.config
        self.config = cfg.serve
        _check_serve_config(self.config)
        if self.config.kv_events.enabled:  # the only servers that need pyzmq and msgspec
            from enginekit.serve.kv_events import check_kv_events_config

            check_kv_events_config(self.config.kv_events)
        self.kv_events: KVEventPublisher | None = None  # serve.kv_events, while serving
        self.codec = TextCodec.of_model_path(cfg.model.path, self.engine.shape.vocab_size)
        self.model_name = str(cfg.serve.served_model_name or cfg.model.path or cfg.model.name)
        self.created = int(time.time())
        self.version = _version()
        # The simulator's steps take simulated time: pace them in wall-clock time.
        self.pace = 1.0 / float(self.config.time_scale) if cfg.executor == "sim" else None
        self.longest_servable = _longest_servable(self.engine)
        self.backlog = Backlog()
        self.loop: EngineLoop | None = None
        self.is_stopping = False
        infos = self.engine.plugin_infos
        self.metrics = ServeMetrics(
            self.engine.max_model_len,
            {
                group: {"name": i.name, "distribution": i.distribution, "version": i.version}
                for group, i in infos.items()
            },
            {
                "model": self.engine.shape.name,
                "executor": str(cfg.executor),
                "block_size": str(self.engine.kv_spec.block_size),
                "max_model_len": str(self.engine.max_model_len),
                "served_model_name": self.model_name,
            },
        )
        self.metrics.read_from(self.snapshot)

    def snapshot(self) -> Snapshot:
        return self.loop.snapshot if self.loop is not None else Snapshot()

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Starts the engine loop on the running event loop; on shutdown stops it (every
        request still live is aborted) and waits for its thread."""
        loop = EngineLoop(
            self.engine, asyncio.get_running_loop(), self.metrics, self.backlog, self.pace
        )
        self.loop = loop
        if self.config.kv_events.enabled:
            from enginekit.serve.kv_events import KVEventPublisher

            self.kv_events = KVEventPublisher(self.engine, self.config.kv_events)
            loop.after_engine = self.kv_events.after_engine
        loop.start()
        try:
            yield
        finally:
            self.is_stopping = True
            await asyncio.to_thread(loop.stop, LOOP_STOP_TIMEOUT_S)
            if self.kv_events is not None:
                await asyncio.to_thread(self.kv_events.close)

    @property
    def is_healthy(self) -> bool:
        return self.loop is not None and self.loop.is_alive and not self.is_stopping

    # -- for the routes --------------------------------------------------------------------

    def check_request(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        """Raises ApiError: 404 for another model, 400 for a field enginekit does not
        implement or a size no request can have (``n`` past the sequences the engine runs
        at once, more prompts than may wait), 503 while the server stops or after its
        engine loop failed. Checked before anything is built for the request, so that a
        huge size costs nothing."""
        self.check_model(body.model)
        refusal = body.refusal()
        if refusal is not None:
            raise refusal
        max_num_seqs = self.engine.limits.max_num_seqs
        if body.n > max_num_seqs:
            raise ApiError(
                400,
                f"n={body.n} exceeds the {max_num_seqs} sequences this server runs at once "
                "(scheduler.max_num_seqs)",
                param="n",
            )
        num_prompts = body.num_prompts if isinstance(body, CompletionRequest) else 1
        if num_prompts > self.config.max_waiting:
            raise ApiError(
                400,
                f"{num_prompts} prompts in one request; at most {self.config.max_waiting} may "
                "wait (serve.max_waiting)",
                param="prompt",
            )
        if not self.is_healthy:
            raise ApiError(503, "the server is shutting down or its engine has failed")

    def check_model(self, model: str | None) -> None:
        """Raises ApiError (404) for a model this server does not serve (None: this one)."""
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def require_codec(self, param: str, what: str = "this") -> TextCodec:
        """The tokenizer; ApiError (400, naming ``param``, saying ``what`` needs it) for a
        model without one."""
        if self.codec is None:
            raise ApiError(
                400,
                f"{what} needs the model's tokenizer, which comes from its folder "
                "(model.path=...); this model has none: send token ids",
                param=param,
            )
        return self.codec

    def prompt_ids(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """A completion prompt's token ids (with the BOS the tokenizer adds, unless
        ``add_special_tokens`` is False). Raises ApiError (400) for a text prompt to a
        model without a tokenizer."""
        if not isinstance(prompt, str):
            return prompt
        codec = self.require_codec("prompt", "a text prompt")
        return codec.encode(prompt, add_special_tokens=add_special_tokens)

    def chat_prompt_ids(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The messages through the chat template (the BOS in front with
        ``add_special_tokens``, on top of what the template writes). Raises ApiError (400)
        when the model has no tokenizer or no template, or the template refuses the
        messages."""
        codec = self.require_codec("messages", "a chat prompt")
        try:
            token_ids = codec.chat_prompt(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template_kwargs=chat_template_kwargs,
            )
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        bos = codec.bos_token_id
        if add_special_tokens and bos is not None:
            token_ids = [bos, *token_ids]
        return token_ids

    def echo_text(self, prompt_ids: list[int]) -> str:
        """The text ``echo`` puts in front of a completion: the prompt decoded (empty
        without a tokenizer)."""
        return "" if self.codec is None else self.codec.decode(prompt_ids)

    def token_names(self, body: CompletionRequest | ChatCompletionRequest) -> TokenNames:
        """How the request's logprobs name tokens: their text, or ``token_id:<id>``."""
        codec = self.codec
        if codec is None:
            return token_names(None, None, as_ids=True)
        return token_names(codec.token_text, codec.token_bytes, body.return_tokens_as_token_ids)

    def generation(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        body: CompletionRequest | ChatCompletionRequest,
        id_prefix: str,
        request: Request | None = None,
        received_at: float | None = None,
    ) -> Generation:
        """The engine requests of ``body``; its id is ``id_prefix``-(the body's
        ``request_id``, else the ``X-Request-Id`` header, else a random one).
        ``received_at`` (``time.monotonic()``, default now) is when the server started on
        the request, before reading its body (``api.ArrivalStamp``): the latencies count
        from there."""
        assert self.loop is not None, "the server's lifespan has not started"
        header = request.headers.get("x-request-id") if request is not None else None
        return Generation(
            self.loop,
            self.metrics,
            self.codec,
            prompts,
            sampling,
            body.stop_strings,
            body.cache_salt,
            id_prefix,
            priority=body.priority,
            user=body.user,
            text_options=TextOptions(
                include_stop_str_in_output=body.include_stop_str_in_output,
                min_tokens=body.min_tokens,
                skip_special_tokens=body.skip_special_tokens,
            ),
            request_id=body.request_id or header,
            received_at=received_at,
        )

    async def on_engine(self, fn: Callable[[Engine], _T]) -> _T:
        """``fn(engine)`` run on the engine loop's thread, between two steps."""
        if self.loop is None or not self.loop.is_alive:
            raise ApiError(503, "the engine loop is not running")
        result: _T = await asyncio.wrap_future(self.loop.call(fn))
        return result

    def model_card(self) -> dict[str, Any]:
        cfg = self.engine.config
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "enginekit",
            "root": str(cfg.model.path or cfg.model.name),
            "max_model_len": self.engine.max_model_len,
        }

    def model_info(self) -> dict[str, Any]:
        """What SGLang's ``/model_info`` answers: the model's path (its name for a model
        without a folder), its tokenizer's, and that it generates."""
        cfg = self.engine.config
        return {
            "model_path": self.model_name,
            "tokenizer_path": str(cfg.model.path) if cfg.model.path else None,
            "is_generation": True,
            "max_model_len": self.engine.max_model_len,
            "vocab_size": self.engine.shape.vocab_size,
        }

    def server_info(self, engine: Engine) -> dict[str, Any]:
        """What SGLang's ``/server_info`` answers, enginekit's way: the config, the
        engine's ``describe()`` and the live load (run on the engine's thread)."""
        snap = self.snapshot()
        return {
            "served_model_name": self.model_name,
            "model_path": self.model_name,
            "max_model_len": engine.max_model_len,
            "config": OmegaConf.to_container(engine.config, resolve=True),
            "engine": engine.describe(),
            "num_requests_running": snap.num_requests_running,
            "num_requests_waiting": snap.num_requests_waiting,
            "kv_cache_usage_perc": snap.kv_cache_usage,
        }


def _version() -> str:
    """enginekit's installed version (the source tree's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("enginekit")
    except PackageNotFoundError:
        return "0+unknown"


def _longest_servable(engine: Engine) -> int:
    """The most tokens (prompt + output) one sequence may reach: the model's context, or
    less where the whole cache cannot hold that many (admission's bound). Read before the
    engine loop starts (the bound depends on the config alone)."""
    cache = engine.cache
    low, high = 1, engine.max_model_len
    if cache.max_blocks_held(high) <= cache.num_blocks:
        return high
    while low < high:  # the largest total whose blocks fit (monotone in the total)
        middle = (low + high + 1) // 2
        if cache.max_blocks_held(middle) <= cache.num_blocks:
            low = middle
        else:
            high = middle - 1
    return low


def _check_serve_config(serve: DictConfig) -> None:
    """Raises ConfigError naming the first ``serve.*`` key out of range."""
    if not 0 <= serve.port <= 65535:
        raise ConfigError(f"serve.port must be in [0, 65535], got {serve.port}")
    if serve.max_waiting < 1:
        raise ConfigError(f"serve.max_waiting must be >= 1, got {serve.max_waiting}")
    if serve.retry_after_s < 0:
        raise ConfigError(f"serve.retry_after_s must be >= 0, got {serve.retry_after_s}")
    if not serve.time_scale > 0:
        raise ConfigError(f"serve.time_scale must be > 0, got {serve.time_scale}")
    if serve.shutdown_timeout_s < 0:
        raise ConfigError(f"serve.shutdown_timeout_s must be >= 0, got {serve.shutdown_timeout_s}")

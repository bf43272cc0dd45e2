"""The OpenAI-compatible request bodies, their checks, and errors in OpenAI's JSON shape.

A body is parsed by pydantic (strict types: ``"8"`` is no ``max_tokens``); fields that
clients and routers add on their own are accepted and ignored, the OpenAI fields enginekit
does not implement (logprobs, penalties, echo, tools, ...) are refused with 400 when set
to anything but their neutral value. Sampling fields become a ``SamplingParams``, whose
own checks name the field of a bad value. Extra fields, as vLLM takes them: ``top_k``
(0 or -1: off), ``stop_token_ids``, ``ignore_eos``, ``return_token_ids`` (each choice
then carries ``token_ids`` and ``prompt_token_ids``) and ``cache_salt`` (the prefix
cache's salt: requests share cached blocks only with the same salt).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from enginekit.errors import InvalidRequestError
from enginekit.request import SamplingParams

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default (the engine's own default is greedy)

StrictFloat = Annotated[float, Field(strict=True)]  # ints are taken, strings are not


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with HTTP
    ``status`` (and ``headers``, e.g. Retry-After)."""

    TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 503: "server_error"}

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(exc: Exception) -> ApiError:
    """A 400 for an engine refusal: the message as the engine words it, the field it names
    (``sampling.top_p ...`` -> ``top_p``) as ``param``."""
    message = re.sub(r"^request '[^']*': ", "", str(exc))  # the id is the server's own
    named = re.search(r"\bsampling\.(\w+)", message)
    if named:
        param: str | None = named.group(1)
        message = message.replace("sampling.", "")  # the API's fields have no prefix
    elif message.startswith(("prompt", "token ids", "the prompt")):
        param = "prompt"
    else:
        param = None
    return ApiError(400, message, param=param)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False


class _Sampled(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    seed: StrictInt | None = None
    ignore_eos: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False
    cache_salt: StrictStr | None = None
    user: StrictStr | None = None  # the tenant +queue=fair shares service among
    # lower is served first under +queue=priority; another queue refuses any but 0 (400)
    priority: StrictInt = 0
    # OpenAI fields enginekit does not implement: refused unless neutral (``unsupported``).
    logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None

    NEUTRAL: ClassVar[dict[str, tuple[Any, ...]]] = {
        "logprobs": (None, False),
        "presence_penalty": (None, 0, 0.0),
        "frequency_penalty": (None, 0, 0.0),
        "logit_bias": (None, {}),
    }

    def unsupported(self) -> ApiError | None:
        """A 400 for the first field set that enginekit does not implement, else None."""
        for name, neutral in self.NEUTRAL.items():
            if getattr(self, name) not in neutral:
                return ApiError(400, f"{name} is not supported by enginekit", param=name)
        return None

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams. Raises ApiError (400, naming the field)."""
        top_k = self.top_k
        if top_k == -1:  # vLLM's spelling of "off"
            top_k = 0
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
                top_k=0 if top_k is None else top_k,
                top_p=1.0 if self.top_p is None else self.top_p,
                seed=self.seed,
                n=self.n,
            )
        except InvalidRequestError as exc:
            raise bad_request(exc) from None


class CompletionRequest(_Sampled):
    """``POST /v1/completions``: ``prompt`` is a text, token ids, or a list of either
    (one engine request per prompt; choices are numbered prompt by prompt, n each)."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = COMPLETIONS_MAX_TOKENS
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    NEUTRAL: ClassVar[dict[str, tuple[Any, ...]]] = {
        **_Sampled.NEUTRAL,
        "echo": (None, False),
        "best_of": (None, 1),
        "suffix": (None, ""),
    }

    @property
    def num_prompts(self) -> int:
        """How many prompts ``prompts`` holds (read without building them)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return 1
        return len(prompt)

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request, text or token ids. Raises ApiError for none."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise ApiError(400, "prompt is empty", param="prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]  # a list of ints
        return list(prompt)  # type: ignore[arg-type]  # texts, or lists of ids


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates take it: content parts of type text joined."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(
                        400,
                        f"messages: content parts of type {part.get('type')!r} are not "
                        "supported (text only)",
                        param="messages",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        extra = {k: v for k, v in (self.model_extra or {}).items() if k != "content"}
        return {**extra, "role": self.role, "content": content or ""}


class ChatCompletionRequest(_Sampled):
    """``POST /v1/chat/completions``: the messages through the model's chat template.
    Without ``max_tokens`` (or ``max_completion_tokens``) a reply may fill the context,
    or as much of it as the whole KV cache holds."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None

    NEUTRAL: ClassVar[dict[str, tuple[Any, ...]]] = {
        **_Sampled.NEUTRAL,
        "top_logprobs": (None, 0),
        "tools": (None, []),
        "tool_choice": (None, "none"),
        "response_format": (None, {"type": "text"}),
    }

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


FinishReason = Literal["stop", "length", "abort"]

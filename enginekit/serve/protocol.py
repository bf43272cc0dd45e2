"""The OpenAI-compatible request bodies, their checks, and errors in OpenAI's JSON shape.

A body is parsed by pydantic (strict types: ``"8"`` is no ``max_tokens``). Every field of
vLLM's completions and chat requests is either served (the models' own fields) or
refused with a 400 naming it when set to anything but its neutral value (``fields``);
keys neither knows are a client's or router's own and ignored, unless one edit away from
a known field. Sampling fields become a ``SamplingParams``, whose own checks name the
field of a bad value (the executor refuses what it cannot do: the simulator has no
distribution for logprobs and penalties). vLLM's extras, as vLLM takes them: ``top_k``
(0 or -1: off), ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``,
``ignore_eos``, ``include_stop_str_in_output``, ``skip_special_tokens``,
``prompt_logprobs``, ``truncate_prompt_tokens``, ``add_special_tokens``,
``use_beam_search`` (``n`` beams, greedy), ``request_id`` (the response's id),
``return_token_ids`` (each choice then carries ``token_ids`` and ``prompt_token_ids``),
``return_tokens_as_token_ids`` (logprobs name tokens ``token_id:<id>``), ``cache_salt``
(the prefix cache's salt: requests share cached blocks only with the same salt),
``priority`` and ``user``; chat's ``echo``, ``add_generation_prompt``,
``continue_final_message`` and ``chat_template_kwargs``. Structured outputs: OpenAI's
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs``
(``json``, ``json_object``, ``regex``, ``choice``, ``grammar``) and its older
``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar`` (xgrammar's
EBNF), one at a time, become the engine's ``StructuredOutput``; an engine refusal names
the request's own field.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from enginekit.errors import InvalidRequestError
from enginekit.request import MAX_LOGPROBS, SamplingParams, StructuredOutput
from enginekit.serve import fields

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
    continuous_usage_stats: StrictBool = False  # usage in every chunk, not only at the end


class _Sampled(BaseModel):
    """Fields both endpoints share (see ``fields`` for the ones refused)."""

    model_config = ConfigDict(extra="allow")
    ENDPOINT: ClassVar[str] = ""

    model: StrictStr | None = None  # None: the served model
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat = 0.0
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    min_tokens: StrictInt = 0
    seed: StrictInt | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    use_beam_search: StrictBool = False
    prompt_logprobs: StrictInt | None = None
    truncate_prompt_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False
    return_tokens_as_token_ids: StrictBool = False
    request_id: StrictStr | None = None
    # Structured outputs (``structured_output``): one of them, or response_format's.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: StrictStr | dict[str, Any] | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None
    guided_decoding_backend: StrictStr | None = None
    cache_salt: StrictStr | None = None
    user: StrictStr | None = None  # the tenant +queue=fair shares service among
    # lower is served first under +queue=priority; another queue refuses any but 0 (400)
    priority: StrictInt = 0

    def refusal(self) -> ApiError | None:
        """A 400 for the first field set that enginekit does not implement (``fields``),
        for a misspelt field, or for fields that contradict each other; else None."""
        known = set(type(self).model_fields)
        for name, value in (self.model_extra or {}).items():
            reason = fields.refusal_of(name, value, self.ENDPOINT)
            if reason is not None:
                return ApiError(400, reason, param=name)
            typo = fields.typo_of(name, known | set(fields.REFUSED))
            if typo is not None:
                return ApiError(400, f"unknown field {name!r}; did you mean {typo!r}?", param=name)
        if self.stream_options is not None and not self.stream:
            return ApiError(400, "stream_options needs stream: true", param="stream_options")
        if self.prompt_logprobs is not None:
            if not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
                return _out_of_range("prompt_logprobs", self.prompt_logprobs)
            if self.stream:
                return ApiError(
                    400, "prompt_logprobs are not available with stream: true",
                    param="prompt_logprobs",
                )  # fmt: skip
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            return ApiError(
                400,
                f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}",
                param="truncate_prompt_tokens",
            )
        return None

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def output_logprobs(self) -> int | None:
        """How many alternatives each output token's logprobs list; None: no logprobs."""
        raise NotImplementedError

    def truncated(self, prompt: list[int]) -> list[int]:
        """The prompt's last ``truncate_prompt_tokens`` tokens (all without the field)."""
        keep = self.truncate_prompt_tokens
        return prompt if keep is None or keep >= len(prompt) else prompt[-keep:]

    def sampling(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams. Raises ApiError (400, naming the field)."""
        top_k = self.top_k
        if top_k == -1:  # vLLM's spelling of "off"
            top_k = 0
        temperature = self.temperature
        if temperature is None:  # beams are greedy; samples take OpenAI's default
            temperature = 0.0 if self.use_beam_search else DEFAULT_TEMPERATURE
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                temperature=temperature,
                top_k=0 if top_k is None else top_k,
                top_p=1.0 if self.top_p is None else self.top_p,
                min_p=self.min_p,
                presence_penalty=self.presence_penalty or 0.0,
                frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=(
                    1.0 if self.repetition_penalty is None else self.repetition_penalty
                ),
                min_tokens=self.min_tokens,
                seed=self.seed,
                n=self.n,
                beam_width=self.n if self.use_beam_search else 1,
                logprobs=self.output_logprobs,
                prompt_logprobs=self.prompt_logprobs_asked,
                structured=self.structured_output(),
            )
        except InvalidRequestError as exc:
            raise self.named(bad_request(exc)) from None

    @property
    def structured_field(self) -> str | None:
        """The field that asks for structured output (None: none does). Raises ApiError
        (400) when more than one does."""
        named = [
            name
            for name in _STRUCTURED_FIELDS
            if getattr(self, name) is not None
            and not (name == "response_format" and self.response_format == {"type": "text"})
        ]
        if len(named) > 1:
            raise ApiError(
                400, f"{named[0]} and {named[1]} cannot both be set: one output format",
                param=named[1],
            )  # fmt: skip
        return named[0] if named else None

    def named(self, error: ApiError) -> ApiError:
        """``error`` with the engine's ``structured`` named as the request's own field."""
        field_name = self.structured_field
        if field_name is not None:
            error.message = re.sub(r"\bstructured(\.\w+)?", field_name, error.message)
            if error.param == "structured":
                error.param = field_name
        return error

    def structured_output(self) -> StructuredOutput | None:
        """The engine's StructuredOutput of the structured-output field set, if any.
        Raises ApiError (400, naming the field) for a value enginekit cannot take."""
        field_name = self.structured_field
        if field_name is None:
            return None
        backend = self.guided_decoding_backend
        if backend is not None and backend not in ("auto", "xgrammar"):
            raise ApiError(
                400, f"guided_decoding_backend: only xgrammar is here, not {backend!r}",
                param="guided_decoding_backend",
            )  # fmt: skip
        try:
            if field_name == "response_format":
                return _of_response_format(self.response_format or {})
            if field_name == "structured_outputs":
                return _of_structured_outputs(self.structured_outputs or {})
            if field_name == "guided_json":
                return StructuredOutput(json_schema=_schema_text(self.guided_json, field_name))
            if field_name == "guided_regex":
                return StructuredOutput(regex=self.guided_regex)
            if field_name == "guided_choice":
                return StructuredOutput(choice=tuple(self.guided_choice or ()))
            return StructuredOutput(grammar=self.guided_grammar)
        except InvalidRequestError as exc:
            raise ApiError(400, f"{field_name}: {exc}", param=field_name) from None

    @property
    def prompt_logprobs_asked(self) -> int | None:
        """How many alternatives each prompt token's logprobs list; None: none asked."""
        return self.prompt_logprobs


_STRUCTURED_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def _schema_text(schema: object, field_name: str) -> str:
    """A JSON schema as JSON text (a dict is dumped, text is checked to parse)."""
    if isinstance(schema, dict):
        return json.dumps(schema)
    if not isinstance(schema, str):
        raise ApiError(400, f"{field_name}: a JSON schema is an object", param=field_name)
    try:
        json.loads(schema)
    except ValueError as exc:
        message = f"{field_name}: the schema is not JSON: {exc}"
        raise ApiError(400, message, param=field_name) from None
    return schema


def _of_response_format(response_format: dict[str, Any]) -> StructuredOutput:
    """OpenAI's ``response_format``: ``json_object``, or ``json_schema`` with
    ``json_schema.schema``."""
    kind = response_format.get("type")
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise ApiError(
                400, "response_format: json_schema needs json_schema.schema",
                param="response_format",
            )  # fmt: skip
        return StructuredOutput(json_schema=_schema_text(schema, "response_format"))
    raise ApiError(
        400,
        f"response_format: type {kind!r} is not taken (text, json_object or json_schema)",
        param="response_format",
    )


def _of_structured_outputs(spec: dict[str, Any]) -> StructuredOutput:
    """vLLM's ``structured_outputs``: one of ``json``, ``json_object``, ``regex``,
    ``choice`` or ``grammar``."""
    known = {"json", "json_object", "regex", "choice", "grammar"}
    asked = {k: v for k, v in spec.items() if v is not None and v is not False}
    unknown = sorted(set(asked) - known)
    if unknown or len(asked) != 1:
        raise ApiError(
            400,
            f"structured_outputs: set exactly one of {sorted(known)}"
            + (f"; {unknown[0]!r} is not taken" if unknown else ""),
            param="structured_outputs",
        )
    ((kind, value),) = asked.items()
    if kind == "json":
        return StructuredOutput(json_schema=_schema_text(value, "structured_outputs"))
    if kind == "json_object":
        return StructuredOutput(json_object=value)
    if kind == "choice":
        if not isinstance(value, list):
            raise ApiError(400, "structured_outputs: choice is a list", param="structured_outputs")
        return StructuredOutput(choice=tuple(value))
    return StructuredOutput(**{kind: value})


def _out_of_range(name: str, value: int) -> ApiError:
    return ApiError(400, f"{name} must be in [0, {MAX_LOGPROBS}], got {value}", param=name)


class CompletionRequest(_Sampled):
    """``POST /v1/completions``: ``prompt`` is a text, token ids, or a list of either
    (one engine request per prompt; choices are numbered prompt by prompt, n each).
    ``echo`` puts the prompt in front of each choice's text (and, with ``logprobs``, its
    tokens' logprobs in front); with ``max_tokens: 0`` it returns the prompt alone."""

    ENDPOINT: ClassVar[str] = fields.COMPLETIONS

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = COMPLETIONS_MAX_TOKENS
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    add_special_tokens: StrictBool = True

    def refusal(self) -> ApiError | None:
        refusal = super().refusal()
        if refusal is not None:
            return refusal
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            return _out_of_range("logprobs", self.logprobs)
        if self.max_tokens == 0 and not self.echo:
            return ApiError(400, "max_tokens must be >= 1 (0 only with echo)", param="max_tokens")
        if self.echo and self.logprobs is not None and self.stream:
            return ApiError(
                400,
                "the echoed prompt's logprobs are not streamed: send stream: false",
                param="echo",
            )
        return None

    @property
    def output_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprobs_asked(self) -> int | None:
        if self.prompt_logprobs is None and self.echo:
            return self.logprobs  # echoed tokens carry logprobs as the generated ones do
        return self.prompt_logprobs

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: the answer is the prompt, nothing generated."""
        return self.echo and self.max_tokens == 0

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
    or as much of it as the whole KV cache holds. ``echo`` puts the last message's
    content in front of the reply when that message is the assistant's."""

    ENDPOINT: ClassVar[str] = fields.CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    echo: StrictBool = False
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False  # the template writes any BOS itself
    chat_template_kwargs: dict[str, Any] | None = None

    def refusal(self) -> ApiError | None:
        refusal = super().refusal()
        if refusal is not None:
            return refusal
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                return _out_of_range("top_logprobs", self.top_logprobs)
            if self.top_logprobs > 0 and not self.logprobs:
                return ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            return ApiError(
                400,
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message",
            )
        return None

    @property
    def output_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def echoed_text(self) -> str:
        """What ``echo`` puts in front of the reply: the last message's content when it is
        the assistant's, else nothing."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return ""
        return str(last.as_template_input()["content"])


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a completion ``prompt`` or chat ``messages`` to token ids."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None  # None: True for a prompt, False for chat
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids to text."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    tokens: list[StrictInt]


FinishReason = Literal["stop", "length", "abort"]

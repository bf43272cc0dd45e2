"""Log-probabilities in OpenAI's response shapes, from the engine's ``TokenLogprob``s.

- Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one
  entry per token. A token's ``top_logprobs`` maps the text of its ``logprobs`` most
  likely alternatives and of the token itself to their logprobs (as vLLM answers:
  ``logprobs: 0`` gives the token alone). Echoed prompt tokens come first; the prompt's
  first token has none (``None``). ``text_offset`` is each token's offset in the choice's
  text, its tokens' texts laid end to end.
- Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``, where
  ``top_logprobs`` lists the ``top_logprobs`` most likely alternatives, most likely first.
- vLLM's ``prompt_logprobs``: per prompt token ``None`` (the first) or ``{token id:
  {"logprob", "rank", "decoded_token"}}`` for the token and its alternatives.

Logprobs are the model's raw distribution (before penalties and temperature). JSON has
no -inf: a logprob below ``MIN_LOGPROB`` is written as ``MIN_LOGPROB``, as vLLM does.
``as_ids`` (``return_tokens_as_token_ids``) names every token ``token_id:<id>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from enginekit.request import TokenLogprob

MIN_LOGPROB = -9999.0

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]


@dataclass(frozen=True)
class TokenNames:
    """How a response names tokens: ``text`` (the tokenizer's ``token_text``, or
    ``token_id:<id>``) and ``raw``, the bytes chat's ``bytes`` field lists."""

    text: TokenText
    raw: TokenBytes


def token_names(
    token_text: TokenText | None, token_bytes: TokenBytes | None, as_ids: bool
) -> TokenNames:
    """Tokens named by the tokenizer, or ``token_id:<id>`` with ``as_ids`` or without one."""
    if as_ids or token_text is None or token_bytes is None:
        return TokenNames(lambda t: f"token_id:{t}", lambda t: f"token_id:{t}".encode())
    return TokenNames(token_text, token_bytes)


def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


class CompletionLogprobs:
    """A completion choice's ``logprobs`` object, grown as its tokens arrive."""

    def __init__(self, name: TokenText, num_top: int, text_offset: int = 0) -> None:
        self.name = name
        self.num_top = num_top
        self._offset = text_offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, entry: TokenLogprob | None) -> None:
        """Appends one token (``entry`` None: it has no logprob, the prompt's first)."""
        text = self.name(token_id)
        self.tokens.append(text)
        self.text_offset.append(self._offset)
        self._offset += len(text)
        if entry is None:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
        else:
            top = {self.name(t): _clamped(lp) for t, lp in entry.top[: self.num_top]}
            top[text] = _clamped(entry.logprob)
            self.token_logprobs.append(_clamped(entry.logprob))
            self.top_logprobs.append(top)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


def completion_delta(
    logprobs: CompletionLogprobs, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None]
) -> dict[str, Any]:
    """Adds ``token_ids`` with their ``entries`` and returns the delta for them all."""
    start = len(logprobs.tokens)
    for token_id, entry in zip(token_ids, entries, strict=True):
        logprobs.add(token_id, entry)
    full = logprobs.as_dict()
    return {key: values[start:] for key, values in full.items()}


def chat_content(
    names: TokenNames, num_top: int, token_ids: Sequence[int], entries: Sequence[TokenLogprob]
) -> list[dict[str, Any]]:
    """The chat ``logprobs.content`` entries of ``token_ids``."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": names.text(token_id),
            "logprob": _clamped(logprob),
            "bytes": list(names.raw(token_id)),
        }

    content = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        head = item(token_id, entry.logprob)
        head["top_logprobs"] = [item(t, lp) for t, lp in entry.top[:num_top]]
        content.append(head)
    return content


def prompt_logprobs_of(
    name: TokenText, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None]
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token None or its alternatives by token id."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        if entry is None:
            out.append(None)
            continue
        ranked = {
            str(t): {"logprob": _clamped(lp), "rank": rank, "decoded_token": name(t)}
            for rank, (t, lp) in enumerate(entry.top, start=1)
        }
        ranked[str(token_id)] = {
            "logprob": _clamped(entry.logprob),
            "rank": entry.rank,
            "decoded_token": name(token_id),
        }
        out.append(ranked)
    return out

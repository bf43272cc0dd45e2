"""Every field of vLLM's completions and chat-completions requests, and what enginekit
does with it: serves it, or refuses it with a 400 that names it.

vLLM accepts any JSON key and ignores the ones it does not know; enginekit never ignores
a field it cannot honour. ``REFUSED`` lists the fields vLLM (or OpenAI) defines and
enginekit does not implement: a request that sets one to anything but its neutral value
(the value that asks for nothing) is answered 400 with ``param`` the field's name and a
message saying why. The fields enginekit serves are the request models' own
(``protocol.CompletionRequest`` and ``protocol.ChatCompletionRequest``). A key that is
neither is taken as a client's or router's own addition and ignored, unless it is one
edit away from a known field (``temprature``): that is a typo, refused naming the field
it meant.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "completions"
CHAT = "chat"
BOTH = (COMPLETIONS, CHAT)

TYPO_CUTOFF = 0.85  # difflib's similarity from which an unknown key is taken as a typo


@dataclass(frozen=True)
class Refused:
    """A field enginekit does not implement: refused unless its value is in ``neutral``."""

    endpoints: tuple[str, ...]
    neutral: tuple[Any, ...]
    reason: str


_STRUCTURED = "structural tags are not implemented (JSON schema, regex, choice and grammar are)"
_NONE: tuple[Any, ...] = (None,)

REFUSED: dict[str, Refused] = {
    # OpenAI's
    "logit_bias": Refused(BOTH, (None, {}), "logit_bias is not implemented"),
    "suffix": Refused((COMPLETIONS,), (None, ""), "suffix (insertion) is not implemented"),
    "tools": Refused((CHAT,), (None, []), "tool calling is not implemented"),
    "functions": Refused((CHAT,), (None, []), "function calling is not implemented"),
    "function_call": Refused((CHAT,), (None, "none"), "function calling is not implemented"),
    "tool_choice": Refused((CHAT,), (None, "none", "auto"), "tool calling is not implemented"),
    "parallel_tool_calls": Refused((CHAT,), (None, False), "tool calling is not implemented"),
    "reasoning_effort": Refused((CHAT,), _NONE, "reasoning models are not implemented"),
    "include_reasoning": Refused((CHAT,), (None, True), "reasoning models are not implemented"),
    "modalities": Refused((CHAT,), (None, ["text"]), "only text is generated"),
    "audio": Refused((CHAT,), _NONE, "audio output is not implemented"),
    "prediction": Refused((CHAT,), _NONE, "predicted outputs are not implemented"),
    "web_search_options": Refused((CHAT,), _NONE, "web search is not implemented"),
    "metadata": Refused(BOTH, (None, {}), "stored completions are not implemented"),
    "store": Refused(BOTH, (None, False), "stored completions are not implemented"),
    "service_tier": Refused(BOTH, (None, "auto", "default"), "service tiers do not exist here"),
    # vLLM's
    "best_of": Refused(
        BOTH, (None, 1), "best_of (draw more than n, return the best n) is not implemented"
    ),
    "prompt_embeds": Refused((COMPLETIONS,), (None, []), "prompt embeddings are not taken"),
    "length_penalty": Refused(
        BOTH,
        _NONE,
        "beams are ranked by their total log-probability (no length normalization); "
        "length_penalty is not implemented",
    ),
    "spaces_between_special_tokens": Refused(
        BOTH, (None, True), "special tokens are always decoded with the tokenizer's spacing"
    ),
    "allowed_token_ids": Refused(BOTH, _NONE, "allowed_token_ids is not implemented"),
    "bad_words": Refused(BOTH, (None, []), "bad_words is not implemented"),
    "logits_processors": Refused(BOTH, (None, []), "custom logits processors are not taken"),
    "guided_whitespace_pattern": Refused(
        BOTH, _NONE, "JSON is laid out as json.dumps lays it out; no other whitespace pattern"
    ),
    "structural_tag": Refused(BOTH, _NONE, _STRUCTURED),
    "documents": Refused((CHAT,), (None, []), "documents (RAG templates) are not taken"),
    "chat_template": Refused(
        (CHAT,), _NONE, "the model's own chat template is used; a per-request one is not taken"
    ),
    "mm_processor_kwargs": Refused((CHAT,), (None, {}), "only text models are served"),
    "media_io_kwargs": Refused((CHAT,), (None, {}), "only text models are served"),
    "kv_transfer_params": Refused(BOTH, (None, {}), "disaggregated KV transfer is not implemented"),
    "vllm_xargs": Refused(BOTH, (None, {}), "extension arguments are not taken"),
    "thinking_token_budget": Refused((CHAT,), _NONE, "reasoning models are not implemented"),
}


def refusal_of(name: str, value: Any, endpoint: str) -> str | None:
    """Why ``name`` = ``value`` is refused at ``endpoint``; None when it is not a refused
    field there or its value is neutral."""
    refused = REFUSED.get(name)
    if refused is None or endpoint not in refused.endpoints:
        return None
    if value is None or any(
        value == neutral and type(value) is type(neutral) for neutral in refused.neutral
    ):
        return None
    return f"{name}: {refused.reason}"


def typo_of(name: str, known: set[str]) -> str | None:
    """The known field ``name`` is most likely a misspelling of, or None."""
    if name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=TYPO_CUTOFF)
    return close[0] if close else None

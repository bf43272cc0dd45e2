"""Text for the server: prompts to token ids, chat messages through the model's chat
template, and output ids back to text as they stream, cut at stop strings.

The tokenizer is the one ``enginekit.tokenizer`` loads (the Hugging Face tokenizer in
``model.path``, loaded with the same call, never downloaded), so a text prompt gets the
same token ids over HTTP as through ``Engine.add_request``. A model without a folder (the
presets, ``tiny``) has none: it takes token-id prompts, and its outputs have empty text
(their ids come back with ``return_token_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from enginekit.errors import ConfigError, InvalidRequestError

# Prompt tokens decoded in front of the first output tokens, so that the first delta has
# the spacing it has in the whole text (a word-initial token decoded alone loses its space).
CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"  # what decode gives for a token that ends inside a character


class TextCodec:
    """The model's tokenizer: ``encode``, ``decode`` and ``chat_prompt``."""

    def __init__(self, folder: str) -> None:
        from transformers import AutoTokenizer

        try:
            self._inner: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"model.path={folder!r} holds no usable tokenizer ({type(exc).__name__})"
            ) from None

    @classmethod
    def of_model_path(cls, path: str | None) -> TextCodec | None:
        """The tokenizer of ``path``'s folder; None for a model without a folder. Raises
        ConfigError for a folder without a usable tokenizer."""
        if not path or not Path(path).is_dir():
            return None
        return cls(path)

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, with the model's BOS where its tokenizer adds
        one (as ``Engine.add_request`` tokenizes text)."""
        return list(self._inner.encode(text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._inner.decode(list(token_ids), skip_special_tokens=True))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._inner, "chat_template", None))

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered by the chat template with the generation
        prompt (the template writes any BOS itself, so none is added). Raises
        InvalidRequestError when the tokenizer has no template or the template refuses
        the messages."""
        if not self.has_chat_template:
            raise InvalidRequestError(
                "messages: this model's tokenizer has no chat template; "
                "use /v1/completions with a prompt"
            )
        try:
            text = self._inner.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja2's errors, and the template's own raise_exception
            raise InvalidRequestError(f"messages: the chat template refused them: {exc}") from None
        return list(self._inner.encode(str(text), add_special_tokens=False))


class SampleText:
    """One output (a choice) as it streams: its token ids, its text so far, and whether a
    stop string ended it.

    ``add(ids)`` appends tokens and returns the text that may be sent now. Text is decoded
    incrementally (a window of recent tokens, as vLLM does), held back while it ends inside
    a character, and, with stop strings, by the longest stop string's length less one (a
    stop string may be starting); ``flush()`` returns what was held back once the output
    ends. A stop string found ends the output: the text stops right before it, and the
    tokens after the one that completed it are ignored (``num_tokens`` counts up to it).
    Without a codec the text stays empty and only ids are kept.
    """

    def __init__(
        self, codec: TextCodec | None, prompt_ids: Sequence[int], stop: Sequence[str]
    ) -> None:
        self.codec = codec
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.text = ""
        self.is_stopped = False
        self._num_sent = 0  # characters of ``text`` already returned
        self._context = list(prompt_ids[-CONTEXT_TOKENS:])
        self._ids = list(self._context)  # context + outputs: the decoding window's source
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def add(self, token_ids: Sequence[int]) -> str:
        """Appends ``token_ids`` (ignored once stopped) and returns the text to send now."""
        for token_id in token_ids:
            if self.is_stopped:
                break
            self.token_ids.append(token_id)
            if self.codec is not None:
                self._ids.append(token_id)
                self._append_text(self._decode_delta())
        if self.is_stopped:
            return self.flush()
        safe = len(self.text) - self._hold
        return self._take(safe)

    def flush(self) -> str:
        """All the text not yet returned (the output has ended)."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self._num_sent:
            return ""
        chunk = self.text[self._num_sent : end]
        self._num_sent = end
        return chunk

    def _decode_delta(self) -> str:
        """The text the newest token adds ("" while it ends inside a character)."""
        assert self.codec is not None
        window = self._ids[self._prefix_offset :]
        prefix_text = self.codec.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self.codec.decode(window)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _append_text(self, delta: str) -> None:
        if not delta:
            return
        start = max(0, len(self.text) - self._hold)
        self.text += delta
        if not self.stop:
            return
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.is_stopped = True

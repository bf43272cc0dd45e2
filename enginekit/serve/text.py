"""A choice's text as it streams: output ids decoded incrementally by the model's
``TextCodec`` (``enginekit.serve.codec``), cut at stop strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.serve.codec import REPLACEMENT_CHAR, TextCodec

# Prompt tokens decoded in front of the first output tokens, so that the first delta has
# the spacing it has in the whole text (a word-initial token decoded alone loses its space).
CONTEXT_TOKENS = 5


@dataclass(frozen=True)
class TextOptions:
    """How a choice's text is made from its tokens (vLLM's request fields of the same
    names): ``include_stop_str_in_output`` keeps the stop string that ended it,
    ``min_tokens`` defers the search for stop strings until the output has that many
    tokens, ``skip_special_tokens`` leaves special tokens out of the text."""

    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True


class SampleText:
    """One output (a choice) as it streams: its token ids, its text so far, and whether a
    stop string ended it.

    ``add(ids)`` appends tokens and returns the text that may be sent now. Text is decoded
    incrementally (a window of recent tokens, as vLLM does), held back while it ends inside
    a character, and, with stop strings, by the longest stop string's length less one (a
    stop string may be starting); ``flush()`` returns what was held back once the output
    ends. A stop string found ends the output: the text stops right before it, and the
    tokens after the one that completed it are ignored (``num_tokens`` counts up to it).
    Without a codec the text stays empty and only ids are kept. ``options`` (vLLM's):
    keep the stop string in the text, look for stop strings only once the output has
    ``min_tokens`` tokens, decode special tokens too.
    """

    def __init__(
        self,
        codec: TextCodec | None,
        prompt_ids: Sequence[int],
        stop: Sequence[str],
        options: TextOptions | None = None,
    ) -> None:
        self.codec = codec
        self.stop = [s for s in stop if s]
        self.options = options or TextOptions()
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
        skip = self.options.skip_special_tokens
        prefix_text = self.codec.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip
        )
        new_text = self.codec.decode(window, skip_special_tokens=skip)
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
        if not self.stop or len(self.token_ids) < self.options.min_tokens:
            return
        found = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if found:
            index, stop = min(found)
            end = index + len(stop) if self.options.include_stop_str_in_output else index
            self.text = self.text[:end]
            self.is_stopped = True

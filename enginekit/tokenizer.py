"""Text in and out: the tokenizer that ships in a model's Hugging Face folder.

Loaded from ``model.path`` only, never from the network. Models without a folder (the
presets, ``tiny``) take token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from enginekit.errors import ConfigError


class Tokenizer:
    """Wraps the folder's transformers tokenizer: ``encode(text)`` to token ids (with the
    model's BOS when its tokenizer adds one) and ``decode(ids)`` back to text."""

    def __init__(self, folder: str) -> None:
        from transformers import AutoTokenizer

        try:
            self._inner: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"model.path={folder!r} holds no usable tokenizer ({type(exc).__name__}): "
                "pass token ids instead of text"
            ) from None

    @classmethod
    def of_model_path(cls, path: str | None) -> Tokenizer:
        """The tokenizer of ``path``; ConfigError when there is no folder to read it from."""
        if not path or not Path(path).is_dir():
            raise ConfigError(
                "text prompts need a tokenizer, which comes from the model's folder "
                "(model.path=...); this model has none: pass token ids"
            )
        return cls(path)

    def encode(self, text: str) -> list[int]:
        return list(self._inner.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._inner.decode(token_ids, skip_special_tokens=True))

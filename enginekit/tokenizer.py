"""Text in and out: the tokenizer that ships in a model's Hugging Face folder, or the
SentencePiece vocabulary enginekit ships for models without one.

Loaded from ``model.path`` only, never from the network. ``Tokenizer.of_model`` is a
model's tokenizer (``Engine.add_request`` takes text through it, and structured outputs
read its vocabulary): its folder's; for a model without a folder whose vocabulary has
``SENTENCEPIECE_VOCAB_SIZE`` ids (``tiny``), ``SentencePieceTokenizer``, Mistral-7B's
32,000-token SentencePiece vocabulary as the ``mistral-common`` package ships it
(``tokenizer.model.v1``), loaded with ``sentencepiece`` (the ``data`` extra); other models
without a folder take token ids. Workloads made of text (ShareGPT) take
``Tokenizer.for_workload``: the folder's tokenizer when ``model.path`` has one, otherwise
the SentencePiece vocabulary. The server uses the same rule, with
``SENTENCEPIECE_CHAT_TEMPLATE``; ``enginekit.tokenizer_folder`` writes the vocabulary as a
folder.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

from enginekit.errors import ConfigError
from enginekit.extras import install_hint


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
    def of_model(cls, path: str | None, vocab_size: int) -> Tokenizer | SentencePieceTokenizer:
        """The model's tokenizer: its folder's; for a model without a folder whose
        vocabulary has ``SENTENCEPIECE_VOCAB_SIZE`` ids (``tiny``), the shipped
        SentencePiece vocabulary. ConfigError for any other model without a folder."""
        if path and Path(path).is_dir():
            return cls(path)
        if vocab_size == SENTENCEPIECE_VOCAB_SIZE:
            return SentencePieceTokenizer()
        raise ConfigError(
            f"the model has no folder (model.path) and its {vocab_size} ids are not the "
            f"SentencePiece vocabulary's {SENTENCEPIECE_VOCAB_SIZE}: it has no tokenizer "
            "(pass token ids)"
        )

    @classmethod
    def for_workload(cls, path: str | None) -> Tokenizer | SentencePieceTokenizer:
        """The folder's tokenizer when ``path`` is a folder with one, otherwise the shipped
        SentencePiece vocabulary (``SentencePieceTokenizer``). ConfigError when neither
        can be loaded (naming the extra to install)."""
        if path and Path(path).is_dir():
            try:
                return cls(path)
            except ConfigError:
                pass
        return SentencePieceTokenizer()

    @property
    def name(self) -> str:
        """What the tokens come from, for reports."""
        return f"{type(self._inner).__name__} of the model folder"

    @property
    def transformers_tokenizer(self) -> Any:
        """The transformers tokenizer it wraps (what libraries that read a vocabulary
        take: the grammars of structured outputs)."""
        return self._inner

    @property
    def vocab_size(self) -> int:
        return int(len(self._inner))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the model's BOS (when its
        tokenizer adds one) comes first."""
        return list(self._inner.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._inner.decode(token_ids, skip_special_tokens=True))


SENTENCEPIECE_PACKAGE = "mistral_common"
SENTENCEPIECE_MODEL = "data/tokenizer.model.v1"  # Mistral-7B v0.1's, 32,000 pieces
SENTENCEPIECE_VOCAB_SIZE = 32_000
DATA_EXTRA_HINT = install_hint(["data"])

SENTENCEPIECE_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}"
    "{%- set turns = messages[1:] %}"
    "{%- else %}"
    "{%- set system = none %}"
    "{%- set turns = messages %}"
    "{%- endif %}"
    "{%- if not turns %}"
    "{{- raise_exception('the conversation has no user message') }}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in turns %}"
    "{%- if message['role'] != ('user' if loop.index0 % 2 == 0 else 'assistant') %}"
    "{{- raise_exception('after an optional first system message, the roles must "
    "alternate user, assistant, user, ...; got ' ~ message['role'] ~ ' at turn ' "
    "~ loop.index) }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' }}"
    "{%- if loop.first and system is not none %}"
    "{{- system ~ '\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] ~ ' [/INST]' }}"
    "{%- else %}"
    "{{- ' ' ~ message['content'] ~ eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)
"""The chat template of the SentencePiece vocabulary (Jinja, as Hugging Face tokenizers
carry theirs): Mistral's instruct format, ``<s>[INST] user [/INST] assistant</s>[INST]
user [/INST]``. A first system message is folded into the first user turn (``system``,
a blank line, then the user's text), as Mistral's own template does; after it the roles
alternate user, assistant, ..., starting with the user, and anything else is refused
(``raise_exception``). The generation prompt is empty: ``[/INST]`` already hands the turn
to the assistant."""


class SentencePieceTokenizer:
    """Mistral-7B's SentencePiece vocabulary (32,000 ids; BOS 1, EOS 2), read from the
    ``mistral-common`` package with ``sentencepiece``. ``encode`` puts BOS first when
    ``add_special_tokens``, as Mistral's and Llama-2's tokenizers do. ``model_proto`` is
    the vocabulary's file; ``piece``, ``score``, ``special_tokens`` and ``byte_value``
    describe its pieces. ConfigError at construction when either package is missing."""

    def __init__(self) -> None:
        try:
            import sentencepiece

            model = resources.files(SENTENCEPIECE_PACKAGE).joinpath(SENTENCEPIECE_MODEL)
            proto = model.read_bytes()
        except (ImportError, FileNotFoundError, ModuleNotFoundError) as exc:
            raise ConfigError(
                f"text workloads without model.path need a SentencePiece vocabulary "
                f"({type(exc).__name__}: {exc}); {DATA_EXTRA_HINT}"
            ) from None
        self._inner: Any = sentencepiece.SentencePieceProcessor(model_proto=proto)
        self.model_proto: bytes = proto
        self.bos_token_id = int(self._inner.bos_id())
        self.eos_token_id = int(self._inner.eos_id())
        self.unk_token_id = int(self._inner.unk_id())

    @property
    def name(self) -> str:
        return "Mistral-7B SentencePiece (mistral-common tokenizer.model.v1)"

    @property
    def vocab_size(self) -> int:
        return int(self._inner.get_piece_size())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(self._inner.encode(text))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode(text, add_special_tokens=False)`` of each text, in one call."""
        return [list(ids) for ids in self._inner.encode(texts)]

    def decode(self, token_ids: list[int]) -> str:
        return str(self._inner.decode(token_ids))

    def piece(self, token_id: int) -> str:
        """The piece of ``token_id`` as the vocabulary spells it (``▁`` for a space,
        ``<0x0A>`` for a byte)."""
        return str(self._inner.id_to_piece(token_id))

    def score(self, token_id: int) -> float:
        """The piece's score: BPE merges the adjacent pair whose merged piece scores
        highest first."""
        return float(self._inner.get_score(token_id))

    @functools.cached_property
    def special_tokens(self) -> dict[str, int]:
        """The control and unknown pieces (``<unk>``, ``<s>``, ``</s>``) -> their ids."""
        inner = self._inner
        return {
            self.piece(i): i
            for i in range(self.vocab_size)
            if inner.is_control(i) or inner.is_unknown(i)
        }

    def byte_value(self, token_id: int) -> int | None:
        """The byte a byte-fallback piece (``<0xNN>``) stands for; None for other pieces."""
        if not self._inner.is_byte(token_id):
            return None
        return int(self.piece(token_id)[3:5], 16)

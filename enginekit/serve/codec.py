"""The model's tokenizer as the server uses it (``TextCodec``): prompts to token ids,
chat messages through the chat template, ids back to text, and each token's text and
bytes for logprobs.

The tokenizer is the one ``enginekit.tokenizer`` picks (``Tokenizer.of_model``: the
Hugging Face tokenizer in ``model.path``, loaded with the same call, never downloaded), so
a text prompt gets the same token ids over HTTP as through ``Engine.add_request``. A model
without a folder whose vocabulary has 32,000 ids (``tiny``, and the presets of that size)
gets Mistral-7B's SentencePiece vocabulary with a chat template in Mistral's instruct
format: the ids, text and chat prompts transformers gives for the folder
``python3 -m enginekit.tokenizer_folder`` writes. Any other model without a folder has
none: it takes token-id prompts, and its outputs have empty text (their ids come back
with ``return_token_ids``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from enginekit.errors import ConfigError, InvalidRequestError
from enginekit.tokenizer import (
    SENTENCEPIECE_CHAT_TEMPLATE,
    SENTENCEPIECE_VOCAB_SIZE,
    SentencePieceTokenizer,
)

REPLACEMENT_CHAR = "\ufffd"  # what decode gives for a token that ends inside a character

SPACE_PIECE = "\u2581"  # "▁", SentencePiece's space
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte-fallback piece


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE vocabularies' (GPT-2's, Llama 3's, Qwen2's) character for each byte:
    the byte itself where it is a printable Latin-1 character, else ``chr(256 + n)`` for
    the n-th other byte in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet: dict[str, int] = {}
    others = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + others)] = byte
            others += 1
    return alphabet


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()


def _decoder_types(tokenizer: Any) -> set[str]:
    """The types of a transformers tokenizer's decoder and of the decoders it chains
    (empty for a tokenizer without a ``tokenizers`` backend)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    types: set[str] = set()
    pending = [json.loads(decoder.__getstate__())]
    while pending:
        node = pending.pop()
        types.add(str(node.get("type")))
        pending.extend(node.get("decoders") or [])
    return types


def _utf8_or_replacements(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return REPLACEMENT_CHAR * len(run)


def _template_error(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _json_ready(value: Any) -> Any:
    """``value`` as JSON holds it: a special token (an object with ``content``) as its
    text, mappings with string keys, sequences as lists, anything else not JSON as text."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [_json_ready(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# Keys chat_template_kwargs may not set: the server sets them, or they name the call's own
# arguments rather than the template's variables.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "chat_template",
        "tools",
        "documents",
        "return_dict",
        "return_tensors",
    }
)
# Appended to the final message's content to find where it ends once rendered.
CONTINUE_MARKER = "\x00continue-final-message\x00"


class TextCodec:
    """The model's tokenizer as the server uses it; ``of_model_path`` picks one.

    - ``encode(text, add_special_tokens)``: a prompt's ids (BOS first where the tokenizer
      adds one, unless ``add_special_tokens`` is False); special tokens written in the text
      (``</s>``) become their ids.
    - ``decode(ids, skip_special_tokens)``: the text of ids (special tokens left out, or
      written as their text).
    - ``token_bytes(id)`` and ``token_text(id)``: one token alone, as logprobs name it.
    - ``chat_prompt(messages, ...)``: the ids of messages rendered by the chat template.
    - ``info()``: what vLLM's ``GET /tokenizer_info`` returns.
    - ``vocab_size``, ``bos_token_id``, ``eos_token_id`` (None where there is none).

    Two kinds: ``FolderCodec``, the Hugging Face tokenizer of ``model.path``, and
    ``SentencePieceCodec``, the SentencePiece vocabulary for a model without a folder whose
    vocabulary has its size (``tiny``).
    """

    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    @staticmethod
    def of_model_path(path: str | None, vocab_size: int | None = None) -> TextCodec | None:
        """The tokenizer of ``path``'s folder; for a model without a folder whose
        ``vocab_size`` is the SentencePiece vocabulary's (32,000), that vocabulary; None for
        any other model without a folder. Raises ConfigError for a folder without a usable
        tokenizer, or when the SentencePiece vocabulary's packages are missing."""
        if path and Path(path).is_dir():
            return FolderCodec(path)
        if vocab_size == SENTENCEPIECE_VOCAB_SIZE:
            return SentencePieceCodec()
        return None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for alone: a special token's text, a byte
        piece's byte, an ordinary piece's text (its space marker a space) in UTF-8; empty
        for an id outside the vocabulary."""
        raise NotImplementedError

    @property
    def chat_template(self) -> str | None:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        raise NotImplementedError

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        raise NotImplementedError

    def token_text(self, token_id: int) -> str:
        """The text of ``token_id`` alone, as OpenAI's logprobs name a token: its bytes as
        UTF-8 (``" Hello"``, ``"<s>"``), or, for bytes that are not UTF-8 alone (a piece
        of a character), ``bytes:`` and each byte as ``\\xNN`` (``bytes:\\xe2\\x80``)."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the chat template (the template writes
        any BOS itself, so none is added): with the generation prompt, or with the last
        message left open for the model to continue (``continue_final_message``: rendered
        up to the end of its content, as transformers' ``apply_chat_template`` does).
        ``chat_template_kwargs`` are the template's extra variables. Raises
        InvalidRequestError, naming the field, when the tokenizer has no template, the
        options conflict, or the template refuses the messages."""
        if not self.has_chat_template:
            raise InvalidRequestError(
                "messages: this model's tokenizer has no chat template; "
                "use /v1/completions with a prompt"
            )
        if continue_final_message and add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message: continuing the final message and adding a "
                "generation prompt exclude each other; set add_generation_prompt to false"
            )
        template_kwargs = dict(chat_template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & template_kwargs.keys())
        if reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs: {', '.join(reserved)} may not be set there "
                "(they are the request's own fields)"
            )
        try:
            text = self._render_chat(
                messages, add_generation_prompt, continue_final_message, template_kwargs
            )
        except InvalidRequestError:
            raise
        except Exception as exc:  # jinja2's errors, and the template's own raise_exception
            raise InvalidRequestError(f"messages: the chat template refused them: {exc}") from None
        return self.encode(text, add_special_tokens=False)


class FolderCodec(TextCodec):
    """The Hugging Face tokenizer of a model folder, loaded as ``enginekit.tokenizer``
    loads it (never downloaded)."""

    def __init__(self, folder: str) -> None:
        from transformers import AutoTokenizer

        try:
            self._inner: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"model.path={folder!r} holds no usable tokenizer ({type(exc).__name__})"
            ) from None
        self.vocab_size = len(self._inner)
        self.bos_token_id = self._inner.bos_token_id
        self.eos_token_id = self._inner.eos_token_id
        self._special_ids = set(self._inner.all_special_ids)
        self._byte_level = "ByteLevel" in _decoder_types(self._inner)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._inner.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._inner.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        token = self._inner.convert_ids_to_tokens(token_id)
        if token is None:
            return b""
        if token_id in self._special_ids:
            return str(token).encode()
        if self._byte_level and all(c in BYTE_LEVEL_ALPHABET for c in token):
            return bytes(BYTE_LEVEL_ALPHABET[c] for c in token)
        byte_piece = BYTE_PIECE.fullmatch(token)
        if byte_piece:
            return bytes([int(byte_piece[1], 16)])
        return str(token).replace(SPACE_PIECE, " ").encode()

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._inner, "chat_template", None)
        return template if isinstance(template, str) else None

    def info(self) -> dict[str, Any]:
        """vLLM's answer: the tokenizer's settings (``tokenizer_config.json`` as loaded,
        file paths left out, special tokens as their text), its class's name, and the
        chat template."""
        settings = {
            key: value
            for key, value in dict(getattr(self._inner, "init_kwargs", None) or {}).items()
            if key not in ("vocab_file", "merges_file")
        }
        info: dict[str, Any] = _json_ready(settings)
        info["tokenizer_class"] = type(self._inner).__name__
        if self.chat_template:
            info["chat_template"] = self.chat_template
        return info

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        return str(
            self._inner.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **template_kwargs,
            )
        )


class SentencePieceCodec(TextCodec):
    """``enginekit.tokenizer.SentencePieceTokenizer`` (Mistral-7B's vocabulary) with
    ``SENTENCEPIECE_CHAT_TEMPLATE``: what transformers gives for the folder
    ``enginekit.tokenizer_folder`` writes (the same ids, text, chat prompts and settings),
    without transformers. Raises ConfigError when sentencepiece, mistral-common or jinja2
    is missing."""

    def __init__(self) -> None:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            self._tokenizer = SentencePieceTokenizer()
        except (ImportError, ConfigError) as exc:
            raise ConfigError(
                f"a model without a folder whose vocabulary has {SENTENCEPIECE_VOCAB_SIZE:,} "
                f"ids is served with the SentencePiece vocabulary, which needs the serve "
                f"extra's packages: {exc}"
            ) from None
        tokenizer = self._tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.bos_token_id = tokenizer.bos_token_id
        self.eos_token_id = tokenizer.eos_token_id
        self._specials = tokenizer.special_tokens
        self._special_texts = {i: piece for piece, i in self._specials.items()}
        self._special_pattern = re.compile(
            "|".join(re.escape(piece) for piece in sorted(self._specials, key=len, reverse=True))
        )
        self._byte_values = [tokenizer.byte_value(i) for i in range(self.vocab_size)]
        self._texts = [tokenizer.piece(i).replace(SPACE_PIECE, " ") for i in range(self.vocab_size)]
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _template_error
        self._template = environment.from_string(SENTENCEPIECE_CHAT_TEMPLATE)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """SentencePiece's ids of each stretch of text between special tokens (each
        gets SentencePiece's leading space, as the folder's normalizer gives it)."""
        ids = [self._tokenizer.bos_token_id] if add_special_tokens else []
        start = 0
        for special in self._special_pattern.finditer(text):
            if special.start() > start:
                ids += self._tokenizer.encode(text[start : special.start()], False)
            ids.append(self._specials[special.group()])
            start = special.end()
        if start < len(text):
            ids += self._tokenizer.encode(text[start:], False)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """As the folder's decoder: pieces laid end to end with their space marker a
        space, each run of byte pieces as UTF-8 (one U+FFFD per byte piece when the run is
        not UTF-8), the first leading space dropped; ids outside the vocabulary skipped."""
        parts: list[str] = []
        run = bytearray()
        for token_id in token_ids:
            if not 0 <= token_id < self.vocab_size:
                continue
            if token_id in self._special_texts and skip_special_tokens:
                continue
            value = self._byte_values[token_id]
            if value is not None:
                run.append(value)
                continue
            if run:
                parts.append(_utf8_or_replacements(run))
                run.clear()
            parts.append(self._special_texts.get(token_id) or self._texts[token_id])
        if run:
            parts.append(_utf8_or_replacements(run))
        text = "".join(parts)
        return text[1:] if text.startswith(" ") else text

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            return b""
        value = self._byte_values[token_id]
        if value is not None:
            return bytes([value])
        return (self._special_texts.get(token_id) or self._texts[token_id]).encode()

    @property
    def chat_template(self) -> str:
        return SENTENCEPIECE_CHAT_TEMPLATE

    def info(self) -> dict[str, Any]:
        """The settings of the folder's ``tokenizer_config.json``, as vLLM answers for a
        loaded tokenizer (special tokens as their text)."""
        from enginekit.tokenizer_folder import tokenizer_config

        info: dict[str, Any] = _json_ready(tokenizer_config(self._tokenizer))
        info["added_tokens_decoder"] = {
            str(i): piece for i, piece in sorted(self._special_texts.items())
        }
        return info

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        messages = [dict(message) for message in messages]
        if continue_final_message:
            if not messages or not isinstance(messages[-1].get("content"), str):
                raise InvalidRequestError(
                    "continue_final_message: the final message has no text to continue"
                )
            messages[-1]["content"] += CONTINUE_MARKER
        text = self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._special_texts[self._tokenizer.bos_token_id],
            eos_token=self._special_texts[self._tokenizer.eos_token_id],
            **template_kwargs,
        )
        if continue_final_message:
            text = text[: text.rindex(CONTINUE_MARKER)]
        return str(text)

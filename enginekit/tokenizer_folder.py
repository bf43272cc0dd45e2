"""Mistral-7B's SentencePiece vocabulary (``enginekit.tokenizer.SentencePieceTokenizer``,
the tokenizer the server gives ``tiny``) as a Hugging Face tokenizer folder, for the tools
that load a model's tokenizer with ``transformers.AutoTokenizer.from_pretrained(folder)``:
benchmark clients, evaluation harnesses.

``python3 -m enginekit.tokenizer_folder FOLDER``, or ``write_tokenizer_folder(folder)``,
writes four files into ``FOLDER`` (created if missing; other files in it are left alone):

- ``tokenizer.json``: the vocabulary as a ``tokenizers`` BPE model with byte fallback, so
  that plain transformers loads it (neither sentencepiece nor protobuf needed) and turns
  text into the ids sentencepiece gives. Each piece of two or more characters becomes the
  merges of its splits into two pieces of the vocabulary, ranked by the piece's score
  (SentencePiece merges the best-scoring pair first). The normalizer writes spaces as
  ``▁`` and puts one in front of each stretch of text between special tokens (what
  SentencePiece's dummy prefix does to the text it is given); the decoder maps ``▁`` back
  to a space, fuses byte pieces into UTF-8 and drops the first leading space.
- ``tokenizer.model``: the SentencePiece file itself.
- ``tokenizer_config.json`` (``tokenizer_config``): ``PreTrainedTokenizerFast`` (the
  class that reads ``tokenizer.json`` as it is; transformers' ``LlamaTokenizer`` rebuilds
  its own pre-tokenizer, which differs from sentencepiece on runs of spaces), BOS ``<s>``
  put in front of encoded text, EOS ``</s>``, UNK ``<unk>``, no padding token, and the
  chat template ``SENTENCEPIECE_CHAT_TEMPLATE`` (Mistral's instruct format).
- ``special_tokens_map.json``: the BOS, EOS and UNK tokens.

The command prints the folder it wrote; without the vocabulary's packages (the ``data``
extra) it prints ``error: ...`` naming the extra and exits with 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from enginekit.errors import ConfigError
from enginekit.tokenizer import SENTENCEPIECE_CHAT_TEMPLATE, SentencePieceTokenizer

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
MODEL_MAX_LENGTH = 32768  # Mistral-7B's max_position_embeddings
SPACE_PIECE = "\u2581"  # "▁", SentencePiece's space

USAGE = """\
usage: python -m enginekit.tokenizer_folder FOLDER

Writes Mistral-7B's SentencePiece vocabulary (32,000 pieces, the mistral-common package's)
as a Hugging Face tokenizer folder: tokenizer.json, tokenizer.model, tokenizer_config.json
(with the chat template) and special_tokens_map.json, which
transformers.AutoTokenizer.from_pretrained(FOLDER) loads offline.
"""


def _special_token_entry(piece: str) -> dict[str, Any]:
    """A special token as tokenizers and transformers write one: matched whole in text,
    before normalization, never split."""
    return {
        "content": piece,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def tokenizer_config(tokenizer: SentencePieceTokenizer) -> dict[str, Any]:
    """``tokenizer_config.json`` of the folder (see the module's docstring)."""
    specials = sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
    return {
        "tokenizer_class": TOKENIZER_CLASS,
        "bos_token": tokenizer.piece(tokenizer.bos_token_id),
        "eos_token": tokenizer.piece(tokenizer.eos_token_id),
        "unk_token": tokenizer.piece(tokenizer.unk_token_id),
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "added_tokens_decoder": {str(i): _special_token_entry(piece) for piece, i in specials},
        "chat_template": SENTENCEPIECE_CHAT_TEMPLATE,
    }


def special_tokens_map(tokenizer: SentencePieceTokenizer) -> dict[str, str]:
    """``special_tokens_map.json`` of the folder."""
    return {
        "bos_token": tokenizer.piece(tokenizer.bos_token_id),
        "eos_token": tokenizer.piece(tokenizer.eos_token_id),
        "unk_token": tokenizer.piece(tokenizer.unk_token_id),
    }


def bpe_merges(tokenizer: SentencePieceTokenizer) -> list[tuple[str, str]]:
    """The BPE merges of the vocabulary, first applied first: for every ordinary piece
    (not special, not a byte) of two or more characters, each split of it into two
    ordinary pieces, ranked by the merged piece's score, highest first (ties: lower id
    first, then the split's ids)."""
    specials = set(tokenizer.special_tokens.values())
    ordinary = {
        tokenizer.piece(i): i
        for i in range(tokenizer.vocab_size)
        if i not in specials and tokenizer.byte_value(i) is None
    }
    ranked = []
    for piece, i in ordinary.items():
        score = tokenizer.score(i)
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ordinary and right in ordinary:
                ranked.append((-score, i, ordinary[left], ordinary[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def tokenizer_json(tokenizer: SentencePieceTokenizer) -> dict[str, Any]:
    """``tokenizer.json`` of the folder (see the module's docstring)."""
    vocab = {tokenizer.piece(i): i for i in range(tokenizer.vocab_size)}
    specials = sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
    bos = tokenizer.piece(tokenizer.bos_token_id)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, **_special_token_entry(piece)} for piece, i in specials],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": SPACE_PIECE},
                {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_PIECE},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [tokenizer.bos_token_id], "tokens": [bos]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE_PIECE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokenizer.piece(tokenizer.unk_token_id),
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "vocab": vocab,
            # "left right", the format every tokenizers release reads (no piece holds a
            # space: SentencePiece writes spaces as "▁")
            "merges": [f"{left} {right}" for left, right in bpe_merges(tokenizer)],
        },
    }


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_tokenizer_folder(folder: str) -> None:
    """Writes the four files of the module's docstring into ``folder`` (created with its
    parents when missing). ConfigError when the vocabulary cannot be read (its packages,
    the ``data`` extra, are missing) or ``folder`` is a file."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"FOLDER={folder!r} is a file, not a folder")
    tokenizer = SentencePieceTokenizer()
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.model").write_bytes(tokenizer.model_proto)
    _write_json(path / "tokenizer.json", tokenizer_json(tokenizer))
    _write_json(path / "tokenizer_config.json", tokenizer_config(tokenizer))
    _write_json(path / "special_tokens_map.json", special_tokens_map(tokenizer))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(USAGE, end="")
        return 0
    if len(args) != 1:
        print(USAGE, end="", file=sys.stderr)
        print(f"error: expected one FOLDER, got {len(args)} arguments", file=sys.stderr)
        return 2
    try:
        write_tokenizer_folder(args[0])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote the SentencePiece tokenizer folder {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

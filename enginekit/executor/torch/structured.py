"""Structured outputs on the torch executor: a request's ``StructuredOutput`` compiled by
xgrammar over the model's vocabulary, one grammar matcher per sequence, and the bitmask
of the tokens each constrained row of a step may draw next.

The vocabulary is the model's tokenizer, as the server has it: the Hugging Face
tokenizer of ``model.path``'s folder, or, for a model without a folder whose vocabulary
has the size of Mistral-7B's SentencePiece vocabulary (``tiny``), that vocabulary
(``enginekit.tokenizer.SentencePieceTokenizer``). It is read once, at the first
structured request, sized to the model's ``vocab_size`` (ids past the tokenizer's are
never allowed). Special tokens (BOS, UNK, ...) are never allowed as text: a grammar
accepts exactly the text the output decodes to. A model without a tokenizer refuses
structured outputs.

A grammar ends on the request's stop tokens: EOS unless ``ignore_eos``, and
``stop_token_ids``. Once it is complete they are all it allows, so the sequence stops;
before, only a stop token that is also text the grammar takes may cut it short.
Compiled grammars are kept by spec (``StructuredOutput`` is hashable) in a small LRU,
so that a request compiles at admission and its sequence finds the grammar when it
arrives. JSON is laid out as ``json.dumps`` lays it out (no free whitespace: a model
cannot spend its tokens on blanks). xgrammar (the torch extra) is imported on first
use, so that runs without structured outputs never load it.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from enginekit.errors import ConfigError, InvalidRequestError
from enginekit.extras import install_hint
from enginekit.request import SamplingParams, StructuredOutput

if TYPE_CHECKING:
    import xgrammar

COMPILED_GRAMMAR_CACHE_SIZE = 32  # compiled grammars kept, least recently used dropped
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # ``json_object``: any object
# xgrammar's messages begin with a time stamp and the C++ source line, and assertion
# failures with the failed check: neither means anything to a caller.
_XGRAMMAR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")
_FIELD = "sampling.structured"


def grammar_stop_tokens(
    sampling: SamplingParams, eos_token_id: int | None, vocab_size: int
) -> list[int]:
    """The tokens a structured output of ``sampling`` ends on: EOS unless ``ignore_eos``,
    then ``stop_token_ids``, each once, those inside the vocabulary only. Pure."""
    stops = [] if eos_token_id is None or sampling.ignore_eos else [eos_token_id]
    stops += sampling.stop_token_ids
    return [t for t in dict.fromkeys(stops) if 0 <= t < vocab_size]


def choice_grammar(choice: Sequence[str]) -> str:
    """The EBNF grammar whose whole text is exactly one of ``choice``: each a string
    literal (JSON's escapes, which xgrammar's EBNF reads; characters outside ASCII as
    they are). Pure."""
    return "root ::= " + " | ".join(json.dumps(option, ensure_ascii=False) for option in choice)


def xgrammar_message(exc: BaseException) -> str:
    """xgrammar's message without its time stamp, C++ source line and failed check. Pure."""
    return _XGRAMMAR_PREFIX.sub("", str(exc).strip())


def _import_xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise InvalidRequestError(
            f"{_FIELD} needs xgrammar, which is not installed; {install_hint(['torch'])}"
        ) from None
    return xgrammar


class AllowedTokens:
    """The tokens the constrained rows of a step may draw: ``bitmask`` (int32, one row of
    ``ceil(vocab / 32)`` words per logits row, on the CPU) holds a set bit for each
    allowed token of the logits rows ``rows``; the other rows are unconstrained."""

    def __init__(self, bitmask: torch.Tensor, rows: list[int]) -> None:
        self.bitmask = bitmask
        self.rows = rows

    def apply(self, logits: torch.Tensor) -> None:
        """Sets the logits of the tokens ``rows`` may not draw to -inf. Mutates
        ``logits`` (float32 [n, V], on any device; the bitmask is copied there)."""
        xgr = _import_xgrammar()
        bitmask = self.bitmask
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=logits.shape[-1], indices=self.rows
        )


class StructuredGrammars:
    """Grammars over one model's vocabulary: ``check`` compiles a request's grammar (or
    refuses it), ``matcher`` starts a sequence's matcher, ``allowed`` fills the bitmask of
    a step's constrained rows and ``accept`` moves their matchers on by the tokens drawn.

    ``model_path`` is the model's Hugging Face folder (None without one), ``vocab_size``
    its logits' width, ``eos_token_id`` its EOS (None without one). Nothing is loaded
    until the first structured request."""

    def __init__(
        self,
        model_path: str | None,
        vocab_size: int,
        eos_token_id: int | None,
        device: torch.device,
        cache_size: int = COMPILED_GRAMMAR_CACHE_SIZE,
    ) -> None:
        self.model_path = model_path
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.device = device
        self.cache_size = cache_size
        self._compiler: Any = None  # xgrammar.GrammarCompiler, once the vocabulary is read
        self._no_vocabulary: str | None = None  # why there is none, once known
        self._compiled: OrderedDict[StructuredOutput, Any] = OrderedDict()
        self._bitmask: torch.Tensor | None = None  # reused; grown to the widest step

    @property
    def cached_specs(self) -> tuple[StructuredOutput, ...]:
        """The specs whose compiled grammars are kept, least recently used first."""
        return tuple(self._compiled)

    def check(self, sampling: SamplingParams) -> None:
        """Compiles ``sampling.structured`` (kept in the LRU). Raises InvalidRequestError
        naming the field when the model has no tokenizer, xgrammar is missing, the output
        has no token to end on, the grammar does not compile (with xgrammar's message),
        or no token of the vocabulary can start it."""
        matcher = self.matcher(sampling)
        first = self._buffer(1)[:1]
        matcher.fill_next_token_bitmask(first, 0)
        if bool(self._allow_nothing(first[[0]])[0]):
            raise InvalidRequestError(
                f"{_FIELD}.{self._spec(sampling).kind} admits no first token of this "
                "model's vocabulary"
            )

    def matcher(self, sampling: SamplingParams) -> xgrammar.GrammarMatcher:
        """A new matcher of ``sampling.structured``'s grammar, at its start, ending on
        the request's stop tokens. Raises InvalidRequestError as ``check`` does."""
        xgr = _import_xgrammar()
        stops = self._stop_tokens(sampling)
        compiled = self._compile(self._spec(sampling))
        return xgr.GrammarMatcher(compiled, override_stop_tokens=stops)

    def allowed(self, matchers: Sequence[xgrammar.GrammarMatcher | None]) -> AllowedTokens | None:
        """The tokens row i may draw next under ``matchers[i]`` (None: unconstrained);
        None when no row is constrained (or none's grammar forbids anything). Reuses one
        CPU buffer (pinned for a CUDA device): valid until the next call."""
        rows = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not rows:
            return None
        bitmask = self._buffer(rows[-1] + 1)[: rows[-1] + 1]
        need_apply = [
            i
            for i in rows
            if matchers[i].fill_next_token_bitmask(bitmask, i)  # type: ignore[union-attr]
        ]
        if not need_apply:
            return None
        dead = self._allow_nothing(bitmask[need_apply])
        if bool(dead.any()):
            for k in dead.nonzero()[:, 0].tolist():
                matcher = matchers[need_apply[k]]
                assert matcher is not None
                _allow_only(bitmask[need_apply[k]], matcher.stop_token_ids)
        return AllowedTokens(bitmask, need_apply)

    @staticmethod
    def accept(
        matchers: Sequence[xgrammar.GrammarMatcher | None], token_ids: Sequence[int]
    ) -> None:
        """Moves each matcher on by its row's token (a stop token it refuses ends a
        dead-ended output: nothing to do). Raises RuntimeError if a matcher refuses
        another token (its mask allowed only tokens it takes: a bug)."""
        for matcher, token in zip(matchers, token_ids, strict=True):
            if (
                matcher is not None
                and not matcher.accept_token(token)
                and token not in matcher.stop_token_ids
            ):
                raise RuntimeError(f"the grammar refused token {token}, which its mask allowed")

    def _allow_nothing(self, rows: torch.Tensor) -> torch.Tensor:
        """Whether each of ``rows`` (a copy of bitmask rows: changed here) allows no id of
        the vocabulary (bits past it, in the last word, do not count)."""
        tail = self.vocab_size % 32
        if tail:
            rows[:, -1] &= (1 << tail) - 1
        return (rows == 0).all(dim=1)

    def _buffer(self, num_rows: int) -> torch.Tensor:
        """At least ``num_rows`` rows of bitmask (their contents left as they are)."""
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < num_rows:
            words = (self.vocab_size + 31) // 32
            rows = max(num_rows, 2 * (0 if bitmask is None else bitmask.shape[0]))
            pin = self.device.type == "cuda"
            bitmask = torch.empty((rows, words), dtype=torch.int32, pin_memory=pin)
            self._bitmask = bitmask
        return bitmask

    @staticmethod
    def _spec(sampling: SamplingParams) -> StructuredOutput:
        if sampling.structured is None:
            raise ValueError("the sampling has no structured output")
        return sampling.structured

    def _stop_tokens(self, sampling: SamplingParams) -> list[int]:
        stops = grammar_stop_tokens(sampling, self.eos_token_id, self.vocab_size)
        if not stops:
            why = (
                "sampling.ignore_eos=True"
                if sampling.ignore_eos and self.eos_token_id is not None
                else "the model has no EOS"
            )
            raise InvalidRequestError(
                f"{_FIELD} needs a token to end the output on once its grammar is "
                f"complete: {why} and sampling.stop_token_ids names none in the "
                f"vocabulary; set sampling.stop_token_ids"
            )
        return stops

    def _compile(self, spec: StructuredOutput) -> Any:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        compiler = self._grammar_compiler()
        kind = spec.kind
        try:
            if spec.json_schema is not None:
                compiled = compiler.compile_json_schema(spec.json_schema, any_whitespace=False)
            elif spec.json_object:
                compiled = compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
            elif spec.regex is not None:
                compiled = compiler.compile_regex(spec.regex)
            elif spec.choice is not None:
                compiled = compiler.compile_grammar(choice_grammar(spec.choice))
            else:
                compiled = compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidRequestError(
                f"{_FIELD}.{kind} does not compile: {xgrammar_message(exc)}"
            ) from None
        self._compiled[spec] = compiled
        if len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return compiled

    def _grammar_compiler(self) -> Any:
        """xgrammar's compiler over the model's vocabulary (read on first use).
        InvalidRequestError when the model has no tokenizer or xgrammar is missing."""
        if self._compiler is not None:
            return self._compiler
        xgr = _import_xgrammar()
        if self._no_vocabulary is None:
            try:
                info = tokenizer_info(self.model_path, self.vocab_size, self.eos_token_id)
            except ConfigError as exc:
                self._no_vocabulary = str(exc)
            else:
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False
                )
                return self._compiler
        raise InvalidRequestError(f"{_FIELD} needs the model's tokenizer: {self._no_vocabulary}")


def _allow_only(bitmask_row: torch.Tensor, token_ids: Sequence[int]) -> None:
    """Sets ``bitmask_row`` (int32 words, 32 tokens each, lowest bit first) to allow only
    ``token_ids``. Mutates it."""
    words = bitmask_row.numpy().view(np.uint32)
    words[:] = 0
    for token in token_ids:
        words[token // 32] |= np.uint32(1 << (token % 32))


def tokenizer_info(
    model_path: str | None, vocab_size: int, eos_token_id: int | None
) -> xgrammar.TokenizerInfo:
    """xgrammar's view of the model's vocabulary, ``vocab_size`` ids wide, with the
    tokenizer's special tokens blanked (never allowed as text): the Hugging Face tokenizer
    of the ``model_path`` folder (its vocabulary's encoding as xgrammar detects it), else
    the SentencePiece vocabulary when ``vocab_size`` is its size. Raises ConfigError
    saying why there is none."""
    import xgrammar as xgr

    from enginekit.tokenizer import Tokenizer

    stops = None if eos_token_id is None else [eos_token_id]
    tokenizer = Tokenizer.of_model(model_path, vocab_size)  # ConfigError if none
    if isinstance(tokenizer, Tokenizer):
        inner = tokenizer.transformers_tokenizer
        detected = xgr.TokenizerInfo.from_huggingface(
            inner, vocab_size=vocab_size, stop_token_ids=stops
        )
        encoded = [""] * vocab_size
        for piece, token_id in inner.get_vocab().items():
            if 0 <= token_id < vocab_size:
                encoded[token_id] = piece
        special = list(inner.all_special_ids)
        vocab_type, add_prefix_space = detected.vocab_type, detected.add_prefix_space
    else:
        encoded = [tokenizer.piece(i) for i in range(vocab_size)]
        special = list(tokenizer.special_tokens.values())
        vocab_type, add_prefix_space = xgr.VocabType.BYTE_FALLBACK, True
    for token_id in special:
        if 0 <= token_id < vocab_size:
            encoded[token_id] = ""  # xgrammar never allows an empty piece as text
    return xgr.TokenizerInfo(
        encoded,
        vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=add_prefix_space,
    )

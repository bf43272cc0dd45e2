"""Requests, their sampling parameters and their state as the scheduler moves them."""

from __future__ import annotations

import enum
import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from enginekit.errors import InvalidRequestError

# Below this a temperature is refused rather than run: dividing float32 logits by it can
# overflow them (softmax of inf is NaN), and it samples as greedily as 0 does anyway.
MIN_TEMPERATURE = 1e-5
MAX_EXTRA_KEY_BYTES = 2**32 - 1  # the block hash stores the salt's length in 4 bytes
# The most alternatives ``logprobs`` and ``prompt_logprobs`` may ask per token (vLLM's
# default ``max_logprobs``): each costs a top-k over the vocabulary and a Python tuple.
MAX_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-MAX_PENALTY, MAX_PENALTY]


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must be, as a grammar the sampler enforces token by token.
    Exactly one field is set:

    - ``json_schema``: a JSON schema, as JSON text: the output is one JSON value the
      schema accepts (properties the schema does not name are refused, as in xgrammar's
      strict mode), laid out as ``json.dumps`` lays it out (``", "`` and ``": "``, no
      other whitespace);
    - ``json_object``: True: the output is one JSON object, with any keys, laid out so;
    - ``regex``: the whole output matches it (xgrammar's syntax: no lookarounds or
      backreferences);
    - ``choice``: the output is exactly one of these strings (a list is kept as a tuple);
    - ``grammar``: an EBNF grammar in xgrammar's syntax (GBNF's), whose rule ``root`` the
      whole output matches.

    Once the grammar is complete, the only tokens left are the stop tokens (EOS unless
    ``ignore_eos``, and ``stop_token_ids``), so a complete output ends with finish
    reason ``stop``; an output cut by ``max_tokens`` ends with ``length`` and may be
    incomplete. The values are checked here (types, exactly one field, the schema's
    JSON): InvalidRequestError names the field (``sampling.structured.regex``). Whether
    the grammar compiles is the executor's check, when the request is added. Frozen and
    hashable: equal specs share one compiled grammar."""

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        """Checks the fields; raises InvalidRequestError naming the first bad one.
        Normalizes ``choice`` to a tuple."""
        for name in ("json_schema", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(
                    f"{_STRUCTURED}.{name} must be a str or None, got {_shown(value)}"
                )
        if not isinstance(self.json_object, bool):
            raise InvalidRequestError(
                f"{_STRUCTURED}.json_object must be a bool, got {_shown(self.json_object)}"
            )
        if self.choice is not None:
            if isinstance(self.choice, str | bytes) or not isinstance(self.choice, Sequence):
                raise InvalidRequestError(
                    f"{_STRUCTURED}.choice must be a list of strings, got {_shown(self.choice)}"
                )
            choice = tuple(self.choice)
            if not choice:
                raise InvalidRequestError(f"{_STRUCTURED}.choice must not be empty")
            for i, option in enumerate(choice):
                if not isinstance(option, str):
                    raise InvalidRequestError(
                        f"{_STRUCTURED}.choice[{i}] must be a str, got {_shown(option)}"
                    )
            object.__setattr__(self, "choice", choice)  # frozen: normalized once, here
        given = [name for name in _STRUCTURED_KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                f"{_STRUCTURED} must set exactly one of {', '.join(_STRUCTURED_KINDS)}; "
                f"got {', '.join(given) if given else 'none'}"
            )
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except ValueError as exc:
                raise InvalidRequestError(f"{_STRUCTURED}.json_schema is not JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise InvalidRequestError(
                    f"{_STRUCTURED}.json_schema must be a JSON object (or true / false), "
                    f"got {type(schema).__name__}"
                )

    @property
    def kind(self) -> str:
        """The field that is set: ``json_schema``, ``json_object``, ``regex``, ``choice``
        or ``grammar``. Pure."""
        return next(name for name in _STRUCTURED_KINDS if getattr(self, name) not in (None, False))


_STRUCTURED = "sampling.structured"
_STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class SamplingParams:
    """How a request's output is produced and when it stops.

    ``max_tokens`` bounds the output; generation also stops at any of ``stop_token_ids``
    and at the model's EOS unless ``ignore_eos``. Temperature 0 is greedy decoding.
    ``n > 1`` is parallel sampling: n outputs for one prompt, which is computed once; the
    samples share its KV blocks (copy-on-write) and sample ``k`` draws with seed
    ``seed + k``. ``beam_width > 1`` is beam search (greedy: temperature 0): the
    ``beam_width`` sequences of highest total log-probability are kept at every step, and
    the best ``n`` are returned; beams fork and are pruned by reference counts.

    Shaping the distribution (vLLM's semantics). A sampled row's logits go through, in
    order: the ``min_tokens`` mask, the penalties, the grammar of ``structured``, then
    (temperature 0) argmax, or division by the temperature, ``min_p``, ``top_k``,
    ``top_p`` and one draw from the request's generator (seeded by ``seed``):

    - ``min_tokens``: the first ``min_tokens`` output tokens are never a stop: the torch
      sampler masks ``stop_token_ids`` and EOS (unless ``ignore_eos``) to -inf while the
      output is shorter, and a stop token an executor returns among them (the simulator's
      script) does not stop the output. 0 <= min_tokens <= max_tokens.
    - ``repetition_penalty`` (> 0; 1 is off): the logit of every token seen in the prompt
      or the output so far is divided by it where positive, multiplied where negative.
    - ``frequency_penalty`` and ``presence_penalty`` (in [-2, 2]; 0 is off): subtracted
      from a token's logit, times the number of times it occurs in the output so far,
      and once if it occurs at all (the prompt does not count).
    - ``min_p`` (in [0, 1]; 0 is off): after the temperature, tokens whose probability is
      below ``min_p`` times the most likely token's are dropped.
    - ``structured`` (a ``StructuredOutput``; None is off): after the penalties, the
      tokens its grammar does not allow next are masked, so that greedy decoding takes
      the most likely allowed token and sampling draws among the allowed ones. It ends
      the output on a stop token once the grammar is complete, so it refuses
      ``min_tokens`` (which would hold that token off) and beam search; the executor
      refuses it when the output could not end (``ignore_eos`` without
      ``stop_token_ids``) or the grammar does not compile.

    The penalties apply to greedy rows too. ``logprobs`` (None, or 0 to ``MAX_LOGPROBS``)
    asks, for every output token, its ``TokenLogprob`` under the model's raw distribution
    (before the mask, the penalties and the temperature) with that many most likely
    alternatives; ``prompt_logprobs`` the same for every prompt token but the first. They,
    the penalties, ``min_p`` and ``structured`` need an executor with a model distribution
    (not the simulator's scripted tokens); logprobs stay the raw distribution's under a
    grammar too. Beam search scores beams on the raw distribution, so it refuses
    ``logprobs`` and the penalties.

    Every field is checked here, so that a step never meets a bad value: InvalidRequestError
    names the field and the value. Counts and ids are ints (numpy integers are converted;
    bools, floats and strings are refused), temperature and top_p finite numbers.
    """

    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    beam_width: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        """Checks every field; raises InvalidRequestError naming the first bad one and its
        value. Normalizes numpy scalars to int / float and ``stop_token_ids`` to a tuple."""
        put = object.__setattr__  # frozen: normalized values are written once, here
        put(self, "max_tokens", _int_field("max_tokens", self.max_tokens, 1))
        stop_token_ids = as_token_ids("sampling.stop_token_ids", self.stop_token_ids)
        put(self, "stop_token_ids", tuple(stop_token_ids))
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError(
                f"sampling.stop_token_ids must be >= 0, got {list(self.stop_token_ids)}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError(
                f"sampling.ignore_eos must be a bool, got {_shown(self.ignore_eos)}"
            )
        temperature = _real_field("temperature", self.temperature)
        if temperature < 0 or 0 < temperature < MIN_TEMPERATURE:
            raise InvalidRequestError(
                f"sampling.temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, "
                f"got {temperature}"
            )
        put(self, "temperature", temperature)
        put(self, "top_k", _int_field("top_k", self.top_k, 0, note=" (0 = off)"))
        top_p = _real_field("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidRequestError(f"sampling.top_p must be in (0, 1], got {top_p}")
        put(self, "top_p", top_p)
        if self.seed is not None:
            put(self, "seed", _int_field("seed", self.seed, None, kind="an int or None"))
        put(self, "n", _int_field("n", self.n, 1))
        put(self, "beam_width", _int_field("beam_width", self.beam_width, 1))
        for name in ("presence_penalty", "frequency_penalty"):
            penalty = _real_field(name, getattr(self, name))
            if not -MAX_PENALTY <= penalty <= MAX_PENALTY:
                raise InvalidRequestError(
                    f"sampling.{name} must be in [{-MAX_PENALTY}, {MAX_PENALTY}], got {penalty}"
                )
            put(self, name, penalty)
        repetition_penalty = _real_field("repetition_penalty", self.repetition_penalty)
        if repetition_penalty <= 0:
            raise InvalidRequestError(
                f"sampling.repetition_penalty must be > 0 (1 = off), got {repetition_penalty}"
            )
        put(self, "repetition_penalty", repetition_penalty)
        min_p = _real_field("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise InvalidRequestError(f"sampling.min_p must be in [0, 1], got {min_p}")
        put(self, "min_p", min_p)
        put(self, "min_tokens", _int_field("min_tokens", self.min_tokens, 0))
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"sampling.min_tokens ({self.min_tokens}) cannot exceed "
                f"sampling.max_tokens ({self.max_tokens})"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                count = _int_field(name, value, 0, kind="an int or None")
                if count > MAX_LOGPROBS:
                    raise InvalidRequestError(
                        f"sampling.{name} must be in [0, {MAX_LOGPROBS}] or None, got {count}"
                    )
                put(self, name, count)
        if self.structured is not None:
            self._check_structured()
        if self.beam_width > 1:
            if self.temperature != 0:
                raise InvalidRequestError(
                    "beam search is deterministic: sampling.temperature must be 0, "
                    f"got {self.temperature}"
                )
            if self.n > self.beam_width:
                raise InvalidRequestError(
                    f"sampling.n ({self.n}) cannot exceed sampling.beam_width ({self.beam_width})"
                )
            refused = [
                f"sampling.{name}={getattr(self, name)}"
                for name in ("logprobs", *_PENALTIES)
                if getattr(self, name) != _NEUTRAL[name]
            ]
            if refused:
                raise InvalidRequestError(
                    f"{refused[0]} is not available with beam search (beams are scored on "
                    "the raw distribution)"
                )

    def _check_structured(self) -> None:
        if not isinstance(self.structured, StructuredOutput):
            raise InvalidRequestError(
                f"{_STRUCTURED} must be a StructuredOutput or None, got {_shown(self.structured)}"
            )
        kind = self.structured.kind
        if self.beam_width > 1:
            raise InvalidRequestError(
                f"{_STRUCTURED}.{kind} is not available with beam search "
                f"(sampling.beam_width={self.beam_width}): beams are scored on the raw "
                "distribution"
            )
        if self.min_tokens > 0:
            raise InvalidRequestError(
                f"sampling.min_tokens={self.min_tokens} is not available with "
                f"{_STRUCTURED}.{kind}: the grammar decides where the output ends"
            )

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty is on (each needs the tokens seen so far). Pure."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def needs_distribution(self) -> bool:
        """Whether any field needs the model's next-token distribution (a few attribute
        reads: ``distribution_fields`` names them). Pure."""
        return (
            self.logprobs is not None
            or self.prompt_logprobs is not None
            or self.min_p != 0.0
            or self.has_penalties
            or self.structured is not None
        )

    def distribution_fields(self) -> list[str]:
        """The fields set away from neutral that need the model's next-token
        distribution, as ``name=value`` (logprobs, prompt_logprobs, the penalties,
        min_p), and ``structured.KIND`` for a structured output (its spec can be long):
        what an executor without one refuses. Pure."""
        fields = [
            f"{name}={getattr(self, name)}"
            for name in _DISTRIBUTION_FIELDS
            if getattr(self, name) != _NEUTRAL[name]
        ]
        if self.structured is not None:
            fields.append(f"structured.{self.structured.kind}")
        return fields


_PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty")
_DISTRIBUTION_FIELDS = ("logprobs", "prompt_logprobs", *_PENALTIES, "min_p")
# Each field's value that leaves the distribution as the model gives it.
_NEUTRAL: dict[str, object] = {
    "logprobs": None,
    "prompt_logprobs": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
}


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability under the model's raw next-token distribution: the
    log_softmax of the logits, before the ``min_tokens`` mask, the penalties and the
    temperature (vLLM's default, ``raw_logprobs``).

    ``rank`` is the token's place in that distribution, 1 for the most likely: the number
    of tokens whose logprob is at least its own (so tied tokens share the lowest place).
    ``top`` holds the ``num`` most likely tokens as (token id, logprob), most likely first
    (``num`` is the request's ``logprobs`` or ``prompt_logprobs``; 0 gives an empty
    tuple); the token itself appears there too when it is among them. A logprob may be
    -inf (a token the model gives no probability)."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value: object) -> bool:
    """An integer that is not a bool (numpy integers count; floats such as 8.0 do not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_field(
    name: str, value: object, minimum: int | None, kind: str = "an int", note: str = ""
) -> int:
    if not _is_int(value):
        raise InvalidRequestError(f"sampling.{name} must be {kind}, got {_shown(value)}")
    number = int(value)  # type: ignore[call-overload]  # an Integral
    if minimum is not None and number < minimum:
        raise InvalidRequestError(f"sampling.{name} must be >= {minimum}{note}, got {number}")
    return number


def _finite_number(name: str, value: object) -> float:
    """``value`` as a float; InvalidRequestError naming ``name`` unless it is a finite
    real number (bools refused)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be a number, got {_shown(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRequestError(f"{name} must be finite, got {number}")
    return number


def _real_field(name: str, value: object) -> float:
    return _finite_number(f"sampling.{name}", value)


def as_token_ids(name: str, value: object, expected: str = "a list of token ids") -> list[int]:
    """``value`` as a new list of Python ints. Takes a sequence of ints (numpy integers
    too) or an array with ``tolist()`` (numpy, torch); refuses str, bytes, bools and
    floats. Raises InvalidRequestError naming ``name`` and the first bad token; range
    checks (the vocabulary) are the caller's."""
    tolist = getattr(value, "tolist", None)
    items = tolist() if callable(tolist) and not isinstance(value, list | tuple) else value
    dtype_kind = getattr(getattr(value, "dtype", None), "kind", "")
    if type(items) is list and dtype_kind in ("i", "u") and getattr(value, "ndim", 0) == 1:
        return items  # a 1-d numpy integer array's new list: Python ints only
    if isinstance(items, str | bytes | bytearray) or not isinstance(items, Sequence):
        raise InvalidRequestError(f"{name} must be {expected}, got {type(value).__name__}")
    tokens = list(items)
    if set(map(type, tokens)) - {int}:  # the common case, a list of ints, skips the loop
        for i, token in enumerate(tokens):
            if not _is_int(token):
                raise InvalidRequestError(f"{name} token {i} is {token!r}, not an int")
            tokens[i] = int(token)
    return tokens


def as_extra_key(value: object) -> bytes | None:
    """A prefix-cache salt as bytes: bytes-like values as they are, a str as its UTF-8
    encoding (so ``"tenant-a"`` and ``b"tenant-a"`` share a cache), None as None.
    Raises InvalidRequestError for anything else or a salt of 2**32 bytes or more."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            key = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(f"extra_key {value!r} is not valid UTF-8: {exc}") from None
    elif isinstance(value, bytes | bytearray | memoryview):
        key = bytes(value)
    else:
        raise InvalidRequestError(
            f"extra_key must be bytes, a str (encoded as UTF-8) or None, got {_shown(value)}"
        )
    if len(key) > MAX_EXTRA_KEY_BYTES:
        raise InvalidRequestError(f"extra_key is {len(key)} bytes, more than {MAX_EXTRA_KEY_BYTES}")
    return key


def as_arrival_time(value: object) -> float | None:
    """A finite number of seconds as a float, or None. Raises InvalidRequestError."""
    return None if value is None else _finite_number("arrival_time", value)


def as_priority(value: object) -> int:
    """A request's priority as an int (numpy integers too). Raises InvalidRequestError for
    anything else (bools and floats included)."""
    if not _is_int(value):
        raise InvalidRequestError(f"priority must be an int, got {_shown(value)}")
    return int(value)  # type: ignore[call-overload]  # an Integral


def as_user(value: object) -> str | None:
    """A request's tenant name (a str), or None. Raises InvalidRequestError otherwise."""
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"user must be a str or None, got {_shown(value)}")
    return value


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted, or preempted and waiting to be restored
    RUNNING = "running"  # holds KV blocks; prefilling or decoding
    FINISHED_STOPPED = "stop"  # hit a stop token or EOS
    FINISHED_LENGTH = "length"  # reached max_tokens
    PRUNED = "pruned"  # a beam that fell out of the best beam_width
    ABORTED = "abort"  # aborted by its caller (Engine.abort_request)

    @property
    def is_finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.PRUNED,
            RequestStatus.ABORTED,
        )


@dataclass(eq=False, slots=True)
class Request:
    """One request and its evolving state.

    ``token_ids`` is the prompt followed by every output token so far. The KV of the first
    ``num_computed_tokens`` of them is in the cache (or is being written by the step that was
    just scheduled). A decoding request has exactly one token left to compute: the one
    sampled last. Owned by the scheduler; plugins read it and never resize ``token_ids``.

    ``num_computed_tokens`` has one owner at a time. Outside the scheduler's decode batch
    it is a stored count that the scheduler (and the cache, at admission and fork) sets.
    While the request is a member of the batch, the batch owns it: every member is then
    ``len(token_ids)`` less the tokens the batch has left to compute (one between steps,
    none while a scheduled step runs), one count the batch flips for all its members at
    once (``follow_decode_batch``), so that a step writes nothing per member. Setting the
    count leaves the batch's ownership.
    """

    request_id: str
    seq_id: int
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams
    arrival_time: float = 0.0
    # Prefix-cache salt (e.g. a tenant; add_request encodes a str as UTF-8); None shares
    # globally.
    extra_key: bytes | None = None
    scripted_output_ids: Sequence[int] | None = None  # what the simulator "generates"
    # The waiting queue's inputs (``enginekit.interfaces.queue``): ``priority`` orders
    # requests under ``+queue=priority`` (lower first; 0 is the default and the only value
    # other queues take); ``user`` names the tenant ``+queue=fair`` shares service among.
    priority: int = 0
    user: str | None = None

    token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    # the stored count (see num_computed_tokens), and the decode batch's count of tokens
    # left to compute while the batch owns it (a one-item list the batch shares), else None
    _num_computed: int = field(default=0, init=False, repr=False)
    _batch_left: list[int] | None = field(default=None, init=False, repr=False)
    num_cached_tokens: int = 0  # prefix-cache hit at first admission
    status: RequestStatus = RequestStatus.WAITING
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    # Parallel sampling and beams: the request that prefilled the prompt owns the others.
    parent: Request | None = None
    children: list[Request] = field(default_factory=list)
    # The children not known to be finished (compacted by ``unfinished_children``): beam
    # search prunes a beam nearly every step, so ``children`` grows with the output.
    maybe_unfinished_children: list[Request] = field(default_factory=list)
    # Beam search: the beam's total log-probability, and the continuations the last step
    # offered it (kept until every live beam of the request has its own).
    cumulative_logprob: float = 0.0
    candidates: Sequence[tuple[int, float]] | None = None
    # With ``sampling.logprobs``: one entry per output token, aligned with them (the
    # scheduler appends both from the same step; a recomputed sequence keeps its
    # entries, and its re-prefill samples only the tokens that follow them). Else None.
    output_logprobs: list[TokenLogprob] | None = field(default=None, init=False)
    # With ``sampling.prompt_logprobs``: one entry per prompt token, the first None, set
    # once by the engine when the request arrives. Else None.
    prompt_logprobs: list[TokenLogprob | None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        if self.sampling.logprobs is not None:
            self.output_logprobs = []

    @property
    def num_computed_tokens(self) -> int:
        left = self._batch_left
        if left is None:
            return self._num_computed
        return len(self.token_ids) - left[0]

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        self._num_computed = value
        self._batch_left = None

    def follow_decode_batch(self, left: list[int] | None) -> None:
        """Hands ``num_computed_tokens`` to a decode batch whose members have ``left[0]``
        tokens each left to compute (the batch changes the item), or, with None, takes it
        back as a stored count, as it is now."""
        if left is None and self._batch_left is not None:
            self._num_computed = len(self.token_ids) - self._batch_left[0]
        self._batch_left = left

    def counted_by_decode_batch(self, left: list[int]) -> bool:
        """Whether the decode batch sharing ``left`` owns ``num_computed_tokens``. Pure."""
        return self._batch_left is left

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tenant(self) -> str:
        """Whom the request is served for: its request's ``user`` if set, else its
        prefix-cache salt (``salt:`` and the salt, UTF-8 decoded), else ``""``, the one
        shared tenant. A forked sample or beam is its request's. Pure."""
        root = self.parent or self
        if root.user is not None:
            return root.user
        if root.extra_key is not None:
            return "salt:" + root.extra_key.decode("utf-8", "backslashreplace")
        return ""

    def stop_status(self, token_id: int, eos_token_id: int | None) -> RequestStatus | None:
        """What the rules of its sampling make of ``token_id``, its newest token (already
        appended): FINISHED_STOPPED on one of its stop token ids, or on EOS unless it
        ignores EOS, once more than ``min_tokens`` output tokens are there (the first
        ``min_tokens`` never stop it); else FINISHED_LENGTH once it has ``max_tokens``
        output tokens; None: it goes on. The one statement of when a request stops; the
        decode batch's passes only find the members it may stop. Pure."""
        sampling = self.sampling
        if (
            token_id in sampling.stop_token_ids
            or (token_id == eos_token_id and not sampling.ignore_eos)
        ) and self.num_output_tokens > sampling.min_tokens:
            return RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens >= sampling.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens_to_compute(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """Whether its next tokens run as a prefill chunk: more than one left, or its last
        prompt token (not a decode, and not a beam whose step is done)."""
        num_left = self.num_tokens_to_compute
        return num_left > 1 or (num_left == 1 and self.num_output_tokens == 0)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def add_child(self, child: Request) -> None:
        """Records a sample or beam this request owns. Mutates both lists of children."""
        self.children.append(child)
        self.maybe_unfinished_children.append(child)

    def unfinished_children(self) -> list[Request]:
        """The children still running or waiting, in order. Drops the finished ones from
        ``maybe_unfinished_children`` (each once: amortized O(1) per child)."""
        live = [c for c in self.maybe_unfinished_children if not c.is_finished]
        self.maybe_unfinished_children = live
        return live

    @property
    def is_group_finished(self) -> bool:
        """Finished, and so is every sample it owns."""
        return self.status.is_finished and not self.unfinished_children()

    @property
    def needs_fork(self) -> bool:
        """Owes the other n - 1 samples of parallel sampling (forked when its prompt is
        computed; beams fork as the search goes)."""
        return (
            self.sampling.n > 1
            and self.sampling.beam_width == 1
            and self.parent is None
            and not self.children
        )

    @property
    def is_beam(self) -> bool:
        return self.sampling.beam_width > 1


@dataclass(frozen=True)
class RequestOutput:
    """What a caller reads back about one request (a snapshot: its lists are its own)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the first sample's
    # The request's: "abort" if it was aborted, else the first sample's ("stop" or
    # "length"); None while any sample runs.
    finish_reason: str | None
    num_cached_tokens: int
    num_preemptions: int
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None  # when the last sample finished
    samples: list[list[int]]  # n outputs: the samples in order, or the best beams first
    finish_reasons: list[str | None]  # each sample's own reason (None while it runs)
    # With ``sampling.logprobs``: per sample (aligned with ``samples``), one TokenLogprob
    # per token of that sample, in order. None when not asked.
    logprobs: list[list[TokenLogprob]] | None = None
    # With ``sampling.prompt_logprobs``: one entry per prompt token, None for the first
    # (it has no context). None when not asked (or before the request has arrived).
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @classmethod
    def of(cls, request: Request) -> RequestOutput:
        group = [request, *request.children]
        done = request.is_group_finished
        samples = group
        if request.is_beam:  # the best n surviving beams, best first
            survivors = [r for r in group if r.status != RequestStatus.PRUNED]
            survivors.sort(key=lambda r: -r.cumulative_logprob)
            samples = survivors[: request.sampling.n] or [request]
        finish_reason = None
        if done:
            aborted = any(r.status is RequestStatus.ABORTED for r in group)
            finish_reason = RequestStatus.ABORTED.value if aborted else samples[0].status.value
        return cls(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=samples[0].output_token_ids,
            finish_reason=finish_reason,
            num_cached_tokens=request.num_cached_tokens,
            num_preemptions=sum(r.num_preemptions for r in group),
            arrival_time=request.arrival_time,
            first_token_time=request.first_token_time,
            finish_time=max((r.finish_time or 0.0) for r in group) if done else None,
            samples=[r.output_token_ids for r in samples],
            finish_reasons=[r.status.value if r.is_finished else None for r in samples],
            logprobs=(
                None
                if request.output_logprobs is None
                else [list(r.output_logprobs or ()) for r in samples]
            ),
            prompt_logprobs=(
                None if request.prompt_logprobs is None else list(request.prompt_logprobs)
            ),
        )

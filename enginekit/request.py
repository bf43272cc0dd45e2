"""Requests, their sampling parameters and their state as the scheduler moves them."""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from enginekit.errors import InvalidRequestError

# Below this a temperature is refused rather than run: dividing float32 logits by it can
# overflow them (softmax of inf is NaN), and it samples as greedily as 0 does anyway.
MIN_TEMPERATURE = 1e-5
MAX_EXTRA_KEY_BYTES = 2**32 - 1  # the block hash stores the salt's length in 4 bytes


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

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)

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
        ignores EOS; else FINISHED_LENGTH once it has ``max_tokens`` output tokens; None:
        it goes on. The one statement of when a request stops; the decode batch's passes
        only find the members it may stop. Pure."""
        sampling = self.sampling
        if token_id in sampling.stop_token_ids or (
            token_id == eos_token_id and not sampling.ignore_eos
        ):
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
    """What a caller reads back about one request."""

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
        )

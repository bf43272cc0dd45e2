"""``trace``: replay a request trace from a file (``workload.path``), one request a line.

Two formats (``workload.trace_format``; ``auto`` looks at the first line's fields):

``jsonl``
    One JSON object a line::

        {"id": "r1", "arrival_time": 0.5, "prompt_token_ids": [1, 2, 3], "output_len": 8}

    ``id`` (a str, unique), ``arrival_time`` (seconds, >= 0), ``prompt_token_ids``
    (token ids of the model's vocabulary, at least one) and ``output_len`` (>= 1) are
    required. Optional: ``output_token_ids`` (exactly ``output_len`` ids: what the
    simulator generates; without it, pseudo-random ids that no other request shares),
    ``session`` and ``turn`` (a session's requests run in turn order, each arriving
    ``think_time_s``, default 0, after the previous turn finishes, or at its
    ``arrival_time`` if that is later; its prompt is complete as written), and
    ``extra_key`` (a str salting the prefix cache). ``write_jsonl`` writes this format.
``mooncake``
    Mooncake's published trace format: ``timestamp`` (milliseconds), ``input_length``,
    ``output_length`` and ``hash_ids``, one id per ``MOONCAKE_BLOCK`` = 512 prompt tokens
    (the last block may be partial). Equal hash ids mean equal token blocks: each id
    expands into 512 pseudo-random token ids drawn from the id alone, so two prompts
    share exactly the blocks whose hash ids they share, at any ``cache.block_size`` (two
    different ids can still agree on a token by chance, as real text can).

The file is read twice: a first pass checks every line, so a bad line raises ConfigError
naming its line number and field before any request is made (nothing is half-loaded);
the run then reads the lines again as it needs them. Requests come in arrival order of
their sessions' first turns (ties: file order), each session's later turns right after
its first. ``workload.num_requests`` does not apply: the whole file is replayed.
``workload.arrival_time_scale`` stretches time: every arrival and think time is multiplied
by it (2 replays the trace at half its rate), so one trace can load a smaller system.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from enginekit.config import WorkloadConfig
from enginekit.errors import ConfigError
from enginekit.workloads.traffic import TrafficRequest, Workload

FORMATS = ("auto", "jsonl", "mooncake")
MOONCAKE_BLOCK = 512
_MASK64 = (1 << 64) - 1
_OUTPUT_SALT = 0x5DEECE66D  # keeps generated outputs apart from Mooncake's prompt blocks
_KEY_MULTIPLIER = 0x100000001B3  # spreads consecutive keys' positions apart
_BLOCK_POSITIONS = np.arange(MOONCAKE_BLOCK, dtype=np.uint64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def pseudo_random_tokens(key: int, count: int, vocab_size: int) -> np.ndarray:
    """``count`` token ids in [0, vocab_size) drawn from ``key`` alone (int32): the
    token at position ``i`` is ``splitmix64(key * 0x100000001B3 + i) % vocab_size``
    (wrapping uint64 arithmetic)."""
    base = np.uint64((key * _KEY_MULTIPLIER) & _MASK64)
    positions = np.arange(count, dtype=np.uint64)
    return (_splitmix64(positions + base) % np.uint64(vocab_size)).astype(np.int32)


def mooncake_tokens(hash_ids: Sequence[int], num_tokens: int, vocab_size: int) -> np.ndarray:
    """The prompt of a Mooncake line: ``MOONCAKE_BLOCK`` tokens per hash id, cut at
    ``num_tokens``: block ``j`` is ``pseudo_random_tokens(hash_ids[j], MOONCAKE_BLOCK,
    vocab_size)``, drawn for every block at once (a 128K-token prompt is one array
    operation, not 256)."""
    if not len(hash_ids):
        return np.zeros(0, np.int32)
    with np.errstate(over="ignore"):
        ids = np.asarray([int(h) & _MASK64 for h in hash_ids], dtype=np.uint64)
        bases = ids * np.uint64(_KEY_MULTIPLIER)
    keys = (bases[:, None] + _BLOCK_POSITIONS[None, :]).reshape(-1)[:num_tokens]
    return (_splitmix64(keys) % np.uint64(vocab_size)).astype(np.int32)


class _Line(NamedTuple):
    """What the first pass keeps of a line: where it starts, when it arrives, its
    session (None: a session of its own) and turn."""

    offset: int
    arrival_time: float
    session: str | None
    turn: int


class _BadLine(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem


def _number(obj: dict[str, Any], field: str, minimum: float = 0.0) -> float:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadLine(field, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise _BadLine(field, f"must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def _integer(obj: dict[str, Any], field: str, minimum: int) -> int:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadLine(field, f"must be an int, got {value!r}")
    if value < minimum:
        raise _BadLine(field, f"must be >= {minimum}, got {value}")
    return value


def _token_ids(obj: dict[str, Any], field: str, vocab_size: int, minimum: int) -> list[int]:
    value = obj.get(field)
    if not isinstance(value, list):
        raise _BadLine(field, f"must be a list of token ids, got {type(value).__name__}")
    if len(value) < minimum:
        raise _BadLine(field, f"must hold at least {minimum} token id(s)")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise _BadLine(field, f"token {i} is {token!r}, not an id in [0, {vocab_size})")
    return value


def _check_jsonl(obj: dict[str, Any], vocab_size: int) -> tuple[str, float, str | None, int]:
    request_id = obj.get("id")
    if not isinstance(request_id, str) or not request_id:
        raise _BadLine("id", f"must be a non-empty str, got {request_id!r}")
    arrival = _number(obj, "arrival_time")
    _token_ids(obj, "prompt_token_ids", vocab_size, 1)
    output_len = _integer(obj, "output_len", 1)
    if "output_token_ids" in obj and obj["output_token_ids"] is not None:
        output = _token_ids(obj, "output_token_ids", vocab_size, 0)
        if len(output) != output_len:
            raise _BadLine(
                "output_token_ids", f"holds {len(output)} ids, output_len is {output_len}"
            )
    if obj.get("think_time_s") is not None:
        _number(obj, "think_time_s")
    key = obj.get("extra_key")
    if key is not None and not isinstance(key, str):
        raise _BadLine("extra_key", f"must be a str, got {key!r}")
    session = obj.get("session")
    if session is None:
        if obj.get("turn") is not None:
            raise _BadLine("turn", "a turn needs a session")
        return request_id, arrival, None, 0
    if isinstance(session, bool) or not isinstance(session, str | int):
        raise _BadLine("session", f"must be a str or an int, got {session!r}")
    turn = _integer(obj, "turn", 0) if obj.get("turn") is not None else -1
    return request_id, arrival, str(session), turn


def _check_mooncake(obj: dict[str, Any]) -> float:
    timestamp = _number(obj, "timestamp")
    num_tokens = _integer(obj, "input_length", 1)
    _integer(obj, "output_length", 1)
    hash_ids = obj.get("hash_ids")
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids
    ):
        raise _BadLine("hash_ids", "must be a list of non-negative ints")
    needed = -(-num_tokens // MOONCAKE_BLOCK)
    if len(hash_ids) != needed:
        raise _BadLine(
            "hash_ids",
            f"holds {len(hash_ids)} ids; input_length {num_tokens} needs {needed} "
            f"(one per {MOONCAKE_BLOCK} tokens)",
        )
    return timestamp / 1000.0


def _format_of(first: dict[str, Any], requested: str) -> str:
    if requested not in FORMATS:
        raise ConfigError(f"workload.trace_format={requested!r}; choose: {', '.join(FORMATS)}")
    if requested != "auto":
        return requested
    return "mooncake" if "hash_ids" in first else "jsonl"


def _scan(path: Path, requested: str, vocab_size: int) -> tuple[str, list[_Line]]:
    """The first pass: checks every line; returns the format and what the replay needs
    of each line, in file order. Blank lines are skipped."""
    lines: list[_Line] = []
    ids: set[str] = set()
    turns: set[tuple[str, int]] = set()
    session_counts: dict[str, int] = {}
    fmt = ""
    with path.open("rb") as stream:
        offset = 0
        for number, raw in enumerate(stream, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"{where}: not a JSON object ({exc})") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{where}: not a JSON object")
            fmt = fmt or _format_of(obj, requested)
            try:
                if fmt == "mooncake":
                    lines.append(_Line(start, _check_mooncake(obj), None, 0))
                    continue
                request_id, arrival, session, turn = _check_jsonl(obj, vocab_size)
                if request_id in ids:
                    raise _BadLine("id", f"{request_id!r} is used by an earlier line")
                ids.add(request_id)
                if session is not None:
                    if turn < 0:
                        turn = session_counts.get(session, 0)
                    if (session, turn) in turns:
                        raise _BadLine("turn", f"session {session!r} has turn {turn} already")
                    turns.add((session, turn))
                    session_counts[session] = max(session_counts.get(session, 0), turn + 1)
                lines.append(_Line(start, arrival, session, turn))
            except _BadLine as bad:
                raise ConfigError(f"{where}: field {bad.field!r} {bad.problem}") from None
    if not lines:
        raise ConfigError(f"workload.path={str(path)!r} holds no request")
    return fmt, lines


def _replay_order(lines: list[_Line]) -> list[tuple[int, int | None]]:
    """(line index, the request id it follows) in the order of the module docstring."""
    sessions: dict[str, list[int]] = {}
    firsts: list[int] = []
    for i, line in enumerate(lines):
        if line.session is None:
            firsts.append(i)
        else:
            members = sessions.setdefault(line.session, [])
            if not members:
                firsts.append(i)  # a placeholder: the session is sorted below
            members.append(i)
    for members in sessions.values():
        members.sort(key=lambda i: lines[i].turn)
    groups: list[list[int]] = []
    for i in firsts:
        session = lines[i].session
        groups.append([i] if session is None else sessions[session])
    groups.sort(key=lambda g: lines[g[0]].arrival_time)  # stable: ties keep file order
    return [(i, None if k == 0 else g[k - 1]) for g in groups for k, i in enumerate(g)]


def _read_line(stream: IO[bytes], offset: int) -> dict[str, Any]:
    stream.seek(offset)
    obj: dict[str, Any] = json.loads(stream.readline())
    return obj


def _replay(
    path: Path, fmt: str, lines: list[_Line], vocab_size: int, scale: float
) -> Iterator[TrafficRequest]:
    """The requests of the trace, in replay order, their times multiplied by ``scale``."""
    order = _replay_order(lines)
    ids: dict[int, str] = {}
    with path.open("rb") as stream:
        for index, previous in order:
            obj = _read_line(stream, lines[index].offset)
            if fmt == "mooncake":
                prompt = mooncake_tokens(obj["hash_ids"], obj["input_length"], vocab_size)
                num_out = int(obj["output_length"])
                output = pseudo_random_tokens(_OUTPUT_SALT + index, num_out, vocab_size)
                yield TrafficRequest(
                    f"req-{index}", prompt, output, lines[index].arrival_time * scale, num_out
                )
                continue
            request_id = obj["id"]
            ids[index] = request_id
            num_out = int(obj["output_len"])
            given = obj.get("output_token_ids")
            output = (
                np.asarray(given, dtype=np.int32)
                if given is not None
                else pseudo_random_tokens(_OUTPUT_SALT + index, num_out, vocab_size)
            )
            yield TrafficRequest(
                request_id,
                np.asarray(obj["prompt_token_ids"], dtype=np.int32),
                output,
                float(obj["arrival_time"]) * scale,
                num_out,
                follows=None if previous is None else ids[previous],
                think_time_s=float(obj.get("think_time_s") or 0.0) * scale,
                extra_key=obj.get("extra_key"),
                prepend_context=False,
            )


def open_trace(config: WorkloadConfig, vocab_size: int, max_model_len: int) -> Workload:
    """The ``trace`` workload of ``config.path`` (module docstring): checks every line
    now. ConfigError without a path, for a missing file or a bad line."""
    if not config.path:
        raise ConfigError("workload=trace needs workload.path=<file>")
    scale = config.arrival_time_scale
    if not scale > 0:
        raise ConfigError(f"workload.arrival_time_scale must be > 0, got {scale}")
    path = Path(config.path)
    if not path.is_file():
        raise ConfigError(f"workload.path={config.path!r}: no such file")
    fmt, lines = _scan(path, config.trace_format, vocab_size)
    source = f"trace {path.name} ({fmt}, {len(lines):,} requests)"
    if scale != 1:
        source += f", times x{scale:g}"
    return Workload(len(lines), lambda: _replay(path, fmt, lines, vocab_size, scale), source)


def _session_lines(group: list[TrafficRequest]) -> Iterator[dict[str, Any]]:
    """The lines of one session (a first turn and the turns that follow it, in order)."""
    first = group[0]
    context = np.zeros(0, np.int32)
    for turn, r in enumerate(group):
        prompt = np.asarray(r.prompt_token_ids, dtype=np.int32)
        output = np.asarray(r.output_token_ids, dtype=np.int32)
        if turn and r.prepend_context:
            prompt = np.concatenate([context, prompt])
        line: dict[str, Any] = {"id": r.request_id}
        line["arrival_time"] = max(first.arrival_time, r.arrival_time) if turn else r.arrival_time
        if len(group) > 1:
            line |= {"session": first.request_id, "turn": turn}
            if turn:
                line["think_time_s"] = r.think_time_s
        line |= {"prompt_token_ids": prompt.tolist(), "output_len": int(r.max_tokens)}
        line["output_token_ids"] = output.tolist()
        if r.extra_key is not None:
            line["extra_key"] = r.extra_key
        if len(group) > 1:
            context = np.concatenate([prompt, output])
        yield line


def write_jsonl(requests: Iterable[TrafficRequest], stream: IO[str]) -> int:
    """Writes ``requests`` (a workload's, in its order) as ``jsonl`` lines; returns how
    many. A later turn's prompt is written whole (the earlier turn's prompt and scripted
    output in front of its own part, when it had them prepended), with its session (the
    first turn's id), turn and think time, and the first turn's arrival time, so that a
    replay runs it after the earlier turn as the workload would."""
    count = 0
    group: list[TrafficRequest] = []

    def flush() -> None:
        for line in _session_lines(group):
            stream.write(json.dumps(line, separators=(",", ":")) + "\n")
        group.clear()

    for r in requests:
        if r.follows is None and group:
            flush()
        elif r.follows is not None and (not group or group[-1].request_id != r.follows):
            raise ValueError(f"{r.request_id} follows {r.follows}, which is not the turn before it")
        group.append(r)
        count += 1
    if group:
        flush()
    return count

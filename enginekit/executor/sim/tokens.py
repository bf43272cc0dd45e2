"""ScriptedTokens: the simulator's output tokens of every registered sequence, drawn for a
whole step at once.

A sequence returns its script in order, one token each time it is sampled; past the
script's end, output position ``p`` returns ``fallback_token_id(key, p, vocab_size)``, a
pseudo-random id of the sequence's key (its seq id; a forked sample's own key) and the
position only, so tokens depend neither on batching nor on which other sequences run.

Layout: every script lies in one int64 arena, and each sequence owns a slot of four
aligned arrays (its script's start and end in the arena, its cursor: the start plus the
tokens returned so far, and its fallback key premixed mod 2**64), so that drawing a
step's tokens is one dict lookup per sequence and a few whole-array operations, not
Python work per token. A
forgotten sequence's script stays in the arena as dead space until the arena is
compacted (when it must grow and at least half of it is dead).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_MASK64 = (1 << 64) - 1
_MIX_SEQ = 0x9E3779B97F4A7C15
_MIX_POS = 0xD1B54A32D192ED03
_MIX_ADD = 0x94D049BB133111EB
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_MIN_CAPACITY = 64


def fallback_token_id(seq_id: int, position: int, vocab_size: int) -> int:
    """The id returned for output ``position`` of ``seq_id`` once its script is exhausted:
    a SplitMix64 finalizer of ``seq_id·A + position·B + C`` (mod 2**64), reduced to
    ``[0, vocab_size)``. The scalar specification of ``fallback_token_ids``."""
    x = (seq_id * _MIX_SEQ + position * _MIX_POS + _MIX_ADD) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX_1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX_2) & _MASK64
    return (x ^ (x >> 31)) % vocab_size


def mixed_key(seq_id: int) -> int:
    """``seq_id·A + C`` mod 2**64: the part of ``fallback_token_id``'s input that depends
    on the sequence only."""
    return (seq_id * _MIX_SEQ + _MIX_ADD) & _MASK64


def fallback_token_ids(
    mixed_keys: npt.NDArray[np.uint64], positions: npt.NDArray[np.int64], vocab_size: int
) -> npt.NDArray[np.uint64]:
    """``fallback_token_id(key_i, positions[i], vocab_size)`` for every i, where
    ``mixed_keys[i] = mixed_key(key_i)``; numpy's uint64 arithmetic wraps mod 2**64
    exactly like the masked scalar version. ``positions`` are >= 0."""
    with np.errstate(over="ignore"):
        x = mixed_keys + positions.astype(np.uint64) * np.uint64(_MIX_POS)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX_1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX_2)
        return (x ^ (x >> np.uint64(31))) % np.uint64(vocab_size)  # type: ignore[no-any-return]


class ScriptedTokens:
    """Owns the registered sequences' scripts, positions and fallback keys (module
    docstring). ``add`` registers, ``remove`` forgets, ``draw`` returns and advances."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._slot_of: dict[int, int] = {}
        self._free_slots: list[int] = []
        self._start = np.zeros(0, dtype=np.int64)
        self._end = np.zeros(0, dtype=np.int64)
        self._cursor = np.zeros(0, dtype=np.int64)  # start + tokens returned
        self._key = np.zeros(0, dtype=np.uint64)
        self._arena = np.zeros(_MIN_CAPACITY, dtype=np.int64)
        self._arena_end = 0  # the arena's used prefix
        self._num_dead = 0  # tokens of forgotten scripts within that prefix

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._slot_of

    def add(self, seq_id: int, script: Sequence[int] | np.ndarray, key: int) -> None:
        """Registers ``seq_id`` at output position 0 with ``script`` (copied) and the
        fallback key ``key``. Raises ValueError if it is already registered."""
        if seq_id in self._slot_of:
            raise ValueError(f"sequence {seq_id} is already registered")
        tokens = np.asarray(script, dtype=np.int64)
        num_tokens = len(tokens)
        if self._arena_end + num_tokens > len(self._arena):
            self._make_room(num_tokens)
        start = self._arena_end
        self._arena[start : start + num_tokens] = tokens
        self._arena_end = start + num_tokens
        if not self._free_slots:
            self._grow_slots()
        slot = self._free_slots.pop()
        self._start[slot] = start
        self._end[slot] = start + num_tokens
        self._cursor[slot] = start
        self._key[slot] = mixed_key(key)
        self._slot_of[seq_id] = slot

    def remove(self, seq_id: int) -> None:
        """Forgets ``seq_id``; an unknown id is ignored."""
        slot = self._slot_of.pop(seq_id, None)
        if slot is None:
            return
        self._num_dead += int(self._end[slot] - self._start[slot])
        self._free_slots.append(slot)

    def draw(self, seq_ids: Sequence[int]) -> list[int]:
        """The next token of each of ``seq_ids`` (distinct), in order; each one's position
        advances by one. Raises KeyError, changing nothing, for an unregistered id."""
        num = len(seq_ids)
        if not num:
            return []
        slots = np.fromiter(map(self._slot_of.__getitem__, seq_ids), dtype=np.intp, count=num)
        cursors = self._cursor[slots]
        self._cursor[slots] = cursors + 1
        scripted = cursors < self._end[slots]
        if scripted.all():
            tokens: list[int] = self._arena[cursors].tolist()
            return tokens
        out = np.empty(num, dtype=np.int64)
        out[scripted] = self._arena[cursors[scripted]]
        past = ~scripted
        past_slots = slots[past]
        positions = cursors[past] - self._start[past_slots]
        out[past] = fallback_token_ids(self._key[past_slots], positions, self.vocab_size)
        tokens = out.tolist()
        return tokens

    def _grow_slots(self) -> None:
        """Doubles the slot arrays; the new slots are free."""
        old = len(self._start)
        new = max(_MIN_CAPACITY, 2 * old)
        for name in ("_start", "_end", "_cursor", "_key"):
            array = getattr(self, name)
            grown = np.zeros(new, dtype=array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self._free_slots.extend(range(new - 1, old - 1, -1))  # lowest slot popped first

    def _make_room(self, num_tokens: int) -> None:
        """Makes the arena hold ``num_tokens`` more behind its used prefix: compacts it
        when at least half the prefix is dead, and grows it (doubling) when that is not
        enough."""
        if self._num_dead and 2 * self._num_dead >= self._arena_end:
            self._compact()
        needed = self._arena_end + num_tokens
        if needed > len(self._arena):
            grown = np.zeros(max(needed, 2 * len(self._arena)), dtype=np.int64)
            grown[: self._arena_end] = self._arena[: self._arena_end]
            self._arena = grown

    def _compact(self) -> None:
        """Moves the live scripts to the arena's front, in slot order; drops the dead."""
        live = np.fromiter(self._slot_of.values(), dtype=np.intp, count=len(self._slot_of))
        live.sort()
        starts = self._start[live]
        lengths = self._end[live] - starts
        total = int(lengths.sum())
        new_starts = np.cumsum(lengths) - lengths
        gather = np.repeat(starts - new_starts, lengths) + np.arange(total)
        self._arena[:total] = self._arena[gather]
        moved = starts - new_starts
        self._start[live] = new_starts
        self._end[live] -= moved
        self._cursor[live] -= moved
        self._arena_end = total
        self._num_dead = 0

    def check_integrity(self) -> None:
        """Raises RuntimeError unless the slots and the arena agree: every live slot is
        registered once and not free, live scripts lie in the used prefix without
        overlapping, and the dead count is the rest of that prefix."""
        live = sorted(self._slot_of.values())
        if len(set(live)) != len(live):
            raise RuntimeError("two sequences share a token slot")
        if set(live) & set(self._free_slots):
            raise RuntimeError("a live token slot is also free")
        if len(live) + len(self._free_slots) != len(self._start):
            raise RuntimeError("token slots are lost")
        spans = sorted((int(self._start[s]), int(self._end[s] - self._start[s])) for s in live)
        end = 0
        for start, length in spans:
            if start < end or length < 0:
                raise RuntimeError("live scripts overlap in the arena")
            end = start + length
        if end > self._arena_end or self._arena_end > len(self._arena):
            raise RuntimeError("a live script lies beyond the arena's used prefix")
        if self._num_dead != self._arena_end - sum(length for _, length in spans):
            raise RuntimeError(f"the arena's dead count {self._num_dead} is stale")
        if any(int(self._cursor[s]) < int(self._start[s]) for s in live):
            raise RuntimeError("a sequence's cursor lies before its script")

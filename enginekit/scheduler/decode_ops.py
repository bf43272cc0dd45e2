"""The decode batch's two per-step passes over its members, in Python (the executable
spec) and in Rust (``enginekit._native``, the same contract in one call each).

Every step, the decodes' context lengths (and which of them fill a block) are read when
the step is scheduled, and each decode's sampled token is appended, its stop conditions
checked, when the step's tokens come back. ``DecodeBatch`` holds the members' fields side
by side; these passes take those fields whole and touch no request. Each checks its
arguments (lengths, types) before it changes anything.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

# (num_tokens, block_size, ints) -> (context lengths, filled): see decode_context_lens
ContextLens: TypeAlias = Callable[
    [npt.NDArray[np.int64], int, list[int]], tuple[list[int], list[int]]
]
# (token_lists, token_ids, num_tokens, max_num_tokens, stops_at_eos, eos) -> (stopped by
# EOS, at max_tokens): see append_decode_tokens
AppendTokens: TypeAlias = Callable[
    [
        list[list[int]],
        list[int],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.uint8],
        int | None,
    ],
    tuple[list[int], list[int]],
]


_INT64_MAX = (1 << 63) - 1


class DecodeOps(NamedTuple):
    """One implementation of the two passes."""

    context_lens: ContextLens
    append_tokens: AppendTokens


def _check_array(
    name: str, array: npt.NDArray[np.generic], dtype: type[np.generic], writable: bool = False
) -> None:
    """ValueError unless ``array`` is a 1-D C-contiguous numpy array of ``dtype`` (and
    writable, if asked)."""
    if not isinstance(array, np.ndarray) or array.dtype != dtype:
        raise ValueError(f"{name} must be a 1-D C-contiguous buffer of {np.dtype(dtype).name}")
    if array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError(f"{name} must be 1-D and C-contiguous")
    if writable and not array.flags.writeable:
        raise ValueError(f"{name} must be writable")


def _check_list(name: str, value: object) -> None:
    """TypeError unless ``value`` is a list."""
    if not isinstance(value, list):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")


def _check_lengths(expected: int, **fields: Sequence[object] | npt.NDArray[np.generic]) -> None:
    for name, values in fields.items():
        if len(values) != expected:
            raise ValueError(f"{name} has {len(values)} entries for a batch of {expected}")


def decode_context_lens(
    num_tokens: npt.NDArray[np.int64], block_size: int, ints: list[int]
) -> tuple[list[int], list[int]]:
    """(``ints[num_tokens[i]]`` for every i as a new list: the decodes' context lengths
    once the step is scheduled, the indices i whose ``num_tokens[i]`` is a multiple of
    ``block_size``, ascending: the decodes whose token fills a block). ``ints`` is the
    caller's table of int objects: item n is n for every count in ``num_tokens``, so that
    no int is made per decode. Raises, in this order, TypeError for a ``block_size`` that is
    no int and ValueError for one below 1, ValueError for a ``num_tokens`` that is no 1-D
    C-contiguous int64 array, TypeError for ``ints`` that is no list, ValueError for a count
    outside ``ints``. Pure."""
    block_size = operator.index(block_size)
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    _check_array("num_tokens", num_tokens, np.int64)
    _check_list("ints", ints)
    counts: list[int] = num_tokens.tolist()
    outside = [n for n in counts if not 0 <= n < len(ints)]
    if outside:
        raise ValueError(
            f"num_tokens holds {outside[0]}, outside the {len(ints)} ints of the table"
        )
    context_lens = [ints[n] for n in counts]
    # Past int64 only the count 0 (the counts are ints' indices: not negative) is a multiple.
    multiples = num_tokens % block_size if block_size <= _INT64_MAX else num_tokens
    filled: list[int] = np.flatnonzero(multiples == 0).tolist()
    return context_lens, filled


def append_decode_tokens(
    token_lists: list[list[int]],
    token_ids: list[int],
    num_tokens: npt.NDArray[np.int64],
    max_num_tokens: npt.NDArray[np.int64],
    stops_at_eos: npt.NDArray[np.uint8],
    eos: int | None,
) -> tuple[list[int], list[int]]:
    """Appends ``token_ids[i]`` to ``token_lists[i]`` and adds one to ``num_tokens[i]`` (in
    place) for every i; returns (the indices whose token is the int ``eos`` where
    ``stops_at_eos[i]`` is nonzero, the indices where ``num_tokens[i]`` reached
    ``max_num_tokens[i]``), both ascending; ``eos`` None stops none. The arrays are 1-D
    C-contiguous numpy arrays of their dtypes, ``num_tokens`` writable. Raises, changing
    nothing: TypeError if ``token_lists`` or ``token_ids`` is no list or ``eos`` no int
    (nor None), then ValueError for an array that is not as described or arguments of
    different lengths, then TypeError for a token list that is not a list."""
    _check_list("token_lists", token_lists)
    _check_list("token_ids", token_ids)
    if eos is not None:
        eos = operator.index(eos)
    _check_array("num_tokens", num_tokens, np.int64, writable=True)
    _check_array("max_num_tokens", max_num_tokens, np.int64)
    _check_array("stops_at_eos", stops_at_eos, np.uint8)
    n = len(token_lists)
    _check_lengths(
        n,
        token_ids=token_ids,
        num_tokens=num_tokens,
        max_num_tokens=max_num_tokens,
        stops_at_eos=stops_at_eos,
    )
    if not all(isinstance(tokens, list) for tokens in token_lists):
        raise TypeError("every token list must be a list")
    stopped: list[int] = []
    if eos is not None and eos in token_ids:
        stopped = [
            i
            for i, t in enumerate(token_ids)
            if isinstance(t, int) and t == eos and stops_at_eos[i]
        ]
    deque(map(list.append, token_lists, token_ids), maxlen=0)
    num_tokens += 1
    at_length: list[int] = np.flatnonzero(num_tokens >= max_num_tokens).tolist()
    return stopped, at_length


PYTHON_DECODE_OPS = DecodeOps(decode_context_lens, append_decode_tokens)


def decode_ops(native: bool) -> DecodeOps:
    """The Rust passes (``native``) or the Python ones, which behave the same."""
    if not native:
        return PYTHON_DECODE_OPS
    from enginekit._native import append_decode_tokens as native_append
    from enginekit._native import decode_context_lens as native_context_lens

    return DecodeOps(native_context_lens, native_append)

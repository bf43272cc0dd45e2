"""Argument types of the pure-Python twins, checked as the Rust bindings check them.

A list of ids, counts, hashes or tokens is a ``list`` or ``tuple`` of ints (``operator.index``
decides what an int is). Anything else is a TypeError: ``bytes`` (which iterates as ints),
``str``, a dict (which iterates as its keys), a set, a generator, None. The batch calls of
the block tables (``num_blocks_to_grow``, ``grow``) also take a 1-D C-contiguous int64 numpy
array (``int_batch``). An extra key is ``bytes`` or None.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from enginekit.errors import KVCacheError

__all__ = [
    "extra_key_arg",
    "int_batch",
    "int_list",
    "known_seq_id",
    "new_seq_id",
    "u32_buffer",
    "u64_buffer",
]

_MAX_U64 = (1 << 64) - 1


def int_list(obj: Any, what: str, check: Callable[[int], int] | None = None) -> list[int]:
    """The ints of the list or tuple ``obj`` (argument ``what``), each passed through
    ``check`` (which raises for a bad value) as soon as it is read, as the Rust bindings do;
    TypeError for another type or an item that is not an int."""
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"{what} must be a list or tuple of ints, got {type(obj).__name__}")
    ints = []
    for x in obj:
        v = operator.index(x)
        ints.append(v if check is None else check(v))
    return ints


def int_batch(obj: Any, what: str, check: Callable[[int], int] | None = None) -> list[int]:
    """``int_list``, or the values of a 1-D C-contiguous int64 numpy array, each through
    ``check`` in order."""
    if (
        isinstance(obj, np.ndarray)
        and obj.dtype == np.int64
        and obj.ndim == 1
        and obj.flags.c_contiguous
    ):
        values: list[int] = obj.tolist()
        return values if check is None else [check(v) for v in values]
    return int_list(obj, what, check)


def u64_buffer(obj: Any) -> list[int] | None:
    """The values of ``obj`` if it is a 1-D C-contiguous buffer of 8-byte unsigned ints
    (``array.array("Q")``, a numpy uint64 array), else None (lists and tuples included)."""
    return _typed_buffer(obj, 8, ("Q", "L"))


def u32_buffer(obj: Any) -> list[int] | None:
    """The values of ``obj`` if it is a 1-D C-contiguous buffer of 4-byte unsigned ints
    (``array.array("I")``), else None (lists and tuples included)."""
    return _typed_buffer(obj, 4, ("I",))


def _typed_buffer(obj: Any, itemsize: int, formats: tuple[str, ...]) -> list[int] | None:
    if isinstance(obj, (list, tuple)):
        return None
    try:
        view = memoryview(obj)
    except TypeError:
        return None
    with view:
        if view.ndim != 1 or view.itemsize != itemsize or view.format.lstrip("@=") not in formats:
            return None
        if not view.c_contiguous:
            return None
        values: list[int] = view.tolist()
    return values


def extra_key_arg(extra_key: Any) -> bytes | None:
    """``extra_key`` itself if it is bytes (a subclass included) or None; else TypeError."""
    if extra_key is not None and not isinstance(extra_key, bytes):
        raise TypeError(f"extra_key must be bytes or None, got {type(extra_key).__name__}")
    return extra_key


def new_seq_id(seq_id: Any) -> int:
    """A new sequence's id, which must fit in u64 (ValueError otherwise)."""
    seq_id = operator.index(seq_id)
    if not 0 <= seq_id <= _MAX_U64:
        raise ValueError(f"sequence id {seq_id} is not in [0, 2**64)")
    return seq_id


def known_seq_id(seq_id: Any) -> int:
    """An existing sequence's id: one outside u64 is an unknown sequence (KVCacheError)."""
    seq_id = operator.index(seq_id)
    if not 0 <= seq_id <= _MAX_U64:
        raise KVCacheError(f"unknown sequence {seq_id}")
    return seq_id

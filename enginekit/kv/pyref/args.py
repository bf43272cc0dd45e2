"""Argument types of the pure-Python twins, checked as the Rust bindings check them.

A list of ids, counts, hashes or tokens is a ``list`` or ``tuple`` of ints (``operator.index``
decides what an int is). Anything else is a TypeError: ``bytes`` (which iterates as ints),
``str``, a dict (which iterates as its keys), a set, a generator, None. The batch calls of
the block tables (``num_blocks_to_grow``, ``grow``) also take a 1-D C-contiguous buffer of
int64 (a numpy array, ``int_batch``); token ids may also come as a 1-D C-contiguous buffer
of u32 (an ``array("I")``, ``token_batch``). An extra key is ``bytes`` or None; a pool or
block tables argument is an object of the twins' class (``instance_arg``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from enginekit.errors import KVCacheError

__all__ = [
    "extra_key_arg",
    "instance_arg",
    "int_batch",
    "int_list",
    "is_token_batch",
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
    """``int_list``, or the values of a 1-D C-contiguous buffer of int64 (a numpy array, an
    ``array("q")``), each through ``check`` in order."""
    values = _typed_buffer(obj, 8, ("q", "l"))
    if values is not None:
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


def is_token_batch(obj: Any) -> bool:
    """Whether ``obj`` is a list, a tuple or a 1-D C-contiguous buffer of u32 (its items
    unread)."""
    return isinstance(obj, (list, tuple)) or _buffer_view(obj, 4, ("I",)) is not None


def _buffer_view(obj: Any, itemsize: int, formats: tuple[str, ...]) -> memoryview | None:
    """A view of ``obj`` if it is a 1-D C-contiguous buffer of ``itemsize``-byte items in one
    of ``formats`` (native byte order), else None (lists and tuples included)."""
    if isinstance(obj, (list, tuple)):
        return None
    try:
        view = memoryview(obj)
    except TypeError:
        return None
    if view.ndim != 1 or view.itemsize != itemsize or view.format.lstrip("@=") not in formats:
        view.release()
        return None
    if not view.c_contiguous:
        view.release()
        return None
    return view


def _typed_buffer(obj: Any, itemsize: int, formats: tuple[str, ...]) -> list[int] | None:
    view = _buffer_view(obj, itemsize, formats)
    if view is None:
        return None
    with view:
        values: list[int] = view.tolist()
    return values


def instance_arg(obj: Any, what: str, cls: type) -> Any:
    """``obj`` itself if it is a ``cls`` (a pool or block tables of the twins); else
    TypeError, as the Rust bindings refuse any object but their own classes."""
    if not isinstance(obj, cls):
        raise TypeError(f"{what} must be a {cls.__name__}, got {type(obj).__name__}")
    return obj


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

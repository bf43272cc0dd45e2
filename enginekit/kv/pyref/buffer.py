"""Int32 buffers for the pure-Python twins: the view ``export_into`` writes through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HOLE = -1
"""A released table entry (see PyBlockTables.release_range), shown as -1 and exported as pad."""


def int32_view(out: Any) -> memoryview:
    """A flat, writable int32 memoryview over ``out``; ValueError if it is not one."""
    try:
        view = memoryview(out)
    except TypeError as exc:
        raise ValueError(f"out does not support the buffer protocol: {exc}") from exc
    if view.readonly:
        raise ValueError("out is read-only")
    if not view.c_contiguous:
        raise ValueError("out is not C-contiguous")
    if view.itemsize != 4 or view.format.lstrip("@=<") not in ("i", "l"):
        raise ValueError(f"out is not int32 (format {view.format!r})")
    if view.nbytes == 0:  # memoryview cannot cast a view with a zero in its shape
        return memoryview(bytearray()).cast("i")
    return view.cast("B").cast("i")


def write_rows(flat: memoryview, rows: Sequence[Sequence[int]], width: int, pad: int) -> None:
    """Writes ``rows`` into ``flat`` with row stride ``width``, padding each row and writing
    holes as ``pad`` (the caller has checked that every row fits)."""
    for r, row in enumerate(rows):
        padded = [pad if b == HOLE else b for b in row] + [pad] * (width - len(row))
        for col, value in enumerate(padded):
            flat[r * width + col] = value

"""Arguments the native bindings and their twins refuse alike, for the structure tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

NOT_A_LIST: dict[str, Callable[[], Any]] = {
    "bytes": lambda: b"\x00\x01",  # iterates as the ints 0 and 1
    "bytearray": lambda: bytearray(b"\x00\x01"),
    "str": lambda: "01",
    "dict": lambda: {0: 1, 1: 2},  # iterates as its keys
    "set": lambda: {0, 1},
    "generator": lambda: (x for x in [0, 1]),
    "range": lambda: range(2),
    "numpy": lambda: np.array([0, 1], dtype=np.int64),
    "None": lambda: None,
    "int": lambda: 0,
}
"""Each builds (fresh, since a generator is consumed once) a value holding the ints 0 and 1
that is not a list or tuple: every list argument refuses it with TypeError."""

NOT_AN_EXTRA_KEY: dict[str, Callable[[], Any]] = {
    "int": lambda: 5,
    "huge int": lambda: 2**33,  # bytes(2**33) would be 8 GiB of zeros
    "bytearray": lambda: bytearray(b"t"),
    "memoryview": lambda: memoryview(b"t"),
    "str": lambda: "t",
    "list": lambda: [116],
}
"""Extra keys that are neither bytes nor None: TypeError."""

"""Pure-Python twin of ``enginekit._native.sum_attribute`` (rust/py/attrs.rs)."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any


def sum_attribute(objects: list[Any], name: str) -> Any:
    """``0 + o.name + ...`` over ``objects`` in order, by Python's ``+`` (for ints and bools,
    ``sum(getattr(o, name) for o in objects)``), each attribute read once. Raises
    TypeError unless ``objects`` is a list, and whatever the reads or an addition raise."""
    if not isinstance(objects, list):
        raise TypeError(f"objects must be a list, not {type(objects).__name__}")
    return reduce(operator.add, (getattr(o, name) for o in objects), 0)

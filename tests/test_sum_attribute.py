"""``sum_attribute``: the Rust function against its twin (``enginekit.kv.pyref.attributes``)
and against Python's own ``+`` in order, on slot and non-slot objects, every kind of
value, and the errors."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginekit import _native
from enginekit.kv.pyref.attributes import sum_attribute as twin

IMPLEMENTATIONS = [
    pytest.param(_native.sum_attribute, id="rust"),
    pytest.param(twin, id="twin"),
]


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


class Plain:
    def __init__(self, value: object) -> None:
        self.value = value


class Counted:
    """Counts the reads of its ``value``: each must be read once."""

    reads = 0

    def __init__(self, value: object) -> None:
        self._value = value

    @property
    def value(self) -> object:
        Counted.reads += 1
        return self._value


class SlottedSubclass(Slotted):
    __slots__ = ()


VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=2**63 - 8, max_value=2**63 + 8),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
KINDS = st.sampled_from([Slotted, Plain, SlottedSubclass])


@given(st.lists(st.tuples(KINDS, VALUES), max_size=40))
def test_rust_and_twin_add_in_order(items: list[tuple[type, Any]]) -> None:
    objects = [kind(value) for kind, value in items]
    expected = reduce(operator.add, (value for _, value in items), 0)
    for implementation in (_native.sum_attribute, twin):
        got = implementation(objects, "value")
        assert got == expected
        assert type(got) is type(expected)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_slots_of_one_type_then_others(implementation: Any) -> None:
    """The first object's type takes the slot path; a subclass, an object without the slot
    and a property after it are read by getattr."""
    objects = [Slotted(3), Slotted(4), SlottedSubclass(5), Plain(6), Counted(7), Slotted(8)]
    Counted.reads = 0
    assert implementation(objects, "value") == 33
    assert Counted.reads == 1


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_each_attribute_read_once_past_the_fast_path(implementation: Any) -> None:
    Counted.reads = 0
    objects = [Counted(2**62), Counted(2**62), Counted(2**62), Counted(1.5), Counted(1)]
    assert implementation(objects, "value") == 3 * 2**62 + 2.5
    assert Counted.reads == 5


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_errors_are_pythons(implementation: Any) -> None:
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        implementation([Slotted(1)], "missing")
    with pytest.raises(AttributeError):
        implementation([Slotted(1), Plain(2), object()], "value")
    with pytest.raises(TypeError):
        implementation([Slotted(1), Slotted("two")], "value")
    with pytest.raises(TypeError):
        implementation((Slotted(1),), "value")
    with pytest.raises(TypeError):
        implementation([Slotted(1)], 3)
    assert implementation([], "value") == 0


def test_an_empty_slot_raises_as_getattr_does() -> None:
    empty = Slotted.__new__(Slotted)
    for implementation in (_native.sum_attribute, twin):
        with pytest.raises(AttributeError):
            implementation([Slotted(1), empty], "value")


class Shrinking:
    """Reading its ``value`` removes the last object of the list it is in."""

    def __init__(self, value: int, objects: list[Any]) -> None:
        self._value = value
        self._objects = objects

    @property
    def value(self) -> int:
        self._objects.pop()
        return self._value


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_read_that_changes_the_list_is_seen(implementation: Any) -> None:
    # As a for loop over the list: each step reads the list as it is then.
    objects: list[Any] = [Slotted(1)]
    objects += [Shrinking(10, objects), Slotted(100), Slotted(1000), Slotted(10000)]
    assert implementation(objects, "value") == 1 + 10 + 100 + 1000
    assert len(objects) == 4
    objects = [Slotted(1)]
    objects.append(Shrinking(10, objects))  # removes itself: the list ends there
    assert implementation(objects, "value") == 11
    assert len(objects) == 1

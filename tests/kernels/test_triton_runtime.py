"""``is_interpreter``: TRITON_INTERPRET read as Triton reads it, through Triton's setting
and through the fallback for a Triton without ``knobs``."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from enginekit.kernels.triton.runtime import is_interpreter  # noqa: E402

# Value of TRITON_INTERPRET (None: unset) -> whether Triton interprets.
CASES = [
    ("1", True),
    ("true", True),
    ("TRUE", True),
    ("True", True),
    ("on", True),
    ("ON", True),
    ("yes", True),
    ("y", True),
    ("0", False),
    ("false", False),
    ("off", False),
    ("no", False),
    ("2", False),
    ("", False),
    (" 1", False),
    (None, False),
]


def set_env(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)


@pytest.mark.parametrize(("value", "expected"), CASES)
def test_is_interpreter_reads_tritons_setting(monkeypatch, value, expected):
    set_env(monkeypatch, value)
    assert is_interpreter() is expected
    if hasattr(triton, "knobs"):
        assert triton.knobs.runtime.interpret is expected  # Triton agrees


@pytest.mark.parametrize(("value", "expected"), CASES)
def test_without_knobs_the_environment_is_parsed_as_triton_parses_it(monkeypatch, value, expected):
    set_env(monkeypatch, value)
    monkeypatch.delattr(triton, "knobs", raising=False)
    assert is_interpreter() is expected


def test_a_knob_set_by_the_program_wins_over_the_environment(monkeypatch):
    if not hasattr(triton, "knobs"):
        pytest.skip("this Triton has no knobs")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setitem(triton.knobs.runtime.__dict__, "interpret", True)
    assert is_interpreter() is True

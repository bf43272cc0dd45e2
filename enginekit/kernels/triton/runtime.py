"""Where the Triton kernels run: compiled for a GPU, or under Triton's interpreter.

``is_interpreter`` asks Triton's own setting, ``triton.knobs.runtime.interpret`` (Triton
3.6 and 3.9 both have it; it reads ``TRITON_INTERPRET`` on every access unless a program
set the knob), and falls back, for a Triton without ``knobs``, to reading
``TRITON_INTERPRET`` the way Triton's ``getenv_bool`` does: set and, lowercased, one of
``1``, ``y``, ``yes``, ``on``, ``true`` (nothing stripped, so ``" 1"`` is false); unset is
false. ``os.environ["TRITON_INTERPRET"] == "1"`` would miss ``true``, ``on`` and ``yes``.

``triton.jit`` reads the setting when it decorates a kernel, so a kernel module imported
while the setting was false holds compiled kernels even if it is turned on later: set it
before any kernel module is imported.
"""

from __future__ import annotations

import os

TRUE_VALUES = frozenset({"1", "y", "yes", "on", "true"})


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a value Triton reads as true
    (see the module docstring). Reads the environment; mutates nothing."""
    value = os.environ.get(name)
    return value is not None and value.lower() in TRUE_VALUES


def is_interpreter() -> bool:
    """Whether Triton runs kernels under its interpreter (on the CPU, through numpy)
    rather than compiling them: Triton's own setting, else ``TRITON_INTERPRET`` parsed as
    Triton parses it. Reads the setting at each call; mutates nothing. Imports Triton
    (so that this module can be imported where Triton may be absent)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return env_flag("TRITON_INTERPRET")

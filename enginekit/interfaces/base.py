"""What every plugin class has, whatever its group."""

from __future__ import annotations

from collections.abc import Mapping


class Plugin:
    """Base of the group interfaces. A plugin also carries a ``Config`` dataclass (see the
    group's interface) stored in Hydra's ConfigStore under its entry-point name."""

    @classmethod
    def check_compatible(cls, selected: Mapping[str, type[Plugin]]) -> None:
        """Raises ConfigError, saying why, if this plugin cannot work with the other plugins
        selected (group -> plugin class). Called once the config is read, before anything
        is built. Decide by what the other classes can do (their declared capabilities,
        ``issubclass`` of a protocol in ``enginekit.interfaces``), never by their names, so
        that a third-party plugin with the same capability is accepted. Default: works with
        every combination."""


def plugin_name(plugin_cls: type[Plugin]) -> str:
    """The name a plugin class is selected by (its ``Config``'s default ``name``), for
    messages."""
    name = getattr(getattr(plugin_cls, "Config", None), "name", None)
    return name if isinstance(name, str) else plugin_cls.__name__

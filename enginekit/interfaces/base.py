"""What every plugin class has, whatever its group."""

from __future__ import annotations

from collections.abc import Mapping


class Plugin:
    """Base of the group interfaces. A plugin also carries a ``Config`` dataclass (see the
    group's interface) stored in Hydra's ConfigStore under its entry-point name."""

    @classmethod
    def check_compatible(cls, selected: Mapping[str, str]) -> None:
        """Raises ConfigError, saying why, if this plugin cannot work with the other plugins
        selected (group -> name). Called once the config is read, before anything is built.
        Default: works with every combination."""

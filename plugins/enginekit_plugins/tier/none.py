"""``none``: no tier below device memory; a block the device pool evicts is gone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from enginekit.config import TierConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.base import Plugin
from enginekit.interfaces.tier import KVTier, Payload, TierContext


@dataclass
class NoTierConfig(TierConfig):
    name: str = "none"


class NoTier(KVTier):
    """Selects no level (``+tier=none``, the default). The engine builds no level for it;
    constructing one is a configuration error."""

    Config = NoTierConfig

    @classmethod
    def check_compatible(cls, selected: Mapping[str, type[Plugin]]) -> None:
        """No level: works with every combination."""

    def __init__(self, config: TierConfig, context: TierContext) -> None:
        raise ConfigError("tier 'none' is no level: leave it out of tier.levels")

    @property
    def capacity_blocks(self) -> int:
        return 0

    @property
    def bytes_per_s(self) -> float:
        return 0.0

    def num_blocks(self) -> int:
        return 0

    def num_present(self, keys: Sequence[int]) -> int:
        return 0

    def load(self, keys: Sequence[int]) -> list[Payload]:
        return []

    def store(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        return []

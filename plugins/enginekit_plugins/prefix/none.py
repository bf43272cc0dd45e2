"""``none``: no prefix caching; every prompt is computed in full."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import PrefixConfig
from enginekit.interfaces import NO_MATCH, PrefixCache, PrefixMatch
from enginekit.request import Request


@dataclass
class NoPrefixConfig(PrefixConfig):
    name: str = "none"


class NoPrefixCache(PrefixCache):
    """Never matches and never publishes, so released blocks go straight to the free list."""

    Config = NoPrefixConfig
    shares_blocks = False

    def match(self, request: Request) -> PrefixMatch:
        return NO_MATCH

    def may_match_more(self, request: Request, match: PrefixMatch) -> bool:
        return False

    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        pass

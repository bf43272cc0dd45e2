"""``sliding_window``: give back the blocks a running sequence can no longer attend to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from enginekit.config import EvictionConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import Eviction
from enginekit.kv.context import KVContext
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


@dataclass
class SlidingWindowConfig(EvictionConfig):
    name: str = "sliding_window"
    window: int | None = None  # tokens; None: the model's own sliding window


class SlidingWindowEviction(Eviction):
    """A query at position q attends to keys at positions p with q - p < window (the
    Mistral rule: the window counts the query itself). After every step, each running
    sequence gives back its leading blocks that lie wholly before the window of the next
    token it will compute, so once past its prompt it holds at most the window plus one
    block. (Admission reserves a prompt's blocks all at once, so during its prefill a prompt
    longer than the window holds more, until its chunks pass.)

    Exact for sliding-window models (window = the model's). For a model without one, a
    ``window`` makes attention windowed as well: a bounded-memory approximation of full
    attention (StreamingLLM without its attention sinks). Cached prefix blocks are still
    evicted least recently used first, as by ``lru``.

    Needs an allocator that can leave holes in a table (``paged``); refused with
    ``radix``, whose tree indexes whole sequences from their first token.
    """

    Config = SlidingWindowConfig

    def __init__(self, config: SlidingWindowConfig, kv: KVContext) -> None:
        super().__init__(config, kv)
        window = kv.attention_window
        if window is None:
            raise ConfigError(
                "eviction.window is not set and the model has no sliding window: set "
                "eviction.window=<tokens> (an approximation for this model) or use +eviction=lru"
            )
        self.window = window

    @classmethod
    def attention_window(cls, config: EvictionConfig, model_window: int | None) -> int | None:
        window = getattr(config, "window", None)
        if window is not None and window < 1:
            raise ConfigError(f"eviction.window must be >= 1, got {window}")
        if window is None:
            return model_window
        return window if model_window is None else min(window, model_window)

    @classmethod
    def check_compatible(cls, selected: Mapping[str, str]) -> None:
        if selected.get("allocator") != "paged":
            raise ConfigError(
                "+eviction=sliding_window needs +allocator=paged (got "
                f"{selected.get('allocator')}): it releases blocks from the front of a table"
            )
        if selected.get("prefix") == "radix":
            raise ConfigError(
                "+eviction=sliding_window cannot be combined with +prefix=radix: the radix tree "
                "indexes whole sequences from their first token, which this policy releases"
            )

    def evict(self, num_blocks: int) -> list[int]:
        return self.kv.pool.evict_lru(num_blocks)

    def release_out_of_window(self, running: Sequence[Request], kv: KVCacheManager) -> int:
        block_size = self.kv.spec.block_size
        reach = self.window - 1  # the next query, at q, sees back to q - (window - 1)
        num_released = 0
        for request in running:
            num_behind = (request.num_computed_tokens - reach) // block_size
            if num_behind > 0:
                num_released += kv.release_front(request, num_behind)
        return num_released

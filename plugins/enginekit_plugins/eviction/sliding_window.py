"""``sliding_window``: give back the blocks a running sequence can no longer attend to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from enginekit.config import EvictionConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import (
    AttentionSpan,
    BlockRange,
    Eviction,
    HoleAllocator,
    KVContext,
    Plugin,
    PrefixCache,
    plugin_name,
)
from enginekit.request import Request

DEFAULT_SINK_TOKENS = 4
"""Attention sinks of the approximation mode: StreamingLLM (Xiao et al., 2024) finds that
keeping the first 4 tokens restores window attention's perplexity to that of full attention
on Llama-2, Falcon, MPT and Pythia; at 16-token blocks they cost one block per sequence."""


@dataclass
class SlidingWindowConfig(EvictionConfig):
    name: str = "sliding_window"
    window: int | None = None  # tokens; None: the model's own sliding window
    # Attention sinks: tokens at the start every query keeps attending to (StreamingLLM).
    # None: 4 where the window is an approximation (a model without a sliding window of its
    # own), 0 for a sliding-window model, which refuses any other value.
    sink_tokens: int | None = None
    # True: a prefill step also holds at most the bound, so a chunk past the window adds
    # one block per step; False: a chunk may also use, for its step, blocks no one is
    # promised.
    strict_bound: bool = False


class SlidingWindowEviction(Eviction):
    """A query at position p attends to the key at position k iff k <= p and
    (k > p - window or k < sinks): the Mistral rule (the window counts the query itself),
    plus ``sinks`` attention-sink tokens at the start that never leave it. After every step,
    and when a sequence is admitted, each running sequence gives back the blocks that lie
    wholly outside both the sinks and the window of the next token it will compute: its
    table keeps ceil(sinks / block_size) sink blocks, then holes, then the window's blocks.

    Bound: a sequence holds at most ceil(sinks / block) + ceil(window / block) + 1 blocks
    (``max_blocks_per_sequence``) between steps, and during every step in which it decodes.
    Blocks come with each prefill chunk, and admission promises a prefill the bound (or its
    whole prompt, if smaller), so it does not wait for memory (unless the blocks it gives
    back are still held by another sequence: the cache manager then tops the promise up as
    blocks come free).
    A chunk may also use, for its step only, blocks no sequence is promised (a long prompt
    then prefills at the step's token budget); with ``strict_bound`` it may not, and a
    chunk past the window adds one block per step, so that a prefill step too stays within
    the bound.

    Exact for sliding-window models (window = the model's, no sinks). For a model without
    one, ``window`` makes attention windowed as well, and ``sink_tokens`` (default 4) keeps
    StreamingLLM's attention sinks: a bounded-memory approximation of full attention.
    Cached prefix blocks are still evicted least recently used first, as by ``lru``.

    Needs an allocator that can leave holes in a table (a ``HoleAllocator``, such as
    ``paged``) and a prefix cache that works with them (refused with ``radix``, whose tree
    indexes whole sequences from their first token).
    """

    Config = SlidingWindowConfig

    def __init__(self, config: SlidingWindowConfig, kv: KVContext) -> None:
        """Attends as ``kv.attention_window`` / ``attention_sinks`` say: what ``attention``
        resolved for this config and model."""
        super().__init__(config, kv)
        window = kv.attention_window
        if window is None:
            raise ConfigError(
                "eviction.window is not set and the model has no sliding window: set "
                "eviction.window=<tokens> (an approximation for this model) or use +eviction=lru"
            )
        self.window = window
        self.sinks = kv.attention_sinks
        block_size = kv.spec.block_size
        self.num_sink_blocks = -(-self.sinks // block_size)
        self._max_blocks = self.num_sink_blocks + -(-window // block_size) + 1
        self._strict_bound = config.strict_bound

    @classmethod
    def attention(cls, config: EvictionConfig, model_window: int | None) -> AttentionSpan:
        """The window: ``window`` (capped by the model's own), else the model's. The sinks:
        ``sink_tokens``, or by default 4 in the approximation mode and 0 for a
        sliding-window model. Raises ConfigError for a window below 1, a negative sink
        count, and sinks on a sliding-window model (its window is exact; sinks would
        change the model)."""
        window = getattr(config, "window", None)
        if window is not None and window < 1:
            raise ConfigError(f"eviction.window must be >= 1, got {window}")
        if window is not None and model_window is not None:
            window = min(window, model_window)
        elif window is None:
            window = model_window
        sinks = getattr(config, "sink_tokens", None)
        if sinks is not None and sinks < 0:
            raise ConfigError(f"eviction.sink_tokens must be >= 0, got {sinks}")
        if model_window is not None:
            if sinks:
                raise ConfigError(
                    f"eviction.sink_tokens={sinks} is refused: the model has its own "
                    f"{model_window}-token sliding window, which this policy keeps exact, and "
                    "attention sinks would change the model; leave eviction.sink_tokens unset "
                    "or 0"
                )
            return AttentionSpan(window, 0)
        if window is None:
            return AttentionSpan(None, 0)  # no window at all: refused when the policy is built
        return AttentionSpan(window, DEFAULT_SINK_TOKENS if sinks is None else sinks)

    @classmethod
    def check_compatible(cls, selected: Mapping[str, type[Plugin]]) -> None:
        allocator = selected.get("allocator")
        if allocator is not None and not issubclass(allocator, HoleAllocator):
            raise ConfigError(
                f"+eviction=sliding_window needs an allocator that can leave holes in a block "
                f"table (such as +allocator=paged); {plugin_name(allocator)} cannot: this "
                "policy releases blocks from the middle of a table"
            )
        prefix = selected.get("prefix")
        if (
            prefix is not None
            and issubclass(prefix, PrefixCache)
            and not prefix.supports_table_holes
        ):
            raise ConfigError(
                f"+eviction=sliding_window cannot be combined with +prefix={plugin_name(prefix)}: "
                "it indexes whole sequences from their first token, which this policy releases"
            )

    @property
    def max_blocks_per_sequence(self) -> int:
        """ceil(sinks / block_size) + ceil(window / block_size) + 1."""
        return self._max_blocks

    @property
    def strict_bound(self) -> bool:
        return self._strict_bound

    def first_window_block(self, num_computed_tokens: int) -> int:
        """The first block the next query (at position ``num_computed_tokens``) reaches
        through its window: blocks before it and past the sink blocks are out. Pure."""
        return max(0, num_computed_tokens - self.window + 1) // self.kv.spec.block_size

    def kept_blocks(self, block_ids: Sequence[int], num_computed_tokens: int) -> list[int]:
        """The sink blocks and those from ``first_window_block`` on. Pure."""
        first = max(self.num_sink_blocks, self.first_window_block(num_computed_tokens))
        return [*block_ids[: self.num_sink_blocks], *block_ids[first:]]

    def ranges_out_of_window(self, running: Sequence[Request]) -> list[BlockRange]:
        """For each request, its blocks from the sink blocks up to the first block of its
        next query's window that it still holds. The holes this policy makes are exactly
        the blocks ``num_sink_blocks .. num_sink_blocks + num_holes - 1`` of a table, so
        each range starts after them."""
        tables = self.kv.tables
        num_sink = self.num_sink_blocks
        ranges = []
        for request in running:
            end = self.first_window_block(request.num_computed_tokens)
            if end <= num_sink:
                continue
            first = num_sink + tables.num_holes(request.seq_id)
            if first < end:
                ranges.append(BlockRange(request.seq_id, first, end))
        return ranges

"""CacheView: what a preemption policy may read of the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from enginekit.spec.kv import KVSpec

if TYPE_CHECKING:
    from enginekit.interfaces.structures import BlockTables


class CacheView(Protocol):
    """The storage format and the block tables, to weigh a victim's restore cost. A
    policy reads them and changes nothing: it returns a decision (``Preemption.mode``)."""

    @property
    def spec(self) -> KVSpec: ...

    @property
    def tables(self) -> BlockTables: ...

    def num_held_blocks(self, seq_id: int) -> int:
        """Blocks the sequence's table holds (holes excluded): what a swap moves."""
        ...

    @property
    def num_free_swap_blocks(self) -> int:
        """Host blocks the swap space has free: a swap of more falls back to recompute."""
        ...

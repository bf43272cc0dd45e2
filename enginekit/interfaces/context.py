"""KVContext: the shared cache structures every memory plugin works on."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from enginekit.spec.kv import KVSpec

if TYPE_CHECKING:
    from enginekit.interfaces.backend import Backend
    from enginekit.interfaces.structures import BlockPool, BlockTables


class KVContext(NamedTuple):
    """What the cache manager hands each memory plugin at construction.

    ``pool`` and ``tables`` are the Rust structures, or in tests their pure-Python twins;
    ``backend`` makes more of the same kind (a radix tree, block hashes), so a plugin never
    asks which it has. The manager owns the
    structures; plugins mutate them only as their group's contract says.

    ``attention_window`` and ``attention_sinks`` are what the executors attend with: the
    model's own sliding window, or the one the eviction policy asked for
    (``Eviction.attention``), and the sink tokens kept in front of it.
    """

    pool: BlockPool
    tables: BlockTables
    spec: KVSpec
    max_model_len: int
    backend: Backend
    attention_window: int | None = None  # keys a query can reach (None: all before it)
    attention_sinks: int = 0  # leading tokens every query also attends to

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

"""KVContext: the shared cache structures every memory plugin works on."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from enginekit.spec.kv import KVSpec

if TYPE_CHECKING:
    from enginekit._native import BlockPool, BlockTables


class KVContext(NamedTuple):
    """What the KVCacheManager hands each memory plugin at construction.

    ``pool`` is a BlockPool and ``tables`` a BlockTables, native (``enginekit._native``) or
    their pure-Python twins (``enginekit.kv.pyref``): same API, so plugins never care which.
    The manager owns them; plugins mutate them only as their contracts say.
    """

    pool: BlockPool  # or enginekit.kv.pyref.PyBlockPool: same API
    tables: BlockTables  # or enginekit.kv.pyref.PyBlockTables
    spec: KVSpec
    max_model_len: int
    attention_window: int | None = None  # keys a query can reach (None: all before it)

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

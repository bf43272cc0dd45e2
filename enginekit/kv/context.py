"""KVContext: the shared cache structures every memory plugin works on."""

from __future__ import annotations

from typing import NamedTuple

from enginekit.kv.spec import KVSpec


class KVContext(NamedTuple):
    """What the KVCacheManager hands each memory plugin at construction.

    ``pool`` is a BlockPool and ``tables`` a BlockTables, native (``enginekit._native``) or
    their pure-Python twins (``enginekit.kv.pyref``): same API, so plugins never care which.
    The manager owns them; plugins mutate them only as their contracts say.
    """

    pool: object
    tables: object
    spec: KVSpec
    max_model_len: int

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks  # type: ignore[attr-defined,no-any-return]

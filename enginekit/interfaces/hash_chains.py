"""HashChains: per sequence, the names of its leading full blocks, for block-hash prefix
caching (the Rust class of ``enginekit._native`` and its twin in ``enginekit.kv.pyref``).

A block's name is its chained hash (``Backend.hash_block``): block i of a sequence is named
after block i - 1's name, its tokens and the sequence's extra key, the first after the root
hash. A chain holds a sequence's names and how many of them are published in the pool's
hash map (through the sequence's blocks of the block tables). It is created by the
sequence's first ``extend`` and lives until ``remove``; the caller passes the sequence's
extra key alike each time.

A sequence id is an int in [0, 2**64) (ValueError outside it, which no sequence has; one
without a chain reads as no names); the conventions of ``enginekit.interfaces.structures``
hold otherwise: a call that raises changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from enginekit.interfaces.structures import BlockPool, BlockTables, TokenBatch

__all__ = ["HashChains"]

PoolT = TypeVar("PoolT", bound=BlockPool, contravariant=True)
TablesT = TypeVar("TablesT", bound=BlockTables[Any], contravariant=True)


class HashChains(Protocol[PoolT, TablesT]):
    """Names of sequences' leading full blocks, and how many of them are published, over
    one implementation's pool (``PoolT``) and block tables (``TablesT``)."""

    @property
    def block_size(self) -> int:
        """Tokens a block."""

    def num_names(self, seq_id: int) -> int:
        """Names the sequence has (0 for one without a chain). Pure."""

    def num_published(self, seq_id: int) -> int:
        """How many of its first names are published (0 for one without a chain). Pure."""

    def names(self, seq_id: int) -> list[int]:
        """Its names, in block order (a copy; empty for one without a chain). Pure."""

    def extend(
        self, seq_id: int, token_ids: TokenBatch, num_blocks: int, extra_key: bytes | None = None
    ) -> int:
        """Names the sequence's first ``num_blocks`` full blocks, creating its chain, from
        ``token_ids`` (the whole sequence): only the tokens of the blocks not named yet are
        read, and they must all be there (ValueError otherwise). Returns ``num_names``
        after, never fewer than before."""

    def lookup(self, pool: PoolT, seq_id: int, num_blocks: int) -> list[int]:
        """The pool's blocks for the longest run of the sequence's first ``num_blocks``
        names that the pool holds (a prefix match). Pure."""

    def is_cached(self, pool: PoolT, seq_id: int, index: int) -> bool:
        """Whether the sequence has a name at ``index`` that the pool holds. Pure."""

    def publish(self, tables: TablesT, pool: PoolT, seq_id: int, end: int) -> int:
        """Publishes its names ``num_published..end - 1`` through its blocks at those
        indices, skipping holes, and counts its first ``end`` names as published; returns
        how many blocks the pool recorded (a block whose name names another block already
        is not). ValueError if ``end`` passes its names; KVCacheError if its table is
        unknown or shorter than ``end``."""

    def publish_filled(
        self,
        tables: TablesT,
        pool: PoolT,
        seq_ids: Sequence[int],
        token_lists: Sequence[TokenBatch],
        num_tokens: Sequence[int],
        extra_keys: Sequence[bytes | None],
    ) -> list[int]:
        """A step's decodes that fill a block, in one call: sequence ``seq_ids[i]``, whose
        first ``num_tokens[i]`` tokens are scheduled, fills the block after its names if
        ``num_tokens[i]`` is a positive multiple of the block size and it has
        ``num_tokens[i] / block_size - 1`` names, all published. Each that does is given
        that block's name (from ``token_lists[i]``, with ``extra_keys[i]``), published
        through its table; one recording for all. Returns the positions of the others,
        ascending: the caller publishes those its own way. A sequence filling twice is a
        ValueError."""

    def remove(self, seq_id: int) -> None:
        """Forgets the sequence's chain (nothing if it has none)."""

    def seq_ids(self) -> list[int]:
        """The sequences that have a chain, ascending. Pure."""

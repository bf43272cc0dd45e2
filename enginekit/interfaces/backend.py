"""Backend: the implementation of the cache structures a run uses, Rust or Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from enginekit.interfaces.hash_chains import HashChains
    from enginekit.interfaces.structures import (
        BlockPool,
        BlockTables,
        FreeBlockReserve,
        LruRoom,
        RadixTree,
    )


class Backend(NamedTuple):
    """Constructors and functions of one implementation of the cache structures: the
    Rust extension (``native``) or its pure-Python twins (``pyref``, the executable spec).
    Both behave the same; a plugin that needs a structure of its own (a radix tree, hash
    chains) or the block hashes takes it from here, never by importing either
    implementation.

    ``hash_block(parent, tokens, extra_key)`` names one full block after its parent's
    name; ``hash_blocks(tokens, block_size, extra_key)`` names every full block of a
    sequence; ``root_hash`` is the parent name of a sequence's first block.
    ``new_lru_room(pool, reserve)`` is a make-room call back for ``BlockTables.grow_with``:
    ``pool.make_room_lru(n, reserve.total)``, which the Rust tables run without a call into
    Python.
    """

    name: str  # "native" or "pyref"
    new_block_pool: Callable[[int], BlockPool]  # num_blocks -> a pool, every block free
    new_block_tables: Callable[[int], BlockTables]  # block_size -> no tables
    new_radix_tree: Callable[[int], RadixTree]  # block_size -> an empty tree
    new_hash_chains: Callable[[int], HashChains[Any, Any]]  # block_size -> no chains
    root_hash: int
    hash_block: Callable[[int, list[int], bytes | None], int]
    hash_blocks: Callable[[list[int], int, bytes | None], list[int]]
    # (a pool of this backend, its reserve) -> a make-room call back
    new_lru_room: Callable[[Any, FreeBlockReserve], LruRoom]

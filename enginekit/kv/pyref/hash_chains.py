"""Pure-Python twin of ``enginekit._native.HashChains`` (rust/hash_chains.rs).

Per sequence, the names of its leading full blocks (chained block hashes, ``hashing``) and
how many of them are published in the pool's hash map: the memo of block-hash prefix
caching. A chain is created by a sequence's first ``extend`` and lives until ``remove``; the
sequence's extra key is the caller's to pass alike each time.

A sequence id to look up (``num_names``, ``names``, ``lookup``...) is an int in
[0, 2**64): ValueError for one outside it, which no sequence can have; one without a chain
reads as no names. Token ranges are read by slicing the caller's sequence, so only the
tokens of the blocks to name are converted and checked; the sequence's type is checked
whole (a list, a tuple or an ``array("I")``: TypeError otherwise) even where no token is
read. A pool or block tables argument is one of the twins (TypeError otherwise).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from enginekit.errors import KVCacheError
from enginekit.interfaces.structures import TokenBatch
from enginekit.kv.pyref.args import (
    extra_key_arg,
    instance_arg,
    int_list,
    is_token_batch,
    known_seq_id,
    new_seq_id,
)
from enginekit.kv.pyref.hashing import ROOT_HASH, hash_block, hash_blocks
from enginekit.kv.pyref.pool import _MAX_HASH, PyBlockPool, _check_count
from enginekit.kv.pyref.radix_node import token_list
from enginekit.kv.pyref.tables import HOLE, PyBlockTables, _record_hashes

__all__ = ["PyHashChains"]


def _items(obj: Any, what: str) -> list[Any]:
    if not isinstance(obj, (list, tuple)):
        raise TypeError(f"{what} must be a list or tuple, got {type(obj).__name__}")
    return list(obj)


def _check_token_batch(obj: Any, what: str) -> None:
    if not is_token_batch(obj):
        raise TypeError(
            f'{what} must be a list, tuple or array("I") of token ids, got {type(obj).__name__}'
        )


class _Chain:
    __slots__ = ("names", "num_published")

    def __init__(self) -> None:
        self.names: list[int] = []
        self.num_published = 0  # names 0..num_published went to the pool


class PyHashChains:
    """See the module docstring; every method as the Rust class's."""

    def __init__(self, block_size: int, root_hash: int | None = None) -> None:
        """No chains. Raises ValueError if block_size is not in [1, 2**64) or root_hash
        (``ROOT_HASH`` if None) not in [0, 2**64)."""
        block_size = operator.index(block_size)
        if not 1 <= block_size <= _MAX_HASH:
            raise ValueError(f"block_size must be in [1, 2**64), got {block_size}")
        root = ROOT_HASH if root_hash is None else _check_root(root_hash)
        self._block_size = block_size
        self._root_hash = root
        self._chains: dict[int, _Chain] = {}

    @property
    def block_size(self) -> int:
        return self._block_size

    def _chain(self, seq_id: int) -> _Chain | None:
        """The sequence's chain (None if it has none); ValueError for an id outside
        [0, 2**64)."""
        return self._chains.get(new_seq_id(seq_id))

    def num_names(self, seq_id: int) -> int:
        """Names the sequence has (0 for one without a chain)."""
        chain = self._chain(seq_id)
        return 0 if chain is None else len(chain.names)

    def num_published(self, seq_id: int) -> int:
        """Names of the sequence published (0 for one without a chain)."""
        chain = self._chain(seq_id)
        return 0 if chain is None else chain.num_published

    def names(self, seq_id: int) -> list[int]:
        """The sequence's names (a copy; empty for one without a chain)."""
        chain = self._chain(seq_id)
        return [] if chain is None else list(chain.names)

    def extend(
        self, seq_id: int, token_ids: TokenBatch, num_blocks: int, extra_key: bytes | None = None
    ) -> int:
        """Names the sequence's first ``num_blocks`` full blocks (creating its chain) from
        ``token_ids``, the whole sequence: only the tokens of blocks not named yet are read,
        and they must all be there (ValueError otherwise, changing nothing). Returns
        ``num_names(seq_id)`` after (never fewer than before). Checked in the order seq_id
        (ValueError outside [0, 2**64)), num_blocks (ValueError if negative), extra_key
        (TypeError), token_ids' type (TypeError), then the tokens read."""
        seq_id = new_seq_id(seq_id)
        num_blocks = min(_check_count("num_blocks", num_blocks), _MAX_HASH)
        extra = extra_key_arg(extra_key)
        _check_token_batch(token_ids, "token_ids")
        chain = self._chains.get(seq_id)
        have = 0 if chain is None else len(chain.names)
        if num_blocks <= have:
            if chain is None:
                self._chains[seq_id] = _Chain()
            return have
        bs = self._block_size
        tokens = token_list(token_ids[have * bs : min(num_blocks * bs, _MAX_HASH)])  # type: ignore[index]
        needed = (num_blocks - have) * bs
        if len(tokens) < needed:
            start = have * bs
            raise ValueError(
                f"naming {num_blocks} blocks of sequence {seq_id} needs its tokens up to "
                f"{min(start + needed, _MAX_HASH)}, it has {start + len(tokens)}"
            )
        if chain is None:
            chain = self._chains[seq_id] = _Chain()
        parent = chain.names[-1] if chain.names else self._root_hash
        chain.names += hash_blocks(tokens, bs, extra, parent)
        return len(chain.names)

    def lookup(self, pool: PyBlockPool, seq_id: int, num_blocks: int) -> list[int]:
        """The pool's blocks for the longest run of the sequence's first ``num_blocks`` names
        that the pool holds (fewer names: all of them; no chain: none)."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        num_blocks = _check_count("num_blocks", num_blocks)
        chain = self._chain(seq_id)
        if chain is None:
            return []
        return pool.lookup_prefix(chain.names[:num_blocks])

    def is_cached(self, pool: PyBlockPool, seq_id: int, index: int) -> bool:
        """Whether the sequence has a name at ``index`` and the pool holds it (False past
        its names)."""
        pool = instance_arg(pool, "pool", PyBlockPool)
        index = _check_count("index", index)
        chain = self._chain(seq_id)
        if chain is None or index >= len(chain.names):
            return False
        return bool(pool.lookup_prefix([chain.names[index]]))

    def publish(self, tables: PyBlockTables, pool: PyBlockPool, seq_id: int, end: int) -> int:
        """Publishes names ``num_published(seq_id)..end - 1`` through the sequence's blocks at
        those indices of ``tables``, skipping holes, then counts the first ``end`` as
        published; returns how many blocks were recorded. KVCacheError for a seq id outside
        [0, 2**64), ValueError for a negative ``end`` or one past its names (no chain: none),
        KVCacheError if the table is unknown or shorter than ``end`` or a recording is
        refused; every error changes nothing."""
        tables = instance_arg(tables, "tables", PyBlockTables)
        pool = instance_arg(pool, "pool", PyBlockPool)
        seq_id = known_seq_id(seq_id)
        end = min(_check_count("end", end), _MAX_HASH)
        num_names = self.num_names(seq_id)
        if end > num_names:
            raise ValueError(
                f"cannot publish {end} blocks of sequence {seq_id}: it has {num_names} names"
            )
        chain = self._chains.get(seq_id)
        if chain is None or end <= chain.num_published:  # no chain: end is 0
            return 0
        num_blocks = tables.num_blocks(seq_id)
        if end > num_blocks:
            raise KVCacheError(
                f"cannot publish {end} blocks of sequence {seq_id}: its table has {num_blocks}"
            )
        block_ids, names, parents = [], [], []
        for index in range(chain.num_published, end):
            block_id = tables.block_id_at(seq_id, index)
            if block_id != HOLE:
                block_ids.append(block_id)
                names.append(chain.names[index])
                parents.append(chain.names[index - 1] if index else None)
        recorded = _record_hashes(pool, block_ids, names, parents)
        chain.num_published = end
        return recorded

    def _fills_next(self, seq_id: int, num_tokens: int) -> bool:
        bs = self._block_size
        if num_tokens == 0 or num_tokens % bs:
            return False
        chain = self._chains.get(seq_id)
        return (
            chain is not None
            and len(chain.names) == num_tokens // bs - 1
            and chain.num_published == len(chain.names)
        )

    def publish_filled(
        self,
        tables: PyBlockTables,
        pool: PyBlockPool,
        seq_ids: Sequence[int],
        token_lists: Sequence[TokenBatch],
        num_tokens: Sequence[int],
        extra_keys: Sequence[bytes | None],
    ) -> list[int]:
        """The step's decodes that filled a block, named and published in one call: for each
        i whose sequence's chain has ``num_tokens[i] / block_size - 1`` names, all published
        (``num_tokens[i]`` a positive multiple of the block size), names the block after
        them from ``token_lists[i][num_tokens[i] - block_size : num_tokens[i]]``, chained to
        its last name with ``extra_keys[i]``, and publishes it through the table. Returns
        the positions of the others, ascending (the caller publishes those its own way).
        Checked first, in order: seq_ids (KVCacheError for one outside [0, 2**64)),
        token_lists (TypeError unless a list or tuple of lists, tuples or ``array("I")``s,
        all of them, filling or not), num_tokens (ValueError outside [0, 2**64)), extra_keys
        (TypeError), their lengths (ValueError), the tokens of each filling decode
        (ValueError if fewer than ``num_tokens[i]``), each filling decode's extra key
        (TypeError), a sequence filling twice (ValueError); then the tables record all the
        blocks at once (KVCacheError: an unknown table, an index past it or a hole), so any
        error changes nothing."""

        def check_count(n: int) -> int:
            if not 0 <= n <= _MAX_HASH:
                raise ValueError(f"num_tokens {n} is not in [0, 2**64)")
            return n

        tables = instance_arg(tables, "tables", PyBlockTables)
        pool = instance_arg(pool, "pool", PyBlockPool)
        seqs = int_list(seq_ids, "seq_ids", known_seq_id)
        lists = _items(token_lists, "token_lists")
        for i, tokens in enumerate(lists):
            _check_token_batch(tokens, f"token_lists[{i}]")
        counts = int_list(num_tokens, "num_tokens", check_count)
        keys = _items(extra_keys, "extra_keys")
        if not len(seqs) == len(lists) == len(counts) == len(keys):
            raise ValueError(
                "seq_ids, token_lists, num_tokens and extra_keys differ in length "
                f"({len(seqs)}, {len(lists)}, {len(counts)}, {len(keys)})"
            )
        bs = self._block_size
        skipped: list[int] = []
        filling: list[int] = []
        blocks: list[list[int]] = []
        filling_keys: list[Any] = []
        for i, (s, n) in enumerate(zip(seqs, counts, strict=True)):
            if not self._fills_next(s, n):
                skipped.append(i)
                continue
            tokens = token_list(lists[i][n - bs : n])
            if len(tokens) != bs:
                raise ValueError(
                    f"sequence {s} has {n} tokens scheduled but fewer in its token list"
                )
            blocks.append(tokens)
            filling.append(s)
            filling_keys.append(keys[i])
        extras = [extra_key_arg(k) for k in filling_keys]
        if len(set(filling)) != len(filling):
            twice = next(s for k, s in enumerate(filling) if s in filling[:k])
            raise ValueError(
                f"sequence {twice} does not fill the block after its published names once"
            )
        chains = [self._chains[s] for s in filling]
        indices = [len(c.names) for c in chains]
        names = [
            hash_block(c.names[-1] if c.names else self._root_hash, tokens, extra)
            for c, tokens, extra in zip(chains, blocks, extras, strict=True)
        ]
        parents = [c.names[-1] if c.names else None for c in chains]
        tables._cache_blocks_after(pool, filling, indices, names, parents)
        for chain, name in zip(chains, names, strict=True):
            chain.names.append(name)
            chain.num_published = len(chain.names)
        return skipped

    def remove(self, seq_id: int) -> None:
        """Forgets the sequence's chain (nothing if it has none)."""
        self._chains.pop(new_seq_id(seq_id), None)

    def seq_ids(self) -> list[int]:
        """The sequences that have a chain, ascending."""
        return sorted(self._chains)


def _check_root(root_hash: int) -> int:
    root_hash = operator.index(root_hash)
    if not 0 <= root_hash <= _MAX_HASH:
        raise ValueError(f"root_hash {root_hash} is not in [0, 2**64)")
    return root_hash

"""SchedulerCache: the door between the scheduler and the KV cache.

The scheduler decides who runs; the cache decides which blocks they run in. Everything the
scheduler asks of the cache goes through the eight calls of this Protocol, in the order of
a step's life:

- ``admit``: a waiting request gets a block table (its cached prefix matched, or its
  swapped-out blocks brought back), or None if it does not fit now;
- ``admit_together``: a group (the preempted beams of one request) is admitted whole, or
  none of it;
- ``reserve_prefill``: blocks for a running prefill's next chunk, whose full blocks the
  prefix cache may then publish;
- ``grow``: one more token for each decode (and a copy of a block another sequence still
  writes into), all or nothing;
- ``fork``: a new sequence that shares its parent's blocks;
- ``take_step_blocks``: the step is decided: the decodes' filled blocks are published, and
  the block operations (copies, swaps) and block tables the executor needs are handed
  over;
- ``release``: a request gives up its blocks (finished, aborted, or preempted: swapped out
  to host memory when asked and there is room);
- ``finish_step``: the executor ran the step: what it unpinned and what finished is given
  back, and blocks out of every window are released.

Beside them, one pure query, ``num_cached_prefix_tokens``, which the waiting queue's
order may read (longest prefix first).

The cache never changes a request's queue or status; the scheduler never touches a block.
``enginekit.kv.manager.KVCacheManager`` is the implementation; its other public members
serve the engine (usage, checks) and the preemption plugin (``CacheView``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import numpy as np

    from enginekit.interfaces.structures import IntBatch
    from enginekit.request import Request
    from enginekit.step import BlockCopy, BlockSwap, TierLoad, TierSave


class Admission(NamedTuple):
    """How ``SchedulerCache.admit`` let a request in."""

    restored: bool  # its swapped-out blocks were brought back (it keeps its computed tokens)
    # prompt tokens served from cache (0 for a restore): the prefix cache's, then a tier's
    num_matched_tokens: int
    num_blocks_swapped_in: int  # host blocks copied back (0 unless restored)
    num_loaded_tokens: int = 0  # of num_matched_tokens, those loaded from a KV tier


class StepBlocks(NamedTuple):
    """What the executor needs of the cache for one step (``take_step_blocks``)."""

    copies: list[BlockCopy]
    swap_outs: list[BlockSwap]
    swap_ins: list[BlockSwap]
    block_tables: np.ndarray | None  # one row per asked sequence, or None if not asked
    tier_saves: Sequence[TierSave] = ()  # device blocks to read out for a KV tier
    tier_loads: Sequence[TierLoad] = ()  # a KV tier's payloads into device blocks


class SchedulerCache(Protocol):
    """The cache as the scheduler sees it. Each call keeps the cache's invariants
    (``KVCacheManager.check_integrity``); a call that cannot do what it is asked says so in
    its result and changes nothing but the cached blocks it evicted trying; it never raises
    for lack of blocks."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    def admit(self, request: Request, step_has_work: bool) -> Admission | None:
        """Gives the waiting ``request`` a block table if it fits now with the admission
        watermark to spare; returns how, or None, having changed nothing but the cached
        blocks it evicted while trying (they stay evicted). A swapped-out request is
        restored (its blocks copied back, holes where they were); any other is admitted
        with its cached prefix, or with none if only that fits, and its
        ``num_computed_tokens`` is set to the tokens matched. With KV tiers, the prompt's
        blocks after that prefix that a tier holds are loaded (queued for the executor)
        and count as matched, where loading is faster than computing them.
        ``step_has_work``: the step already schedules something, so a match whose last
        tokens this very step computes waits for the next step (None)."""
        ...

    def admit_together(
        self, requests: Sequence[Request], step_has_work: bool
    ) -> list[Admission] | None:
        """Admits every one of the waiting ``requests`` as ``admit`` would (each with its
        cached prefix where it fits), or none: returns their admissions in order, or None
        if the blocks all of them need without a prefix hit, with the watermark to spare,
        are not there (changing nothing but the cached blocks evicted while trying). For
        the beams of one request, which advance in lockstep: a beam admitted without its
        siblings would hold blocks while it waits for them."""
        ...

    def reserve_prefill(self, request: Request, num_tokens: int) -> int:
        """Grows the running prefill's table for its next chunk, of at most ``num_tokens``
        tokens from ``request.num_computed_tokens``, out of the blocks its admission
        promised; returns the chunk's length (0: the promise fell short, the chunk waits).
        The prefix cache may publish the full blocks the chunk computes. The caller
        advances ``num_computed_tokens``."""
        ...

    def grow(self, seq_ids: IntBatch, num_tokens: IntBatch, decodes: Sequence[Request]) -> bool:
        """Makes each sequence's table hold ``num_tokens[i]`` tokens, and gives each of
        ``decodes`` (the same sequences, as requests) a copy of a partly filled block that
        another sequence still writes into; evicts cached blocks as needed. False if the
        blocks are not there: no copy is made, and the tables either grew nothing or, when
        only the copies fell short, grew all (asking again for the same counts takes
        nothing more); cached blocks evicted while trying stay evicted. The caller then
        preempts and asks again."""
        ...

    def fork(self, parent: Request, child: Request) -> None:
        """``child`` shares every block of the running ``parent`` (a partly filled last
        block is copied before a second writer writes into it)."""
        ...

    def take_step_blocks(
        self,
        filled: Sequence[Request],
        num_computed_tokens: Sequence[int],
        table_seq_ids: list[int] | None,
    ) -> StepBlocks:
        """Closes the scheduling of a step: ``filled[i]`` (a decode) fills a block with its
        first ``num_computed_tokens[i]`` tokens, which the prefix cache may publish; then
        hands over the block operations queued since the last call, and the block tables
        of ``table_seq_ids`` (None: no tables)."""
        ...

    def release(self, request: Request, swap_out: bool = False) -> int | None:
        """``request`` gives up what the cache holds for it, whatever its state: a running
        one its blocks (published ones stay as evictable cache), a swapped-out one its host
        blocks, a waiting one what the prefix cache remembers of it. ``swap_out`` (a
        running request being preempted): its blocks are first copied to host memory, and
        the number of blocks copied is returned; None if not asked or if the swap space
        lacked room (the blocks are then released, and the request computes again)."""
        ...

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """How many of ``request``'s leading tokens the prefix cache holds now: what
        ``admit`` would match on the device (tiers apart). Pure: a query for the waiting
        queue's order (``enginekit.interfaces.queue.PrefixProbe``)."""
        ...

    def finish_step(self, finished: Sequence[Request], running: Sequence[Request]) -> None:
        """The executor ran the step last scheduled: copy-on-write sources it copied are
        unpinned, swapped-in host blocks freed, ``finished`` requests released (in order),
        and blocks no future query of ``running`` can attend to given back."""
        ...

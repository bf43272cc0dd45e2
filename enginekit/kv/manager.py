"""KVCacheManager: coordinates the allocator, prefix-cache and eviction plugins over one
block pool and one set of block tables. The scheduler talks only to this class."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from enginekit.errors import KVCacheError, OutOfBlocksError
from enginekit.executor.base import BlockCopy, BlockSwap
from enginekit.interfaces.prefix import NO_MATCH, PrefixMatch
from enginekit.kv.context import KVContext
from enginekit.kv.spec import KVSpec
from enginekit.request import Request

if TYPE_CHECKING:
    from enginekit._native import BlockPool, BlockTables
    from enginekit.interfaces import Allocator, Eviction, PrefixCache


def make_structures(
    num_blocks: int, block_size: int, native: bool
) -> tuple[BlockPool, BlockTables]:
    """A BlockPool and BlockTables: the Rust ones, or their pure-Python twins (same API)."""
    if native:
        from enginekit import _native

        return _native.BlockPool(num_blocks), _native.BlockTables(block_size)
    from enginekit.kv import pyref

    return pyref.PyBlockPool(num_blocks), pyref.PyBlockTables(block_size)  # type: ignore[return-value]


class KVUsage(NamedTuple):
    num_total_blocks: int
    num_used_blocks: int  # referenced by a running sequence
    num_evictable_blocks: int  # cached, unreferenced: reclaimable
    num_free_blocks: int


class KVCacheManager:
    """Admission, growth, forking, swapping and release of sequences' KV blocks.

    Invariant between calls (checked by ``check_integrity``): every block's reference
    count equals the references held on it by block tables, copy-on-write pins and the
    prefix cache itself.
    """

    def __init__(
        self,
        kv: KVContext,
        allocator: Allocator,
        prefix: PrefixCache,
        eviction: Eviction,
        watermark: float,
    ) -> None:
        self.kv = kv
        self.pool = kv.pool
        self.tables = kv.tables
        self.allocator = allocator
        self.prefix = prefix
        self.eviction = eviction
        self.num_watermark_blocks = int(watermark * kv.num_blocks)
        # Block operations decided this step, handed to the executor by take_block_ops.
        self._copies: list[BlockCopy] = []
        self._swap_outs: list[BlockSwap] = []
        self._swap_ins: list[BlockSwap] = []
        self._unpin_after_copy: list[int] = []  # copy-on-write sources, held until copied
        # Partly filled blocks that forked sequences share: block -> the sequences that
        # will write into it. Each but the last to write gets a copy first.
        self._shared_tails: dict[int, set[int]] = {}

    @property
    def spec(self) -> KVSpec:
        return self.kv.spec

    @property
    def block_size(self) -> int:
        return self.kv.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.kv.num_blocks

    def usage(self) -> KVUsage:
        """Block counts by state. Blocks that only a prefix cache holding its own
        references keeps (radix) count as evictable, not used (an estimate from above)."""
        pool = self.pool
        cache_only = self.prefix.num_evictable_blocks()
        return KVUsage(
            pool.num_blocks,
            max(0, pool.num_used_blocks - cache_only),
            pool.num_evictable_blocks + cache_only,
            pool.num_free_blocks,
        )

    def num_reclaimable_blocks(self) -> int:
        """Blocks that can be handed out now: free ones, evictable ones, and those only a
        prefix cache that holds its own references (radix) would release. The last part may
        be an estimate from above; make_room then falls short and callers back off."""
        pool = self.pool
        return pool.num_free_blocks + pool.num_evictable_blocks + self.prefix.num_evictable_blocks()

    # -- admission -----------------------------------------------------------------------

    def match(self, request: Request) -> PrefixMatch:
        """The request's cached prefix. Pure."""
        return self.prefix.match(request)

    def _split(self, match: PrefixMatch) -> tuple[list[int], int | None]:
        """(the matched blocks the request shares, the partially matched last block whose
        valid slots it copies into a block of its own, or None)."""
        if match.num_tokens % self.block_size == 0:
            return match.block_ids, None
        return match.block_ids[:-1], match.block_ids[-1]

    def can_admit(self, request: Request, match: PrefixMatch) -> bool:
        """True if admitting ``request`` with ``match`` leaves at least the watermark of
        blocks reclaimable. Matched blocks that are evictable stop being reclaimable once
        the request holds them, so they count against the room. Pure."""
        shared, _ = self._split(match)
        num_needed = self.allocator.num_blocks_to_admit(request, len(shared))
        pool = self.pool
        num_pinned_evictable = sum(1 for b in match.block_ids if pool.ref_count(b) == 0)
        room = self.num_reclaimable_blocks() - num_pinned_evictable
        return num_needed + self.num_watermark_blocks <= room

    def admit(self, request: Request, match: PrefixMatch) -> None:
        """Gives ``request`` a block table: the fully matched blocks (pinned first, so
        eviction cannot take them), then fresh blocks for the rest, evicting cached blocks
        if the free list is short. A match ending inside a block (token-granular prefix
        caches) is copy-on-write: the request's first fresh block receives a copy of that
        block, whose pin is held until the copy has run (``on_step_executed``).
        Sets ``num_computed_tokens`` to the match. Raises OutOfBlocksError, changing
        nothing, if the room is not there (call can_admit first)."""
        pool = self.pool
        shared, partial = self._split(match)
        for block_id in match.block_ids:
            pool.incref(block_id)
        try:
            num_needed = self.allocator.num_blocks_to_admit(request, len(shared))
            if not self.make_room(num_needed):
                raise OutOfBlocksError(
                    f"admitting request {request.request_id!r} needs {num_needed} free blocks; "
                    f"only {pool.num_free_blocks} could be reclaimed"
                )
            self.allocator.admit(request, shared)
        except Exception:
            pool.free(match.block_ids)
            raise
        if partial is not None:
            self.add_block_copy(partial, self.tables.block_id_at(request.seq_id, len(shared)))
            self._unpin_after_copy.append(partial)
        request.num_computed_tokens = match.num_tokens

    # -- growth --------------------------------------------------------------------------

    def try_grow(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> bool:
        """Makes each sequence's table hold num_tokens[i] tokens, evicting if needed.
        Returns False, changing nothing, if the blocks are not there."""
        num_needed = self.allocator.num_blocks_to_grow(seq_ids, num_tokens)
        if num_needed == 0:
            return True
        if num_needed > self.num_reclaimable_blocks() or not self.make_room(num_needed):
            return False
        self.allocator.grow(seq_ids, num_tokens)
        return True

    def make_room(self, num_blocks: int) -> bool:
        """Reclaims cached blocks until ``num_blocks`` are free: first the pool's evictable
        blocks (the eviction plugin picks them), then those the prefix cache holds itself.
        Returns whether that many are free now (blocks reclaimed stay reclaimed)."""
        pool = self.pool
        shortfall = num_blocks - pool.num_free_blocks
        if shortfall > 0 and pool.num_evictable_blocks:
            evicted = self.eviction.evict(min(shortfall, pool.num_evictable_blocks))
            self.prefix.on_evicted(evicted)
            shortfall = num_blocks - pool.num_free_blocks
        while shortfall > 0 and self.prefix.num_evictable_blocks():
            pool.free(self.prefix.evict(shortfall))
            shortfall = num_blocks - pool.num_free_blocks
        return shortfall <= 0

    # -- computed tokens and release -----------------------------------------------------

    def on_computed(self, request: Request, num_computed_tokens: int) -> None:
        """The request's first ``num_computed_tokens`` tokens are scheduled into its
        blocks: the prefix cache may publish the full ones."""
        self.prefix.on_computed(request, num_computed_tokens)

    def release(self, request: Request) -> int:
        """Drops every block reference of the request; returns how many blocks it held.
        Published blocks stay resident as evictable cache."""
        num_blocks: int = self.tables.num_blocks(request.seq_id)
        if self._shared_tails:
            self._leave_shared_tails(request.seq_id)
        self.prefix.on_released(request)  # first: it may still publish the request's blocks
        self.allocator.release(request.seq_id)
        return num_blocks

    # -- parallel sampling: fork and copy-on-write -------------------------------------------

    def fork(self, parent: Request, child: Request) -> None:
        """Gives ``child`` the parent's blocks, shared. If the parent's last block is only
        partly filled, both will write into it: each but the last writer gets a copy
        (``copy_on_write``) before its write."""
        self.allocator.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        num_computed = parent.num_computed_tokens
        if num_computed % self.block_size:
            tail = self.tables.block_id_at(parent.seq_id, num_computed // self.block_size)
            self._shared_tails.setdefault(tail, {parent.seq_id}).add(child.seq_id)

    def _tail_writers(self, decodes: Sequence[Request]) -> list[tuple[Request, int, int]]:
        """(request, logical index, block) of each decode about to write into a block that
        another sequence will write into too."""
        shared = self._shared_tails
        if not shared:
            return []
        found = []
        for request in decodes:
            index, slot = divmod(request.num_computed_tokens, self.block_size)
            if slot == 0:
                continue  # writes at the start of a fresh block
            block_id = self.tables.block_id_at(request.seq_id, index)
            writers = shared.get(block_id)
            if writers is not None and request.seq_id in writers:
                found.append((request, index, block_id))
        return found

    def try_copy_on_write(self, decodes: Sequence[Request]) -> bool:
        """Before ``decodes`` write their next token: each that would write into a block
        another sequence still writes into gets a copy of it (queued for the executor).
        Returns False, copying nothing, if the blocks for the copies are not there
        (cached blocks it evicted trying stay evicted)."""
        writers = self._tail_writers(decodes)
        num_copies = len(writers)  # an upper bound: the last writer of a block copies nothing
        if num_copies and (
            num_copies > self.num_reclaimable_blocks() or not self.make_room(num_copies)
        ):
            return False
        for request, index, block_id in writers:
            holders = self._shared_tails.get(block_id)
            if holders is None:
                continue  # the others copied it away in this same call: it owns the block
            holders.discard(request.seq_id)
            if len(holders) <= 1:
                del self._shared_tails[block_id]  # at most one writer left: it owns the block
            if not holders:
                continue  # this was the last writer: it writes in place
            (copy,) = self.pool.allocate(1)
            self.add_block_copy(block_id, copy)
            self.tables.set_block(request.seq_id, index, copy)
            # The table's reference to the source becomes the copy's pin, dropped once the
            # executor has copied it.
            self._unpin_after_copy.append(block_id)
        return True

    def _leave_shared_tails(self, seq_id: int) -> None:
        for block_id in [b for b, holders in self._shared_tails.items() if seq_id in holders]:
            holders = self._shared_tails[block_id]
            holders.discard(seq_id)
            if len(holders) <= 1:
                del self._shared_tails[block_id]

    def release_out_of_window(self, running: Sequence[Request]) -> int:
        """Lets the eviction policy give back blocks no future query of ``running`` can
        attend to; returns how many."""
        return self.eviction.release_out_of_window(running, self)

    def release_front(self, request: Request, num_blocks: int) -> int:
        """Gives back the request's first ``num_blocks`` blocks (holes stay in its table)."""
        return self.allocator.release_front(request.seq_id, num_blocks)

    # -- swapping -------------------------------------------------------------------------

    def swap_out(self, request: Request, host_block_ids: Sequence[int]) -> None:
        """Queues copies of the request's blocks (in logical order, holes skipped) to
        ``host_block_ids`` and releases the blocks; the request keeps its computed tokens.
        Raises ValueError, changing nothing, unless there is one host block per block."""
        block_ids = [b for b in self.tables.block_ids(request.seq_id) if b >= 0]
        if len(block_ids) != len(host_block_ids):
            raise ValueError(
                f"swap-out of sequence {request.seq_id}: {len(block_ids)} blocks, "
                f"{len(host_block_ids)} host blocks"
            )
        self._swap_outs.extend(map(BlockSwap, block_ids, host_block_ids))
        self.release(request)

    def swap_in(self, request: Request, host_block_ids: Sequence[int], num_holes: int = 0) -> None:
        """Gives the request a fresh block table (through the allocator, making room),
        queues copies of ``host_block_ids`` into its blocks after the first ``num_holes``
        (which are released again), and keeps ``num_computed_tokens``. Call
        can_admit(request, NO_MATCH) first."""
        num_computed = request.num_computed_tokens
        self.admit(request, NO_MATCH)
        request.num_computed_tokens = num_computed
        block_ids = self.tables.block_ids(request.seq_id)
        device_block_ids = block_ids[num_holes : num_holes + len(host_block_ids)]
        self._swap_ins.extend(map(BlockSwap, device_block_ids, host_block_ids))
        if num_holes:
            self.release_front(request, num_holes)

    def add_block_copy(self, src_block_id: int, dst_block_id: int) -> None:
        """Queues a copy-on-write copy for the executor to do before the step computes."""
        self._copies.append(BlockCopy(src_block_id, dst_block_id))

    def take_block_ops(self) -> tuple[list[BlockCopy], list[BlockSwap], list[BlockSwap]]:
        """(copies, swap-outs, swap-ins) queued since the last call; clears them."""
        ops = (self._copies, self._swap_outs, self._swap_ins)
        self._copies, self._swap_outs, self._swap_ins = [], [], []
        return ops

    def on_step_executed(self) -> None:
        """The executor has run the step last scheduled: copy-on-write sources are
        unpinned (a source that nothing else holds becomes evictable or free) and the
        prefix cache may index what the step computed."""
        self.pool.free(self._unpin_after_copy)
        self._unpin_after_copy.clear()
        self.prefix.on_step_executed()

    def num_unused_slots(self, running: Sequence[Request]) -> int:
        """Token slots the block tables hold that no computed token fills (``running`` must
        be every request holding a table): partial last blocks and reservations."""
        allocator = self.allocator
        num_slots = allocator.num_reserved_blocks() * self.block_size
        num_released = allocator.num_hole_blocks() * self.block_size  # tokens dropped in front
        return num_slots - sum([r.num_computed_tokens for r in running]) + num_released

    # -- checks --------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raises KVCacheError unless the pool, tables and prefix cache are each consistent
        and every block's reference count equals the references held on it: by block
        tables, by copy-on-write pins, and by the prefix cache itself."""
        pool, tables = self.pool, self.tables
        pool.check_integrity()
        tables.check_integrity(pool)
        self.prefix.check_integrity()
        table_refs: Counter[int] = Counter()
        for seq_id in tables.seq_ids():
            table_refs.update(b for b in tables.block_ids(seq_id) if b >= 0)  # -1: a hole
        num_table_refs = sum(table_refs.values())
        if self.allocator.num_reserved_blocks() != num_table_refs:
            raise KVCacheError(
                f"the allocator counts {self.allocator.num_reserved_blocks()} reserved blocks "
                f"but the tables hold {num_table_refs}"
            )
        holders = (
            table_refs + Counter(self._unpin_after_copy) + Counter(self.prefix.held_block_ids())
        )
        for block_id, ref_count in enumerate(pool.ref_counts()):
            if ref_count != holders[block_id]:
                raise KVCacheError(
                    f"block {block_id} has ref_count {ref_count} but block tables, "
                    f"copy-on-write pins and prefix-cache references hold it {holders[block_id]} "
                    "times"
                )

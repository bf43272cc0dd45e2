"""``swap``: copy a victim's KV to host memory and back, or recompute it when cheaper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from enginekit.config import PreemptionConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import Preemption, PreemptionResult
from enginekit.kv.host_pool import HostSwapPool, host_pool_num_blocks
from enginekit.request import Request, RequestStatus
from enginekit.spec.restore_cost import RestoreCost
from enginekit_plugins.preemption.recompute import recompute

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


@dataclass
class SwapConfig(PreemptionConfig):
    name: str = "swap"
    # Host memory for swapped-out KV blocks, at most the device pool's blocks (see
    # enginekit.kv.host_pool.host_pool_num_blocks): the swap bookkeeping and the torch
    # executor's host pool (allocated as swaps fill it) are both sized from this key.
    swap_space_gib: float = 4.0
    num_candidates: int = 4  # lowest-priority running requests weighed as victims


class SwapPreemption(Preemption):
    """Victim choice weighs the cost to restore. Among the ``num_candidates`` running
    requests of lowest priority (the most recently admitted), the victim is the one whose
    restore is cheapest, where a request's restore cost is the lesser of

    - swap: both transfers of its blocks over PCIe (bytes / effective PCIe bandwidth, ×2);
    - recompute: prefilling its computed tokens again (matmul and attention FLOPs at the
      effective FLOP rate): the work it has already done;

    ties go to the lower priority. The victim is then preempted the cheaper way: swapped
    out to the host pool (if it has room, else recompute, counted as
    ``recompute_fallback``) or recomputed. A swapped request is restored before any new
    request is admitted, into fresh blocks, with its computed tokens intact.
    """

    Config = SwapConfig

    def __init__(self, config: SwapConfig, costs: RestoreCost, kv: KVCacheManager) -> None:
        super().__init__(config, costs, kv)
        if config.num_candidates < 1:
            raise ConfigError(
                f"preemption.num_candidates must be >= 1, got {config.num_candidates}"
            )
        self.num_candidates = config.num_candidates
        self.host = HostSwapPool(
            host_pool_num_blocks(config.swap_space_gib, kv.spec.bytes_per_block, kv.num_blocks)
        )
        # seq_id -> (host blocks in logical order, leading holes of its table)
        self._swapped: dict[int, tuple[list[int], int]] = {}

    def restore_cost_s(self, request: Request) -> tuple[float, bool]:
        """(the cheaper restore time, whether that is a swap). Pure."""
        tables = self.kv.tables
        num_blocks = tables.num_blocks(request.seq_id) - tables.num_holes(request.seq_id)
        swap_s = self.costs.swap_s(num_blocks)
        recompute_s = self.costs.recompute_s(request.num_computed_tokens)
        return min(swap_s, recompute_s), swap_s <= recompute_s

    def choose_victim(self, running: Sequence[Request]) -> Request:
        candidates = list(running[-self.num_candidates :])
        candidates.reverse()  # lowest priority first, so min() breaks ties toward it
        return min(candidates, key=lambda r: self.restore_cost_s(r)[0])

    def preempt(self, request: Request) -> PreemptionResult:
        _, prefer_swap = self.restore_cost_s(request)
        if not prefer_swap:
            return recompute(request, self.kv, kind="recompute")
        tables = self.kv.tables
        num_holes = tables.num_holes(request.seq_id)
        num_blocks = tables.num_blocks(request.seq_id) - num_holes
        if num_blocks > self.host.num_free_blocks:
            return recompute(request, self.kv, kind="recompute_fallback")
        host_block_ids = self.host.allocate(num_blocks)
        self.kv.swap_out(request, host_block_ids)
        self._swapped[request.seq_id] = (host_block_ids, num_holes)
        request.status = RequestStatus.WAITING
        return PreemptionResult("swap", num_blocks, 0, num_blocks_swapped=num_blocks)

    def is_swapped(self, request: Request) -> bool:
        return request.seq_id in self._swapped

    def restore(self, request: Request) -> int:
        host_block_ids, num_holes = self._swapped[request.seq_id]
        # may raise OutOfBlocksError: then it stays swapped
        self.kv.swap_in(request, host_block_ids, num_holes)
        del self._swapped[request.seq_id]
        self.host.free(host_block_ids)
        return len(host_block_ids)

    def on_step_end(self) -> None:
        self.host.release_quarantined()

    def check_integrity(self) -> None:
        self.host.check_integrity()
        held = sum(len(ids) for ids, _ in self._swapped.values())
        if held != self.host.num_used_blocks:
            from enginekit.errors import KVCacheError

            raise KVCacheError(
                f"host pool: {self.host.num_used_blocks} blocks used, swapped requests hold {held}"
            )

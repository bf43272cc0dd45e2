"""``swap``: copy a victim's KV to host memory and back, or recompute it when cheaper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enginekit.config import PreemptionConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import CacheView, Preemption, PreemptionMode, RestoreCost
from enginekit.request import Request


@dataclass
class SwapConfig(PreemptionConfig):
    name: str = "swap"
    # Host memory for swapped-out KV blocks, at most the device pool's blocks: the cache
    # manager's swap space and the torch executor's host tensors (allocated as swaps fill
    # them) are both sized from this key.
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
    out to host memory (if the swap space has room, else recomputed, counted as
    ``recompute_fallback``) or recomputed. A swapped request is restored before any new
    request is admitted, into fresh blocks, with its computed tokens intact.
    """

    Config = SwapConfig
    config: SwapConfig

    def __init__(self, config: SwapConfig, costs: RestoreCost, cache: CacheView) -> None:
        super().__init__(config, costs, cache)
        if config.num_candidates < 1:
            raise ConfigError(
                f"preemption.num_candidates must be >= 1, got {config.num_candidates}"
            )
        self.num_candidates = config.num_candidates

    @classmethod
    def swap_space_gib(cls, config: PreemptionConfig) -> float:
        gib = float(getattr(config, "swap_space_gib", 0.0))
        if gib < 0:
            raise ConfigError(f"preemption.swap_space_gib must be >= 0, got {gib}")
        return gib

    def restore_cost_s(self, request: Request) -> tuple[float, bool]:
        """(the cheaper restore time, whether that is a swap). Pure."""
        swap_s = self.costs.swap_s(self.cache.num_held_blocks(request.seq_id))
        recompute_s = self.costs.recompute_s(request.num_computed_tokens)
        return min(swap_s, recompute_s), swap_s <= recompute_s

    def choose_victim(self, running: Sequence[Request]) -> Request:
        candidates = list(running[-self.num_candidates :])
        candidates.reverse()  # lowest priority first, so min() breaks ties toward it
        return min(candidates, key=lambda r: self.restore_cost_s(r)[0])

    def mode(self, request: Request) -> PreemptionMode:
        _, prefer_swap = self.restore_cost_s(request)
        return PreemptionMode.SWAP if prefer_swap else PreemptionMode.RECOMPUTE

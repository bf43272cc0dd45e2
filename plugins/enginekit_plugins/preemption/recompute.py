"""``recompute``: drop a victim's blocks; prefill its prompt and outputs again later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from enginekit.config import PreemptionConfig
from enginekit.interfaces import Preemption, PreemptionResult
from enginekit.request import Request, RequestStatus

if TYPE_CHECKING:
    from enginekit.kv.manager import KVCacheManager


@dataclass
class RecomputeConfig(PreemptionConfig):
    name: str = "recompute"


class RecomputePreemption(Preemption):
    """Victim: the most recently admitted request (it has the lowest priority under
    first-come-first-served). Its blocks are released: the ones the prefix cache published
    stay resident as evictable cache, so when the request is admitted again its prompt and
    outputs so far are matched like any prompt and only the rest is prefilled."""

    Config = RecomputeConfig

    def preempt(self, request: Request) -> PreemptionResult:
        return recompute(request, self.kv, kind="recompute")


def recompute(request: Request, kv: KVCacheManager, kind: str) -> PreemptionResult:
    """Releases the request's blocks and rewinds it to prefill everything again."""
    num_dropped_tokens = request.num_computed_tokens
    num_blocks = kv.release(request)
    request.num_computed_tokens = 0
    request.status = RequestStatus.WAITING
    return PreemptionResult(kind, num_blocks, num_dropped_tokens)

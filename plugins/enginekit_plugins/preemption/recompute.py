"""``recompute``: drop a victim's blocks; prefill its prompt and outputs again later."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import PreemptionConfig
from enginekit.interfaces import Preemption


@dataclass
class RecomputeConfig(PreemptionConfig):
    name: str = "recompute"


class RecomputePreemption(Preemption):
    """Victim: the most recently admitted request (it has the lowest priority under
    first-come-first-served). Its blocks are released: the ones the prefix cache published
    stay resident as evictable cache, so when the request is admitted again its prompt and
    outputs so far are matched like any prompt and only the rest is prefilled. (The
    interface's defaults are exactly this policy.)"""

    Config = RecomputeConfig

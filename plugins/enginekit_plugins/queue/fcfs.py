"""``fcfs``: first come, first served: waiting requests are tried in arrival order."""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.config import QueueConfig
from enginekit.interfaces import WaitingQueue


@dataclass
class FcfsConfig(QueueConfig):
    name: str = "fcfs"


class FcfsQueue(WaitingQueue):
    """Arrival order; the oldest request that does not fit holds back every later one.
    (The interface's defaults are exactly this policy.)"""

    Config = FcfsConfig

"""``priority``: waiting requests by their ``priority`` (lower first), ties by arrival."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from enginekit.config import QueueConfig
from enginekit.interfaces import WaitingQueue
from enginekit.request import Request


@dataclass
class PriorityConfig(QueueConfig):
    name: str = "priority"


class PriorityQueue(WaitingQueue):
    """Tries the waiting request of the lowest ``priority`` value first; among equal
    priorities, the one that arrived first. A request set at any int priority is taken
    (``Engine.add_request(priority=...)``, the server's ``priority`` field); every request
    is 0 unless set, so with no priority set this is first come, first served.

    Only fresh requests are ordered: a preempted request goes back in front of every
    waiting one whatever its priority (the scheduler's rule, so it is never starved), and
    the preemption plugin still chooses its victims (the most recently admitted, by
    default), not the lowest priority running."""

    Config = PriorityConfig
    orders_by_priority = True

    def order(self, waiting: Sequence[Request]) -> Iterable[Request]:
        """``waiting`` sorted by priority; the sort is stable, so arrival order breaks ties."""
        return sorted(waiting, key=_priority)


def _priority(request: Request) -> int:
    return request.priority

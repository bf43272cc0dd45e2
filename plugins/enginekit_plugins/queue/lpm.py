"""``lpm``: longest prefix match first, with aging: a request waits behind at most
``max_overtakes`` later arrivals."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from enginekit.config import QueueConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import PrefixProbe, WaitingQueue
from enginekit.request import Request


@dataclass
class LpmConfig(QueueConfig):
    name: str = "lpm"
    # The aging bound: how many later arrivals may be admitted before a waiting request;
    # 0 is first come, first served.
    max_overtakes: int = 8


class LongestPrefixMatchQueue(WaitingQueue):
    """Tries first the waiting request whose prompt the prefix cache holds most of now
    (``PrefixProbe.num_cached_prefix_tokens``, read once per admission pass); ties by
    arrival. Requests sharing a cached prefix are then admitted while it is cached, which
    raises the hit rate when the queue is long; the cost falls on requests that share
    nothing (cold ones), which later arrivals overtake.

    Aging, the contract: a fresh request is *overtaken* when a request that arrived after
    it is admitted while it waits. No request is overtaken more than
    ``queue.max_overtakes`` times: once a request has been overtaken that often it is
    *due*, and due requests are tried before any other, oldest first. (The scheduler
    admits a prefix of the order and stops at the first request that does not fit, so a
    due request that does not fit holds back every later arrival.) A request therefore
    waits for at most ``max_overtakes`` admissions of later arrivals, on top of those of
    earlier ones."""

    Config = LpmConfig

    def __init__(self, config: LpmConfig, cache: PrefixProbe) -> None:
        super().__init__(config, cache)
        bound = config.max_overtakes
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
            raise ConfigError(f"queue.max_overtakes must be an int >= 0, got {bound!r}")
        self.max_overtakes = bound
        # The fresh waiting requests, in arrival order: seq_id -> times overtaken so far.
        self._overtakes: dict[int, int] = {}

    def num_overtakes(self, request: Request) -> int:
        """How many later arrivals have been admitted while the waiting ``request``
        waits (at most ``max_overtakes``). Pure."""
        return self._overtakes[request.seq_id]

    def on_arrived(self, request: Request) -> None:
        self._overtakes[request.seq_id] = 0

    def on_admitted(self, request: Request) -> None:
        """Every request that arrived before ``request`` and still waits is overtaken."""
        overtakes = self._overtakes
        for seq_id in overtakes:  # arrival order: the ones before it
            if seq_id == request.seq_id:
                break
            overtakes[seq_id] += 1
        del overtakes[request.seq_id]

    def on_left(self, request: Request) -> None:
        del self._overtakes[request.seq_id]

    def order(self, waiting: Sequence[Request]) -> Iterable[Request]:
        if self.max_overtakes == 0 or len(waiting) <= 1:
            return waiting
        return self._aged_order(list(waiting))

    def _aged_order(self, waiting: list[Request]) -> Iterator[Request]:
        """The due requests oldest first, else the longest cached prefix (re-read at
        each item: the scheduler admitted the previous one, which may have made others
        due)."""
        probe = self.cache
        hits = [probe.num_cached_prefix_tokens(r) for r in waiting]
        # stable: arrival order among equal hits
        ranked = sorted(range(len(waiting)), key=lambda i: -hits[i])
        position = {r.seq_id: i for i, r in enumerate(waiting)}
        yielded: set[int] = set()
        next_rank = 0
        while True:
            pick = self._oldest_due(position)
            if pick is None:
                while next_rank < len(ranked) and ranked[next_rank] in yielded:
                    next_rank += 1
                if next_rank == len(ranked):
                    return
                pick = ranked[next_rank]
            yielded.add(pick)
            yield waiting[pick]

    def _oldest_due(self, position: dict[int, int]) -> int | None:
        """The position in the pass of the oldest waiting request overtaken
        ``max_overtakes`` times, or None."""
        bound = self.max_overtakes
        for seq_id, num in self._overtakes.items():
            if num >= bound and seq_id in position:
                return position[seq_id]
        return None

    def check_integrity(self) -> None:
        over = [n for n in self._overtakes.values() if n > self.max_overtakes]
        if over:
            raise RuntimeError(
                f"lpm: a waiting request was overtaken {max(over)} times, "
                f"beyond queue.max_overtakes={self.max_overtakes}"
            )

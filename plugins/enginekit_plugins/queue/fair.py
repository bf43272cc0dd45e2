"""``fair``: per-tenant fairness by virtual token counters (VTC: Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from enginekit.config import QueueConfig
from enginekit.errors import ConfigError
from enginekit.interfaces import PrefixProbe, WaitingQueue
from enginekit.request import Request


@dataclass
class FairConfig(QueueConfig):
    name: str = "fair"
    prompt_weight: float = 1.0  # counter units per prompt token computed
    output_weight: float = 2.0  # counter units per output token produced


class FairQueue(WaitingQueue):
    """Each tenant (``Request.tenant``: the request's ``user``, else its prefix-cache salt,
    else one shared tenant) has a counter of the service it received: ``prompt_weight``
    per prompt token computed in a prefill chunk (prefix hits are free; recomputation
    after a preemption counts) and ``output_weight`` per output token produced, counted
    as the scheduler schedules them. Admission tries first the oldest waiting request of
    the tenant whose counter is lowest (ties: the tenant whose oldest request is
    oldest), and counts again after each admission (its first chunk has been counted).

    A tenant that had nothing waiting and arrives again is lifted to the lowest counter
    among the tenants with requests waiting (or, if none waits, to the counter of the
    tenant whose request left the queue last), so it cannot bank the service it did not
    ask for while away; its counter never goes down. Requests preempted back into the
    queue come first whatever their tenant (the scheduler's rule)."""

    Config = FairConfig
    counts_service = True

    def __init__(self, config: FairConfig, cache: PrefixProbe) -> None:
        super().__init__(config, cache)
        for key in ("prompt_weight", "output_weight"):
            weight = getattr(config, key)
            if not (isinstance(weight, int | float) and math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"queue.{key} must be a finite number >= 0, got {weight!r}")
        if config.prompt_weight == 0 and config.output_weight == 0:
            raise ConfigError("queue.prompt_weight and queue.output_weight cannot both be 0")
        self._prompt_weight = float(config.prompt_weight)
        self._output_weight = float(config.output_weight)
        self._counters: dict[str, float] = {}
        self._num_waiting: dict[str, int] = {}  # tenants with fresh requests waiting
        self._last_left = 0.0  # the counter of the tenant whose request left last

    def counter(self, tenant: str) -> float:
        """The tenant's virtual token counter (0 for one never seen). Pure."""
        return self._counters.get(tenant, 0.0)

    @property
    def waiting_tenants(self) -> list[str]:
        """The tenants with fresh requests waiting, in the order they became so. Pure."""
        return list(self._num_waiting)

    def on_arrived(self, request: Request) -> None:
        tenant = request.tenant
        num = self._num_waiting.get(tenant, 0)
        if num == 0:
            waiting = self._num_waiting
            floor = min((self.counter(t) for t in waiting), default=self._last_left)
            self._counters[tenant] = max(self.counter(tenant), floor)
        self._num_waiting[tenant] = num + 1

    def on_admitted(self, request: Request) -> None:
        self._leave(request.tenant)

    def on_left(self, request: Request) -> None:
        self._leave(request.tenant)

    def _leave(self, tenant: str) -> None:
        num = self._num_waiting[tenant] - 1
        if num:
            self._num_waiting[tenant] = num
        else:
            del self._num_waiting[tenant]
        self._last_left = self.counter(tenant)

    def on_served(self, request: Request, num_prompt_tokens: int, num_output_tokens: int) -> None:
        tenant = request.tenant
        self._counters[tenant] = (
            self.counter(tenant)
            + self._prompt_weight * num_prompt_tokens
            + self._output_weight * num_output_tokens
        )

    def order(self, waiting: Sequence[Request]) -> Iterable[Request]:
        if len(waiting) <= 1:
            return waiting
        return self._fair_order(waiting)

    def _fair_order(self, waiting: Sequence[Request]) -> Iterator[Request]:
        by_tenant: dict[str, deque[tuple[int, Request]]] = {}
        for position, request in enumerate(waiting):
            by_tenant.setdefault(request.tenant, deque()).append((position, request))
        while by_tenant:
            tenant = min(by_tenant, key=lambda t: (self.counter(t), by_tenant[t][0][0]))
            queue = by_tenant[tenant]
            yield queue.popleft()[1]
            if not queue:
                del by_tenant[tenant]

    def check_integrity(self) -> None:
        if any(n <= 0 for n in self._num_waiting.values()):
            raise RuntimeError(f"fair: waiting counts {self._num_waiting} must be positive")

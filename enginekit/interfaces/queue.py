"""WaitingQueue: the order in which the scheduler tries to admit waiting requests.

The scheduler owns the waiting requests and admits them; the queue plugin only says in
which order it tries them. Requests a preemption sent back wait in front of every other,
in the order they were preempted, and are tried first whatever the plugin: the plugin
orders the *fresh* requests, those never admitted yet.

The scheduler's side of the contract, which every plugin may rely on:

- ``on_arrived`` is called once for each request as it joins the queue, in arrival order;
  ``on_admitted`` when a fresh request leaves it admitted, ``on_left`` when it leaves
  otherwise (aborted). Between these, the requests ``order`` is handed are exactly the
  fresh requests arrived and not yet gone, in arrival order.
- An admission pass iterates ``order``'s result lazily: the scheduler takes the next
  request only after it has admitted the one before (and called ``on_admitted`` for it),
  and stops at the first it cannot admit (head-of-line blocking: the budget, the
  running sequences or the cache), leaving that one and everything after it waiting. The
  requests admitted in a pass are therefore always a prefix of the order.
- With ``counts_service``, ``on_served`` reports the work done for each request as it is
  scheduled: prompt tokens in prefill chunks (recomputations included, prefix hits not)
  and output tokens as they are produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol

from enginekit.config import QueueConfig
from enginekit.errors import InvalidRequestError
from enginekit.interfaces.base import Plugin
from enginekit.request import Request


class PrefixProbe(Protocol):
    """What a queue plugin may ask of the cache: one pure query."""

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """How many of ``request``'s leading tokens the prefix cache holds now (what an
        admission now would match on the device, tiers apart). Pure."""
        ...


class WaitingQueue(Plugin):
    """Orders the fresh waiting requests for admission. The defaults are first come,
    first served: ``order`` returns the requests as they arrived, and no hook keeps state.

    A plugin never admits, removes or changes a request: it reads them (and the cache,
    through ``PrefixProbe``) and returns an order.
    """

    Config: ClassVar[type[QueueConfig]] = QueueConfig
    # Whether the plugin orders by ``Request.priority``; other plugins refuse a request
    # whose priority is not the default 0 (``check_request``), rather than ignore it.
    orders_by_priority: ClassVar[bool] = False
    # Whether the scheduler reports service (``on_served``); off, it calls nothing per token.
    counts_service: ClassVar[bool] = False

    def __init__(self, config: QueueConfig, cache: PrefixProbe) -> None:
        self.config = config
        self.cache = cache

    def check_request(self, request: Request) -> None:
        """Raises InvalidRequestError, saying why, for a request this queue cannot honour
        (called before the request is queued). Default: a priority other than 0 is
        refused unless the plugin ``orders_by_priority``. Pure."""
        if request.priority != 0 and not self.orders_by_priority:
            raise InvalidRequestError(
                f"request {request.request_id!r}: priority {request.priority} needs a queue "
                f"that orders by priority (+queue=priority); this run's queue is "
                f"{self.config.name!r}"
            )

    def on_arrived(self, request: Request) -> None:  # noqa: B027 - optional hook
        """``request`` joined the queue, behind every request arrived before it."""

    def on_admitted(self, request: Request) -> None:  # noqa: B027 - optional hook
        """``request``, fresh, was just admitted: it has left the queue."""

    def on_left(self, request: Request) -> None:  # noqa: B027 - optional hook
        """``request``, fresh, left the queue without being admitted (aborted)."""

    def on_served(  # noqa: B027 - optional hook
        self, request: Request, num_prompt_tokens: int, num_output_tokens: int
    ) -> None:
        """Work was done for the running ``request`` (a forked sample or beam too): a
        prefill chunk of ``num_prompt_tokens`` was scheduled, or ``num_output_tokens``
        were produced. Called only when ``counts_service``."""

    def order(self, waiting: Sequence[Request]) -> Iterable[Request]:
        """The fresh waiting requests (``waiting``, in arrival order) in the order the
        scheduler should try to admit them, each at most once; consumed lazily, as the
        module's docstring says (a generator may look at what was admitted before its
        next item). Default: ``waiting`` itself, first come first served."""
        return waiting

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raises RuntimeError if the plugin's own records are inconsistent."""

"""The queue plugins: exact orders on small hand-made queues, their contracts as properties
(lpm's overtake bound, priority's order, fair's smallest counter, fcfs's arrival order),
the errors for bad input, and whole engines under each queue.

A queue is driven here as the scheduler drives it (``Driver``): ``on_arrived`` in arrival
order, then admission passes that take a prefix of ``order`` (the test decides how many
fit), calling ``on_admitted`` before asking for the next."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from enginekit_plugins.queue.fair import FairConfig, FairQueue
from enginekit_plugins.queue.fcfs import FcfsConfig, FcfsQueue
from enginekit_plugins.queue.lpm import LongestPrefixMatchQueue, LpmConfig
from enginekit_plugins.queue.priority import PriorityConfig, PriorityQueue
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit import Engine, SamplingParams
from enginekit.config import QueueConfig
from enginekit.errors import ConfigError, InvalidRequestError, PluginError
from enginekit.interfaces import WaitingQueue
from enginekit.request import Request


class Probe:
    """A PrefixProbe answering from a table: request id -> cached prefix tokens."""

    def __init__(self, hits: dict[str, int] | None = None) -> None:
        self.hits = hits or {}

    def num_cached_prefix_tokens(self, request: Request) -> int:
        return self.hits.get(request.request_id, 0)


def make_request(
    seq_id: int, priority: int = 0, user: str | None = None, num_tokens: int = 8
) -> Request:
    return Request(
        request_id=f"r{seq_id}",
        seq_id=seq_id,
        prompt_token_ids=list(range(num_tokens)),
        sampling=SamplingParams(max_tokens=4),
        priority=priority,
        user=user,
    )


class Driver:
    """The scheduler's side of the contract, with admission decided by the test."""

    def __init__(self, queue: WaitingQueue) -> None:
        self.queue = queue
        self.waiting: list[Request] = []
        self.admitted: list[Request] = []
        # seq_id -> later arrivals admitted while it waits, counted by the test itself
        self.overtaken: dict[int, int] = {}

    def arrive(self, request: Request) -> None:
        self.waiting.append(request)
        self.overtaken[request.seq_id] = 0
        self.queue.on_arrived(request)

    def admit(
        self, num_fitting: int, serve: Callable[[Request], None] | None = None
    ) -> list[Request]:
        """One pass: the first ``num_fitting`` of the order are admitted, then one does
        not fit (head-of-line blocking). Returns the pass's admissions."""
        admitted: list[Request] = []
        for request in self.queue.order(list(self.waiting)):
            if len(admitted) == num_fitting:
                break
            position = self.waiting.index(request)
            for earlier in self.waiting[:position]:
                self.overtaken[earlier.seq_id] += 1
            self.waiting.remove(request)
            self.queue.on_admitted(request)
            if serve is not None:
                serve(request)
            admitted.append(request)
        self.admitted += admitted
        return admitted

    def abort(self, request: Request) -> None:
        self.waiting.remove(request)
        self.queue.on_left(request)


def ids(requests: Sequence[Request]) -> list[int]:
    return [r.seq_id for r in requests]


# ---- fcfs -------------------------------------------------------------------------------


def test_fcfs_is_the_interfaces_default_and_keeps_arrival_order() -> None:
    waiting = [make_request(i) for i in range(5)]
    for queue in (FcfsQueue(FcfsConfig(), Probe()), WaitingQueue(QueueConfig("fcfs"), Probe())):
        assert list(queue.order(waiting)) == waiting


@given(st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_fcfs_admits_in_arrival_order_whatever_fits(fits: list[int]) -> None:
    driver = Driver(FcfsQueue(FcfsConfig(), Probe()))
    seq_ids = itertools.count()
    for num_fitting in fits:
        driver.arrive(make_request(next(seq_ids)))
        driver.admit(num_fitting)
    assert ids(driver.admitted) == sorted(ids(driver.admitted))
    assert ids(driver.admitted + driver.waiting) == list(range(len(fits)))


# ---- lpm --------------------------------------------------------------------------------


def test_lpm_orders_by_cached_prefix_then_arrival() -> None:
    probe = Probe({"r0": 0, "r1": 32, "r2": 16, "r3": 32})
    driver = Driver(LongestPrefixMatchQueue(LpmConfig(max_overtakes=10), probe))
    for i in range(4):
        driver.arrive(make_request(i))
    assert ids(driver.admit(4)) == [1, 3, 2, 0]


def test_lpm_puts_a_request_first_once_it_was_overtaken_max_overtakes_times() -> None:
    probe = Probe({f"r{i}": 16 for i in range(1, 6)})  # r0 is cold, the others hit
    queue = LongestPrefixMatchQueue(LpmConfig(max_overtakes=2), probe)
    driver = Driver(queue)
    for i in range(6):
        driver.arrive(make_request(i))
    assert ids(driver.admit(1)) == [1]
    assert queue.num_overtakes(driver.waiting[0]) == 1
    # r2 overtakes r0 a second time; r0 is then due and goes before r3, r4, r5
    assert ids(driver.admit(3)) == [2, 0, 3]
    assert driver.overtaken[0] == 2


def test_lpm_with_max_overtakes_0_is_fcfs() -> None:
    probe = Probe({"r2": 64})
    driver = Driver(LongestPrefixMatchQueue(LpmConfig(max_overtakes=0), probe))
    for i in range(3):
        driver.arrive(make_request(i))
    assert ids(driver.admit(3)) == [0, 1, 2]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 4),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 64), st.booleans()),
        min_size=1,
        max_size=40,
    ),
)
def test_lpm_never_lets_a_request_be_overtaken_beyond_the_bound(
    bound: int, steps: list[tuple[int, int, int, bool]]
) -> None:
    """Whatever arrives, whatever the cache holds and however many fit each pass, no
    waiting request is overtaken by more than ``max_overtakes`` later arrivals (counted by
    the driver, not the plugin), and the plugin's own count agrees."""
    probe = Probe()
    queue = LongestPrefixMatchQueue(LpmConfig(max_overtakes=bound), probe)
    driver = Driver(queue)
    seq_ids = itertools.count()
    for num_arrivals, num_fitting, hit, abort in steps:
        for _ in range(num_arrivals):
            request = make_request(next(seq_ids))
            probe.hits[request.request_id] = (hit * (request.seq_id + 1)) % 65
            driver.arrive(request)
        if abort and driver.waiting:
            driver.abort(driver.waiting[-1])
        driver.admit(num_fitting)
        queue.check_integrity()
        assert all(n <= bound for n in driver.overtaken.values())
        for request in driver.waiting:
            assert queue.num_overtakes(request) == driver.overtaken[request.seq_id]


@pytest.mark.parametrize("bound", [-1, 1.5, True, "3"])
def test_lpm_refuses_a_bad_bound(bound: Any) -> None:
    with pytest.raises(ConfigError, match="queue.max_overtakes must be an int >= 0"):
        LongestPrefixMatchQueue(LpmConfig(max_overtakes=bound), Probe())


def test_lpm_bad_bound_from_the_command_line_names_the_key() -> None:
    with pytest.raises(ConfigError, match="max_overtakes"):
        Engine.from_overrides(["+queue=lpm", "queue.max_overtakes=-2", "cache.num_blocks=64"])


# ---- priority ---------------------------------------------------------------------------


def test_priority_orders_lower_first_then_by_arrival() -> None:
    driver = Driver(PriorityQueue(PriorityConfig(), Probe()))
    for seq_id, priority in enumerate([5, -1, 5, 0, -1]):
        driver.arrive(make_request(seq_id, priority=priority))
    assert ids(driver.admit(5)) == [1, 4, 3, 0, 2]


@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 3)), min_size=1, max_size=30))
def test_priority_admits_each_pass_in_priority_then_arrival_order(
    steps: list[tuple[int, int]],
) -> None:
    driver = Driver(PriorityQueue(PriorityConfig(), Probe()))
    for seq_id, (priority, num_fitting) in enumerate(steps):
        driver.arrive(make_request(seq_id, priority=priority))
        before = list(driver.waiting)
        admitted = driver.admit(num_fitting)
        expected = sorted(before, key=lambda r: (r.priority, r.seq_id))[: len(admitted)]
        assert admitted == expected


# ---- fair -------------------------------------------------------------------------------


def test_fair_serves_the_tenant_with_the_smallest_counter_first() -> None:
    queue = FairQueue(FairConfig(prompt_weight=1.0, output_weight=2.0), Probe())
    driver = Driver(queue)
    for seq_id, user in enumerate(["a", "a", "a", "b"]):
        driver.arrive(make_request(seq_id, user=user))

    def serve(request: Request) -> None:  # each admission computes its 8-token prompt
        queue.on_served(request, request.num_prompt_tokens, 0)

    # a and b start at 0; a's request is older: a, then b (a has 8), then a, a
    assert ids(driver.admit(4, serve)) == [0, 3, 1, 2]
    assert queue.counter("a") == 24 and queue.counter("b") == 8
    queue.on_served(make_request(9, user="b"), 0, 3)  # b's outputs: 3 x 2
    assert queue.counter("b") == 14


def test_fair_lifts_a_returning_tenant_to_the_smallest_waiting_counter() -> None:
    queue = FairQueue(FairConfig(), Probe())
    driver = Driver(queue)
    driver.arrive(make_request(0, user="a"))
    driver.arrive(make_request(1, user="b"))
    driver.admit(2, lambda r: queue.on_served(r, 100 if r.user == "a" else 10, 0))
    driver.arrive(make_request(2, user="a"))
    driver.arrive(make_request(3, user="b"))  # b, away, comes back below a: lifted to 100
    assert queue.counter("b") == 100
    driver.arrive(make_request(4, user="c"))  # new: lifted too
    assert queue.counter("c") == 100
    # idle queue: a newcomer is lifted to the counter of the tenant that left last
    driver.admit(3)
    driver.arrive(make_request(5, user="d"))
    assert queue.counter("d") == queue.counter(driver.admitted[-1].tenant)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 50), st.integers(0, 3)),
        min_size=1,
        max_size=40,
    )
)
def test_fair_always_admits_from_a_waiting_tenant_with_the_smallest_counter(
    steps: list[tuple[str, int, int]],
) -> None:
    queue = FairQueue(FairConfig(), Probe())
    driver = Driver(queue)
    for seq_id, (user, num_tokens, num_fitting) in enumerate(steps):
        driver.arrive(make_request(seq_id, user=user, num_tokens=num_tokens))

        def serve(request: Request) -> None:
            queue.on_served(request, request.num_prompt_tokens, 0)

        for request in queue.order(list(driver.waiting)):
            if num_fitting == 0:
                break
            lowest = min(queue.counter(r.tenant) for r in driver.waiting)
            assert queue.counter(request.tenant) == lowest
            oldest = next(r for r in driver.waiting if r.tenant == request.tenant)
            assert request is oldest
            driver.waiting.remove(request)
            queue.on_admitted(request)
            serve(request)
            num_fitting -= 1
        queue.check_integrity()
        assert sorted(queue.waiting_tenants) == sorted({r.tenant for r in driver.waiting})


def test_tenant_is_the_user_else_the_salt_else_shared() -> None:
    assert make_request(0, user="alice").tenant == "alice"
    salted = Request("r", 1, [1, 2], SamplingParams(), extra_key=b"acme")
    assert salted.tenant == "salt:acme"
    assert make_request(2).tenant == ""


@pytest.mark.parametrize(
    "keys",
    [
        {"prompt_weight": -1.0},
        {"output_weight": float("inf")},
        {"prompt_weight": 0.0, "output_weight": 0.0},
    ],
)
def test_fair_refuses_bad_weights(keys: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="queue."):
        FairQueue(FairConfig(**keys), Probe())


# ---- through the engine -----------------------------------------------------------------


def test_a_misspelt_queue_is_refused_with_the_closest_name() -> None:
    with pytest.raises(PluginError, match="did you mean 'priority'"):
        Engine.from_overrides(["+queue=priorty", "cache.num_blocks=64"])


@pytest.mark.parametrize("queue", ["fcfs", "lpm", "fair"])
def test_a_priority_is_refused_unless_the_queue_orders_by_it(queue: str) -> None:
    engine = Engine.from_overrides([f"+queue={queue}", "cache.num_blocks=64"])
    with pytest.raises(InvalidRequestError, match=r"\+queue=priority"):
        engine.add_request([1, 2, 3], priority=1)
    engine.add_request([1, 2, 3], priority=0)  # the default is taken everywhere
    assert engine.num_waiting == 0 and engine.has_unfinished_requests()


@pytest.mark.parametrize("bad", [1.5, True, "1", None])
def test_a_priority_that_is_not_an_int_is_refused(bad: Any) -> None:
    engine = Engine.from_overrides(["+queue=priority", "cache.num_blocks=64"])
    with pytest.raises(InvalidRequestError, match="priority must be an int"):
        engine.add_request([1, 2, 3], priority=bad)


def _run(queue: list[str], requests: list[dict[str, Any]]) -> tuple[list[str], dict]:
    """Requests all arriving at 0 into a pool that holds one at a time; the order in
    which they got their first token, and the summary."""
    engine = Engine.from_overrides(
        [*queue, "cache.num_blocks=40", "cache.watermark=0", "scheduler.max_num_seqs=1"]
    )
    for spec in requests:
        engine.add_request(sampling=SamplingParams(max_tokens=4, ignore_eos=True), **spec)
    result = engine.run()
    first = sorted(result.outputs, key=lambda o: (o.first_token_time, o.arrival_time))
    return [o.request_id for o in first], result.summary


def test_the_engine_serves_by_priority_under_the_priority_queue() -> None:
    requests = [
        {"prompt_token_ids": list(range(10 * i, 10 * i + 20)), "request_id": f"p{p}", "priority": p}
        for i, p in enumerate([3, 1, 2, 0])
    ]
    order, _ = _run(["+queue=priority"], requests)
    # all arrive at 0 and join the queue before the first step: priority alone decides
    assert order == ["p0", "p1", "p2", "p3"]


def test_the_engine_serves_the_longest_cached_prefix_first_under_lpm() -> None:
    shared = list(range(1000, 1064))  # 4 blocks of 16
    requests = [
        {"prompt_token_ids": shared + [1], "request_id": "warm-up"},
        {"prompt_token_ids": list(range(2000, 2070)), "request_id": "cold"},
        {"prompt_token_ids": shared + [2], "request_id": "hit"},
    ]
    fcfs, _ = _run(["+queue=fcfs"], requests)
    lpm, _ = _run(["+queue=lpm"], requests)
    assert fcfs == ["warm-up", "cold", "hit"]
    assert lpm == ["warm-up", "hit", "cold"]


def test_fcfs_runs_as_the_default_does() -> None:
    requests = [
        {"prompt_token_ids": list(range(7 * i, 7 * i + 30)), "request_id": f"r{i}"}
        for i in range(6)
    ]
    assert _run([], requests) == _run(["+queue=fcfs"], requests)

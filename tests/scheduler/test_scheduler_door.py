"""The scheduler reaches the cache only through its door: run with a cache that answers
nothing but ``SchedulerCache``'s members, whole engines (swap and recompute preemption,
prefix hits, parallel samples, beams, aborts, a sliding window) finish every request with
the same outputs as with the manager itself."""

from __future__ import annotations

from typing import Any

import pytest

from enginekit.engine import Engine
from enginekit.interfaces.scheduler_cache import SchedulerCache
from enginekit.kv.manager import KVCacheManager
from enginekit.request import SamplingParams

DOOR = frozenset(name for name in vars(SchedulerCache) if not name.startswith("_"))


class DoorOnly:
    """A manager seen through ``SchedulerCache`` alone: any other attribute raises."""

    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        if name not in DOOR:
            raise AttributeError(f"the scheduler reached past its door for {name!r}")
        return getattr(self._manager, name)


def test_the_door_is_the_protocols_eight_calls_one_query_and_the_block_size() -> None:
    calls = {"admit", "admit_together", "reserve_prefill", "grow", "fork"}
    calls |= {"take_step_blocks", "release", "finish_step"}
    assert calls | {"num_cached_prefix_tokens", "block_size"} == DOOR


def test_the_stand_in_refuses_what_the_door_lacks() -> None:
    engine = Engine.from_overrides(["cache.num_blocks=64"])
    with pytest.raises(AttributeError, match="past its door for 'usage'"):
        _ = DoorOnly(engine.cache).usage


def _run(door_only: bool, overrides: list[str]) -> tuple[list[Any], dict[str, Any]]:
    engine = Engine.from_overrides(overrides)
    if door_only:
        door = DoorOnly(engine.cache)
        engine.scheduler.cache = door  # type: ignore[assignment]
        engine.scheduler._forker._cache = door  # type: ignore[assignment]
        engine.scheduler.queue.cache = door  # the queue's order reads the cache too
    shared = list(range(100, 124))
    for i in range(10):
        prompt = shared + list(range(200 + 30 * i, 200 + 30 * i + 8 + 2 * i))
        width = 2 if i % 5 == 3 else 1
        sampling = SamplingParams(
            max_tokens=12 + i, n=2 if i % 4 == 1 else 1, beam_width=width, ignore_eos=True
        )
        engine.add_request(prompt, sampling, request_id=f"r{i}")
    num_steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
        num_steps += 1
        if num_steps == 5:
            engine.abort_request("r6")
    outputs = [(o.request_id, o.samples, o.finish_reason) for o in engine.outputs()]
    return outputs, engine.summary()


@pytest.mark.parametrize(
    "overrides",
    [
        ["+preemption=swap", "preemption.swap_space_gib=0.1", "cache.num_blocks=12"],
        ["+prefix=radix", "cache.num_blocks=12"],
        ["+queue=lpm", "queue.max_overtakes=2", "cache.num_blocks=12"],
        ["+eviction=sliding_window", "eviction.window=32", "cache.num_blocks=12"],
    ],
    ids=["swap", "radix-recompute", "lpm", "sliding-window"],
)
def test_the_scheduler_needs_nothing_past_its_door(overrides: list[str]) -> None:
    overrides = [*overrides, "cache.watermark=0"]
    through_door, summary = _run(True, overrides)
    assert through_door == _run(False, overrides)[0]
    assert summary["num_requests_finished"] == 9  # and r6, aborted at the fifth step
    assert [reason for rid, _, reason in through_door if rid == "r6"] == ["abort"]
    assert summary["num_preemptions_total"] > 0  # the pool is short: preemption ran

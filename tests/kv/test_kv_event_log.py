"""KV events of the cache manager (``record_kv_events``, ``take_kv_events``), under both
prefix caches, on the Rust structures and their twins:

- after every operation, the blocks rebuilt from the events alone (each hash stored once,
  then removed once) are the cache's full blocks: the pool's hash map under
  ``block_hash``, the blocks whose every position the trees hold under ``radix``;
- every stored block is named by the chain hash of its tokens, computed here by the
  hash's readable twin (``enginekit.kv.pyref.hashing``), so both caches name the same
  content alike, and salts part names;
- a policy that hears accesses hears exactly what it hears with the events off, call by
  call, and the run is the same;
- starting needs an empty cache.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_eviction_policies import tiny_engine

from enginekit import Engine, SamplingParams
from enginekit.errors import KVCacheError
from enginekit.interfaces.kv_events import CacheCleared, KVEvent, RemovedBlocks, StoredBlocks
from enginekit.kv.pyref.hashing import ROOT_HASH, hash_block, hash_blocks

BLOCK_SIZE = 4  # tiny_engine's
SALTS = (None, "tenant-a", "tenant-b")


def salt_key(salt: str | None) -> bytes | None:
    return None if salt is None else salt.encode()


def chain_hash(parent: int, tokens: list[int], salt: str | None) -> int:
    """A block's name as the docs give it (the readable twin of the Rust hash)."""
    return hash_block(parent, tokens, salt_key(salt))


def chain_hashes(tokens: list[int], salt: str | None) -> list[int]:
    """The names of every full block of ``tokens``."""
    return hash_blocks(tokens, BLOCK_SIZE, salt_key(salt))


class Subscriber:
    """What a router following one engine's events holds: each stored name once, until
    it is removed. Checks every stored name against the hash's definition."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.ever_stored: set[int] = set()
        self.num_removed = 0

    def hear(self, events: list[KVEvent]) -> None:
        for event in events:
            if isinstance(event, CacheCleared):
                self.held.clear()
            elif isinstance(event, StoredBlocks):
                assert len(event.token_ids) == BLOCK_SIZE * len(event.block_hashes)
                assert event.block_hashes == self.names(event), event
                for name in event.block_hashes:
                    assert name not in self.held, f"{name:#x} stored twice"
                    self.held.add(name)
                self.ever_stored.update(event.block_hashes)
            else:
                assert isinstance(event, RemovedBlocks)
                for name in event.block_hashes:
                    assert name in self.held, f"{name:#x} removed but not held"
                    self.held.remove(name)
                self.num_removed += len(event.block_hashes)

    @staticmethod
    def names(event: StoredBlocks) -> list[int]:
        """The names of the event's blocks under the salt that reproduces the first (the
        event does not carry the salt; a wrong one gives other names)."""
        for salt in SALTS:
            names, parent = [], ROOT_HASH if event.parent_hash is None else event.parent_hash
            for start in range(0, len(event.token_ids), BLOCK_SIZE):
                parent = chain_hash(parent, event.token_ids[start : start + BLOCK_SIZE], salt)
                names.append(parent)
            if names[0] == event.block_hashes[0]:
                return names
        raise AssertionError(f"no salt names {event}")


def cached_names(engine: Engine) -> set[int]:
    """The names of the full blocks the engine's cache holds, read off its structures."""
    if engine.config.prefix.name == "radix":
        return set(engine.cache.prefix.full_blocks().values())
    return set(engine.cache.pool.cached_blocks())


def check(engine: Engine, subscriber: Subscriber) -> None:
    subscriber.hear(engine.cache.take_kv_events())
    engine.check_integrity()
    assert subscriber.held == cached_names(engine)


PROMPTS = st.lists(
    st.tuples(
        st.integers(0, 2),  # which shared head
        st.integers(0, 24),  # how much of it
        st.lists(st.integers(3, 400), min_size=1, max_size=10),  # the request's own tail
        st.sampled_from(SALTS),
        st.integers(1, 9),  # max_tokens
        st.integers(0, 3),  # steps after adding it
        st.booleans(),  # abort it after those steps
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("policy", ["lru", "slru"])
@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
@settings(max_examples=25, deadline=None)
@given(ops=PROMPTS, seed=st.integers(0, 2**16))
def test_the_events_rebuild_the_cached_blocks_after_every_operation(
    prefix: str, policy: str, native: bool, ops: list[Any], seed: int
) -> None:
    engine = tiny_engine(policy, 24, native=native, prefix=prefix)
    engine.cache.record_kv_events(True)
    subscriber = Subscriber()
    check(engine, subscriber)
    rng = random.Random(seed)
    heads = [rng.choices(range(3, 400), k=24) for _ in range(3)]
    for head, length, tail, salt, max_tokens, num_steps, abort in ops:
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=1)
        request_id = engine.add_request(heads[head][:length] + tail, sampling, extra_key=salt)
        check(engine, subscriber)
        for _ in range(num_steps):
            if engine.has_unfinished_requests():
                engine.step()
                check(engine, subscriber)
        if abort:
            engine.abort_request(request_id)
            check(engine, subscriber)
    while engine.has_unfinished_requests():
        engine.step()
        check(engine, subscriber)


class PromptRun:
    """Thirty prompts sharing heads, two salts, in a pool that evicts; one output token
    each (no output is computed, so the cached blocks are the prompts' alone). ``heard``:
    every batch of accesses the eviction policy heard, in order."""

    def __init__(self, prefix: str, policy: str, events: bool) -> None:
        self.engine = engine = tiny_engine(policy, 24, prefix=prefix)
        self.heard: list[list[Any]] = []
        self._hear = engine.cache.eviction.hear
        engine.cache.eviction.hear = self._record  # type: ignore[method-assign]
        self.subscriber = Subscriber()
        if events:
            engine.cache.record_kv_events(True)
        self.prompts: list[tuple[list[int], str | None]] = []
        rng = random.Random(7)
        heads = [rng.choices(range(3, 400), k=16) for _ in range(3)]
        for i in range(30):
            prompt = rng.choice(heads)[: rng.choice((4, 10, 16))] + rng.choices(range(3, 400), k=5)
            self.prompts.append((prompt, SALTS[i % 2]))
            engine.add_request(prompt, SamplingParams(max_tokens=1), extra_key=SALTS[i % 2])
            if i % 3 == 2:
                while engine.has_unfinished_requests():
                    engine.step()
                    if events:
                        check(engine, self.subscriber)
                    else:
                        engine.check_integrity()

    def _record(self, accesses: Any) -> None:
        self.heard.append(list(accesses))
        self._hear(accesses)


@pytest.mark.parametrize("policy", ["slru", "lfu", "chain_aware"])
@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_a_policy_hears_the_same_accesses_with_the_events_on(prefix: str, policy: str) -> None:
    off = PromptRun(prefix, policy, events=False)
    on = PromptRun(prefix, policy, events=True)
    assert on.heard == off.heard and off.heard
    assert on.engine.summary() == off.engine.summary()
    assert on.subscriber.num_removed > 0  # the pool evicted


def test_both_prefix_caches_name_the_same_blocks_alike() -> None:
    """The same prompts store the same names under block_hash and radix: every full block
    of every prompt, named from its tokens and salt."""
    stored = {}
    for prefix in ("block_hash", "radix"):
        run = PromptRun(prefix, "lru", events=True)
        stored[prefix] = run.subscriber.ever_stored
        expected = {name for prompt, salt in run.prompts for name in chain_hashes(prompt, salt)}
        assert run.subscriber.ever_stored == expected
    assert stored["block_hash"] == stored["radix"]


def test_salts_part_the_names_of_the_same_tokens() -> None:
    engine = tiny_engine("lru", 64)
    engine.cache.record_kv_events(True)
    prompt = list(range(10, 27))  # four full blocks and a token
    for salt in SALTS:
        engine.add_request(prompt, SamplingParams(max_tokens=1), extra_key=salt)
    while engine.has_unfinished_requests():
        engine.step()
    subscriber = Subscriber()
    subscriber.hear(engine.cache.take_kv_events())
    names = [chain_hashes(prompt, salt) for salt in SALTS]
    assert subscriber.held == set(names[0]) | set(names[1]) | set(names[2])
    assert len(subscriber.held) == 12  # no name shared between salts


def test_events_start_on_an_empty_cache_with_a_clear() -> None:
    engine = tiny_engine("lru", 32)
    assert engine.cache.take_kv_events() == []  # off: nothing
    engine.add_request(list(range(10, 30)), SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    with pytest.raises(KVCacheError, match="empty cache"):
        engine.cache.record_kv_events(True)  # its blocks are cached: unknown to the events
    fresh = tiny_engine("lru", 32, prefix="radix")
    fresh.cache.record_kv_events(True)
    assert fresh.cache.take_kv_events() == [CacheCleared()]
    assert fresh.cache.take_kv_events() == []

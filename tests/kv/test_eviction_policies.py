"""The eviction policies that hear accesses (``slru``, ``lfu``, ``chain_aware``): their
rules on hand-made access orders, and on random ones against the pool:

- the pool logs the accesses their hooks rely on, in order, the same in Rust and in the
  Python twin;
- every victim is evictable (``Eviction.evict_blocks`` raises at one that is not), and a
  policy's state agrees with the pool's evictable blocks after every operation;
- each rule holds at every choice, checked against a model built here from the accesses;
- the Rust structures and their twins choose the same victims.

A "world" is a pool whose sequences are chains of contents (hashes): ``put`` admits a
chain as a prefix cache would (its cached leading blocks hit, the rest allocated and
published), ``release`` frees it tail first, ``evict`` asks the policy for room.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from enginekit_plugins.eviction.chain_aware import ChainAwareConfig, ChainAwareEviction
from enginekit_plugins.eviction.lfu import LFUConfig, LFUEviction
from enginekit_plugins.eviction.lru import LRUConfig, LRUEviction
from enginekit_plugins.eviction.slru import SLRUConfig, SLRUEviction
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv_manager import make_manager

from enginekit import Engine, SamplingParams
from enginekit import metric_keys as mk
from enginekit.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, WorkloadConfig
from enginekit.driver import WorkloadDriver
from enginekit.errors import ConfigError
from enginekit.interfaces import AccessKind, AttentionSpan, Eviction
from enginekit.kv.backend import make_backend, make_context
from enginekit.plugins import load_plugin
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset

SPEC = KVSpec.of(model_preset("tiny"), bits_per_element=32, block_size=4)
POLICIES: dict[str, tuple[type[Eviction], Any]] = {
    "lru": (LRUEviction, LRUConfig()),
    "slru": (SLRUEviction, SLRUConfig(protected_fraction=0.5)),
    "lfu": (LFUEviction, LFUConfig(half_life=8)),
    "chain_aware": (ChainAwareEviction, ChainAwareConfig()),
}


class World:
    """A pool of ``num_blocks`` blocks, block tables and one policy, of the Rust structures
    (``native``) or their twins, with the pool logging accesses as the cache manager has it
    log them for a policy that hears them."""

    def __init__(self, native: bool, num_blocks: int, policy: str) -> None:
        backend = make_backend(native)
        self.kv = make_context(backend, num_blocks, SPEC, 64, AttentionSpan(None, 0))
        self.pool, self.tables = self.kv.pool, self.kv.tables
        cls, config = POLICIES[policy]
        self.policy = cls(config, self.kv)
        self.pool.record_accesses(True)  # lru hears nothing, but the model here does
        self.accesses: list[tuple[int, int, int, int | None]] = []  # every access, in order
        self._next_seq = 0

    def deliver(self) -> None:
        accesses = self.pool.take_accesses()
        self.accesses += accesses
        if accesses:
            self.policy.hear(accesses)

    def put(self, chain: list[int]) -> int | None:
        """Admits a sequence of these contents: its longest cached prefix hits, the rest is
        allocated (None, changing nothing, if the free blocks fall short) and published."""
        hit = self.pool.lookup_prefix(chain)
        num_new = len(chain) - len(hit)
        if num_new > self.pool.num_free_blocks:
            return None
        self.pool.incref_all(hit)
        blocks = hit + self.pool.allocate(num_new)
        seq_id, self._next_seq = self._next_seq, self._next_seq + 1
        self.tables.add_sequence(seq_id, blocks)
        self.tables.cache_blocks(self.pool, seq_id, 0, chain)
        return seq_id

    def release(self, seq_id: int) -> None:
        self.tables.free_sequence(self.pool, seq_id)

    def evict(self, num_blocks: int) -> list[int]:
        self.deliver()
        return self.policy.evict(min(num_blocks, self.pool.num_evictable_blocks))

    def check(self) -> None:
        self.pool.check_integrity()
        self.deliver()
        self.policy.check_integrity()


# ---- the access log ------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_the_pool_logs_insertions_with_their_parents_hits_releases_and_evictions(native):
    w = World(native, 8, "slru")
    a = w.put([10, 11])
    assert a is not None
    w.release(a)
    b = w.put([10, 12])  # hits 10, caches 12 after it
    assert b is not None
    w.release(b)
    victims = w.evict(1)
    w.deliver()
    block = {content: blk for content, blk in zip((10, 11), range(2), strict=True)}
    assert w.accesses[:6] == [
        (AccessKind.INSERT, block[10], 10, None),
        (AccessKind.INSERT, block[11], 11, 10),
        (AccessKind.RELEASE, block[11], 11, None),  # a sequence frees its tail first
        (AccessKind.RELEASE, block[10], 10, None),
        (AccessKind.HIT, block[10], 10, None),
        (AccessKind.INSERT, 2, 12, 10),
    ]
    assert w.accesses[6:] == [
        (AccessKind.RELEASE, 2, 12, None),
        (AccessKind.RELEASE, block[10], 10, None),
        (AccessKind.EVICT, victims[0], 11, None),
    ]


def test_the_pool_logs_nothing_for_a_policy_that_hears_nothing():
    assert not LRUEviction.hears_accesses()
    assert SLRUEviction.hears_accesses() and LFUEviction.hears_accesses()
    assert not make_manager(True).pool.is_recording_accesses


# ---- each rule on a hand-made order ------------------------------------------------------


def _cached(w: World) -> dict[int, int]:
    """content -> block of every cached block."""
    return w.pool.cached_blocks()  # type: ignore[attr-defined]


def use(w: World, content: int, times: int = 1) -> None:
    """A one-block sequence of ``content``, admitted and released ``times`` times."""
    for _ in range(times):
        seq = w.put([content])
        assert seq is not None
        w.release(seq)


def evicted_content(w: World) -> int:
    """Evicts one block; returns its content."""
    by_block = {b: c for c, b in _cached(w).items()}
    (victim,) = w.evict(1)
    return by_block[victim]


@pytest.mark.parametrize("native", [True, False])
def test_slru_keeps_a_reused_block_past_a_scan_where_lru_evicts_it(native):
    for policy, survives in (("slru", True), ("lru", False)):
        w = World(native, 8, policy)
        use(w, 1, times=2)  # reused: protected
        for content in (50, 51, 52):  # a scan of one-off blocks, released after it
            use(w, content)
        victims = [evicted_content(w) for _ in range(3)]
        assert (1 not in victims) is survives, policy


@pytest.mark.parametrize("native", [True, False])
def test_slru_evicts_probation_then_protected_each_least_recently_released_first(native):
    w = World(native, 8, "slru")
    for content, times in ((1, 2), (2, 1), (3, 2), (4, 1)):
        use(w, content, times)
    assert [evicted_content(w) for _ in range(4)] == [2, 4, 1, 3]


@pytest.mark.parametrize("native", [True, False])
def test_slru_drops_the_protected_overflow_to_probation(native):
    w = World(native, 4, "slru")  # protected holds 2 of the 4 blocks
    for content in (1, 2, 3):
        use(w, content, times=2)
    w.check()
    # 1 dropped to probation when 3 joined protected: it goes first, then protected's order
    assert [evicted_content(w) for _ in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("native", [True, False])
def test_lfu_evicts_the_least_used_first(native):
    w = World(native, 8, "lfu")
    for content, times in ((1, 3), (2, 1), (3, 2)):
        use(w, content, times)
    assert [evicted_content(w) for _ in range(3)] == [2, 3, 1]


@pytest.mark.parametrize("native", [True, False])
def test_lfu_counts_halve_each_half_life_so_old_popularity_fades(native):
    w = World(native, 64, "lfu")  # half-life 8 accesses
    use(w, 1, times=3)
    for content in range(100, 140):  # 40 accesses: 1's count halves five times
        use(w, content)
    use(w, 7, times=2)
    policy, cached = w.policy, _cached(w)
    assert isinstance(policy, LFUEviction)
    w.deliver()
    assert policy.rank(cached[1]) < policy.rank(cached[7])
    assert policy.rank(cached[1]) < policy.rank(cached[139])  # below a recent one-off
    # 1's three uses at clocks 1-3 rank as one use at clock 14.7: the one-offs before
    # it (clocks 4-14) go first, then 1, before the one-offs after it
    assert [evicted_content(w) for _ in range(12)] == [*range(100, 111), 1]


@pytest.mark.parametrize("native", [True, False])
def test_chain_aware_evicts_a_chain_from_its_tail_where_lru_takes_its_head(native):
    for policy, expected in (("chain_aware", [3, 2, 1]), ("lru", [1, 2, 3])):
        w = World(native, 8, policy)
        seq = w.put([1, 2, 3])
        assert seq is not None
        w.pool.free(w.tables.remove_sequence(seq))  # head released first
        assert [evicted_content(w) for _ in range(3)] == expected, policy


def test_policies_refuse_bad_settings_naming_the_key():
    kv = make_context(make_backend(True), 8, SPEC, 64, AttentionSpan(None, 0))
    with pytest.raises(ConfigError, match="protected_fraction"):
        SLRUEviction(SLRUConfig(protected_fraction=0.0), kv)
    with pytest.raises(ConfigError, match="half_life"):
        LFUEviction(LFUConfig(half_life=0), kv)


# ---- random orders -----------------------------------------------------------------------


class Model:
    """What the accesses say, independently of any policy: each cached block's content
    and parent, which are evictable, and in which order they were released."""

    def __init__(self) -> None:
        self.content: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.released: dict[int, int] = {}  # evictable block -> release number
        self.uses: dict[int, list[int]] = {}  # block -> clock of its insertion and hits
        self.clock = 0
        self.number = 0

    def hear(self, accesses: list[tuple[int, int, int, int | None]]) -> None:
        for kind, block, content, parent in accesses:
            if kind == AccessKind.INSERT:
                self.clock += 1
                self.content[block], self.parent[content] = content, parent
                self.uses[block] = [self.clock]
            elif kind == AccessKind.HIT:
                self.clock += 1
                self.released.pop(block, None)
                self.uses[block].append(self.clock)
            elif kind == AccessKind.RELEASE:
                self.number += 1
                self.released[block] = self.number
            else:
                self.released.pop(block, None)
                if block in self.content:
                    del self.parent[self.content.pop(block)]
                self.uses.pop(block, None)

    def has_cached_child(self, block: int) -> bool:
        return self.content[block] in {p for p in self.parent.values() if p is not None}

    def aged_count(self, block: int, half_life: int) -> float:
        return sum(2.0 ** (-(self.clock - u) / half_life) for u in self.uses[block])


def check_choice(policy: str, model: Model, victims: list[int], half_life: int) -> None:
    """Each victim is the policy's rule's choice among the evictable blocks (the model's,
    updated as each victim leaves)."""
    for victim in victims:
        assert victim in model.released, "evicted a block that was not evictable"
        evictable = list(model.released)
        if policy == "lru":
            assert victim == min(evictable, key=model.released.__getitem__)
        elif policy == "lfu":
            counts = {b: model.aged_count(b, half_life) for b in evictable}
            assert math.isclose(counts[victim], min(counts.values()), rel_tol=1e-9)
        elif policy == "chain_aware":
            leaves = [b for b in evictable if not model.has_cached_child(b)]
            if leaves:
                assert victim == min(leaves, key=model.released.__getitem__)
            else:
                assert victim == min(evictable, key=model.released.__getitem__)
        model.hear([(AccessKind.EVICT, victim, model.content[victim], None)])


@st.composite
def operations(draw: Any) -> list[tuple[str, int]]:
    """Puts of chains over a small content space (shared prefixes), releases and
    evictions, in a random order."""
    ops = []
    for _ in range(draw(st.integers(5, 60))):
        ops.append(
            draw(
                st.one_of(
                    st.tuples(st.just("put"), st.integers(0, 10**6)),
                    st.tuples(st.just("release"), st.integers(0, 10**6)),
                    st.tuples(st.just("evict"), st.integers(1, 4)),
                )
            )
        )
    return ops


def chain_for(seed: int) -> list[int]:
    """A chain of 1-4 blocks over a tree of contents: roots 1-3, each child
    10 * parent + 1..3, so prefixes are shared often."""
    length = 1 + seed % 4
    contents, content = [], 1 + (seed // 4) % 3
    seed //= 12
    for _ in range(length):
        contents.append(content)
        content = 10 * content + 1 + seed % 3
        seed //= 3
    return contents


def run(native: bool, policy: str, ops: list[tuple[str, int]]) -> tuple[list[Any], list[Any]]:
    """Runs ``ops`` on a world of 10 blocks, checking every victim against the model and
    the policy against the pool after every operation; returns the victims of each
    eviction and every access."""
    w = World(native, 10, policy)
    model = Model()
    live: list[int] = []
    choices = []
    for op, arg in ops:
        if op == "put":
            seq = w.put(chain_for(arg))
            if seq is not None:
                live.append(seq)
        elif op == "release" and live:
            w.release(live.pop(arg % len(live)))
        elif op == "evict":
            num_heard = len(w.accesses)
            w.deliver()
            model.hear(w.accesses[num_heard:])
            victims = w.policy.evict(min(arg, w.pool.num_evictable_blocks))
            check_choice(policy, model, victims, half_life=8)
            choices.append(victims)
        num_heard = len(w.accesses)
        w.check()
        model.hear(w.accesses[num_heard:])
    return choices, w.accesses


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(ops=operations())
def test_victims_follow_the_rule_and_both_backends_choose_the_same(policy, ops):
    native = run(True, policy, ops)
    twin = run(False, policy, ops)
    assert native == twin


# ---- in an engine, under both prefix caches --------------------------------------------


def tiny_engine(
    policy: str,
    num_blocks: int,
    *,
    native: bool = True,
    prefix: str = "block_hash",
    max_num_seqs: int = 4,
    workload: WorkloadConfig | None = None,
) -> Engine:
    """The tiny model on the simulator under eviction ``policy``: blocks of 4 tokens, no
    watermark, the Rust structures or (``native`` false) their twins."""
    return Engine(
        EngineConfig(
            eviction=POLICIES[policy][1],
            prefix=load_plugin("prefix", prefix).Config(),
            model=ModelConfig(name="tiny"),
            cache=CacheConfig(block_size=4, num_blocks=num_blocks, watermark=0.0),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64),
            workload=workload or WorkloadConfig(),
            progress=False,
        ),
        make_backend(native),
    )


def step_to_the_end(engine: Engine) -> None:
    """Steps until every request has finished, checking every invariant (the policy's
    own included) after every step."""
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()


def _engine_run(policy: str, prefix: str, native: bool, seed: int) -> tuple[Any, Any]:
    """A tight pool: 30 ragged requests, a third of them sharing a 24-token head, stepped
    to the end. Returns each request's tokens, and the run's prefix-cache hits and
    preemptions."""
    engine = tiny_engine(policy, 40, native=native, prefix=prefix)
    assert isinstance(engine.cache.eviction, POLICIES[policy][0])
    rng = random.Random(seed)
    heads = [rng.choices(range(3, 500), k=24) for _ in range(3)]
    ids = []
    for _ in range(30):
        prompt = rng.choice(heads)[: rng.choice((0, 12, 24))] + rng.choices(range(3, 500), k=8)
        sampling = SamplingParams(max_tokens=rng.choice((4, 12)), ignore_eos=True, seed=1)
        ids.append(engine.add_request(prompt, sampling))
    step_to_the_end(engine)
    summary = engine.summary()
    tokens = [engine.output(i).output_token_ids for i in ids]
    return tokens, (summary["prefix_cache_hits"], summary["num_preemptions_total"])


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
@pytest.mark.parametrize("policy", ["slru", "lfu", "chain_aware"])
def test_each_policy_runs_an_engine_the_same_on_both_backends(policy, prefix):
    native = _engine_run(policy, prefix, True, seed=7)
    assert native == _engine_run(policy, prefix, False, seed=7)
    assert native[1][0] > 0  # the shared heads hit


@pytest.mark.parametrize("native", [True, False])
def test_under_radix_a_policy_picks_among_the_tree_s_tails(native):
    """slru's choice among the tree's candidates: the first tail not hit since it was
    cached. A 13-token prompt used twice (its second use hits its 3 whole blocks), then two
    one-off prompts: room for a new prompt takes the one-offs' tails before the reused
    prefix's, where the tree's own order (partly filled blocks, then the least recently
    used leaf) takes the reused prefix's."""

    def run(policy: str) -> int:
        engine = tiny_engine(policy, 12, native=native, prefix="radix", max_num_seqs=1)
        sampling = SamplingParams(max_tokens=1, ignore_eos=True)
        reused = list(range(10, 23))  # 3 blocks and a partly filled one
        prompts = (reused, reused, list(range(100, 112)), list(range(200, 212)))
        for prompt in (*prompts, list(range(300, 320))):  # the last, 5 blocks, evicts
            engine.add_request(prompt, sampling)
            step_to_the_end(engine)
        probe = engine.add_request(reused[:12] + [1], sampling)
        step_to_the_end(engine)
        return engine.output(probe).num_cached_tokens

    assert run("slru") == 12  # the reused prefix survived
    assert run("lru") < 12


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), num_blocks=st.sampled_from([32, 40, 48]))
def test_no_policy_beats_belady_s_opt_on_its_own_run(policy, seed, num_blocks):
    """Each policy's first-admission hit rate is at most OPT's at the same pool on the
    same run's block accesses, on random multi-turn runs of the tiny model in small pools,
    up to one block of hits: OPT bounds every policy on the recorded stream's model of the
    pool (its pinned blocks read once per step), which an engine run can pass by a block
    (seed 2204 at 48 blocks: lru hits 306 blocks, as the LRU curve predicts, where OPT and
    lru simulated block by block on the stream hit 305; ``tests/engine/test_reuse_opt.py``
    checks the bound on streams)."""
    workload = WorkloadConfig(
        name="multiturn",
        num_requests=40,
        seed=seed,
        shared_prefix_len=16,
        min_turns=2,
        max_turns=4,
        message_len=10,
        min_output_len=2,
        max_output_len=8,
        arrival_rate=20.0,
        think_time_s=0.05,
    )
    engine = tiny_engine(policy, num_blocks, max_num_seqs=3, workload=workload)
    driver = WorkloadDriver(engine)
    driver.add_workload()
    summary = driver.run().summary
    share = summary[mk.PREFIX_CACHE_HIT_RATE_OF_OPT.key]
    opt = summary[mk.PREFIX_CACHE_HIT_RATE_OPT.key]
    assert share is not None and share > 0
    # the measured hits beyond OPT's, in tokens (both rates are over the first queries)
    queries = summary[mk.PREFIX_CACHE_FIRST_QUERIES.key]
    excess = summary[mk.PREFIX_CACHE_FIRST_HITS.key] - opt * queries
    assert excess <= 4 + 1e-6, (summary[mk.PREFIX_CACHE_FIRST_HITS.key], opt * queries)

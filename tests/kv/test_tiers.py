"""KV tiers under the cache manager, built by hand: what is written down (by write policy),
what a re-admission loads back and from which level, the load-or-recompute choice, failed
loads, and the integrity of it all after every operation. Payloads are labels the test
gives each saved block, so a load can be traced to the block that was written down.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from enginekit_plugins.allocator.paged import PagedAllocator, PagedConfig
from enginekit_plugins.eviction.lru import LRUConfig, LRUEviction
from enginekit_plugins.prefix.block_hash import BlockHashConfig, BlockHashPrefixCache
from enginekit_plugins.prefix.radix import RadixConfig, RadixPrefixCache
from enginekit_plugins.tier.host import HostTier
from hypothesis import event, given, settings
from hypothesis import strategies as st

from enginekit.config import TierConfig
from enginekit.errors import ConfigError
from enginekit.interfaces.tier import KVTier, LruIndex, Payload, TierContext
from enginekit.kv.backend import make_backend, make_context
from enginekit.kv.manager import KVCacheManager
from enginekit.kv.tiers import TierStack
from enginekit.request import Request, SamplingParams
from enginekit.spec.kv import KVSpec
from enginekit.spec.model import model_preset
from enginekit.spec.restore_cost import RestoreCost
from enginekit.step import TierLoad

BLOCK = 4
SPEC = KVSpec.of(model_preset("tiny"), bits_per_element=32, block_size=BLOCK)
CONTEXT = TierContext(SPEC.bytes_per_block, "test", True, 50e9, 1 << 40)


class DictTier(KVTier):
    """A level written from the interfaces alone, as a third party would: an LRU of
    ``capacity`` blocks whose loads fail from key ``failing_from`` on."""

    def __init__(self, capacity: int, failing: Sequence[int] = ()) -> None:
        super().__init__(TierConfig(name="dict"), CONTEXT)
        self._index = LruIndex(capacity)
        self._failing = set(failing)

    @property
    def capacity_blocks(self) -> int:
        return self._index.capacity

    @property
    def bytes_per_s(self) -> float:
        return 10e9

    def num_blocks(self) -> int:
        return len(self._index)

    def num_present(self, keys: Sequence[int]) -> int:
        return self._index.num_leading(keys)

    def load(self, keys: Sequence[int]) -> list[Payload]:
        payloads = []
        for key in keys:
            if key not in self._index or key in self._failing:
                self.num_failures += key in self._failing
                break
            payloads.append(self._index.get(key))
        return payloads

    def store(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        return self._index.put(key, payload)


def host(num_blocks: int) -> HostTier:
    return HostTier(
        HostTier.Config(host_gib=num_blocks * SPEC.bytes_per_block / (1 << 30)), CONTEXT
    )


def make_manager(
    levels: Sequence[KVTier],
    write_policy: str = "on_evict",
    prefix: str = "block_hash",
    num_blocks: int = 8,
    costs: RestoreCost | None = None,
    native: bool = True,
) -> KVCacheManager:
    backend = make_backend(native)
    attention = LRUEviction.attention(LRUConfig(), None)
    context = make_context(backend, num_blocks, SPEC, 64, attention)
    prefix_cache = (
        BlockHashPrefixCache(BlockHashConfig(), context)
        if prefix == "block_hash"
        else RadixPrefixCache(RadixConfig(), context)
    )
    names = [f"level{i}" for i in range(len(levels))]
    tiers = TierStack(levels, names, backend, BLOCK, SPEC.bytes_per_block, write_policy, costs)
    return KVCacheManager(
        context,
        PagedAllocator(PagedConfig(), context),
        prefix_cache,
        LRUEviction(LRUConfig(), context),
        watermark=0.0,
        tiers=tiers,
    )


def request(seq_id: int, prompt: Sequence[int]) -> Request:
    return Request(str(seq_id), seq_id, list(prompt), SamplingParams(max_tokens=8), 0.0)


def run_prompt(manager: KVCacheManager, r: Request) -> int:
    """Admits ``r``, computes its whole prompt and releases it (a request that finished
    with its prompt); returns the tokens its admission loaded from a tier."""
    admission = manager.admit(r, step_has_work=False)
    assert admission is not None
    manager.check_integrity()
    r.num_computed_tokens += manager.reserve_prefill(r, r.num_tokens - r.num_computed_tokens)
    manager.check_integrity()
    manager.release(r)
    manager.check_integrity()
    return admission.num_loaded_tokens


def step(manager: KVCacheManager, labels: dict[int, str]) -> tuple[list[int], list[TierLoad]]:
    """Closes a step and runs it as an executor would: each saved block is read out as a
    payload naming the block's label (``labels``: device block -> its content); each loaded
    payload becomes its device block's label. Returns (saved blocks, loads)."""
    blocks = manager.take_step_blocks([], [], None)
    saved = [save.device_block_id for save in blocks.tier_saves]
    manager.complete_tier_saves([labels[b] for b in saved])
    for load in blocks.tier_loads:
        labels[load.device_block_id] = load.payload  # type: ignore[assignment]
    manager.finish_step([], [])
    manager.check_integrity()
    return saved, list(blocks.tier_loads)


def label_table(manager: KVCacheManager, r: Request, labels: dict[int, str], name: str) -> None:
    """The executor computed ``r``'s blocks: block i of its table holds ``name``'s i-th."""
    for i, block_id in enumerate(manager.tables.block_ids(r.seq_id)):
        labels[block_id] = f"{name}{i}"


PROMPT_A = list(range(13))  # 3 full blocks and 1 token
PROMPT_B = list(range(100, 129))  # 29 tokens: 8 blocks, the whole pool


def fill_then_evict(manager: KVCacheManager, labels: dict[int, str]) -> list[str]:
    """A computes its prompt and finishes; B then needs the whole pool, evicting A's cached
    blocks. Returns the labels of the blocks the step after B's admission saves."""
    a = request(0, PROMPT_A)
    assert manager.admit(a, step_has_work=False) is not None
    a.num_computed_tokens += manager.reserve_prefill(a, 13)
    label_table(manager, a, labels, "a")
    manager.release(a)
    step(manager, labels)
    b = request(1, PROMPT_B)
    assert manager.admit(b, step_has_work=False) is not None
    b.num_computed_tokens += manager.reserve_prefill(b, 29)
    saved, _ = step(manager, labels)  # reads A's blocks out before B's compute overwrites
    saved_labels = [labels[block_id] for block_id in saved]
    label_table(manager, b, labels, "b")
    manager.release(b)
    step(manager, labels)
    return saved_labels


@pytest.mark.parametrize("native", [True, False], ids=["native", "pyref"])
@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_blocks_the_device_evicts_are_written_down_and_loaded_back_in_order(
    native: bool, prefix: str
) -> None:
    level = host(8)
    manager = make_manager([level], prefix=prefix, native=native)
    labels: dict[int, str] = {}
    assert sorted(fill_then_evict(manager, labels)) == ["a0", "a1", "a2"]  # full blocks only
    assert level.num_blocks() == 3
    again = request(2, PROMPT_A)
    admission = manager.admit(again, step_has_work=False)
    assert admission is not None
    assert admission.num_matched_tokens == 12 and admission.num_loaded_tokens == 12
    assert again.num_computed_tokens == 12  # the last token is computed for its logits
    manager.check_integrity()
    _, loads = step(manager, labels)
    table = manager.tables.block_ids(again.seq_id)
    assert [load.device_block_id for load in loads] == table[:3]
    assert [load.payload for load in loads] == ["a0", "a1", "a2"]
    assert [s.num_hit_blocks for s in manager.tier_stats()] == [3]


def test_write_through_writes_a_request_s_full_blocks_as_it_releases_them() -> None:
    level = host(8)
    manager = make_manager([level], write_policy="write_through")
    labels: dict[int, str] = {}
    a = request(0, PROMPT_A)
    assert manager.admit(a, step_has_work=False) is not None
    a.num_computed_tokens += manager.reserve_prefill(a, 13)
    label_table(manager, a, labels, "a")
    manager.release(a)
    saved, _ = step(manager, labels)
    assert [labels[b] for b in saved] == ["a0", "a1", "a2"]
    assert level.num_blocks() == 3
    # Released again with the same content: nothing is written twice.
    assert run_prompt(manager, request(1, PROMPT_A)) == 0  # the device still has them
    saved, _ = step(manager, labels)
    assert saved == []


def test_second_hit_writes_only_blocks_two_requests_used() -> None:
    level = host(8)
    manager = make_manager([level], write_policy="second_hit")
    labels: dict[int, str] = {}
    assert fill_then_evict(manager, labels) == []  # A's blocks were used once
    assert level.num_blocks() == 0
    manager = make_manager([level], write_policy="second_hit")
    labels = {}
    a = request(0, PROMPT_A)
    run_prompt(manager, a)
    assert run_prompt(manager, request(1, PROMPT_A)) == 0  # a device hit: a second use
    step(manager, labels)
    labels.update({b: f"a{i}" for i, b in enumerate(manager.pool.evictable_block_ids())})
    b = request(2, PROMPT_B)
    assert manager.admit(b, step_has_work=False) is not None
    saved, _ = step(manager, labels)
    assert len(saved) == 3 and level.num_blocks() == 3


def test_a_level_full_hands_its_least_recent_blocks_to_the_next_level() -> None:
    fast, slow = DictTier(1), DictTier(8)
    manager = make_manager([fast, slow])
    labels: dict[int, str] = {}
    fill_then_evict(manager, labels)
    assert (fast.num_blocks(), slow.num_blocks()) == (1, 2)
    stats = manager.tier_stats()
    assert [s.num_written_blocks for s in stats] == [3, 2]
    assert [s.num_evicted_blocks for s in stats] == [2, 0]
    again = request(2, PROMPT_A)
    admission = manager.admit(again, step_has_work=False)
    assert admission is not None and admission.num_loaded_tokens == 12
    _, loads = step(manager, labels)
    assert [load.payload for load in loads] == ["a0", "a1", "a2"]
    assert sorted({load.level for load in loads}) == [0, 1]
    assert [s.num_hit_blocks for s in manager.tier_stats()] == [1, 2]


def test_a_load_that_fails_midway_loads_the_blocks_before_it_and_computes_the_rest() -> None:
    level = DictTier(8)
    manager = make_manager([level])
    labels: dict[int, str] = {}
    fill_then_evict(manager, labels)
    keys = manager.tiers.keys(request(9, PROMPT_A), 3)  # type: ignore[union-attr]
    level._failing = {keys[1]}  # the second block's bytes are lost
    again = request(2, PROMPT_A)
    admission = manager.admit(again, step_has_work=False)
    assert admission is not None and admission.num_loaded_tokens == 4
    assert again.num_computed_tokens == 4
    _, loads = step(manager, labels)
    assert [load.payload for load in loads] == ["a0"]
    assert level.num_failures == 1


def test_a_load_slower_than_computing_the_tokens_is_not_made() -> None:
    slow = RestoreCost(swap_s_per_block=1.0, prefill_s_per_token=1e-9, attention_s_per_pair=0)
    manager = make_manager([host(8)], costs=slow)
    labels: dict[int, str] = {}
    fill_then_evict(manager, labels)
    assert run_prompt(manager, request(2, PROMPT_A)) == 0
    assert manager.tiers.num_avoided_blocks == 3  # type: ignore[union-attr]
    fast = RestoreCost(swap_s_per_block=1.0, prefill_s_per_token=1.0, attention_s_per_pair=0)
    manager = make_manager([host(8)], costs=fast)
    fill_then_evict(manager, {})
    assert run_prompt(manager, request(2, PROMPT_A)) == 12


def test_an_unknown_write_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="on_evict, write_through, second_hit"):
        make_manager([host(8)], write_policy="on_eviction")


def test_a_host_level_larger_than_the_host_is_refused() -> None:
    small_host = CONTEXT._replace(host_memory_bytes=1 << 30)
    with pytest.raises(ConfigError, match="more than the host's memory"):
        HostTier(HostTier.Config(host_gib=2.0), small_host)


@pytest.mark.parametrize("prefix", ["block_hash", "radix"])
def test_two_requests_admitted_in_one_step_load_their_shared_blocks_once(prefix: str) -> None:
    manager = make_manager([host(8)], prefix=prefix)
    labels: dict[int, str] = {}
    fill_then_evict(manager, labels)
    first, second = request(2, PROMPT_A), request(3, PROMPT_A + [7, 7, 7, 7])
    admitted = manager.admit(first, step_has_work=False)
    assert admitted is not None and admitted.num_loaded_tokens == 12
    first.num_computed_tokens += manager.reserve_prefill(first, 1)
    # the second waits for the step that loads them (its match is deferred), or shares
    # them at once; it never loads them again
    again = manager.admit(second, step_has_work=True)
    assert again is None or again.num_loaded_tokens == 0
    _, loads = step(manager, labels)
    assert len(loads) == 3
    if again is None:
        again = manager.admit(second, step_has_work=False)
        assert again is not None
    assert again.num_loaded_tokens == 0 and again.num_matched_tokens >= 12
    _, loads = step(manager, labels)
    assert loads == []


class CheckingTier(DictTier):
    """A level whose payloads are the keys of the content the executor read out: storing
    a payload under another key means a block was written down under a wrong name."""

    def store(self, key: int, payload: Payload) -> Sequence[tuple[int, Payload]]:
        assert payload == key, f"block content {payload!r} written under key {key}"
        return super().store(key, payload)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_block_written_down_and_loaded_back_holds_its_key_s_content(data) -> None:
    """Random admissions (prompts drawn from a few shared prefixes), prefills and releases
    under every write policy, both prefix caches and one or two levels, executed as an
    executor does (saves read before the step's loads, copies and compute write): every
    payload written is its key's content, every load puts a prompt block's own content in
    its place, and the cache's invariants hold after every operation."""
    prefix = data.draw(st.sampled_from(["block_hash", "radix"]))
    policy = data.draw(st.sampled_from(["on_evict", "write_through", "second_hit"]))
    levels = [CheckingTier(data.draw(st.integers(1, 6)))]
    if data.draw(st.booleans()):
        levels.append(CheckingTier(data.draw(st.integers(1, 12))))
    manager = make_manager(levels, write_policy=policy, prefix=prefix, num_blocks=8)
    backend = make_backend(True)
    stems = [[s * 50 + t for t in range(20)] for s in range(2)]
    content: dict[int, object] = {}  # device block -> the key of what it holds (or a tag)
    computed: list[tuple[int, object]] = []  # writes the step being scheduled computes
    running: list[Request] = []
    seq_ids = iter(range(10**6))

    def run_step() -> None:
        blocks = manager.take_step_blocks([], [], None)
        payloads = [content.get(save.device_block_id) for save in blocks.tier_saves]
        manager.complete_tier_saves(payloads)
        for load in blocks.tier_loads:
            content[load.device_block_id] = load.payload
        for copy in blocks.copies:
            content[copy.dst_block_id] = content.get(copy.src_block_id)
        for block_id, label in computed:
            content[block_id] = label
        computed.clear()
        manager.finish_step([], running)
        manager.check_integrity()

    for _ in range(data.draw(st.integers(8, 40))):
        action = data.draw(st.sampled_from(["admit", "admit", "release", "step"]))
        if action == "admit":
            stem = data.draw(st.sampled_from(stems))
            length = data.draw(st.integers(2, 20))
            tail = data.draw(st.lists(st.integers(1000, 1003), max_size=9))
            r = request(next(seq_ids), stem[:length] + tail)
            num_loads_before = len(manager._block_ops._tier_loads)
            admission = manager.admit(r, step_has_work=False)
            manager.check_integrity()
            if admission is None:
                continue
            keys = backend.hash_blocks(list(r.token_ids), BLOCK, None)
            table = manager.tables.block_ids(r.seq_id)
            for load in manager._block_ops._tier_loads[num_loads_before:]:
                if load.device_block_id in table:
                    index = table.index(load.device_block_id)
                    assert load.payload == keys[index], "a load put other content in a block"
            start = r.num_computed_tokens
            r.num_computed_tokens += manager.reserve_prefill(r, r.num_tokens - start)
            manager.check_integrity()
            table = manager.tables.block_ids(r.seq_id)
            for index in range(start // BLOCK, len(table)):
                full = (index + 1) * BLOCK <= r.num_computed_tokens
                computed.append((table[index], keys[index] if full else ("partial", r.seq_id)))
            running.append(r)
        elif action == "release" and running:
            r = running.pop(data.draw(st.integers(0, len(running) - 1)))
            run_step()  # its compute has run before it finishes
            manager.release(r)
            manager.check_integrity()
        else:
            run_step()
    run_step()
    stats = manager.tier_stats()
    event(f"blocks written: {min(sum(s.num_written_blocks for s in stats), 3)}+")
    event(f"blocks loaded: {min(sum(s.num_hit_blocks for s in stats), 3)}+")

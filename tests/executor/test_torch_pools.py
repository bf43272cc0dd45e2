"""How large the torch executor's pools are, and who decides: the device KV pool sized
from what the run can use, the host swap pool sized by the swap plugin's one key
(``preemption.swap_space_gib``) for both its bookkeeping and the executor's host tensors,
allocated as swaps reach it; the report says what was chosen."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from torch_helpers import prompts

from enginekit import Engine, SamplingParams
from enginekit.config import CacheConfig, EngineConfig, ModelConfig, PreemptionConfig
from enginekit.errors import ConfigError, KVCacheError, OutOfBlocksError
from enginekit.executor.torch import factory as torch_factory
from enginekit.executor.torch.kv_tensors import PagedKVTensors
from enginekit.kernels.ops import REFERENCE_OPS
from enginekit.kv.swap_space import SwapSpace
from enginekit.spec.kv import KVSpec, swap_space_num_blocks
from enginekit.spec.model import model_preset
from enginekit.step import BlockSwap

TINY = ["executor=torch", "model=tiny", "progress=false"]


# -- the host swap pool: one key, one rule --------------------------------------------------


def test_the_removed_cache_swap_gib_is_refused_naming_the_key_that_sizes_the_pool():
    with pytest.raises(ConfigError, match="preemption.swap_space_gib"):
        Engine.from_overrides([*TINY, "+preemption=swap", "cache.swap_gib=0.000001"])


def test_a_name_only_swap_config_sizes_both_sides_alike():
    """Built from a config that names the plugin and nothing else (its defaults filled
    in by the engine), the executor's host pool and the plugin's bookkeeping still agree."""
    config = EngineConfig(
        preemption=PreemptionConfig(name="swap"),
        model=ModelConfig(name="tiny", max_model_len=64),
        cache=CacheConfig(block_size=4, num_blocks=24),
        executor="torch",
        progress=False,
    )
    eng = Engine(OmegaConf.structured(config))
    host = eng.cache.swap_space
    assert eng.executor.kv_tensors.num_host_blocks == host.num_blocks == 24  # capped at the pool
    assert eng.describe()["swap_pool_blocks"] == 24
    assert eng.describe()["swap_pool_bytes"] == 24 * eng.kv_spec.bytes_per_block


def test_the_host_pool_holds_at_most_the_device_pool_and_its_key_refuses_negatives():
    assert swap_space_num_blocks(4.0, 4096, num_device_blocks=100) == 100
    assert swap_space_num_blocks(1e-6, 1024, num_device_blocks=100) == 1
    assert swap_space_num_blocks(0.0, 1024, num_device_blocks=100) == 0
    with pytest.raises(ConfigError, match="preemption.swap_space_gib"):
        swap_space_num_blocks(-1.0, 1024, num_device_blocks=100)


def swapping_engine(*overrides: str) -> Engine:
    """Tiny, a pool of 24 blocks of 4 that six prompts overflow, swap made cheap so that
    the swap plugin always swaps."""
    eng = Engine.from_overrides(
        [*TINY, "+prefix=none", "+preemption=swap", "cache.block_size=4",
         "cache.num_blocks=24", "cache.watermark=0", *overrides]
    )  # fmt: skip
    policy = eng.scheduler.preemption
    policy.costs = dataclasses.replace(policy.costs, swap_s_per_block=1e-12)
    for prompt in prompts(512, shared=13, seed=1):
        eng.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    return eng


@pytest.mark.parametrize("swap_space_gib", ["0.00003", "4.0"])
def test_swaps_run_to_the_end_within_a_host_pool_of_any_size(swap_space_gib):
    """A host pool of 15 blocks of 2 KiB or of 4 GiB (capped at the device pool's 24):
    the executor's host tensors grow with the host ids used, never past the pool nor
    past what the bookkeeping handed out, rounded up to a doubling."""
    eng = swapping_engine(f"preemption.swap_space_gib={swap_space_gib}")
    host = eng.cache.swap_space
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
        allocated = eng.executor.kv_tensors.num_host_blocks_allocated
        assert allocated <= min(host.num_blocks, max(16, 2 * host.num_touched_blocks))
    summary = eng.summary()
    assert summary["num_requests_finished"] == 6
    assert summary["num_preemptions_by_kind"].get("swap", 0) > 0
    assert summary["swap_in_bytes_total"] == summary["swap_out_bytes_total"] > 0
    assert eng.describe()["swap_pool_blocks"] == host.num_blocks
    assert host.num_blocks == (15 if swap_space_gib == "0.00003" else 24)


def test_the_host_pool_tensors_grow_keeping_the_blocks_they_hold():
    spec = KVSpec.of(model_preset("tiny"), bits_per_element=32, block_size=4)
    tensors = PagedKVTensors(spec, 40, 40, torch.float32, torch.device("cpu"), REFERENCE_OPS)
    for t in tensors.on_device.block_tensors:
        t.copy_(torch.randn(t.shape))
    assert tensors.num_host_blocks_allocated == 0
    tensors.swap_out([BlockSwap(3, 0)])
    assert tensors.num_host_blocks_allocated == 16
    tensors.swap_out([BlockSwap(5, 20)])  # beyond the first allocation: doubles
    assert tensors.num_host_blocks_allocated == 32
    tensors.swap_in([BlockSwap(7, 0), BlockSwap(8, 20)])
    assert torch.equal(tensors.on_device.data[7], tensors.on_device.data[3])
    assert torch.equal(tensors.on_device.data[8], tensors.on_device.data[5])
    with pytest.raises(KVCacheError, match="outside the swap space of 40 blocks"):
        tensors.swap_out([BlockSwap(1, 40)])


def test_host_swap_pool_bookkeeping_grows_with_use_not_with_its_size():
    """A pool of 2**40 blocks costs what its used blocks cost: ids are handed out lowest
    first, freed ones reused before new ones, and the integrity check walks only those."""
    pool = SwapSpace(1 << 40)
    assert pool.put(7, [5, -1, 6]) == [0, 1]  # a hole takes no host block
    assert pool.put(8, [9]) == [2] and pool.num_touched_blocks == 3
    assert pool.take(7).layout == [(False, 1), (True, 1), (False, 1)]
    pool.check_integrity()
    with pytest.raises(OutOfBlocksError):
        SwapSpace(2).put(9, [1, 2, 3])
    pool.release_quarantined()
    assert pool.put(9, [1, 2, 3]) == [0, 1, 3]  # the lowest free first
    assert pool.num_free_blocks == (1 << 40) - 4
    pool.check_integrity()


# -- the device pool ------------------------------------------------------------------------


def test_the_default_cpu_pool_holds_what_the_run_can_use_and_the_report_says_so():
    eng = Engine.from_overrides(
        [*TINY, "scheduler.max_num_seqs=8", "model.max_model_len=250", "cache.block_size=16"]
    )
    described = eng.describe()
    assert eng.cache.num_blocks == described["kv_pool_blocks"] == 8 * 16  # ceil(250 / 16) each
    assert described["kv_pool_bytes"] == 8 * 16 * eng.kv_spec.bytes_per_block
    assert described["kv_pool_sized_by"] == "scheduler.max_num_seqs x max_model_len"
    assert eng.executor.kv_tensors.on_device.num_blocks == 8 * 16


def _pool_cfg(**cache):
    return OmegaConf.create(
        {
            "cache": {"num_blocks": None, "memory_gib": None, "block_size": 16, **cache},
            "scheduler": {"max_num_seqs": 256},
            "hardware": {"memory_utilization": 0.9, "reserve_gib": 2.0},
        }
    )


def test_the_default_cpu_pool_is_capped_by_memory(monkeypatch):
    shape = dataclasses.replace(model_preset("tiny"), max_model_len=1 << 20)
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch_factory, "available_memory_bytes", lambda device: 64 << 30)
    size = torch_factory.pool_size(_pool_cfg(), shape, cpu, 4096)
    assert size == (torch_factory.CPU_POOL_CAP_GIB * (1 << 30) // 4096, "1 GiB cap")
    monkeypatch.setattr(torch_factory, "available_memory_bytes", lambda device: 1 << 30)
    size = torch_factory.pool_size(_pool_cfg(), shape, cpu, 4096)
    assert size == ((1 << 29) // 4096, "50% of the available memory")


@pytest.mark.parametrize("key", ["cache.num_blocks=1000000000", "cache.memory_gib=100000"])
def test_a_pool_larger_than_the_memory_is_refused_before_allocating(key):
    with pytest.raises(ConfigError, match="GiB is available") as info:
        Engine.from_overrides([*TINY, key])
    assert key in str(info.value)


def test_the_memory_available_is_at_most_what_the_cgroup_leaves(monkeypatch):
    monkeypatch.setattr(torch_factory, "_cgroup_room", lambda: 1 << 20)
    assert torch_factory.available_memory_bytes(torch.device("cpu")) == 1 << 20
    with pytest.raises(ConfigError, match="only 0.00 GiB is available"):
        Engine.from_overrides([*TINY, "cache.num_blocks=4096"])

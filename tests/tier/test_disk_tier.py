"""The ``disk`` level on its own: block files that come back bit for bit, least recently
used evicted first (its file deleted, its bytes handed down), a missing, truncated or
corrupted file a counted miss and never wrong bytes, and a folder or size that cannot
work refused before the run."""

from __future__ import annotations

import os

import numpy as np
import pytest
from enginekit_plugins.tier.disk import HEADER, DiskTier, file_name

from enginekit.errors import ConfigError
from enginekit.interfaces.tier import TierContext

BLOCK_BYTES = 4096
GIB = 1 << 30
CONTEXT = TierContext(BLOCK_BYTES, "model-abc", True, 50e9, 1 << 40)


def level(path, num_blocks: int = 4, context: TierContext = CONTEXT, **config) -> DiskTier:
    return DiskTier(
        DiskTier.Config(
            disk_path=None if path is None else str(path),
            disk_gib=num_blocks * BLOCK_BYTES / GIB,
            **config,
        ),
        context,
    )


def payload(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)


def same(got, want: np.ndarray) -> bool:
    return bytes(got) == want.tobytes()


def test_blocks_come_back_bit_for_bit_in_a_folder_per_namespace(tmp_path):
    disk = level(tmp_path)
    keys = [11, 2**64 - 1, 0]
    for key in keys:
        assert list(disk.store(key, payload(key % 1000))) == []
    assert disk.num_blocks() == 3 and disk.capacity_blocks == 4
    assert disk.num_present(keys) == 3 and disk.num_present([11, 5, 0]) == 1
    got = disk.load(keys)
    assert [same(g, payload(k % 1000)) for g, k in zip(got, keys, strict=True)] == [True] * 3
    names = sorted(os.listdir(tmp_path / "model-abc"))
    assert names == sorted(file_name(k) for k in keys)
    assert file_name(11) == "000000000000000b.kvb"
    assert disk.load([11, 5, 0]) == disk.load([11])[:1] and len(disk.load([5, 11])) == 0
    assert disk.num_failures == 0
    disk.check_integrity()


def test_the_least_recently_used_block_is_evicted_its_file_deleted_its_bytes_handed_down(
    tmp_path,
):
    disk = level(tmp_path, num_blocks=3)
    for key in (1, 2, 3):
        disk.store(key, payload(key))
    disk.load([1])  # 2 is now the least recently used
    disk.store(3, payload(3))  # held already: refreshed, not rewritten
    evicted = disk.store(4, payload(4))
    assert [k for k, _ in evicted] == [2] and same(evicted[0][1], payload(2))
    assert not (tmp_path / "model-abc" / file_name(2)).exists()
    assert [k for k, _ in disk.store(5, payload(5))] == [1]
    assert disk.num_present([3]) == 1 and disk.num_present([1]) == disk.num_present([2]) == 0
    assert disk.num_blocks() == 3
    disk.check_integrity()


def _corrupt(path):
    data = bytearray(path.read_bytes())
    data[HEADER.size + 100] ^= 0x01  # one bit of the payload
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-1])


def _extend(path):
    path.write_bytes(path.read_bytes() + b"\0")


def _remove(path):
    path.unlink()


def _swap_with_another_key(path):
    other = path.with_name(file_name(1))
    path.write_bytes(other.read_bytes())


@pytest.mark.parametrize("damage", [_corrupt, _truncate, _extend, _remove, _swap_with_another_key])
def test_a_damaged_file_is_a_counted_miss_that_ends_the_load_and_drops_the_key(tmp_path, damage):
    disk = level(tmp_path)
    for key in (1, 2, 3):
        disk.store(key, payload(key))
    damage(tmp_path / "model-abc" / file_name(2))
    got = disk.load([1, 2, 3])
    assert len(got) == 1 and same(got[0], payload(1))  # the block before it, never block 2
    assert disk.num_failures == 1
    assert disk.num_present([2]) == 0 and disk.num_blocks() == 2
    assert not (tmp_path / "model-abc" / file_name(2)).exists()
    assert same(disk.load([3])[0], payload(3))
    disk.check_integrity()


def test_a_failed_write_is_dropped_and_counted(tmp_path):
    disk = level(tmp_path)
    disk.store(1, payload(1))
    folder = tmp_path / "model-abc"
    for name in os.listdir(folder):
        os.unlink(folder / name)
    folder.rmdir()  # the folder went away under the level: every write fails
    assert list(disk.store(2, payload(2))) == []
    assert list(disk.store(3, object())) == []  # no buffer protocol: dropped as well
    assert disk.num_failures == 2
    assert disk.num_present([2]) == disk.num_present([3]) == 0
    assert disk.load([1]) == [] and disk.num_failures == 3  # its file went too


def test_an_unwritable_folder_is_refused_up_front(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"")
    with pytest.raises(ConfigError, match="tier.disk_path: cannot write block files in"):
        level(a_file / "blocks")


def test_more_than_the_free_space_is_refused_up_front(tmp_path):
    with pytest.raises(ConfigError, match=r"tier.disk_gib=.* is more than the free space"):
        DiskTier(DiskTier.Config(disk_path=str(tmp_path), disk_gib=1e9), CONTEXT)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"disk_gib": 0.0}, "tier.disk_gib must be > 0"),
        ({"disk_gib": -1.0}, "tier.disk_gib must be > 0"),
        ({"disk_gib": 1e-9}, "holds no block"),
        ({"disk_gb_per_s": 0.0}, "tier.disk_gb_per_s must be > 0"),
    ],
)
def test_sizes_and_speeds_that_cannot_work_are_refused(tmp_path, config, message):
    with pytest.raises(ConfigError, match=message):
        DiskTier(DiskTier.Config(disk_path=str(tmp_path), **config), CONTEXT)


def test_without_a_path_the_level_makes_its_own_folder_and_close_removes_it():
    disk = level(None)
    assert disk.folder is not None
    root = disk.folder.parent
    disk.store(7, payload(7))
    assert same(disk.load([7])[0], payload(7))
    disk.close()
    assert not root.exists()
    disk.close()  # twice is harmless


def test_a_user_folder_keeps_its_files_for_the_next_engine_of_the_namespace(tmp_path):
    first = level(tmp_path)
    for key in (1, 2, 3):
        first.store(key, payload(key))
    first.close()
    assert len(os.listdir(tmp_path / "model-abc")) == 3
    second = level(tmp_path, num_blocks=2)  # adopts the newest that fit
    assert second.num_blocks() == 2
    kept = [key for key in (1, 2, 3) if second.num_present([key])]
    assert len(kept) == 2
    for key in kept:
        assert same(second.load([key])[0], payload(key))
    other = level(tmp_path, context=CONTEXT._replace(namespace="other-model"))
    assert other.num_blocks() == 0 and other.load([1]) == []


def test_the_speed_is_the_drive_s_at_most_the_host_link_s(tmp_path):
    assert level(tmp_path, disk_gb_per_s=2.0).bytes_per_s == 2e9
    slow_link = CONTEXT._replace(link_bytes_per_s=1e9)
    assert level(tmp_path, context=slow_link, disk_gb_per_s=6.0).bytes_per_s == 1e9


def test_a_level_that_moves_no_data_keeps_an_index_and_writes_no_file(tmp_path):
    sim = CONTEXT._replace(moves_data=False)
    disk = level(tmp_path / "never", num_blocks=2, context=sim)
    assert list(disk.store(1, None)) == [] and list(disk.store(2, None)) == []
    assert disk.load([1, 2, 3]) == [None, None]
    assert disk.store(3, None) == [(1, None)]
    assert not (tmp_path / "never").exists()
    # a simulated drive is as large as it says, whatever this machine has free
    assert DiskTier(DiskTier.Config(disk_gib=1e9), sim).capacity_blocks == int(1e9 * GIB) // 4096

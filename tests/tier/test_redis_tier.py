"""The ``redis`` level against a real Redis server (the ``redis_server`` fixture): blocks
that come back bit for bit under keys every process spells alike, a server that dies
mid-run a counted miss and never an exception, a server that cannot be reached refused up
front naming its URL, and redis-py missing refused naming the extra that brings it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO_ROOT
from enginekit_plugins.tier.redis import HEADER, RedisTier, redis_key

from enginekit.errors import ConfigError
from enginekit.interfaces.tier import TierContext

BLOCK_BYTES = 4096
GIB = 1 << 30
CONTEXT = TierContext(BLOCK_BYTES, "enginekit-test", True, 50e9, 1 << 40)


def level(url: str, context: TierContext = CONTEXT, **config) -> RedisTier:
    return RedisTier(RedisTier.Config(redis_url=url, **config), context)


def payload(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)


def same(got, want: np.ndarray) -> bool:
    return bytes(got) == want.tobytes()


def test_blocks_come_back_bit_for_bit_under_the_namespaced_key(redis_server):
    import redis

    tier = level(redis_server.url, redis_gib=1.0, redis_gb_per_s=2.0)
    keys = [5, 2**64 - 1, 0]
    for key in keys:
        assert list(tier.store(key, payload(key % 100))) == []  # the server evicts, not the level
    assert tier.num_present(keys) == 3 and tier.num_present([5, 6, 0]) == 1
    got = tier.load([*keys, 6, 5])
    assert len(got) == 3
    assert all(same(g, payload(k % 100)) for g, k in zip(got, keys, strict=True))
    assert tier.load([6, 5]) == [] and tier.num_present([]) == 0 and tier.load([]) == []
    assert tier.num_failures == 0
    assert tier.is_shared and tier.num_blocks() == 3
    assert tier.capacity_blocks == GIB // BLOCK_BYTES and tier.bytes_per_s == 2e9
    server = redis.Redis.from_url(redis_server.url)
    assert redis_key("enginekit-test", 5) == "enginekit-test:0000000000000005"
    names = sorted(redis_key(CONTEXT.namespace, k).encode() for k in keys)
    assert sorted(server.keys("*")) == names
    tier.close()


def test_a_value_cut_short_or_of_another_writer_is_a_miss(redis_server):
    import redis

    tier = level(redis_server.url)
    for key in (1, 2, 3):
        tier.store(key, payload(key))
    server = redis.Redis.from_url(redis_server.url)
    name = redis_key(CONTEXT.namespace, 2)
    server.set(name, server.get(name)[: HEADER.size + 10])
    got = tier.load([1, 2, 3])
    assert len(got) == 1 and same(got[0], payload(1))
    server.set(name, b"not a block")
    assert len(tier.load([1, 2, 3])) == 1


def test_a_level_that_moves_no_data_shares_presence_through_empty_markers(redis_server):
    import redis

    sim = level(redis_server.url, CONTEXT._replace(moves_data=False))
    assert list(sim.store(9, None)) == []
    assert sim.num_present([9, 10]) == 1 and sim.load([9, 10]) == [None]
    assert redis.Redis.from_url(redis_server.url).get(redis_key(CONTEXT.namespace, 9)) == b""
    # an engine that moves data finds the key, but a marker is no block: a miss
    real = level(redis_server.url)
    assert real.num_present([9]) == 1 and real.load([9]) == []
    # a block replaces a marker; a marker never replaces a block
    real.store(9, payload(9))
    sim.store(9, None)
    assert same(real.load([9])[0], payload(9))


def test_a_server_killed_mid_run_is_a_counted_miss_and_never_an_exception(redis_server):
    tier = level(redis_server.url)
    tier.store(1, payload(1))
    assert tier.num_present([1]) == 1
    redis_server.kill()
    assert tier.num_present([1]) == 0
    assert tier.load([1]) == []
    assert list(tier.store(2, payload(2))) == []
    assert tier.num_failures == 3
    tier.check_integrity()
    tier.close()


def test_an_unreachable_server_is_refused_up_front_naming_its_url(redis_server):
    url = redis_server.url
    redis_server.kill()  # nothing listens on its port now
    with pytest.raises(ConfigError, match=f"tier.redis_url={url}: cannot reach the Redis server"):
        level(url)
    with pytest.raises(ConfigError, match="tier.redis_url=nowhere://x: cannot reach"):
        level("nowhere://x")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"redis_gib": 0.0}, "tier.redis_gib must be > 0"),
        ({"redis_gib": 1e-9}, "holds no block"),
        ({"redis_gb_per_s": -1.0}, "tier.redis_gb_per_s must be > 0"),
    ],
)
def test_sizes_and_speeds_that_cannot_work_are_refused(config, message):
    with pytest.raises(ConfigError, match=message):
        level("redis://127.0.0.1:1/0", **config)


STORE_SCRIPT = """
import sys
import numpy as np
from enginekit.interfaces.tier import TierContext
from enginekit_plugins.tier.redis import RedisTier

url, namespace = sys.argv[1], sys.argv[2]
tier = RedisTier(RedisTier.Config(redis_url=url), TierContext(4096, namespace, True, 50e9, 1 << 40))
for key in (3, 2**63 + 11, 17):
    block = np.random.default_rng(key % 1000).integers(0, 256, 4096, dtype=np.uint8)
    tier.store(key, block)
print(tier.num_failures)
"""


def test_a_block_one_process_stores_another_process_loads_under_the_same_key(redis_server):
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # unlike this process's, if it is random
    stored = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STORE_SCRIPT), redis_server.url, "shared-ns"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    assert stored.returncode == 0, stored.stderr
    assert stored.stdout.split() == ["0"]
    reader = level(redis_server.url, CONTEXT._replace(namespace="shared-ns"))
    keys = [3, 2**63 + 11, 17]
    assert reader.num_present(keys) == 3
    got = reader.load(keys)
    assert all(same(g, payload(k % 1000)) for g, k in zip(got, keys, strict=True))
    other = level(redis_server.url, CONTEXT._replace(namespace="another-model"))
    assert other.num_present(keys) == 0


def test_without_redis_py_the_level_names_the_extra_to_install(tmp_path):
    from missing_modules import block_modules

    from enginekit.extras import install_hint

    folder = block_modules(tmp_path / "site", ["redis"])
    script = (
        "from enginekit import Engine\n"
        "from enginekit.errors import ConfigError\n"
        "try:\n"
        "    Engine.from_overrides(['+tier=redis', 'progress=false'])\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    hint = install_hint(["tiers"])
    assert result.stdout.strip() == f"+tier=redis: redis is not installed; {hint}"

"""KV tier configurations an engine refuses before it builds anything, each with the reason,
and the command line's exit code for one."""

from __future__ import annotations

import pytest

from enginekit import Engine
from enginekit.errors import ConfigError, PluginError

SMALL = ("workload.num_requests=4", "progress=false")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+tier=host", "tier.host_gib=1000000"], "more than the host's memory"),
        (["+tier=host", "tier.host_gib=0"], "tier.host_gib must be > 0"),
        (["+tier=host", "tier.write_policy=on_eviction"], "on_evict, write_through, second_hit"),
        (["+tier=host", "tier.levels=[none,host]"], "mixes 'none' with levels"),
        (["+tier=host", "tier.levels=[host,host]"], "names 'host' twice"),
        (
            ["+tier=host", "+eviction=sliding_window", "eviction.window=64"],
            "releases blocks out of a window",
        ),
        (  # the simulator models its disk and writes nothing; torch writes real files
            ["+tier=disk", "tier.disk_path=/proc/enginekit-blocks", "executor=torch", "model=tiny"],
            "tier.disk_path",
        ),
    ],
)
def test_a_tier_that_cannot_work_is_refused_with_its_reason(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("[", r"\[")):
        Engine.from_overrides(overrides)


def test_a_misspelt_level_is_refused_with_the_closest_name():
    with pytest.raises(PluginError, match="'hots'.*'host'"):
        Engine.from_overrides(["+tier=host", "tier.levels=[hots,disk]"])


def test_an_unreachable_redis_is_refused_up_front_naming_it():
    pytest.importorskip("redis")
    url = "redis://127.0.0.1:1/0"  # port 1: nothing listens there
    with pytest.raises(ConfigError, match="redis://127.0.0.1:1/0"):
        Engine.from_overrides(["+tier=redis", f"tier.redis_url={url}"])


def test_a_tier_larger_than_the_host_exits_2_with_one_line(cli):
    result = cli("+tier=host", "tier.host_gib=1000000", *SMALL)
    assert result.returncode == 2, result.stderr
    assert "more than the host's memory" in result.stderr
    assert "Traceback" not in result.stderr

"""The summary's queue figures: the TTFT of cold requests (no cached token at their first
admission) and, for a run of several tenants, the tokens served to each and their ratio."""

from __future__ import annotations

from enginekit import Engine, SamplingParams
from enginekit import metric_keys as mk
from enginekit.metrics import RunMetrics


def test_cold_ttft_counts_requests_that_hit_nothing_at_first_admission():
    m = RunMetrics()
    m.on_request_added("cold", 0.0, 10)
    m.on_request_added("warm", 0.0, 10)
    m.on_request_added("unknown", 0.0, 10)
    m.on_first_token("cold", 2.0, 0)
    m.on_first_token("warm", 0.5, 8)
    m.on_first_token("unknown", 1.0)
    s = m.summary(kv_bytes_per_block=1)
    assert s[mk.TIME_TO_FIRST_TOKEN_SECONDS_COLD.key]["count"] == 1
    assert s[mk.TIME_TO_FIRST_TOKEN_SECONDS_COLD.key]["p99"] == 2.0
    assert mk.TOKENS_SERVED_BY_TENANT.key not in s  # one tenant


def test_tokens_served_by_tenant_and_their_ratio():
    m = RunMetrics()
    m.on_request_added(1, 0.0, 10, "a")
    m.on_request_added(2, 0.0, 30, "b")
    m.on_request_added(3, 0.0, 50, "b")  # unfinished: not served yet
    m.on_request_finished(1, 1.0, 10)
    m.on_request_finished(2, 1.0, 30)
    s = m.summary(kv_bytes_per_block=1)
    assert s[mk.TOKENS_SERVED_BY_TENANT.key] == {"a": 20, "b": 60}
    assert s[mk.TENANT_SERVICE_MAX_MIN_RATIO.key] == 3.0


def test_an_engine_run_reports_tenants_and_cold_requests():
    engine = Engine.from_overrides(["+queue=fair", "cache.num_blocks=256"])
    shared = list(range(100, 164))
    for i, user in enumerate(["a", "b", "a"]):
        engine.add_request(shared + [i], SamplingParams(max_tokens=4, ignore_eos=True), user=user)
    s = engine.run().summary
    assert s[mk.TOKENS_SERVED_BY_TENANT.key] == {"a": 2 * 69, "b": 69}
    assert s[mk.TIME_TO_FIRST_TOKEN_SECONDS_COLD.key]["count"] >= 1

"""workload=trace: JSONL and Mooncake traces on files the tests write, a bad line refused
with its line number and field before anything runs, sessions, salts, and the export of
a built-in workload replayed to the same run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from enginekit import metric_keys as mk
from enginekit.app import compose_config
from enginekit.config import WorkloadConfig
from enginekit.driver import WorkloadDriver
from enginekit.engine import Engine
from enginekit.errors import ConfigError
from enginekit.export import export_workload
from enginekit.export import main as export_main
from enginekit.workloads.trace import (
    MOONCAKE_BLOCK,
    mooncake_tokens,
    open_trace,
    pseudo_random_tokens,
)


def _write(path: Path, lines: list[dict | str]) -> Path:
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


def _run(*overrides: str) -> tuple[Engine, dict]:
    engine = Engine(compose_config(["progress=false", *overrides]))
    driver = WorkloadDriver(engine)
    driver.add_workload()
    return engine, driver.run().summary


def _line(i: int, **fields) -> dict:
    return {
        "id": f"r{i}",
        "arrival_time": 0.0,
        "prompt_token_ids": [5, 6, 7],
        "output_len": 2,
    } | fields


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (_line(2, arrival_time=-1), "arrival_time"),
        (_line(2, arrival_time="soon"), "arrival_time"),
        (_line(2, prompt_token_ids=[]), "prompt_token_ids"),
        (_line(2, prompt_token_ids=[1, 2.5]), "prompt_token_ids"),
        (_line(2, prompt_token_ids=[1, 10**9]), "prompt_token_ids"),
        (_line(2, output_len=0), "output_len"),
        (_line(2, output_token_ids=[1]), "output_token_ids"),
        (_line(1), "id"),  # the id of line 1 again
        (_line(2, extra_key=3), "extra_key"),
        (_line(2, turn=1), "turn"),
        ({"arrival_time": 0, "prompt_token_ids": [1], "output_len": 1}, "id"),
    ],
)
def test_a_bad_line_is_refused_with_its_number_and_field(tmp_path, bad, field) -> None:
    path = _write(tmp_path / "t.jsonl", [_line(1), "", bad, _line(4)])
    config = WorkloadConfig(name="trace", path=str(path))
    with pytest.raises(ConfigError, match=rf"t\.jsonl:3: field '{field}'"):
        open_trace(config, vocab_size=1000, max_model_len=4096)


def test_a_line_that_is_not_json_and_a_missing_path_are_refused(tmp_path) -> None:
    path = _write(tmp_path / "t.jsonl", [_line(1), "{not json"])
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: not a JSON object"):
        open_trace(WorkloadConfig(name="trace", path=str(path)), 1000, 4096)
    with pytest.raises(ConfigError, match="needs workload.path"):
        open_trace(WorkloadConfig(name="trace"), 1000, 4096)
    # the command line refuses it before running anything
    with pytest.raises(ConfigError, match=r":2: not a JSON object"):
        _run("workload=trace", f"workload.path={path}")


def test_requests_replay_in_arrival_order_with_their_outputs(tmp_path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [
            _line(1, arrival_time=2.0, output_token_ids=[9, 8]),
            _line(2, arrival_time=0.5, prompt_token_ids=[5, 6, 7, 1], output_len=3),
            _line(3, arrival_time=1.0),
        ],
    )
    workload = open_trace(WorkloadConfig(name="trace", path=str(path)), 1000, 4096)
    assert workload.num_requests == 3
    requests = list(workload)
    assert [r.request_id for r in requests] == ["r2", "r3", "r1"]
    assert list(requests[2].output_token_ids) == [9, 8]
    assert len(requests[0].output_token_ids) == 3 and requests[0].max_tokens == 3
    engine, summary = _run("workload=trace", f"workload.path={path}")
    assert summary[mk.NUM_REQUESTS_FINISHED.key] == 3
    assert engine.output("r1").output_token_ids == [9, 8]
    assert engine.output("r2").arrival_time == 0.5


def test_a_later_turn_waits_for_the_earlier_one_and_its_think_time(tmp_path) -> None:
    context = list(range(100, 140))
    path = _write(
        tmp_path / "t.jsonl",
        [
            _line(
                2,
                session="a",
                turn=1,
                arrival_time=0.0,
                think_time_s=3.0,
                prompt_token_ids=[*context, 1, 2, 1, 2, 3],
            ),
            _line(
                1,
                session="a",
                turn=0,
                prompt_token_ids=context[:-2],
                output_len=2,
                output_token_ids=context[-2:],
            ),
        ],
    )
    engine, summary = _run("workload=trace", f"workload.path={path}")
    first, later = engine.output("r1"), engine.output("r2")
    assert later.arrival_time == pytest.approx(first.finish_time + 3.0)
    assert later.num_cached_tokens == 32  # the first turn's prompt and output, whole blocks
    assert summary[mk.PREFIX_CACHE_HITS_IDEAL.key] == 32


def test_arrival_time_scale_stretches_arrivals_and_think_times(tmp_path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [
            _line(1, session="a", turn=0, arrival_time=1.5),
            _line(2, session="a", turn=1, think_time_s=2.0),
            _line(3, arrival_time=0.5),
        ],
    )
    config = WorkloadConfig(name="trace", path=str(path), arrival_time_scale=4.0)
    workload = open_trace(config, 1000, 4096)
    times = [(r.request_id, r.arrival_time, r.think_time_s) for r in workload]
    assert times == [("r3", 2.0, 0.0), ("r1", 6.0, 0.0), ("r2", 0.0, 8.0)]
    assert workload.source.endswith("times x4")
    mooncake = _write(
        tmp_path / "m.jsonl",
        [{"timestamp": 250, "input_length": 8, "output_length": 1, "hash_ids": [1]}],
    )
    config = WorkloadConfig(name="trace", path=str(mooncake), arrival_time_scale=2.0)
    assert [r.arrival_time for r in open_trace(config, 1000, 4096)] == [0.5]
    for bad in (0.0, -1.0):
        with pytest.raises(ConfigError, match="workload.arrival_time_scale must be > 0"):
            open_trace(
                WorkloadConfig(name="trace", path=str(path), arrival_time_scale=bad), 1000, 4096
            )


def test_salted_requests_miss_what_other_salts_computed(tmp_path) -> None:
    prompt = list(range(1, 70))
    path = _write(
        tmp_path / "t.jsonl",
        [
            _line(1, prompt_token_ids=prompt),
            _line(2, arrival_time=1.0, prompt_token_ids=prompt, extra_key="tenant-b"),
            _line(3, arrival_time=2.0, prompt_token_ids=prompt),
        ],
    )
    _, summary = _run("workload=trace", f"workload.path={path}")
    assert summary[mk.PREFIX_CACHE_HITS.key] == 64  # r3 hits r1's 4 blocks; r2 nothing
    assert summary[mk.PREFIX_CACHE_MISS_OTHER_KEY.key] == pytest.approx(68 / (3 * 69))


def test_mooncake_hash_ids_share_exactly_their_blocks(tmp_path) -> None:
    a = mooncake_tokens([7, 8, 9], 1300, 32000)
    b = mooncake_tokens([7, 8, 10], 1100, 32000)
    assert len(a) == 1300 and len(b) == 1100
    shared = int(np.argmax(a[:1100] != b))
    assert shared == 2 * MOONCAKE_BLOCK
    path = _write(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 0, "input_length": 1300, "output_length": 4, "hash_ids": [7, 8, 9]},
            {"timestamp": 1500, "input_length": 1100, "output_length": 4, "hash_ids": [7, 8, 10]},
            {"timestamp": 3000, "input_length": 700, "output_length": 4, "hash_ids": [7, 8]},
        ],
    )
    # the second prompt shares 1,024 tokens with the first; the third, 700 (699 reusable)
    for prefix, block_size, hit in (
        ("block_hash", 16, 1024 + 688),
        ("block_hash", 7, 1022 + 693),
        ("radix", 16, 1024 + 699),
    ):
        _, summary = _run(
            "workload=trace",
            f"workload.path={path}",
            f"+prefix={prefix}",
            f"cache.block_size={block_size}",
        )
        assert summary[mk.PREFIX_CACHE_HITS.key] == hit
    engine, _ = _run("workload=trace", f"workload.path={path}")
    assert engine.output("req-1").arrival_time == 1.5  # milliseconds
    bad = _write(
        tmp_path / "bad.jsonl",
        [
            {"timestamp": 0, "input_length": 1300, "output_length": 4, "hash_ids": [7, 8]},
        ],
    )
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: field 'hash_ids' holds 2 ids"):
        _run("workload=trace", f"workload.path={bad}")


def test_an_exported_workload_replays_to_the_same_run(tmp_path, capsys) -> None:
    common = ("workload.num_requests=40", "cache.num_blocks=2000")
    out = tmp_path / "multiturn.jsonl"
    assert export_main(["workload=multiturn", *common, "--out", str(out)]) == 0
    assert "wrote 40 requests" in capsys.readouterr().out
    _, generated = _run("workload=multiturn", *common)
    _, replayed = _run("workload=trace", f"workload.path={out}", *common)
    for key in (mk.WORKLOAD_SOURCE.key,):
        generated.pop(key), replayed.pop(key)
    assert replayed == generated
    single = tmp_path / "sharegpt.jsonl"
    assert export_workload(["workload=sharegpt", "workload.num_requests=30"], single) == 30
    lines = [json.loads(x) for x in single.read_text().splitlines()]
    assert all("session" not in x and x["prompt_token_ids"][0] == 1 for x in lines)


def test_mooncake_blocks_are_drawn_from_their_hash_ids_alone() -> None:
    """The prompt drawn for all blocks at once is, block by block, the tokens of each
    hash id (``pseudo_random_tokens``), for ids up to and past 64 bits, cut anywhere in
    the last block."""
    hash_ids = [0, 1, 7, 2**20 + 3, 2**63 - 1, 2**64 + 5, 7]
    for vocab_size in (2, 32000, 128256):
        blocks = [pseudo_random_tokens(h, MOONCAKE_BLOCK, vocab_size) for h in hash_ids]
        whole = np.concatenate(blocks)
        for num_tokens in (len(whole) - MOONCAKE_BLOCK + 1, len(whole) - 100, len(whole)):
            tokens = mooncake_tokens(hash_ids, num_tokens, vocab_size)
            assert tokens.dtype == np.int32
            assert np.array_equal(tokens, whole[:num_tokens])
    assert np.array_equal(mooncake_tokens([2**64 + 5], 512, 100), mooncake_tokens([5], 512, 100))
    assert mooncake_tokens([], 0, 100).shape == (0,)

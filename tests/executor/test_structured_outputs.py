"""Structured outputs on the torch executor, on a tiny Llama with random weights and a
real tokenizer (Mistral-7B's SentencePiece vocabulary, written as a Hugging Face folder).
The model's free output is gibberish, so an output that matches its grammar proves the
grammar: a regex matches the decoded text exactly, a choice is one of the choices, JSON
parses (and meets its schema); greedy decoding equals a loop over transformers' logits
masked with xgrammar's own bitmask; parallel samples, preemption (recompute and swap)
and the raw logprobs keep their contracts; what cannot be served is refused by name."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import torch
import xgrammar as xgr
from test_logprobs import assert_output_matches
from torch_helpers import hf_model, saved_engine

from enginekit import Engine
from enginekit.errors import InvalidRequestError
from enginekit.executor.torch.structured import (
    StructuredGrammars,
    choice_grammar,
    tokenizer_info,
    xgrammar_message,
)
from enginekit.models.tiny import random_state_dict, tiny_hf_config
from enginekit.request import RequestOutput, SamplingParams, StructuredOutput
from enginekit.tokenizer import SentencePieceTokenizer
from enginekit.tokenizer_folder import write_tokenizer_folder

VOCAB = 32000  # the SentencePiece vocabulary's
EOS = 2
NEWLINE = 13  # the byte piece <0x0A>
CODE = r"[0-9]{3}-[a-z]{2}"
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
}
PERSON = StructuredOutput(json_schema=json.dumps(PERSON_SCHEMA))
GENEROUS = 40  # max_tokens: every grammar here ends well before it


def tiny_config(vocab_size: int = VOCAB) -> Any:
    config = tiny_hf_config()
    config.vocab_size = vocab_size
    return config


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder with weights and the SentencePiece tokenizer, transformers model)."""
    config = tiny_config()
    model = hf_model(config, random_state_dict(config, seed=3))
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    model.save_pretrained(folder)
    write_tokenizer_folder(str(folder))
    return folder, model


@pytest.fixture(scope="module")
def engine(saved):
    return saved_engine(saved[0])


def run(eng: Engine, requests: list[tuple[str, SamplingParams]]) -> list[RequestOutput]:
    ids = [eng.add_request(eng.tokenizer.encode(text), sampling) for text, sampling in requests]
    eng.run()
    return [eng.output(r) for r in ids]


def text_before_stop(eng: Engine, tokens: list[int], stop: int = EOS) -> str:
    """The decoded text of an output that ends on its stop token ``stop``."""
    assert tokens[-1] == stop and stop not in tokens[:-1]
    return eng.decode(tokens[:-1])


def meets_person_schema(value: object) -> bool:
    """PERSON_SCHEMA, checked by hand (no other keys: xgrammar's strict mode)."""
    return (
        isinstance(value, dict)
        and set(value) == {"name", "age", "member"}
        and isinstance(value["name"], str)
        and len(value["name"]) <= 4
        and type(value["age"]) is int
        and 0 <= value["age"] <= 99
        and type(value["member"]) is bool
    )


def hf_constrained_greedy(
    model: Any, compiled: Any, prompt: list[int], stops: list[int], max_tokens: int
) -> list[int]:
    """transformers' logits after each token, masked by xgrammar's bitmask of ``compiled``
    (its own matcher), argmax, until the matcher terminates."""
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stops)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    ids, out = list(prompt), []
    while len(out) < max_tokens and not matcher.is_terminated():
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1].float()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        token = int(torch.argmax(logits))
        assert matcher.accept_token(token)
        ids.append(token)
        out.append(token)
    return out


@pytest.fixture(scope="module")
def hf_compiler(saved):
    """xgrammar's compiler over the folder's tokenizer, built as xgrammar builds it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(saved[0], local_files_only=True)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB)
    return xgr.GrammarCompiler(info, max_threads=1)


def test_regex_choice_and_json_outputs_meet_their_grammars(engine):
    """One batch: a regex, a choice, a JSON schema, any JSON object, a grammar, and an
    unconstrained row beside them (gibberish: the constraint is what makes the others)."""
    grammar = 'root ::= "(" digit ("," digit){0,3} ")"\ndigit ::= [0-9]'
    kinds = [
        StructuredOutput(regex=CODE),
        StructuredOutput(choice=("yes", "no", "maybe so")),
        PERSON,
        StructuredOutput(json_object=True),
        StructuredOutput(grammar=grammar),
    ]
    requests = [("Reply:", SamplingParams(max_tokens=GENEROUS, structured=s)) for s in kinds]
    free = SamplingParams(max_tokens=12)
    code, choice, person, anything, tuple_, unconstrained = run(
        engine, [*requests, ("Reply:", free)]
    )
    for out in (code, choice, person, anything, tuple_):
        assert out.finish_reason == "stop"
    assert re.fullmatch(CODE, text_before_stop(engine, code.output_token_ids))
    assert text_before_stop(engine, choice.output_token_ids) in ("yes", "no", "maybe so")
    assert meets_person_schema(json.loads(text_before_stop(engine, person.output_token_ids)))
    assert isinstance(json.loads(text_before_stop(engine, anything.output_token_ids)), dict)
    assert re.fullmatch(
        r"\([0-9](,[0-9]){0,3}\)", text_before_stop(engine, tuple_.output_token_ids)
    )
    assert unconstrained.finish_reason == "length"
    assert not re.fullmatch(CODE, engine.decode(unconstrained.output_token_ids))


@pytest.mark.parametrize(
    "structured",
    [StructuredOutput(regex=CODE), PERSON, StructuredOutput(choice=("alpha", "beta", "gamma"))],
    ids=["regex", "json_schema", "choice"],
)
def test_greedy_equals_transformers_logits_masked_by_xgrammar(
    saved, engine, hf_compiler, structured
):
    """The exact tokens: the engine's greedy output is the argmax of transformers' logits
    under xgrammar's own bitmask at every step, EOS included."""
    _, model = saved
    compile_spec = {
        "regex": lambda: hf_compiler.compile_regex(structured.regex),
        "json_schema": lambda: hf_compiler.compile_json_schema(
            structured.json_schema, any_whitespace=False
        ),
        "choice": lambda: hf_compiler.compile_grammar(choice_grammar(structured.choice)),
    }[structured.kind]
    prompt = engine.tokenizer.encode("The record reads")
    sampling = SamplingParams(max_tokens=GENEROUS, structured=structured)
    request_id = engine.add_request(prompt, sampling)
    engine.run()
    out = engine.output(request_id)
    expected = hf_constrained_greedy(model, compile_spec(), prompt, [EOS], GENEROUS)
    assert out.output_token_ids == expected
    assert expected[-1] == EOS and out.finish_reason == "stop"


def test_parallel_samples_each_meet_the_grammar(engine):
    """n=2 with sampling: each fork draws from its own matcher, started at its parent's
    state."""
    sampling = SamplingParams(
        max_tokens=GENEROUS, n=2, temperature=1.0, seed=7, structured=StructuredOutput(regex=CODE)
    )
    (out,) = run(engine, [("Two codes:", sampling)])
    assert len(out.samples) == 2 and out.finish_reasons == ["stop", "stop"]
    texts = [text_before_stop(engine, sample) for sample in out.samples]
    assert all(re.fullmatch(CODE, text) for text in texts)
    assert texts[0] != texts[1]


def test_logprobs_stay_the_raw_distribution(saved, engine):
    """The grammar masks what is drawn, not what is reported: each token's logprob, rank
    and alternatives are transformers' raw log_softmax (a constrained token is often not
    the raw favourite)."""
    _, model = saved
    sampling = SamplingParams(max_tokens=GENEROUS, logprobs=3, structured=PERSON)
    (out,) = run(engine, [("Person:", sampling)])
    assert out.finish_reason == "stop"
    assert_output_matches(model, out, 3)
    assert out.logprobs is not None and max(entry.rank for entry in out.logprobs[0]) > 1


def test_stop_token_ids_end_the_output_under_ignore_eos(engine):
    """With ``ignore_eos`` the grammar ends on the request's own stop token, which it
    allows only once the text is complete."""
    sampling = SamplingParams(
        max_tokens=GENEROUS,
        ignore_eos=True,
        stop_token_ids=(NEWLINE,),
        structured=StructuredOutput(regex=CODE),
    )
    (out,) = run(engine, [("Code:", sampling)])
    assert out.finish_reason == "stop"
    assert re.fullmatch(CODE, text_before_stop(engine, out.output_token_ids, NEWLINE))
    assert EOS not in out.output_token_ids


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_keeps_each_matcher_where_its_sequence_is(saved, preemption):
    """A small pool preempts sequences mid-grammar; recompute re-prefills their tokens
    without drawing them again, swap brings their KV back: every output is still the one
    an unpreempted engine gives."""
    folder, _ = saved
    eng = saved_engine(
        folder,
        f"+preemption={preemption}",
        *(["preemption.swap_space_gib=0.01"] if preemption == "swap" else []),
        "cache.num_blocks=14",
        "cache.watermark=0",
    )
    if preemption == "swap":
        policy = eng.scheduler.preemption
        policy.costs = dataclasses.replace(policy.costs, swap_s_per_block=1e-12)
    texts = ["Person one", "A person", "Another person here", "Person two", "Person three"]
    texts.append("Someone")
    specs = [PERSON] * 5 + [StructuredOutput(regex=CODE)]
    requests = [
        (text, SamplingParams(max_tokens=GENEROUS, structured=spec))
        for text, spec in zip(texts, specs, strict=True)
    ]
    ids = [eng.add_request(eng.tokenizer.encode(t), s) for t, s in requests]
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
    assert eng.summary()["num_preemptions_by_kind"].get(preemption, 0) >= 5
    expected = run(saved_engine(folder), requests)
    for request_id, reference in zip(ids, expected, strict=True):
        out = eng.output(request_id)
        assert out.output_token_ids == reference.output_token_ids
        assert out.finish_reason == "stop"


@pytest.mark.parametrize(
    ("structured", "message"),
    [
        (
            StructuredOutput(regex="[0-9"),
            r"sampling.structured.regex does not compile: "
            r"Regex parsing error at position 5: Unclosed '\['",
        ),
        (
            StructuredOutput(json_schema='{"type": "foo"}'),
            'sampling.structured.json_schema does not compile: Unsupported type "foo"',
        ),
        (
            StructuredOutput(grammar='rule ::= "a"'),
            "sampling.structured.grammar does not compile: .*"
            'The root rule with name "root" is not found',
        ),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_by_name(engine, structured, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request([1, 415], SamplingParams(structured=structured))
    assert not engine.has_unfinished_requests()


def test_an_output_that_could_not_end_is_refused(engine):
    sampling = SamplingParams(ignore_eos=True, structured=StructuredOutput(regex=CODE))
    with pytest.raises(
        InvalidRequestError,
        match="sampling.structured needs a token to end the output on once its grammar is "
        "complete: sampling.ignore_eos=True",
    ):
        engine.add_request([1, 415], sampling)


def test_sampling_params_refuse_beams_and_min_tokens_with_a_grammar():
    code = StructuredOutput(regex=CODE)
    with pytest.raises(InvalidRequestError, match="sampling.structured.regex is not available "):
        SamplingParams(beam_width=2, structured=code)
    with pytest.raises(InvalidRequestError, match="sampling.min_tokens=3 is not available with"):
        SamplingParams(min_tokens=3, structured=code)
    with pytest.raises(InvalidRequestError, match="sampling.structured must be a Structured"):
        SamplingParams(structured={"regex": CODE})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "sampling.structured must set exactly one of json_schema, json_object, regex, "),
        ({"regex": "a", "choice": ["a"]}, "exactly one of .*; got regex, choice"),
        ({"regex": 5}, r"sampling.structured.regex must be a str or None, got 5 \(int\)"),
        ({"json_object": 1}, r"sampling.structured.json_object must be a bool, got 1"),
        ({"choice": "yes"}, "sampling.structured.choice must be a list of strings"),
        ({"choice": []}, "sampling.structured.choice must not be empty"),
        ({"choice": ["a", None]}, r"sampling.structured.choice\[1\] must be a str, got None"),
        ({"json_schema": "{"}, "sampling.structured.json_schema is not JSON: "),
        ({"json_schema": "[1]"}, "sampling.structured.json_schema must be a JSON object"),
    ],
)
def test_structured_output_refuses_bad_values_by_name(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        StructuredOutput(**kwargs)


def test_structured_output_is_a_hashable_value_that_names_its_kind():
    a = StructuredOutput(choice=["yes", "no"])
    assert a.choice == ("yes", "no") and a.kind == "choice"
    assert a == StructuredOutput(choice=("yes", "no")) and hash(a) == hash(
        StructuredOutput(choice=("yes", "no"))
    )
    assert StructuredOutput(json_object=True).kind == "json_object"
    fields = SamplingParams(structured=a, logprobs=1).distribution_fields()
    assert fields == ["logprobs=1", "structured.choice"]


def test_the_simulator_refuses_structured_outputs_by_name():
    eng = Engine.from_overrides(["executor=sim", "progress=false"])
    with pytest.raises(
        InvalidRequestError,
        match="sampling.structured.regex needs the model's next-token distribution; "
        "the sim executor scripts its tokens and has none",
    ):
        eng.add_request([5, 6, 7], SamplingParams(structured=StructuredOutput(regex=CODE)))


def test_a_model_without_a_tokenizer_refuses_structured_outputs(tmp_path):
    config = tiny_config()
    hf_model(config, random_state_dict(config, seed=1)).save_pretrained(tmp_path)
    eng = saved_engine(tmp_path, "cache.num_blocks=16")
    sampling = SamplingParams(structured=StructuredOutput(json_object=True))
    with pytest.raises(
        InvalidRequestError,
        match=r"sampling.structured needs the model's tokenizer: model.path=.* holds no usable",
    ):
        eng.add_request([1, 415], sampling)
    free = eng.add_request([1, 415], SamplingParams(max_tokens=2))  # the rest is served
    eng.run()
    assert len(eng.output(free).output_token_ids) == 2


def test_a_model_without_a_folder_reads_the_sentencepiece_vocabulary_as_the_folder_does(saved):
    """No folder and 32,000 ids: the SentencePiece vocabulary, the same tokens (special
    ones never text) as the folder ``enginekit.tokenizer_folder`` writes; any other size
    has no tokenizer."""
    folder, _ = saved
    direct = tokenizer_info(None, VOCAB, EOS)
    via_folder = tokenizer_info(str(folder), VOCAB, EOS)
    assert direct.decoded_vocab == via_folder.decoded_vocab
    assert direct.special_token_ids == via_folder.special_token_ids == [0, 1]
    assert (direct.vocab_type, direct.add_prefix_space) == (
        via_folder.vocab_type,
        via_folder.add_prefix_space,
    )
    grammars = StructuredGrammars(None, 512, EOS, torch.device("cpu"))
    with pytest.raises(
        InvalidRequestError,
        match="needs the model's tokenizer: the model has no folder .* its 512 ids are not "
        "the SentencePiece vocabulary's 32000",
    ):
        grammars.check(SamplingParams(structured=StructuredOutput(regex=CODE)))


def test_tiny_without_a_folder_constrains_with_the_sentencepiece_vocabulary():
    eng = Engine.from_overrides(
        ["executor=torch", "model=tiny", "progress=false", "cache.num_blocks=16"]
    )
    sampling = SamplingParams(max_tokens=GENEROUS, structured=StructuredOutput(regex=CODE))
    request_id = eng.add_request([1, 7596, 28747], sampling)  # "<s>Code:"
    eng.run()
    out = eng.output(request_id)
    assert out.finish_reason == "stop" and out.output_token_ids[-1] == EOS
    assert re.fullmatch(CODE, SentencePieceTokenizer().decode(out.output_token_ids[:-1]))


def test_compiled_grammars_are_kept_by_spec_in_a_bounded_lru():
    grammars = StructuredGrammars(None, VOCAB, EOS, torch.device("cpu"), cache_size=2)
    specs = [StructuredOutput(regex=r) for r in ("a+", "b+", "c+")]
    for spec in (specs[0], specs[1], specs[0], specs[2]):
        grammars.check(SamplingParams(structured=spec))
    assert grammars.cached_specs == (specs[0], specs[2])  # b+, least recently used, left
    assert grammars.matcher(SamplingParams(structured=specs[1])).accept_string("bbb")


def save_word_tokenizer(folder: Any) -> None:
    """A word-level tokenizer ("w<id>" is token id): its pieces spell no digit."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)


def test_a_grammar_the_vocabulary_cannot_spell_is_refused_or_ends_where_it_is_stuck(tmp_path):
    """A grammar no token can start is refused when the request is added; one that gets
    stuck on the way (no token spells what must come next) ends on its stop token rather
    than failing a step."""
    config = tiny_config()
    hf_model(config, random_state_dict(config, seed=1)).save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path)
    eng = saved_engine(tmp_path, "cache.num_blocks=16")
    with pytest.raises(
        InvalidRequestError, match="sampling.structured.regex admits no first token of this"
    ):
        eng.add_request([1, 415], SamplingParams(structured=StructuredOutput(regex="[0-9]+")))
    stuck = SamplingParams(max_tokens=8, structured=StructuredOutput(regex="w3x"))
    request_id = eng.add_request([1, 415], stuck)
    eng.run()
    out = eng.output(request_id)
    assert out.output_token_ids == [3, EOS] and out.finish_reason == "stop"


def test_rows_without_a_grammar_never_reach_the_grammars(saved, monkeypatch):
    """The cost of the feature for everyone else: without a constrained sequence, a step
    neither fills nor accepts anything (one empty check)."""
    eng = saved_engine(saved[0])
    grammars = eng.executor.structured

    def refuse(*_args: object) -> None:
        raise AssertionError("an unconstrained step reached the grammars")

    monkeypatch.setattr(grammars, "allowed", refuse)
    monkeypatch.setattr(grammars, "accept", refuse)
    outputs = run(eng, [("Hello", SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=1))])
    assert [len(s) for s in outputs[0].samples] == [4, 4]


def test_xgrammar_messages_lose_their_stamp_and_source_line():
    raw = (
        "[21:12:28] /project/cpp/json_schema_converter.cc:5077: "
        "Check failed: (e.empty()) is false: Failed to parse JSON"
    )
    assert xgrammar_message(RuntimeError(raw)) == "Failed to parse JSON"
    assert choice_grammar(['a"b', "é\n"]) == 'root ::= "a\\"b" | "é\\n"'

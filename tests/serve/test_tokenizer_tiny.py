"""The server's tokenizer for a model without a folder whose vocabulary has 32,000 ids
(``tiny``): Mistral-7B's SentencePiece vocabulary with a chat template in Mistral's
instruct format. Its ids, text, token texts, chat prompts and settings are what
transformers gives for the folder ``enginekit.tokenizer_folder`` writes (the folder's
own codec); text round-trips; the chat template renders hand-written strings; and a
server of ``model=tiny`` answers text completions and chat completions."""

from __future__ import annotations

import random
import re
from typing import Any

import openai
import pytest
from test_tokenizer_folder import EDGE_CASES, sharegpt_texts

from enginekit import Engine, SamplingParams
from enginekit.app import compose_config
from enginekit.errors import InvalidRequestError
from enginekit.serve import BackgroundServer, Server
from enginekit.serve.codec import (
    BYTE_LEVEL_ALPHABET,
    FolderCodec,
    SentencePieceCodec,
    TextCodec,
)
from enginekit.tokenizer import SENTENCEPIECE_CHAT_TEMPLATE
from enginekit.tokenizer_folder import write_tokenizer_folder

SYSTEM = {"role": "system", "content": "Be brief."}
HI = {"role": "user", "content": "Hi"}
HELLO = {"role": "assistant", "content": "Hello!"}
BYE = {"role": "user", "content": "Bye"}
# Message lists and their rendering in Mistral's instruct format, written by hand.
CHATS = [
    ([HI], "<s>[INST] Hi [/INST]"),
    ([SYSTEM, HI], "<s>[INST] Be brief.\n\nHi [/INST]"),
    ([HI, HELLO, BYE], "<s>[INST] Hi [/INST] Hello!</s>[INST] Bye [/INST]"),
    ([SYSTEM, HI, HELLO, BYE], "<s>[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]"),
    ([HI, HELLO], "<s>[INST] Hi [/INST] Hello!</s>"),
]


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    codec = TextCodec.of_model_path(None, 32000)
    assert isinstance(codec, SentencePieceCodec)
    return codec


@pytest.fixture(scope="module")
def folder_codec(tmp_path_factory) -> TextCodec:
    """The codec of the folder ``enginekit.tokenizer_folder`` writes (transformers)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer_folder(str(folder))
    codec = TextCodec.of_model_path(str(folder), 32000)
    assert isinstance(codec, FolderCodec)
    return codec


def test_only_a_folderless_model_of_32000_ids_gets_the_sentencepiece_vocabulary(codec):
    assert (codec.vocab_size, codec.bos_token_id, codec.eos_token_id) == (32000, 1, 2)
    assert codec.has_chat_template and codec.chat_template == SENTENCEPIECE_CHAT_TEMPLATE
    assert TextCodec.of_model_path(None, 512) is None
    assert TextCodec.of_model_path(None, 128256) is None
    assert TextCodec.of_model_path(None) is None


def test_text_round_trips_and_special_tokens_in_text_are_their_ids(codec):
    texts = EDGE_CASES + sharegpt_texts(40)
    for text in texts:
        ids = codec.encode(text)
        assert ids[0] == 1 and codec.encode(text, add_special_tokens=False) == ids[1:]
        assert codec.decode(ids) == text
    assert codec.encode("Hello world") == [1, 22557, 1526]
    assert codec.encode("a</s>b", add_special_tokens=False) == [264, 2, 287]
    assert codec.decode([1, 22557, 2]) == "Hello"
    assert codec.decode([1, 22557, 2], skip_special_tokens=False) == "<s> Hello</s>"


def test_a_token_alone_is_named_as_openai_names_it(codec):
    assert [codec.token_text(i) for i in (22557, 1526, 1, 2, 0)] == [
        " Hello",
        " world",
        "<s>",
        "</s>",
        "<unk>",
    ]
    assert codec.token_text(13) == "\n" and codec.token_text(3 + 0x41) == "A"  # byte pieces
    assert codec.token_text(3 + 0xE2) == "bytes:\\xe2"  # a character's first byte alone
    assert codec.token_bytes(3 + 0xE2) == b"\xe2" and codec.token_bytes(22557) == b" Hello"
    assert codec.token_text(32000) == "" and codec.token_bytes(-1) == b""


def test_the_codec_gives_what_transformers_gives_for_the_folder(codec, folder_codec):
    texts = [*EDGE_CASES, "<s>[INST] hi [/INST] yo</s>[INST] again [/INST]", "a</s>b<unk>c"]
    for text in texts:
        for add_special_tokens in (True, False):
            assert codec.encode(text, add_special_tokens) == folder_codec.encode(
                text, add_special_tokens
            )
    rng = random.Random(5)
    for _ in range(2000):  # any ids: special, byte pieces (runs that are no UTF-8), ordinary
        ids = [
            rng.choice([rng.randrange(32000), rng.randrange(259)])
            for _ in range(rng.randrange(1, 12))
        ]
        for skip in (True, False):
            assert codec.decode(ids, skip) == folder_codec.decode(ids, skip), ids
    assert [codec.token_text(i) for i in range(32000)] == [
        folder_codec.token_text(i) for i in range(32000)
    ]
    for messages, _ in CHATS:
        assert codec.chat_prompt(messages) == folder_codec.chat_prompt(messages)
    options = dict(add_generation_prompt=False, continue_final_message=True)
    assert codec.chat_prompt([HI, HELLO], **options) == folder_codec.chat_prompt(
        [HI, HELLO], **options
    )
    ours, theirs = codec.info(), folder_codec.info()
    shared = ["bos_token", "eos_token", "unk_token", "pad_token", "model_max_length"]
    shared += ["clean_up_tokenization_spaces", "added_tokens_decoder", "chat_template"]
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    assert ours["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert ours["added_tokens_decoder"] == {"0": "<unk>", "1": "<s>", "2": "</s>"}


@pytest.mark.parametrize(("messages", "rendered"), CHATS)
def test_the_chat_template_renders_mistrals_instruct_format(codec, messages, rendered):
    assert codec.chat_prompt(messages) == codec.encode(rendered, add_special_tokens=False)
    assert codec.chat_prompt(messages, add_generation_prompt=False) == codec.chat_prompt(messages)


def test_continuing_the_final_message_leaves_it_open(codec):
    ids = codec.chat_prompt(
        [HI, {"role": "assistant", "content": "The answer is"}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert ids == codec.encode("<s>[INST] Hi [/INST] The answer is", add_special_tokens=False)
    assert ids[-1] != codec.eos_token_id


REFUSED = "messages: the chat template refused them: "
ALTERNATE = (
    REFUSED + "after an optional first system message, the roles must alternate user, "
    "assistant, user, ...; got "
)


@pytest.mark.parametrize(
    ("messages", "options", "error"),
    [
        ([HELLO], {}, ALTERNATE + "assistant at turn 1"),
        ([HI, BYE], {}, ALTERNATE + "user at turn 2"),
        ([SYSTEM], {}, REFUSED + "the conversation has no user message"),
        ([HI, {"role": "tool", "content": "42"}], {}, ALTERNATE + "tool at turn 2"),
        ([HI, HELLO], {"continue_final_message": True}, "continue_final_message: continuing "
         "the final message and adding a generation prompt exclude each other; set "
         "add_generation_prompt to false"),
        ([HI], {"chat_template_kwargs": {"messages": [], "tokenize": True}},
         "chat_template_kwargs: messages, tokenize may not be set there (they are the "
         "request's own fields)"),
    ],
)  # fmt: skip
def test_refused_chats_name_the_field(codec, folder_codec, messages, options, error):
    for each in (codec, folder_codec):
        with pytest.raises(InvalidRequestError, match="^" + re.escape(error) + "$"):
            each.chat_prompt(messages, **options)


def test_a_byte_level_folder_names_its_tokens_by_their_bytes(tmp_path):
    """A byte-level BPE tokenizer (GPT-2's kind, as Llama 3 and Qwen2 carry) writes each
    byte as a printable character; a token's bytes are those characters' bytes, so the
    bytes of a text's tokens laid end to end are the text's, and the character of a byte
    is ``tokenizers``' own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert sorted(alphabet) == sorted(BYTE_LEVEL_ALPHABET)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet)
    inner.train_from_iterator(["naïve café, 😀 déjà vu"] * 50 + ["hello world"] * 50, trainer)
    PreTrainedTokenizerFast(tokenizer_object=inner).save_pretrained(tmp_path)
    codec = TextCodec.of_model_path(str(tmp_path), 400)
    assert isinstance(codec, FolderCodec)
    text = "naïve 😀 hello, déjà"
    ids = codec.encode(text)
    assert b"".join(codec.token_bytes(i) for i in ids) == text.encode()
    assert codec.decode(ids) == text
    emoji = [i for i in range(codec.vocab_size) if codec.token_bytes(i) == b"\xf0"]
    assert [codec.token_text(i) for i in emoji] == ["bytes:\\xf0"]


SERVED = ["executor=torch", "model=tiny", "cache.block_size=4", "cache.num_blocks=400",
          "+prefix=radix", "progress=false"]  # fmt: skip
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def served() -> Any:
    server = Server(compose_config([*SERVED, "serve.port=0"]))
    with BackgroundServer(server) as running:
        yield running.url, server


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0)


def greedy_offline(prompt: list[int]) -> list[int]:
    engine = Engine.from_overrides(SERVED)
    request_id = engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS))
    engine.run()
    return engine.output(request_id).output_token_ids


def continuation(codec: TextCodec, prompt: list[int], output: list[int]) -> str:
    """The text ``output`` adds to ``prompt``'s (a first word keeps its space)."""
    return codec.decode(prompt + output)[len(codec.decode(prompt)) :]


def test_tiny_answers_a_text_completion(served, client, codec):
    _, server = served
    assert isinstance(server.codec, SentencePieceCodec)
    prompt = "The capital of France is"
    choice = client.completions.create(
        model=server.model_name,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    ).choices[0]
    assert choice.prompt_token_ids == codec.encode(prompt)
    assert choice.token_ids == greedy_offline(codec.encode(prompt))
    assert choice.text and choice.text == continuation(
        codec, choice.prompt_token_ids, choice.token_ids
    )


def test_tiny_answers_a_chat_completion(served, client, codec):
    _, server = served
    messages = [SYSTEM, HI, HELLO, BYE]
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    choice = reply.choices[0]
    expected_prompt = codec.encode(CHATS[3][1], add_special_tokens=False)
    assert choice.prompt_token_ids == expected_prompt
    assert reply.usage.prompt_tokens == len(expected_prompt)
    assert choice.token_ids == greedy_offline(expected_prompt)
    assert choice.message.content == continuation(codec, expected_prompt, choice.token_ids)


def test_a_folderless_model_of_another_size_still_takes_token_ids_only():
    server = Server(compose_config(["executor=sim", "model=llama-3-8b", "serve.port=0"]))
    assert server.codec is None
    with BackgroundServer(server) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=server.model_name, prompt="hi", max_tokens=2)
        assert "this model has none: send token ids" in str(refused.value)
        assert refused.value.body["param"] == "prompt"
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=server.model_name, messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.body["param"] == "messages"
        assert "a chat prompt needs the model's tokenizer" in str(refused.value)
        choice = client.completions.create(
            model=server.model_name, prompt=[5, 6, 7], max_tokens=2
        ).choices[0]
        assert choice.text == ""

"""``enginekit.tokenizer_folder``: the SentencePiece vocabulary as a Hugging Face folder
that ``transformers.AutoTokenizer`` loads offline (without sentencepiece or protobuf),
giving the ids and text of ``SentencePieceTokenizer`` on hand-picked edge cases and on
ShareGPT's conversations, with the chat template rendering Mistral's instruct format."""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from missing_modules import block_modules

from enginekit.tokenizer import SENTENCEPIECE_CHAT_TEMPLATE, SentencePieceTokenizer
from enginekit.tokenizer_folder import write_tokenizer_folder
from enginekit.workloads.sharegpt import dataset_path, iter_conversations

FILES = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}
SHAREGPT_CONVERSATIONS = 150
# Text where SentencePiece's BPE is easy to get wrong: runs of spaces (its "▁▁" pieces
# score lowest), leading and trailing spaces, newlines and tabs (byte pieces), characters
# outside the vocabulary (byte fallback), special tokens' look-alikes that are not them.
EDGE_CASES = [
    "Hello world",
    "",
    " ",
    "  ",
    "  a  b",
    "   leading",
    "trailing   ",
    "\n",
    "Hello\n\nworld  ",
    "x\ty\r\nz",
    "naïve 😀\n",
    "日本語のテキスト",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b\u00a0ﬁ",
    "[INST] hi [/INST]",
    "<0x41> <s > < /s>",
    "1234567.89e-10",
    "don't; won't! (x) {y} [z] <w>",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer") / "mistral-sentencepiece"
    write_tokenizer_folder(str(folder))
    return folder


@pytest.fixture(scope="module")
def loaded(folder) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def sentencepiece() -> SentencePieceTokenizer:
    return SentencePieceTokenizer()


def sharegpt_texts(num_conversations: int) -> list[str]:
    """The messages of the shipped ShareGPT file's first conversations."""
    with open(dataset_path(None), encoding="utf-8") as stream:
        conversations = itertools.islice(iter_conversations(stream), num_conversations)
        return [text for c in conversations if c is not None for _, text in c.messages]


def test_the_folder_holds_its_files_and_transformers_loads_it_offline(folder, loaded):
    assert {p.name for p in folder.iterdir()} == FILES
    assert len(loaded) == 32000
    assert (loaded.bos_token, loaded.bos_token_id) == ("<s>", 1)
    assert (loaded.eos_token, loaded.eos_token_id) == ("</s>", 2)
    assert (loaded.unk_token, loaded.unk_token_id) == ("<unk>", 0)
    assert loaded.pad_token is None
    assert loaded.chat_template == SENTENCEPIECE_CHAT_TEMPLATE
    assert loaded.encode("Hello world") == [1, 22557, 1526]
    assert loaded.convert_ids_to_tokens([22557, 1526, 13]) == ["▁Hello", "▁world", "<0x0A>"]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["chat_template"] == SENTENCEPIECE_CHAT_TEMPLATE
    assert json.loads((folder / "special_tokens_map.json").read_text()) == {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    assert (folder / "tokenizer.model").read_bytes() == SentencePieceTokenizer().model_proto


def test_the_folders_ids_are_sentencepieces_on_edge_cases_and_sharegpt(loaded, sentencepiece):
    texts = EDGE_CASES + sharegpt_texts(SHAREGPT_CONVERSATIONS)
    assert len(texts) > 1000
    for text in texts:
        ids = sentencepiece.encode(text)
        assert loaded.encode(text) == ids, text
        assert loaded.encode(text, add_special_tokens=False) == ids[1:], text


def test_the_folder_decodes_as_sentencepiece_does(loaded, sentencepiece):
    """Random ids of ordinary and byte pieces (bytes that may not form UTF-8), with and
    without BOS and EOS around them (skipped as special tokens)."""
    rng = random.Random(7)
    for _ in range(500):
        ids = [rng.randrange(3, 32000) for _ in range(rng.randrange(1, 16))]
        assert loaded.decode(ids) == sentencepiece.decode(ids), ids
        framed = [1, *ids, 2]
        assert loaded.decode(framed, skip_special_tokens=True) == sentencepiece.decode(ids)


def test_the_chat_template_renders_mistrals_instruct_format_through_transformers(loaded):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s>[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]"
    ids = loaded.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert ids == loaded.encode(text, add_special_tokens=False)
    assert ids[:2] == [1, 733] and ids.count(2) == 1  # "<s>", "▁["; one "</s>"


# Where sentencepiece and protobuf are not installed, finding them gives None (transformers
# asks importlib.util.find_spec before it imports them); missing_modules raises instead.
ABSENT_MODULES = """\
from importlib.machinery import PathFinder

_find_spec = PathFinder.find_spec.__func__


def _absent(cls, name, path=None, target=None):
    if name.split(".")[0] in ("sentencepiece", "google"):
        return None
    return _find_spec(cls, name, path, target)


PathFinder.find_spec = classmethod(_absent)
"""


def test_plain_transformers_loads_it_without_sentencepiece_or_protobuf(folder, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ABSENT_MODULES)
    script = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True); "
        "import importlib.util as u; assert u.find_spec('sentencepiece') is None; "
        "assert u.find_spec('google') is None; print(t.encode('naïve 😀\\n'))"
    )
    result = _run([sys.executable, "-c", script, str(folder)], pythonpath=site)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == str([1, 1879, 28920, 333, 28705, 30575, 13])


def test_the_command_writes_the_folder_and_refuses_what_it_cannot_write(tmp_path):
    folder = tmp_path / "new" / "tokenizer"
    result = _run([sys.executable, "-m", "enginekit.tokenizer_folder", str(folder)])
    assert result.returncode == 0, result.stderr
    assert str(folder) in result.stdout and {p.name for p in folder.iterdir()} == FILES

    result = _run([sys.executable, "-m", "enginekit.tokenizer_folder"])
    assert result.returncode == 2 and "usage: python -m enginekit.tokenizer_folder" in result.stderr
    assert "error: expected one FOLDER, got 0 arguments" in result.stderr

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    result = _run([sys.executable, "-m", "enginekit.tokenizer_folder", str(a_file)])
    assert result.returncode == 2
    assert f"error: FOLDER={str(a_file)!r} is a file, not a folder" in result.stderr

    site = block_modules(tmp_path / "site", ["sentencepiece"])
    result = _run(
        [sys.executable, "-m", "enginekit.tokenizer_folder", str(tmp_path / "other")],
        pythonpath=site,
    )
    assert result.returncode == 2
    assert "install the data extra: pip install 'enginekit[data]'" in result.stderr
    assert not (tmp_path / "other").exists()


def _run(command: list[str], pythonpath: Path | None = None) -> Any:
    import os
    import subprocess

    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

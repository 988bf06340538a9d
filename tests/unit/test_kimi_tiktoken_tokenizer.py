"""The tiktoken-based Kimi-K2.5-style tokenizer: loads as remote code, ids where Kimi has them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"
TIKTOKEN_DIR = ASSETS / "kimi-k2.5-tiktoken"

# Kimi-K2 / K2.5's special-token ids (vocab 163840; 163584 is the first id after the BPE ranks).
KIMI_IDS = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|start_header_id|>": 163590,
    "<|end_header_id|>": 163591,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<|media_begin|>": 163602,
    "<|media_content|>": 163603,
    "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
    "<think>": 163606,
    "</think>": 163607,
    "[UNK]": 163838,
    "[PAD]": 163839,
}

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\n\n",
    "Unicode: naïve café, 中文字符, emoji 🦊🚀, Zürich — and tabs\tand  spaces  ",
    "numbers 1234567 3.14159 and 'quotes' don't we'll",
]


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TIKTOKEN_DIR), trust_remote_code=True)


def test_loads_offline_as_remote_code_without_a_rust_backend() -> None:
    """A fresh interpreter, hub access off: the class comes from tokenization_kimi.py, although
    config.json says model_type kimi_k25 (which some transformers releases overrode)."""
    code = (
        "from transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(TIKTOKEN_DIR)!r}, trust_remote_code=True)\n"
        "print(type(t).__name__, type(t).__module__.rsplit('.', 1)[-1], t.is_fast)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.split() == ["TikTokenTokenizer", "tokenization_kimi", "False"]
    assert not (TIKTOKEN_DIR / "tokenizer.json").exists()
    config = json.loads((TIKTOKEN_DIR / "tokenizer_config.json").read_text())
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi.TikTokenTokenizer"


def test_chat_tokenizer_refuses_it_without_trust_remote_code() -> None:
    """transformers 5 silently converts tiktoken.model to a fast tokenizer instead of running
    the remote code; the client must not render prompts with a tokenizer the model lacks."""
    from transformers import AutoTokenizer

    from eagle3_datagen.errors import TokenizerError
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    converted = AutoTokenizer.from_pretrained(str(TIKTOKEN_DIR), trust_remote_code=False)
    assert type(converted).__name__ != "TikTokenTokenizer"
    with pytest.raises(TokenizerError, match="trust_remote_code"):
        ChatTokenizer(str(TIKTOKEN_DIR), trust_remote_code=False)


def test_chat_tokenizer_refuses_a_fast_stand_in_for_the_remote_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some transformers releases returned a converted fast tokenizer for Kimi-K2.5 even with
    trust_remote_code (wrong ids from 163589 up); such a tokenizer must not render prompts."""
    import transformers

    from eagle3_datagen.errors import TokenizerError
    from eagle3_datagen.render import chat_tokenizer

    converted = transformers.AutoTokenizer.from_pretrained(str(TIKTOKEN_DIR))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: converted)
    chat_tokenizer._load.cache_clear()
    try:
        with pytest.raises(TokenizerError, match="not the remote code"):
            chat_tokenizer.ChatTokenizer(str(TIKTOKEN_DIR), trust_remote_code=True)
    finally:
        chat_tokenizer._load.cache_clear()


def test_special_tokens_have_kimi_k25_ids(tok: Any) -> None:
    for text, expected in KIMI_IDS.items():
        assert tok.convert_tokens_to_ids(text) == expected, text
        assert tok.encode(text, add_special_tokens=False) == [expected], text
    assert tok.vocab_size == 163840
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (163584, 163585, 163839)


def test_text_round_trips_and_uses_only_bpe_ranks(tok: Any) -> None:
    n_ranks = len((TIKTOKEN_DIR / "tiktoken.model").read_text().splitlines())
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < n_ranks for i in ids), text
        assert tok.decode(ids) == text
        # The slow path (tokens as byte-level strings, then back) agrees with the ids.
        assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids


def test_special_tokens_inside_text_are_single_ids(tok: Any) -> None:
    ids = tok.encode("a<think>b</think>c<|im_end|>", add_special_tokens=False)
    assert [i for i in ids if i >= 163584] == [163606, 163607, 163586]
    assert tok.decode(ids) == "a<think>b</think>c<|im_end|>"


def test_skip_special_tokens_drops_role_tokens_keeps_think(tok: Any) -> None:
    """As Kimi's tokenizer: role and turn tokens are special, <think> is text to a reader."""
    ids = tok.encode(
        "<|im_assistant|>assistant<|im_middle|><think>x</think>y<|im_end|>",
        add_special_tokens=False,
    )
    assert tok.decode(ids, skip_special_tokens=True) == "assistant<think>x</think>y"


def test_chat_template_is_the_mini_tokenizers() -> None:
    mini = json.loads((ASSETS / "kimi-k2.5-mini" / "tokenizer_config.json").read_text())
    tiktoken = json.loads((TIKTOKEN_DIR / "tokenizer_config.json").read_text())
    assert tiktoken["chat_template"] == mini["chat_template"]


def test_committed_files_are_what_the_build_script_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "build_kimi_tiktoken_tokenizer", REPO / "scripts" / "build_kimi_tiktoken_tokenizer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    for name in (
        "tiktoken.model",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
        "tokenization_kimi.py",
    ):
        assert (tmp_path / name).read_bytes() == (TIKTOKEN_DIR / name).read_bytes(), name

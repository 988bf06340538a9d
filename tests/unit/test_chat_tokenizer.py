import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.errors import TokenizerError
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


def prompts() -> list[Prompt]:
    return [
        Prompt("a", 1, [{"role": "user", "content": "What is 1+1?"}], None),
        Prompt(
            "b",
            2,
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
            TOOLS,
        ),
        Prompt("c", 3, [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], None),
        Prompt("d", 4, [{"role": "user", "content": "literal <|im_end|> in user text"}], None),
    ]


def test_template_reference_equals_apply_chat_template(tokenizer_dir: object) -> None:
    """``render: template``: the data through the template as it is, nothing reshaped."""
    chat = ChatTokenizer(str(tokenizer_dir), render="template")
    tok = chat.tok
    for prompt, ids in zip(prompts(), chat.render(prompts()), strict=True):
        expected = tok.apply_chat_template(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert ids == list(expected)


def test_generation_prompt_ends_in_think_and_tools_are_declared(
    chat_tokenizer: ChatTokenizer,
) -> None:
    a, b, *_ = chat_tokenizer.render(prompts())
    assert isinstance(a, list) and isinstance(b, list)
    assert a[-1] == chat_tokenizer.token_id("<think>")
    assert "<|im_system|>tool_declare<|im_middle|>" in chat_tokenizer.decode(b)


def test_thinking_off_via_chat_template_kwargs(tokenizer_dir: object) -> None:
    tok = ChatTokenizer(str(tokenizer_dir), chat_template_kwargs={"thinking": False})
    (ids,) = tok.render(prompts()[:1])
    assert isinstance(ids, list)
    assert ids[-2:] == [tok.token_id("<think>"), tok.token_id("</think>")]


def test_template_failure_is_per_prompt(chat_tokenizer: ChatTokenizer) -> None:
    bad = Prompt("x", 9, [{"role": "critic", "content": "x"}], None)
    out = chat_tokenizer.render([prompts()[0], bad])
    assert isinstance(out[0], list)
    assert isinstance(out[1], RenderError) and "unknown role" in out[1].reason


def test_special_token_must_be_one_token(chat_tokenizer: ChatTokenizer) -> None:
    assert chat_tokenizer.token_id("</think>") == chat_tokenizer.tok.convert_tokens_to_ids(
        "</think>"
    )
    with pytest.raises(TokenizerError, match="not a single token"):
        chat_tokenizer.token_id("<thinking>")


def test_fingerprint_names_the_files_it_was_loaded_from(tokenizer_dir: Path) -> None:
    """Checked against the tokenizer's own files, read here without transformers."""
    fp = ChatTokenizer(str(tokenizer_dir)).fingerprint()
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    template_sha = hashlib.sha256(config["chat_template"].encode()).hexdigest()
    assert fp["chat_template_sha256"] == template_sha
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    ids = set(tokenizer["model"]["vocab"].values()) | {t["id"] for t in tokenizer["added_tokens"]}
    assert fp["vocab_size"] == len(ids)


def test_a_request_sglang_refuses_is_a_named_reject(chat_tokenizer: ChatTokenizer) -> None:
    """String arguments that are not a JSON object: SGLang's chat path answers 400
    (serving_chat.py:181-215; recorded in tests/fixtures/sglang-0.5.23/chat_render/)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{x: 1}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    bad = Prompt("x", 9, messages, None)
    (out,) = chat_tokenizer.render([bad])
    assert isinstance(out, RenderError)
    assert out.reason == (
        "SGLang's chat path refuses the request: message 1: "
        "Assistant tool call function.arguments must be valid JSON."
    )
    (raw,) = ChatTokenizer(chat_tokenizer.path, render="template").render([bad])
    assert isinstance(raw, list)  # the data as it is renders; SGLang's chat path would not

"""The fake model's test script: ``[[call NAME {json}]]`` in the message right before the
generation prompt makes it call exactly those tools, so multi-turn tests can make the model's
call agree with the data's or differ from it."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from sglang_emulator.fake_model import FakeModel
from sglang_emulator.vocab import Vocab, pack_int32
from tests.support import TOKENIZER_DIR
from tests.support.prompts import WEATHER_TOOL


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(TOKENIZER_DIR)


def _generate(model: FakeModel, ids: list[int], seed: int = 0) -> list[int]:
    digest = hashlib.sha256(pack_int32(ids)).digest()
    return model.generate(ids, digest, seed, 4096)


def _render(hf_tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(
        hf_tokenizer.apply_chat_template(
            messages,
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def _section(hf_tokenizer: Any, out: list[int]) -> str:
    text = hf_tokenizer.decode(out, skip_special_tokens=False)
    start = text.find("<|tool_calls_section_begin|>")
    return text[start : text.index("<|tool_calls_section_end|>") + 26] if start >= 0 else ""


def test_the_script_sets_the_calls_and_only_in_the_last_message(
    vocab: Vocab, hf_tokenizer: Any
) -> None:
    model = FakeModel(vocab, tool_call_rate=0.0)
    ask = 'Weather? [[call get_weather {"city": "Rome"}]][[call get_weather {"city":"Oslo"}]]'
    out = _generate(model, _render(hf_tokenizer, [{"role": "user", "content": ask}]))
    assert _section(hf_tokenizer, out) == (
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Rome"}'
        "<|tool_call_end|>"
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city":"Oslo"}'
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    # ... and the turn ends right after the section (the stream goes on past the stop token).
    end = out.index(vocab.special["tool_calls_section_end"])
    assert out[end + 1] == vocab.special["im_end"]
    # After the tool result, the user's script is no longer the last message: no call.
    history: list[dict[str, Any]] = [
        {"role": "user", "content": ask},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21 C"},
    ]
    assert _section(hf_tokenizer, _generate(model, _render(hf_tokenizer, history))) == ""
    # The same prompt gives the same calls whatever the seed; only the words around change.
    prompt = _render(hf_tokenizer, [{"role": "user", "content": ask}])
    assert _section(hf_tokenizer, _generate(model, prompt, seed=5)) == _section(hf_tokenizer, out)


def test_without_a_script_the_random_calls_follow_the_rate(vocab: Vocab, hf_tokenizer: Any) -> None:
    never, always = FakeModel(vocab, tool_call_rate=0.0), FakeModel(vocab, tool_call_rate=1.0)
    prompt = _render(hf_tokenizer, [{"role": "user", "content": "Weather in Paris?"}])
    assert _section(hf_tokenizer, _generate(never, prompt)) == ""
    assert "functions.get_weather:0" in _section(hf_tokenizer, _generate(always, prompt))


def test_the_script_can_skip_think_end_and_write_a_bare_counter(
    vocab: Vocab, hf_tokenizer: Any
) -> None:
    model = FakeModel(vocab, tool_call_rate=0.0)
    ask = 'Weather? [[no-think-end]][[call 3 {"city": "Rome"}]]'
    out = _generate(model, _render(hf_tokenizer, [{"role": "user", "content": ask}]))
    assert vocab.special["think_end"] not in out
    text = hf_tokenizer.decode(out, skip_special_tokens=False)
    reasoning, _, rest = text.partition("<|tool_calls_section_begin|>")
    assert reasoning and "<|" not in reasoning  # reasoning, then straight into the section
    assert rest.startswith(
        '<|tool_call_begin|>3<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
    )

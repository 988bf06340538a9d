"""Turn planning, record ids, a turn's output ids back into a message, tool-call divergence,
and the config of turns and samples."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_datagen.config import ConfigError, SpecialTokens, parse_config
from eagle3_datagen.generate.conversation import (
    continue_history,
    first_turn,
    plan_turns,
    record_id,
    served_turn,
    tool_call_divergence,
)
from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from tests.support import TOKENIZER_DIR
from tests.support.prompts import WEATHER_TOOL

CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris", "unit": "C"}<|tool_call_end|>'
    "<|tool_calls_section_end|>"
)


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(str(TOKENIZER_DIR))


@pytest.fixture(scope="module")
def ids(tok: ChatTokenizer) -> TokenIds:
    return TokenIds.resolve(tok, SpecialTokens())


def _out(tok: ChatTokenizer, text: str) -> list[int]:
    return list(tok.tok.encode(text, add_special_tokens=False))


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"unit": "C", "city": "Paris"},
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18"},
        {"role": "assistant", "content": "18 C."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You are welcome."},
    ]


def _prompt(messages: list[dict[str, Any]]) -> Prompt:
    prompt = parse_prompt(b'{"id": "x", "messages": ' + _json(messages) + b"}", 3)
    assert isinstance(prompt, Prompt)
    return prompt


def test_turns_of_a_line() -> None:
    prompt = _prompt(_conversation())
    last = plan_turns(prompt, "last")
    assert [(s.index, s.history_end, s.data) for s in last] == [(0, 6, None)]
    slots = plan_turns(prompt, "all_turns")
    assert [(s.index, s.history_end) for s in slots] == [(0, 2), (1, 4), (2, 6)]
    assert slots[0].data is not None and slots[0].data["tool_calls"][0]["id"] == "c1"
    assert first_turn(prompt, "all_turns").messages == _conversation()[:2]
    assert first_turn(prompt, "last") is prompt


def _json(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


def test_record_ids() -> None:
    assert record_id("a", 0, 0, turns=False, samples=1) == "a"
    assert record_id("a", 2, 0, turns=True, samples=1) == "a#t2"
    assert record_id("a", 0, 3, turns=False, samples=4) == "a#s3"
    assert record_id("a", 1, 3, turns=True, samples=4) == "a#s3#t1"


def _served(tok: ChatTokenizer, text: str, history: list[dict[str, Any]] | None = None) -> Any:
    """The message SGLang's chat path returns for ``text`` as output ids of a request with the
    weather tool declared and ``history`` (the first user message by default)."""
    history = history or _conversation()[:2]
    prompt = Prompt("x", 1, history, [WEATHER_TOOL])
    [prompt_ids] = tok.render([prompt])
    assert isinstance(prompt_ids, list)
    return served_turn(tok, prompt, history, prompt_ids, _out(tok, text), "stop")


def test_output_ids_become_the_message_sglang_returns(tok: ChatTokenizer) -> None:
    message, calls = _served(tok, f"I should check.</think> Let me look. {CALL}<|im_end|>")
    assert message == {
        "role": "assistant",
        "reasoning_content": "I should check.",
        "content": " Let me look. ",  # not stripped
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "index": 0,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'},
            }
        ],
    }
    assert calls is not None and [c.name for c in calls] == ["get_weather"]
    plain, none = _served(tok, "hm</think>Done.<|im_end|>")
    assert plain == {"role": "assistant", "reasoning_content": "hm", "content": "Done."}
    assert none is None


def test_served_ids_count_the_calls_of_the_history_not_the_models_counter(
    tok: ChatTokenizer,
) -> None:
    history = _conversation()[:6]  # one call in the history
    _, calls = _served(tok, f"r</think>{CALL.replace(':0', ':7')}<|im_end|>", history)
    assert calls is not None and [c.id for c in calls] == ["functions.get_weather:1"]


def test_a_tool_section_ends_the_reasoning_without_think_end(tok: ChatTokenizer) -> None:
    message, calls = _served(tok, f"I will call it.{CALL}<|im_end|>")
    assert message["reasoning_content"] == "I will call it."
    assert message["content"] == ""
    assert calls is not None and calls[0].name == "get_weather"


def test_dashed_names_and_bare_counters_are_calls(tok: ChatTokenizer) -> None:
    dashed = CALL.replace("functions.get_weather:0", "functions.get-weather:0")
    _, calls = _served(tok, f"r</think>{dashed}<|im_end|>")
    assert calls is not None and calls[0].name == "get-weather"
    bare = CALL.replace("functions.get_weather:0", "3")
    _, calls = _served(tok, f"r</think>{bare}<|im_end|>")  # the only tool declared
    assert calls is not None and (calls[0].name, calls[0].id) == (
        "get_weather",
        "functions.get_weather:0",
    )


def test_tool_calls_diverge_on_names_arguments_or_number(tok: ChatTokenizer) -> None:
    data = _conversation()[2]
    _, same = _served(tok, f"r</think>{CALL}<|im_end|>")
    assert tool_call_divergence(data, same) is None  # arguments equal as JSON values
    other = CALL.replace("Paris", "Rome")
    _, rome = _served(tok, f"r</think>{other}<|im_end|>")
    reason = tool_call_divergence(data, rome)
    assert reason is not None and '"city":"Rome"' in reason and '"city":"Paris"' in reason
    _, none = _served(tok, "r</think>It is 18.<|im_end|>")
    assert tool_call_divergence(data, none) is not None
    assert tool_call_divergence({"role": "assistant", "content": "ok"}, none) is None


def test_history_answers_the_models_call(tok: ChatTokenizer) -> None:
    messages = _conversation()
    slots = plan_turns(_prompt(messages), "all_turns")
    model, calls = _served(tok, f"r</think>{CALL}<|im_end|>")
    assert calls is not None
    history = continue_history(messages[:2], model, calls, slots[0], slots[1], messages)
    assert history[2] is model
    assert history[3] == {
        "role": "tool",
        "tool_call_id": "functions.get_weather:0",
        "content": "18",
    }
    assert messages[3]["tool_call_id"] == "c1"  # the data is not changed


def _config(**partition: Any) -> dict[str, Any]:
    tiers = [{"name": "T", "concurrency": 1, "max_tokens": 8}]
    parts = [{"name": "p", "input": "in.jsonl", "tier": "T", **partition}]
    return {"model": {"path": "m"}, "tiers": tiers, "partitions": parts}


def test_config_of_turns_and_samples() -> None:
    part = parse_config(_config()).partitions[0]
    assert (part.regenerate, part.samples, part.temperatures) == ("last", 1, None)
    assert part.temperature(3, 0.8) == 0.8
    part = parse_config(
        _config(regenerate="all_turns", samples=5, temperatures=[0.0, 0.7])
    ).partitions[0]
    assert [part.temperature(n, 1.0) for n in range(5)] == [0.0, 0.7, 0.0, 0.7, 0.0]
    for bad, where in (
        ({"regenerate": "every"}, "regenerate"),
        ({"samples": 0}, "samples"),
        ({"temperatures": [-1.0]}, "temperatures.0"),
        ({"temperatures": []}, "temperatures"),
    ):
        with pytest.raises(ConfigError, match=rf"partitions\.0\.{where}"):
            parse_config(_config(**bad), "cfg.yaml")

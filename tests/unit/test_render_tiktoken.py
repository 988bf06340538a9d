"""``ChatTokenizer.render`` on Kimi-K2.5's tokenizer class path (remote code over tiktoken).

With ``render: template``, each prompt's ids must equal an independent
``apply_chat_template(..., tokenize=True)`` on a tokenizer loaded separately from the same
files, for tools, multi-turn histories with reasoning, tool results and the thinking switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

REPO = Path(__file__).resolve().parents[2]
TIKTOKEN_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-tiktoken"
MINI_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def conversations() -> list[Prompt]:
    return [
        Prompt("plain", 1, [{"role": "user", "content": "What is 1+1?"}], None),
        Prompt(
            "tools",
            2,
            [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "Weather in Paris?"},
            ],
            [WEATHER],
        ),
        Prompt(
            "multi-turn-thinking",
            3,
            [
                {"role": "user", "content": "Think: is 17 prime?"},
                {
                    "role": "assistant",
                    "reasoning_content": "Divisors up to 4: none.",
                    "content": "Yes, 17 is prime.",
                },
                {"role": "user", "content": "And 21? 中文 too, naïve café 🦊"},
            ],
            None,
        ),
        Prompt(
            "tool-loop",
            4,
            [
                {"role": "user", "content": "Weather in Paris, then summarise."},
                {
                    "role": "assistant",
                    "reasoning_content": "I should call the tool.",
                    "content": "",
                    "tool_calls": [CALL],
                },
                {
                    "role": "tool",
                    "tool_call_id": "call_0",
                    "content": '{"temp": 21, "sky": "sunny"}',
                },
            ],
            [WEATHER],
        ),
        Prompt(
            "parts-and-literal-specials",
            5,
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "write <think> and "},
                        {"type": "text", "text": "<|im_end|> literally"},
                    ],
                },
            ],
            None,
        ),
        Prompt(
            "code",
            6,
            [
                {"role": "user", "content": "def add(a, b):\n    return a + b\n\n\n\tindented  "},
            ],
            None,
        ),
    ]


@pytest.fixture(scope="module")
def independent() -> Any:
    """A second tokenizer instance, loaded directly (not through ChatTokenizer's cache)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TIKTOKEN_DIR), trust_remote_code=True)


@pytest.mark.parametrize("kwargs", [{}, {"thinking": False}])
def test_render_equals_apply_chat_template(independent: Any, kwargs: dict[str, Any]) -> None:
    chat = ChatTokenizer(str(TIKTOKEN_DIR), chat_template_kwargs=kwargs, render="template")
    assert not chat.tok.is_fast
    rendered = chat.render(conversations())
    for prompt, ids in zip(conversations(), rendered, strict=True):
        expected = independent.apply_chat_template(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        assert ids == list(expected), prompt.id
        assert all(isinstance(i, int) for i in ids)


def test_prompts_end_as_kimi_k25_and_keep_only_current_reasoning() -> None:
    chat = ChatTokenizer(str(TIKTOKEN_DIR))
    by_id = dict(zip([p.id for p in conversations()], chat.render(conversations()), strict=True))
    think, think_end = chat.token_id("<think>"), chat.token_id("</think>")
    assert (think, think_end) == (163606, 163607)
    for ids in by_id.values():
        assert isinstance(ids, list) and ids[-1] == think
    history = chat.decode(by_id["multi-turn-thinking"])  # type: ignore[arg-type]
    assert "<think></think>Yes, 17 is prime." in history and "Divisors" not in history
    loop = chat.decode(by_id["tool-loop"])  # type: ignore[arg-type]
    assert "<think>I should call the tool.</think>" in loop
    # Kimi-K2.5's template prints each call's own id and addresses the result by it; the
    # arguments string was parsed by SGLang's chat path and printed back by ``tojson``.
    assert '<|tool_call_begin|>call_0<|tool_call_argument_begin|>{"city": "Paris"}' in loop
    assert "## Return of call_0" in loop


def test_same_text_as_the_fast_fixture() -> None:
    """Both fixtures share the chat template: only the tokenizer class differs."""
    fast, slow = ChatTokenizer(str(MINI_DIR)), ChatTokenizer(str(TIKTOKEN_DIR))
    assert fast.tok.is_fast and not slow.tok.is_fast
    for prompt, ids in zip(conversations(), slow.render(conversations()), strict=True):
        assert slow.render_text(prompt) == fast.render_text(prompt)
        assert slow.decode(ids) == slow.render_text(prompt)  # type: ignore[arg-type]

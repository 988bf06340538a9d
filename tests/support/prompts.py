"""Prompts for tests and benchmarks: JSONL partitions written line by line, chat-rendered ids."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_TEXT = (
    "the model reads a long document about distributed systems and answers with care while "
    "keeping every token exact because a draft model learns from the target model outputs and "
    "any mismatch between the ids it sees at training time and the ids the server produced "
    "costs acceptance rate at inference time so the pipeline never round trips through text"
)
_WORDS = _TEXT.split(" ")
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def prompt_id(i: int) -> str:
    return f"p{i:07d}"


def prompt_line(i: int, words: int = 60) -> str:
    """Input line ``i``: a user turn (every 4th with a system turn, every 8th with a tool)."""
    rng = random.Random(i)
    text = " ".join(rng.choices(_WORDS, k=words))
    row: dict[str, Any] = {"id": prompt_id(i), "messages": [{"role": "user", "content": text}]}
    if i % 4 == 1:
        row["messages"].insert(0, {"role": "system", "content": "You are a careful assistant."})
    if i % 8 == 3:
        row["tools"] = [WEATHER_TOOL]
    return json.dumps(row)


def write_prompts(path: Path, n: int, words: int = 60, first: int = 0) -> Path:
    """A JSONL partition of prompts ``first`` .. ``first + n - 1``, written line by line."""
    with path.open("w") as fh:
        for i in range(first, first + n):
            fh.write(prompt_line(i, words) + "\n")
    return path


def prompt_ids(n: int, first: int = 0) -> list[str]:
    """The ids :func:`write_prompts` gives, in file order."""
    return [prompt_id(i) for i in range(first, first + n)]


def render(tok: Any, text: str, tools: list[Any] | None = None, **kwargs: Any) -> list[int]:
    """One user turn through a transformers tokenizer's chat template, generation prompt on."""
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}],
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return [int(i) for i in ids]


def expected_prompt_ids(tok: Any, row: dict[str, Any], render: str = "template") -> list[int]:
    """An input row rendered independently of the pipeline (transformers' own chat template,
    trailing assistant turn dropped): what its stored ``prompt_ids`` must be. With
    ``render="sglang_chat"`` the template runs over the request as SGLang's chat path hands it
    over (``render.sglang_chat.prepare``, itself checked id for id against SGLang 0.5.23's own
    chat path by tests/unit/test_sglang_chat_render.py)."""
    messages = row["messages"]
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    tools = row.get("tools")
    if render == "sglang_chat":
        from eagle3_datagen.render import sglang_chat

        fmt = sglang_chat.content_format(str(tok.chat_template))
        messages, tools = sglang_chat.prepare(messages, tools, fmt)
    ids = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]

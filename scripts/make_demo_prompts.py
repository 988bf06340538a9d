"""Write the demo partitions in ``src/eagle3_datagen/assets/demo`` (committed; rerun to change).

The short partition deliberately holds three bad lines (invalid JSON, no messages, an unknown
role) and one repeated prompt, so the demo shows rejects with file, line and reason next to the
accepted records.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "eagle3_datagen" / "assets" / "demo"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
TOPICS = [
    "Paris",
    "Tokyo",
    "prime numbers",
    "binary search",
    "the French revolution",
    "photosynthesis",
    "speculative decoding",
    "a Python list",
    "sorting",
    "black holes",
]


def short_lines() -> list[str]:
    lines = []
    for i in range(60):
        topic = TOPICS[i % len(TOPICS)]
        kind = i % 6
        if kind == 0:
            row = {
                "id": f"short-{i:03d}",
                "messages": [{"role": "user", "content": f"Tell me about {topic}."}],
            }
        elif kind == 1:
            row = {
                "id": f"short-{i:03d}",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"What is {i} + {i}?"},
                    {"role": "assistant", "content": "An old answer that gets regenerated."},
                ],
            }
        elif kind == 2:
            row = {
                "id": f"short-{i:03d}",
                "tools": [WEATHER_TOOL, SEARCH_TOOL],
                "messages": [{"role": "user", "content": f"What is the weather in {topic}?"}],
            }
        elif kind == 3:
            row = {
                "id": f"short-{i:03d}",
                "tools": [WEATHER_TOOL],
                "messages": [
                    {"role": "user", "content": "Weather in Berlin?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "get_weather:0",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Berlin"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "get_weather:0", "content": "sunny, 21 C"},
                ],
            }
        elif kind == 4:
            row = {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": f"Explain {topic} briefly ({i})."}],
                    }
                ]
            }
        else:
            row = {
                "id": f"short-{i:03d}",
                "messages": [
                    {"role": "user", "content": f"Define {topic}."},
                    {"role": "assistant", "content": "A definition."},
                    {"role": "user", "content": "Now give an example."},
                ],
            }
        lines.append(json.dumps(row))
    lines.insert(10, '{"id": "bad-json", "messages": [{"role": "user", "content": "unterminated}')
    lines.insert(25, json.dumps({"id": "bad-no-messages", "prompt": "where are my messages?"}))
    lines.insert(
        40, json.dumps({"id": "bad-role", "messages": [{"role": "wizard", "content": "hi"}]})
    )
    lines.append(lines[0])  # the same prompt twice: the second is rejected as a duplicate id
    return lines


def long_lines() -> list[str]:
    lines = []
    for i in range(24):
        topic = TOPICS[i % len(TOPICS)]
        text = " ".join(
            [f"Section {k}: a long discussion of {topic} with many details." for k in range(8)]
        )
        lines.append(
            json.dumps(
                {
                    "id": f"long-{i:03d}",
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Summarise this document and reason carefully.\n{text}",
                        }
                    ],
                }
            )
        )
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "short.jsonl").write_text("\n".join(short_lines()) + "\n")
    (OUT / "long.jsonl").write_text("\n".join(long_lines()) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

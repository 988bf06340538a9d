"""The prompt ids SGLang 0.5.23's own chat path builds, for a generated corpus of chat requests.

    .venv-conformance/bin/python -m conformance.chat_render [--out DIR] [--asset NAME ...]

Why: ``render: sglang_chat`` (src/eagle3_datagen/render/sglang_chat.py) claims the prompt ids
``POST /v1/chat/completions`` would build for the same request. The oracle is SGLang's real
request path, not a reading of it: each request goes over HTTP to SGLang's own app
(`conformance/process.py`: SGLang's FastAPI app, its ``OpenAIServingChat`` and
``TemplateManager``, the CPU fake engine behind the tokenizer manager) launched as Kimi-K2.5 is
deployed (``--tool-call-parser kimi_k2 --reasoning-parser kimi_k2``), with
``return_prompt_token_ids`` so the response carries the ids SGLang rendered and encoded. A
request SGLang refuses is recorded with its status and message.

The corpus (:func:`corpus`) is generated from a fixed seed: plain and multi-turn chats, tools
declared in every shape the tool model accepts, data histories with tool calls (string
arguments with any spacing, escapes and unicode, object arguments, parallel calls, tool results
as strings and as content parts), ``regenerate: all_turns`` histories built from assistant
turns as SGLang's chat path returns them (reasoning, content, calls with
``functions.{name}:{n}`` ids and JSON-string arguments), and requests SGLang refuses.

The recording (one JSON file per bundled tokenizer under
``tests/fixtures/sglang-0.5.23/chat_render/``) is replayed in CI by
``tests/unit/test_sglang_chat_render.py``, without SGLang.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from conformance.process import REPO, RealAppProcess, model_dir

SEED = 19
FLAGS = [
    "--tool-call-parser",
    "kimi_k2",
    "--reasoning-parser",
    "kimi_k2",
    "--trust-remote-code",
    "--random-seed",
    "1",
]
ASSETS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")
OUT = REPO / "tests" / "fixtures" / "sglang-0.5.23" / "chat_render"

CITIES = ["Paris", "東京", "São Paulo", "New York", 'O"Brien Town', "Back\\slash", "Zürich"]
WORDS = ["weather", "sum", "think", "tool", "answer", "prime", "café", "🦊", "x\ty", "line\nnext"]


# -- tools ---------------------------------------------------------------------------------------


def _tool(rng: random.Random, name: str) -> dict[str, Any]:
    """A tool declaration in one of the shapes clients send."""
    params: dict[str, Any] = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "a city"},
            "days": {"type": rng.choice(["integer", "int64", "bigint", "number"])},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    }
    function: dict[str, Any] = {"name": name, "parameters": params}
    shape = rng.randrange(7)
    if shape == 0:
        function = {"description": f"Call {name}.", **function}
    elif shape == 1:
        function = {"parameters": params, "name": name, "description": "params first"}
    elif shape == 2:
        function["strict"] = rng.choice([True, False])
    elif shape == 3:
        params["properties"]["note"] = {"type": rng.choice(["varchar(255)", "text", "list[str]"])}
    elif shape == 4:
        function = {"name": name}  # no parameters at all
    tool: dict[str, Any] = {"type": "function", "function": function}
    if shape == 5:
        tool["defer_loading"] = rng.choice([True, False])
    if shape == 6:
        tool = {"function": function}  # "type" left to its default
    return tool


def _tools(rng: random.Random, names: list[str]) -> list[dict[str, Any]]:
    return [_tool(rng, n) for n in names]


# -- messages ------------------------------------------------------------------------------------


def _text(rng: random.Random, n: int = 4) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _arguments(rng: random.Random) -> tuple[str | dict[str, Any], dict[str, Any]]:
    """Arguments as a client sends them (a JSON string in some spelling, or an object)."""
    value: dict[str, Any] = {"city": rng.choice(CITIES)}
    if rng.random() < 0.5:
        value["days"] = rng.choice([1, 3, 14, 2.5, -1])
    if rng.random() < 0.3:
        value["opts"] = {"unit": rng.choice(["c", "f"]), "alerts": [True, None, "x"]}
    style = rng.randrange(5)
    if style == 0:
        return value, value
    if style == 1:
        return json.dumps(value, separators=(",", ":")), value
    if style == 2:
        return json.dumps(value, indent=2), value
    if style == 3:
        return json.dumps(value, ensure_ascii=True), value
    return json.dumps(value, ensure_ascii=False), value


def _call(rng: random.Random, name: str, call_id: str) -> dict[str, Any]:
    arguments, _ = _arguments(rng)
    call: dict[str, Any] = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if rng.random() < 0.2:
        call["index"] = 0
    return call


def _result(rng: random.Random, call_id: str, name: str) -> dict[str, Any]:
    shape = rng.randrange(4)
    content: Any = json.dumps({"temp": rng.randrange(-5, 35), "sky": rng.choice(WORDS)})
    if shape == 1:
        content = [{"type": "text", "text": "part one"}, {"type": "text", "text": content}]
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
    if shape == 2:
        message["name"] = name
    return message


def _tool_turns(
    rng: random.Random, names: list[str], *, regenerated: bool, counter: list[int], calls: int
) -> list[dict[str, Any]]:
    """One assistant turn with ``calls`` parallel calls, then their results.

    ``regenerated``: the turn as SGLang's chat path returns it (reasoning, ids
    ``functions.{name}:{history count + i}``, arguments a JSON string as the kimi_k2 parser
    extracts them); otherwise as data sets write them (``call_*`` ids, any argument spelling).
    """
    chosen = [rng.choice(names) for _ in range(calls)]
    tool_calls: list[dict[str, Any]] = []
    if regenerated:
        for i, name in enumerate(chosen):
            _, value = _arguments(rng)
            tool_calls.append(
                {
                    "id": f"functions.{name}:{counter[0] + i}",
                    "index": i,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(value, ensure_ascii=False)},
                }
            )
        said = rng.choice(["", "Let me check."])
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": said,
            "reasoning_content": _text(rng, 6),
            "tool_calls": tool_calls,
        }
    else:
        tool_calls = [_call(rng, n, f"call_{rng.randrange(10**6):06d}") for n in chosen]
        assistant = {"role": "assistant", "tool_calls": tool_calls}
        content = rng.choice([None, "", "Calling tools.", "absent"])
        if content != "absent":
            assistant["content"] = content
        if rng.random() < 0.5:
            assistant["reasoning_content"] = _text(rng, 5)
    counter[0] += calls
    results = [_result(rng, c["id"], c["function"]["name"]) for c in tool_calls]
    return [assistant, *results]


def _conversation(
    rng: random.Random, *, tools: bool, turns: int, regenerated: bool, system: bool
) -> dict[str, Any]:
    names = ["get_weather", "search-web", "calc_sum"][: rng.randrange(1, 4)]
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": "You are a careful assistant."})
    counter = [0]
    for turn in range(turns):
        user: dict[str, Any] = {"role": "user", "content": _text(rng, 5)}
        if rng.random() < 0.2:
            user["content"] = [{"type": "text", "text": _text(rng)}, {"type": "text", "text": "?"}]
        messages.append(user)
        last = turn == turns - 1
        if tools and rng.random() < 0.8:
            for _ in range(rng.randrange(1, 3)):
                messages += _tool_turns(
                    rng,
                    names,
                    regenerated=regenerated,
                    counter=counter,
                    calls=rng.choice([1, 1, 2, 3]),
                )
        if not last:
            reply: dict[str, Any] = {"role": "assistant", "content": _text(rng, 6)}
            if rng.random() < 0.5:
                reply["reasoning_content"] = _text(rng, 4)
            messages.append(reply)
    request: dict[str, Any] = {"messages": messages}
    if tools:
        request["tools"] = _tools(rng, names)
    return request


def _special_cases() -> list[tuple[str, dict[str, Any]]]:
    """Hand-written edges: each pins one step of SGLang's chat path."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    user = {"role": "user", "content": "Weather in Paris?"}
    # fmt: off
    return [
        ("plain", {"messages": [{"role": "user", "content": "What is 1+1?"}]}),
        ("plain_thinking_off", {"messages": [{"role": "user", "content": "Hi"}],
                                "chat_template_kwargs": {"thinking": False}}),
        ("tools_declared", {"messages": [user], "tools": [weather]}),
        ("tools_empty_list", {"messages": [user], "tools": []}),
        ("string_arguments_compact", {"messages": [user, {"role": "assistant", "content": "",
            "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "21C"}],
            "tools": [weather]}),
        ("trailing_assistant_becomes_user", {"messages": [user, {"role": "assistant",
            "content": "It is sunny."}]}),
        ("null_fields", {"messages": [{"role": "system", "content": None, "name": None}, user,
            {"role": "assistant", "content": None, "reasoning_content": None,
             "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}),
        ("unknown_message_keys", {"messages": [{**user, "weight": 0.0, "metadata": {"a": 1}},
            {"role": "assistant", "content": "ok", "loss": False}, user]}),
        ("named_user_and_tool", {"messages": [{**user, "name": "alice"}, {"role": "assistant",
            "content": "", "tool_calls": [call]}, {"role": "tool", "name": "get_weather",
            "tool_call_id": "call_1", "content": "x"}]}),
        ("thinking_part_in_assistant", {"messages": [user, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hidden"}, {"type": "text", "text": "shown"}]},
            user]}),
        ("tool_content_parts", {"messages": [user, {"role": "assistant", "content": "",
            "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
        ("bad_arguments_not_json", {"messages": [user, {"role": "assistant", "content": "",
            "tool_calls": [{**call, "function": {"name": "get_weather",
                                                 "arguments": "{city: Paris}"}}]}]}),
        ("bad_arguments_not_object", {"messages": [user, {"role": "assistant", "content": "",
            "tool_calls": [{**call, "function": {"name": "get_weather",
                                                 "arguments": "[1, 2]"}}]}]}),
        ("empty_messages", {"messages": []}),
    ]
    # fmt: on


def corpus(seed: int = SEED) -> list[tuple[str, dict[str, Any]]]:
    """(name, request body without model/sampling) for every case, the same for a seed."""
    rng = random.Random(seed)
    cases = _special_cases()
    kinds = [("chat", False, False), ("tools", True, False), ("all_turns", True, True)]
    for i in range(72):
        for kind, tools, regenerated in kinds:
            request = _conversation(
                rng,
                tools=tools,
                turns=rng.randrange(1, 5),
                regenerated=regenerated,
                system=rng.random() < 0.4,
            )
            if rng.random() < 0.15:
                request["chat_template_kwargs"] = {"thinking": False}
            cases.append((f"{kind}_{i:03d}", request))
    return cases


# -- recording -----------------------------------------------------------------------------------


def ask(client: httpx.Client, url: str, request: dict[str, Any]) -> dict[str, Any]:
    """What SGLang's chat path made of ``request``: its prompt ids, or its refusal."""
    body = {
        "model": "default",
        **request,
        "max_tokens": 1,
        "temperature": 0,
        "return_prompt_token_ids": True,
    }
    response = client.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    if response.status_code != 200:
        return {"status": response.status_code, "error": response.text}
    choice = response.json()["choices"][0]
    return {"status": 200, "prompt_ids": choice["prompt_token_ids"]}


def record_asset(asset: str, work: Path) -> dict[str, Any]:
    app = RealAppProcess(work, *FLAGS, model_path=model_dir(work, asset))
    with app, httpx.Client() as client:
        cases = [
            {"name": name, "request": request, **ask(client, app.url, request)}
            for name, request in corpus()
        ]
    return {
        "about": "SGLang 0.5.23's POST /v1/chat/completions over the corpus of "
        "conformance/chat_render.py; prompt_ids as the response's prompt_token_ids",
        "asset": asset,
        "flags": FLAGS,
        "cases": cases,
    }


def record_main(
    argv: list[str] | None,
    prog: str,
    out: Path,
    record: Callable[[str, Path], dict[str, Any]],
) -> int:
    """A recorder's command line: ``record`` each asset (or those named by ``--asset``) into
    ``--out``/ASSET.json, and say how many requests SGLang refused."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("--asset", action="append", choices=ASSETS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chat-render-") as tmp:
        for asset in args.asset or ASSETS:
            recording = record(asset, Path(tmp))
            path = args.out / f"{asset}.json"
            path.write_text(json.dumps(recording, ensure_ascii=False, indent=1) + "\n")
            refused = sum(c["status"] != 200 for c in recording["cases"])
            print(f"{path}: {len(recording['cases'])} requests ({refused} refused)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return record_main(argv, "conformance.chat_render", OUT, record_asset)


if __name__ == "__main__":
    raise SystemExit(main())

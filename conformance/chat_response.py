"""Output ids through SGLang 0.5.23's own chat response path, recorded for CI.

    PYTHONPATH=$PWD/src:$PWD .venv-conformance/bin/python -m conformance.chat_response

For each case (a ``/v1/chat/completions`` request and the output ids the model "generates"), the
real app (`conformance/server.py`, launched with ``--reasoning-parser kimi_k2
--tool-call-parser kimi_k2`` as a Kimi-K2.5 deployment is) answers the request with exactly
those ids (``--fake-outputs``, by rid). Everything between the ids and the returned message is
SGLang's: the request's sampling params (``skip_special_tokens`` switched off by tools,
``spaces_between_special_tokens``), its detokenizer (`fake_engine.SGLangDetokenizer`), its
``kimi_k2`` reasoning and tool-call parsers and its tool-call ids. The prompt ids SGLang built
(the last of them feed the detokenizer) are read from the fake engine's log.

`record` writes ``tests/fixtures/sglang-0.5.23/chat-response/<tokenizer>.json`` (one per bundled
tokenizer): each case's request, prompt ids, output ids, finish and SGLang's message (nulls left
out). `tests/unit/test_chat_response.py` replays them in CI against
``eagle3_datagen.sglang.chat_response`` (no SGLang there); `tests/conformance/
test_chat_response.py` runs the cases live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conformance.process import REPO, RealAppProcess, model_dir

FIXTURES = REPO / "tests" / "fixtures" / "sglang-0.5.23" / "chat-response"
TOKENIZERS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")
PARSER_FLAGS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time of a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}
DASHED = {
    "type": "function",
    "function": {
        "name": "web-search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}

S, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
END = "<|im_end|>"


def call(head: str, args: str) -> str:
    return f"<|tool_call_begin|>{head}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


ASK = [{"role": "user", "content": "Weather in Paris, and the time there?"}]
HISTORY_2_CALLS: list[dict[str, Any]] = [
    *ASK,
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Both.",
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "functions.get_time:1",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"zone": "Europe/Paris"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"},
    {"role": "tool", "tool_call_id": "functions.get_time:1", "content": "14:05"},
]
PARIS = call("functions.get_weather:0", '{"city": "Paris"}')
CET = call("functions.get_time:1", '{"zone": "CET"}')
SEARCH = call("functions.web-search:0", '{"query": "x"}')
BARE_PARIS = call("3", '{"city": "Paris"}')
BARE_CET = call("0", '{"zone": "CET"}')
SPACED = call(" functions.get_weather:0 ", ' {"city": "Rome"} ')
NESTED = call("functions.get_weather:0", '{"city": {"name": "Paris"}}')
SPACE_ID = call("get weather", '{"city": "Paris"}')
LIST_ARGS = call("7", "[1, 2]")
LONG = "Ich überlege: 東京 oder París? 🌦️ " * 12  # > 50 ids, multi-byte characters


@dataclass
class Case:
    """One request and the text whose ids the model outputs (encoded by the tokenizer)."""

    name: str
    about: str
    output: str
    messages: list[dict[str, Any]] = field(default_factory=lambda: list(ASK))
    tools: list[dict[str, Any]] | None = field(default_factory=lambda: [WEATHER, TIME])
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: int = 4096
    ids_from: str | None = None  # take the output ids of this recorded /generate fixture
    tokenizers: tuple[str, ...] = TOKENIZERS


CASES = [
    Case(
        "plain_no_tools",
        "no tools: skip_special_tokens stays true",
        f"Think.</think>Hi.{END}",
        tools=None,
    ),
    Case("plain_with_tools", "tools declared, no call", f"Think.</think>It is 18 C.{END}"),
    Case("one_call", "one call after text", f"Look up.</think> Let me look. {S}{PARIS}{E}{END}"),
    Case("parallel_calls", "two calls in one section", f"Both.</think>{S}{PARIS}{CET}{E}{END}"),
    Case(
        "history_counts_ids",
        "two calls in the history: the model's :0 is returned as :2",
        f"Again.</think>{S}{PARIS}{E}{END}",
        messages=HISTORY_2_CALLS,
    ),
    Case(
        "section_ends_reasoning",
        "no </think>: the section ends the reasoning",
        f"I will call it.{S}{PARIS}{E}{END}",
    ),
    Case(
        "section_after_newline",
        "no </think>, the section on its own line",
        f"I will call it.\n{S}\n{PARIS}\n{E}{END}",
    ),
    Case(
        "dashed_name",
        "a name with '-'",
        f"Search.</think>{S}{SEARCH}{E}{END}",
        tools=[WEATHER, DASHED],
    ),
    Case(
        "bare_counter_one_tool",
        "a bare counter, the only tool declared",
        f"r</think>{S}{BARE_PARIS}{E}{END}",
        tools=[WEATHER],
    ),
    Case(
        "bare_counter_by_keys",
        "a bare counter, named by its argument keys",
        f"r</think>{S}{BARE_CET}{E}{END}",
    ),
    Case("spaced_call", "whitespace around ids and arguments", f"r</think>{S}\n{SPACED}\n{E}{END}"),
    Case("nested_arguments", "arguments with a nested object", f"r</think>{S}{NESTED}{E}{END}"),
    Case(
        "id_with_space",
        "an id SGLang cannot read: the call is dropped",
        f"r</think>{S}{SPACE_ID}{E}{END}",
    ),
    Case(
        "arguments_not_object",
        "arguments JSON but not an object",
        f"r</think>Text {S}{LIST_ARGS}{E}{END}",
    ),
    Case(
        "section_without_tools",
        "a tool section in a request without tools",
        f"r</think>Sure. {S}{PARIS}{E}{END}",
        tools=None,
    ),
    Case("think_end_twice", "two </think>", f"a</think>b</think>c{END}"),
    Case("think_start_again", "the model opens <think> itself", f"<think>a</think>b{END}"),
    Case(
        "thinking_off",
        "thinking: false in chat_template_kwargs",
        f"Just this.{END}",
        chat_template_kwargs={"thinking": False},
    ),
    Case(
        "no_spaces_between_special",
        "spaces_between_special_tokens: false",
        f"a</think>b {S}{PARIS}{E}{END}",
        chat_template_kwargs={"spaces_between_special_tokens": False},
    ),
    Case("truncated", "finish length: nothing trimmed", f"Still thinking {LONG}", max_tokens=40),
    Case(
        "long_multibyte",
        "more than 50 ids (chunked detokenization), multi-byte text",
        f"{LONG}</think>{LONG}{END}",
    ),
    Case("long_multibyte_tools", "the same with tools declared", f"{LONG}</think>{LONG}{END}"),
]


def _recorded_turns() -> list[Case]:
    """The real app's answers to the regenerated conversation's turn 0 (``conformance/record.py``,
    recorded with kimi-k2.5-mini): the calls SGLang's parser returns for them are what the
    emulator's scripted calls must give (``tests/emulator/test_recorded_fixtures.py``)."""
    from conformance.record import REGEN_LINE, REGEN_TOOL

    return [
        Case(
            f"recorded_{stem}",
            f"the output ids of the recorded /generate answer {stem}",
            "",
            messages=list(REGEN_LINE["messages"][:1]),
            tools=[REGEN_TOOL],
            ids_from=stem,
            tokenizers=("kimi-k2.5-mini",),
        )
        for stem in (
            "generate_all_turns_tool_call",
            "generate_sample_0_turn_0",
            "generate_sample_2_turn_0",
        )
    ]


CASES += _recorded_turns()


def output_ids(tok: Any, case: Case) -> list[int]:
    if case.ids_from is not None:
        fixture = json.loads((FIXTURES.parent / f"{case.ids_from}.json").read_text())
        return [int(i) for i in fixture["response"]["body"]["output_ids"]]
    return [int(i) for i in tok.encode(case.output, add_special_tokens=False)]


def chat_body(case: Case, rid: str) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": case.messages, "rid": rid, "max_tokens": case.max_tokens}
    if case.tools is not None:
        body["tools"] = case.tools
    if case.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = case.chat_template_kwargs
    return body


def _drop_nulls(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if v is not None}


def run_cases(work: Path, asset: str, cases: list[Case] | None = None) -> list[dict[str, Any]]:
    """Every case through the real app with ``asset``'s tokenizer: one entry per case."""
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    cases = [c for c in (CASES if cases is None else cases) if asset in c.tokenizers]
    model = model_dir(work, asset)
    tok = ChatTokenizer(str(model)).tok
    scripted = {f"chat-response:{c.name}": output_ids(tok, c) for c in cases}
    outputs = work / f"outputs-{asset}.json"
    outputs.write_text(json.dumps(scripted))
    flags = [*PARSER_FLAGS, "--fake-outputs", str(outputs)]
    if "tiktoken" in asset:
        flags.append("--trust-remote-code")
    entries = []
    with RealAppProcess(work, *flags, model_path=model) as app:
        app.wait_ready(300)
        for case in cases:
            rid = f"chat-response:{case.name}"
            body = chat_body(case, rid)
            got = httpx.post(f"{app.url}/v1/chat/completions", json=body, timeout=120)
            assert got.status_code == 200, (case.name, got.text)
            choice = got.json()["choices"][0]
            [served] = [a for a in app.answers() if a["rid"] == rid]
            entries.append(
                {
                    "name": case.name,
                    "about": case.about,
                    "request": {k: v for k, v in body.items() if k not in ("rid", "max_tokens")},
                    "prompt_ids": served["input_ids"],
                    "output_ids": served["output_ids"],
                    "finish_reason": served["finish_reason"],
                    "sglang_finish_reason": choice["finish_reason"],
                    "message": _drop_nulls(choice["message"]),
                }
            )
    return entries


def record(work: Path) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for asset in TOKENIZERS:
        entries = run_cases(work / asset, asset)
        doc = {
            "sglang": "0.5.23",
            "launch_flags": list(PARSER_FLAGS),
            "tokenizer": asset,
            "cases": entries,
        }
        (FIXTURES / f"{asset}.json").write_text(
            json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        )
        print(f"{asset}: {len(entries)} cases -> {FIXTURES / f'{asset}.json'}")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp))

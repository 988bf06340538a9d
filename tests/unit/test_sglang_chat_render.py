"""``render: sglang_chat`` against SGLang 0.5.23's own chat path, recorded: no SGLang needed here.

``conformance/chat_render.py`` sent each request of its corpus to SGLang's real
``POST /v1/chat/completions`` app (Kimi-K2.5's parsers, each bundled tokenizer) and recorded the
prompt ids SGLang built, or its refusal. Every recorded request must render here to exactly
those ids, or be a named reject where SGLang refused it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from conformance.chat_render import corpus
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "sglang-0.5.23" / "chat_render"
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"
TOKENIZERS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")


def recording(asset: str) -> dict[str, Any]:
    return dict(json.loads((RECORDED / f"{asset}.json").read_text(encoding="utf-8")))


def render_all(asset: str, render: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each case's render (ids or RenderError), the cases grouped by their template kwargs."""
    groups: dict[bytes, list[dict[str, Any]]] = defaultdict(list)
    for case in cases:
        kwargs = case["request"].get("chat_template_kwargs") or {}
        groups[orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS)].append(case)
    out: dict[str, Any] = {}
    for key, group in groups.items():
        tok = ChatTokenizer(
            str(ASSETS / asset),
            chat_template_kwargs=orjson.loads(key),
            render=render,  # type: ignore[arg-type]
        )
        prompts = [
            Prompt(c["name"], i, c["request"]["messages"], c["request"].get("tools"))
            for i, c in enumerate(group)
        ]
        out.update(zip([c["name"] for c in group], tok.render(prompts), strict=True))
    return out


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_every_recorded_request_renders_as_sglang_built_it(asset: str) -> None:
    cases = recording(asset)["cases"]
    assert len(cases) >= 200
    rendered = render_all(asset, "sglang_chat", cases)
    wrong = []
    for case in cases:
        got = rendered[case["name"]]
        if case["status"] == 200 and got != case["prompt_ids"]:
            wrong.append(f"{case['name']}: ids differ")
        elif case["status"] != 200 and not isinstance(got, RenderError):
            wrong.append(f"{case['name']}: SGLang refused it ({case['status']}), we rendered it")
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from SGLang: {wrong[:10]}"


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_the_recording_is_of_the_current_corpus(asset: str) -> None:
    """Rerun ``conformance/chat_render.py`` when the corpus changes (its requests are here)."""
    recorded = [[c["name"], c["request"]] for c in recording(asset)["cases"]]
    assert recorded == json.loads(json.dumps(corpus(), ensure_ascii=False))


def test_the_corpus_holds_what_agents_send() -> None:
    """Tools declared, data histories with tool calls (string and object arguments, parallel
    calls, tool results), multi-turn chats, all_turns histories of regenerated tool-call
    turns, and requests SGLang refuses."""
    cases = recording("kimi-k2.5-mini")["cases"]
    ok = [c["request"] for c in cases if c["status"] == 200]
    calls = [(m, tc) for r in ok for m in r["messages"] for tc in m.get("tool_calls") or []]
    assert sum(bool(r.get("tools")) for r in ok) >= 100
    assert sum(isinstance(tc["function"]["arguments"], str) for _, tc in calls) >= 100
    assert sum(isinstance(tc["function"]["arguments"], dict) for _, tc in calls) >= 20
    assert sum(len(m["tool_calls"]) > 1 for m, _ in calls) >= 20
    assert sum(m["role"] == "tool" for r in ok for m in r["messages"]) >= 100
    assert sum(sum(m["role"] == "user" for m in r["messages"]) >= 3 for r in ok) >= 50
    regenerated = [tc for _, tc in calls if tc["id"].startswith("functions.")]
    assert len(regenerated) >= 100
    assert sum(c["status"] != 200 for c in cases) >= 3


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_the_data_as_it_is_differs_where_sglang_reshapes(asset: str) -> None:
    """``render: template`` (the data through the template unchanged) misses SGLang's ids on
    every prompt with tools (their dumps add ``defer_loading``/``description`` as null) and on
    string tool-call arguments in a non-``tojson`` spelling; plain chats are the same."""
    cases = [c for c in recording(asset)["cases"] if c["status"] == 200]
    raw = render_all(asset, "template", cases)
    for case in cases:
        request = case["request"]
        same = raw[case["name"]] == case["prompt_ids"]
        if request.get("tools"):
            assert not same, case["name"]
        elif case["name"].startswith("chat_"):
            assert same, case["name"]


def test_what_sglang_changed_reads_in_its_own_ids() -> None:
    """SGLang's recorded prompts, decoded: what ``render: template`` would have missed."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ASSETS / "kimi-k2.5-mini"))
    cases = {c["name"]: c for c in recording("kimi-k2.5-mini")["cases"]}

    def text(name: str) -> str:
        return str(tok.decode(cases[name]["prompt_ids"]))

    # Finding 1: the string '{"city":"Paris"}' is parsed, then printed by tojson.
    assert '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>' in text(
        "string_arguments_compact"
    )
    # Finding 3: tools as Tool.model_dump(): unset description and defer_loading appear as null.
    assert (
        '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",'
        '"properties":{"city":{"type":"string"}}},"description":null},"defer_loading":null}]'
    ) in text("tools_declared")
    # Finding 2 (input side): the ids in the history are printed as the request has them.
    assert "<|tool_call_begin|>call_1<|tool_call_argument_begin|>" in text("null_fields")
    assert "## Return of call_1\n" in text("null_fields")
    # A final assistant message is sent as a user message.
    assert text("trailing_assistant_becomes_user").endswith(
        "<|im_user|>user<|im_middle|>It is sunny.<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    # A tool result given as text parts is joined with a space.
    assert "## Return of call_1\na b<|im_end|>" in text("tool_content_parts")
    for name in ("bad_arguments_not_json", "bad_arguments_not_object", "empty_messages"):
        assert cases[name]["status"] == 400, name


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_modes_per_line_render_as_sglang_built_them(asset: str) -> None:
    """Serving modes (docs/modes.md) replayed on SGLang 0.5.23's own recorded renders: each
    recorded request's kwargs ({"thinking": false}) as a line naming the instant mode, a request
    without kwargs as a line naming the thinking mode ({"thinking": true}, which the template
    reads as SGLang's default), in both modes, with and without tools, over multi-turn
    histories; the per-line path must give SGLang's ids."""
    from eagle3_datagen.inputs.modes import apply_mode

    modes = {"thinking": {"thinking": True}, "instant": {"thinking": False}}
    cases = [c for c in recording(asset)["cases"] if c["status"] == 200]
    tok = ChatTokenizer(str(ASSETS / asset))
    prompts = []
    for i, c in enumerate(cases):
        request = c["request"]
        own = request.get("chat_template_kwargs") or {}
        assert own in ({}, {"thinking": False}), c["name"]
        line = Prompt(c["name"], i, request["messages"], request.get("tools"))
        line.mode = "instant" if own else "thinking"
        moded = apply_mode(line, modes, None)
        assert isinstance(moded, Prompt)
        prompts.append(moded)
    for mode in ("instant", "thinking"):
        these = [p for p in prompts if p.mode == mode]
        assert sum(bool(p.tools) for p in these) >= 10 and sum(not p.tools for p in these) >= 5
        assert sum(sum(m["role"] == "user" for m in p.messages) >= 2 for p in these) >= 10
    rendered = tok.render(prompts)
    wrong = [c["name"] for c, ids in zip(cases, rendered, strict=True) if ids != c["prompt_ids"]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from SGLang: {wrong[:10]}"

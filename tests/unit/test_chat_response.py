"""The message SGLang 0.5.23's chat path returns for given output ids, replayed without SGLang.

Each case of ``tests/fixtures/sglang-0.5.23/chat-response/<tokenizer>.json`` was answered by
SGLang's own request, detokenizer and ``kimi_k2`` parser code (``conformance/chat_response.py``);
``sglang/chat_response.py`` must give the same message from the same request and ids, on the
same bundled tokenizer. The validator's verdict on every tool-call section must agree with what
SGLang returned: accepted exactly when SGLang returns every call the model wrote (where SGLang
decodes the model's ids at all: see the skip for the tiktoken stand-in).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from eagle3_datagen.config import SpecialTokens, ValidationPolicy
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.sglang.chat_response import ChatRequest, served_message
from eagle3_datagen.validate.tokens import ToolCallCheck, validate_output
from tests.support import REPO

FIXTURES = REPO / "tests" / "fixtures" / "sglang-0.5.23" / "chat-response"
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"
TOOL_CODES = {
    "tool_call_in_reasoning",
    "malformed_tool_call",
    "tool_call_dropped",
    "tool_call_undeclared",
    "think_end_count",
}


def _cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text())
        out += [(doc["tokenizer"], case) for case in doc["cases"]]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, ChatTokenizer]:
    return {}


def _tokenizer(cache: dict[str, ChatTokenizer], name: str) -> ChatTokenizer:
    if name not in cache:
        cache[name] = ChatTokenizer(str(ASSETS / name), trust_remote_code=True)
    return cache[name]


def test_both_bundled_tokenizers_are_recorded() -> None:
    assert sorted({name for name, _ in CASES}) == ["kimi-k2.5-mini", "kimi-k2.5-tiktoken"]
    assert len(CASES) >= 40


@pytest.mark.parametrize(("tokenizer", "case"), CASES, ids=[f"{t}-{c['name']}" for t, c in CASES])
def test_the_message_is_sglangs(
    tokenizers: dict[str, ChatTokenizer], tokenizer: str, case: dict[str, Any]
) -> None:
    tok = _tokenizer(tokenizers, tokenizer)
    req = case["request"]
    request = ChatRequest(req["messages"], req.get("tools"), req.get("chat_template_kwargs"))
    finish = case["finish_reason"]
    stop_matched = finish["type"] == "stop" and isinstance(finish.get("matched"), int)
    message, calls = served_message(
        tok.tok, request, case["prompt_ids"], case["output_ids"], stop_matched=stop_matched
    )
    assert message == case["message"], case["about"]
    assert len(calls or []) == len(case["message"].get("tool_calls", []))
    # The prompt SGLang built for the request is also what render: sglang_chat builds.
    render = ChatTokenizer(
        str(ASSETS / tokenizer), chat_template_kwargs=request.chat_template_kwargs
    )
    assert render.render([Prompt("case", 1, req["messages"], req.get("tools"))]) == [
        case["prompt_ids"]
    ]


@pytest.mark.parametrize(("tokenizer", "case"), CASES, ids=[f"{t}-{c['name']}" for t, c in CASES])
def test_validation_keeps_a_tool_turn_exactly_when_sglang_returns_its_calls(
    tokenizers: dict[str, ChatTokenizer], tokenizer: str, case: dict[str, Any]
) -> None:
    tok = _tokenizer(tokenizers, tokenizer)
    ids = TokenIds.resolve(tok, SpecialTokens())
    assert ids.tools is not None
    out = case["output_ids"]
    if ids.tools.section_begin not in out or case["finish_reason"]["type"] != "stop":
        pytest.skip("no finished tool-call turn")
    if max(out) >= len(tok.tok):
        # SGLang's detokenizer decodes ids past len(tokenizer) as id 0: the tiktoken stand-in
        # numbers its special tokens from 163584 over ~900 ranks (Kimi-K2.5's ids are dense).
        pytest.skip("ids past len(tokenizer): SGLang's text is not the model's here")
    check = ToolCallCheck(tok.decode, case["request"].get("tools"))
    v = validate_output(
        case["prompt_ids"],
        out,
        finish_type="stop",
        finish_matched=out[-1],
        prompt_tokens=len(case["prompt_ids"]),
        completion_tokens=len(out),
        ids=ids,
        policy=ValidationPolicy(),
        tool_check=check,
    )
    kept = not TOOL_CODES & {code for code, _ in v.reasons}
    returned = len(case["message"].get("tool_calls", [])) == out.count(ids.tools.call_end)
    assert kept == returned, (case["about"], v.reasons, case["message"])

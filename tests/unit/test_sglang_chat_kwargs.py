"""Serving-mode kwargs against SGLang 0.5.23's own chat path, recorded: no SGLang needed here.

``conformance/chat_render_kwargs.py`` sent lines with explicit ``{"thinking": true}`` /
``{"thinking": false}`` (as a mode, as the line's own kwargs, the line's over its mode's), lines
under model-level kwargs (SGLang's ``--default-chat-template-kwargs``, both setting the same
keys), and kwargs sets SGLang may refuse, to SGLang's real ``POST /v1/chat/completions``, and
recorded the prompt ids or the refusal. Each recorded line must render through our per-line
path (``apply_mode`` over ``model.chat_template_kwargs``, docs/modes.md) to SGLang's ids, and
the plan's kwargs probe must stop on exactly the sets SGLang refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance.chat_render_kwargs import MODEL_KWARGS, MODES, kwargs_corpus
from eagle3_datagen.generate.kwargs_probe import check_kwargs
from eagle3_datagen.inputs.modes import apply_mode
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "sglang-0.5.23" / "chat_render" / "kwargs"
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"
TOKENIZERS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")


def recording(asset: str) -> list[dict[str, Any]]:
    data = json.loads((RECORDED / f"{asset}.json").read_text(encoding="utf-8"))
    assert data["modes"] == MODES
    return list(data["cases"])


def tokenizer(asset: str, case: dict[str, Any]) -> ChatTokenizer:
    """The run's tokenizer: ``model.chat_template_kwargs`` as the server's default kwargs."""
    model = case["default_chat_template_kwargs"] or {}
    return ChatTokenizer(str(ASSETS / asset), chat_template_kwargs=model)


def render_line(asset: str, case: dict[str, Any]) -> list[int] | RenderError:
    """The case as an input line (its mode, its own kwargs) through the per-line path."""
    request, line = case["request"], case["line"]
    prompt = Prompt(case["name"], 1, request["messages"], request.get("tools"))
    prompt.mode, prompt.kwargs = line["mode"], dict(line["kwargs"])
    moded = apply_mode(prompt, MODES, None)
    assert isinstance(moded, Prompt)
    [ids] = tokenizer(asset, case).render([moded])
    return ids


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_the_recording_is_of_the_current_corpus(asset: str) -> None:
    """Rerun ``conformance/chat_render_kwargs.py`` when the corpus changes."""
    keys = ("name", "default_chat_template_kwargs", "line", "request")
    recorded = [{k: c[k] for k in keys} for c in recording(asset)]
    assert recorded == json.loads(json.dumps(kwargs_corpus(), ensure_ascii=False))


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_each_line_renders_with_its_mode_and_kwargs_as_sglang_built_it(asset: str) -> None:
    cases = recording(asset)
    accepted = [c for c in cases if c["status"] == 200]
    # Explicit thinking true and false, from a mode and from the line, with and without tools,
    # over histories with earlier reasoning; and under model-level kwargs.
    for value in (True, False):
        these = [
            c
            for c in accepted
            if c["request"].get("chat_template_kwargs", {}).get("thinking") is value
        ]
        assert sum(bool(c["request"].get("tools")) for c in these) >= 8, value
        assert sum(not c["request"].get("tools") for c in these) >= 4, value
        assert (
            sum(any(m.get("reasoning_content") for m in c["request"]["messages"]) for c in these)
            >= 8
        )
    assert sum(c["default_chat_template_kwargs"] is not None for c in accepted) >= 10
    wrong = [c["name"] for c in accepted if render_line(asset, c) != c["prompt_ids"]]
    assert not wrong, f"{len(wrong)} of {len(accepted)} differ from SGLang: {wrong[:10]}"


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_which_kwargs_win_reads_in_sglangs_ids(asset: str) -> None:
    """Model-level kwargs fill what the line leaves unset; the line's own win over its mode's
    and over the model's (the Kimi-K2.5 template prints ``tools_ts_str`` for the tools)."""
    tok = ChatTokenizer(str(ASSETS / asset))
    text = {c["name"]: tok.decode(c["prompt_ids"]) for c in recording(asset) if c["status"] == 200}
    assert text["model_tools_0_0"].endswith("<think></think>")  # the model's thinking false
    assert "[model-level tools]" in text["model_tools_0_0"]
    assert text["model_tools_0_1"].endswith("<think>")  # the mode's thinking true wins
    assert "[line tools]" in text["model_tools_0_3"] and text["model_tools_0_3"].endswith("<think>")
    assert "[line tools]" in text["model_tools_0_4"] and text["model_tools_0_4"].endswith(
        "<think></think>"
    )
    assert text["tools_0_instant_own_true"] == text["tools_0_thinking"]
    assert text["tools_0_thinking_own_false"] == text["tools_0_instant"]
    assert text["tools_0_thinking"] == text["tools_0_custom_own_true"]


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_the_plan_rejects_exactly_the_kwargs_sglang_refuses(asset: str) -> None:
    """Every line's kwargs set SGLang's chat path refused is refused by our plan (the probe of
    ``generate/kwargs_probe.py``: that line's reject); every set it rendered passes."""
    cases = recording(asset)
    refused = [c for c in cases if c["status"] != 200]
    assert len(refused) >= 5 and all(c["status"] in (400, 500) for c in refused)
    disagree = []
    for case in cases:
        line = case["line"]
        probe = check_kwargs(
            tokenizer(asset, case), MODES, None, {case["name"]: (7, line["mode"], line["kwargs"])}
        )
        stopped = case["name"] in probe  # its line rejected
        if stopped != (case["status"] != 200):
            disagree.append(f"{case['name']}: SGLang {case['status']}, we stopped: {stopped}")
        if case["status"] != 200 and not isinstance(render_line(asset, case), RenderError):
            disagree.append(f"{case['name']}: SGLang {case['status']}, we rendered the line")
    assert not disagree, disagree


def test_the_model_level_kwargs_are_the_recorded_servers() -> None:
    cases = recording("kimi-k2.5-mini")
    assert {json.dumps(c["default_chat_template_kwargs"]) for c in cases} == {
        "null",
        json.dumps(MODEL_KWARGS),
    }

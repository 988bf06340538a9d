"""Output ids through SGLang 0.5.23's own chat response path (``conformance/chat_response.py``),
live: the message our ``sglang/chat_response.py`` builds equals SGLang's for every case, on
both bundled tokenizers, and the recording CI replays is the current answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from conformance.chat_response import FIXTURES, TOKENIZERS, run_cases  # noqa: E402
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer  # noqa: E402
from eagle3_datagen.sglang.chat_response import ChatRequest, served_message  # noqa: E402
from tests.support import REPO  # noqa: E402


@pytest.mark.parametrize("asset", TOKENIZERS)
def test_our_message_is_sglangs_and_the_recording_is_current(tmp_path: Path, asset: str) -> None:
    live = run_cases(tmp_path, asset)
    tok = ChatTokenizer(str(REPO / "src" / "eagle3_datagen" / "assets" / asset)).tok
    for case in live:
        req = case["request"]
        finish = case["finish_reason"]
        ours, _ = served_message(
            tok,
            ChatRequest(req["messages"], req.get("tools"), req.get("chat_template_kwargs")),
            case["prompt_ids"],
            case["output_ids"],
            stop_matched=finish["type"] == "stop" and isinstance(finish.get("matched"), int),
        )
        assert ours == case["message"], (case["name"], case["about"])
    recorded = json.loads((FIXTURES / f"{asset}.json").read_text())["cases"]
    assert recorded == live

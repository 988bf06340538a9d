"""``render: sglang_chat`` against SGLang 0.5.23's real ``/v1/chat/completions`` app, live: every
request of the generated corpus (``conformance/chat_render.py``) renders to the prompt ids
SGLang built, or is a named reject where SGLang refused it, on both bundled tokenizers; and the
recording CI replays (``tests/unit/test_sglang_chat_render.py``) is SGLang's current answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from conformance.chat_render import ASSETS, OUT, record_asset  # noqa: E402
from tests.unit.test_sglang_chat_render import render_all  # noqa: E402


@pytest.mark.parametrize("asset", ASSETS)
def test_the_corpus_renders_as_sglang_builds_it(tmp_path: Path, asset: str) -> None:
    live = record_asset(asset, tmp_path)
    cases = live["cases"]
    assert len(cases) >= 200
    ours = render_all(asset, "sglang_chat", cases)
    for case in cases:
        if case["status"] == 200:
            assert ours[case["name"]] == case["prompt_ids"], case["name"]
        else:
            assert not isinstance(ours[case["name"]], list), case["name"]
    recorded = json.loads((OUT / f"{asset}.json").read_text(encoding="utf-8"))
    assert recorded == json.loads(json.dumps(live, ensure_ascii=False))


@pytest.mark.parametrize("asset", ASSETS)
def test_the_kwargs_corpus_renders_as_sglang_builds_it(tmp_path: Path, asset: str) -> None:
    """Serving-mode kwargs live (``conformance/chat_render_kwargs.py``): each line through our
    per-line path gives SGLang's ids, our plan stops on exactly the sets SGLang refused, and
    the recording CI replays (``tests/unit/test_sglang_chat_kwargs.py``) is SGLang's answer."""
    from conformance.chat_render_kwargs import KWARGS_OUT
    from conformance.chat_render_kwargs import record_asset as record_kwargs
    from tests.unit.test_sglang_chat_kwargs import render_line

    live = record_kwargs(asset, tmp_path)
    for case in live["cases"]:
        ours = render_line(asset, case)
        if case["status"] == 200:
            assert ours == case["prompt_ids"], case["name"]
        else:
            assert not isinstance(ours, list), case["name"]
    recorded = json.loads((KWARGS_OUT / f"{asset}.json").read_text(encoding="utf-8"))
    assert recorded == json.loads(json.dumps(live, ensure_ascii=False))

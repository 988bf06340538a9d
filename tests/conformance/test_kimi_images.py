"""Kimi-K2.5 image token counts and placeholder expansion against SGLang 0.5.23's own processor
functions, live (``conformance/kimi_images.py``); the recording CI replays
(``tests/unit/test_kimi_image_tokens.py``) must be SGLang's current answer."""

from __future__ import annotations

import json

import pytest

from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from conformance.kimi_images import OUT, record  # noqa: E402
from tests.unit.test_kimi_image_tokens import check_recording  # noqa: E402


def test_kimi_image_corpus_matches_sglang() -> None:
    live = record()
    assert any(case.get("error") for case in live["expansions"])
    check_recording(live)
    assert json.loads(OUT.read_text(encoding="utf-8")) == live

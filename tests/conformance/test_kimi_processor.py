"""Image prompts on real image bytes against SGLang 0.5.23's Kimi-K2.5 multimodal processor,
live (``conformance/kimi_processor.py``): the recording CI replays
(``tests/unit/test_kimi_processor_replay.py``) must be SGLang's current answer, and the
client's request and stored ids must match it."""

from __future__ import annotations

import json

import pytest

from tests.conformance import requires_sglang

requires_sglang()
pytest.importorskip("vllm", reason="vllm 0.33.0 (the image processor's stand-in) is not installed")
pytestmark = pytest.mark.conformance

from conformance.kimi_processor import OUT, record  # noqa: E402


def test_kimi_processor_corpus_matches_sglang() -> None:
    live = record()
    assert json.loads(OUT.read_text(encoding="utf-8")) == live

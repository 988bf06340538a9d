"""Image messages through SGLang 0.5.23's own chat path, live (``conformance/chat_images.py``);
the recording CI replays (``tests/unit/test_image_render.py``) must be SGLang's current
answer."""

from __future__ import annotations

import json

import pytest

from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from conformance.chat_images import OUT, record  # noqa: E402


def test_chat_image_corpus_matches_sglang() -> None:
    assert json.loads(OUT.read_text(encoding="utf-8")) == record()

"""Image prompts on real image bytes replayed against SGLang 0.5.23's Kimi-K2.5 multimodal
processor (``conformance/kimi_processor.py``; live in ``tests/conformance``).

For each recorded line the pipeline's own code runs again here: the line parsed with its images
read from ``tests/fixtures/kimi-images/corpus/``, rendered, and its images counted and expanded
(``generate/media.py``). The ids it sends must be the ids the recording sent SGLang, and what it
stores (``model_prompt_ids``, each image's tokens) must be what SGLang's processor made of that
request; where SGLang refused the request, the client must refuse the line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conformance.kimi_processor import CORPUS, IMAGES, OUT, client_model_dir, client_request

RECORDED: dict[str, list[dict[str, Any]]] = json.loads(OUT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kimi-processor")


def check_case(path: Path, case: dict[str, Any]) -> None:
    """The client's request and stored ids for one recorded line against SGLang's answer."""
    ours = client_request(path, case["line"])
    name = case["line"]["id"]
    assert ours["prompt_ids"] == case["prompt_ids"], f"{name}: the client sends other ids now"
    assert ours["refs"] == case["refs"], name
    sglang = case["sglang"]
    if "error" in sglang:
        # SGLang: "... expected N, found M token(s)"; the client: "Expected N ..., found M."
        want = re.search(r"expected (\d+), found (\d+)", sglang["error"])
        got = re.search(
            r"Expected (\d+) image placeholder token\(s\), found (\d+)",
            ours.get("client_error", ""),
        )
        assert want and got and want.groups() == got.groups(), (name, sglang, ours)
        return
    assert "client_error" not in ours, (name, ours)
    assert ours["expanded_ids"] == sglang["expanded_ids"], name
    assert ours["counts"] == [image["tokens"] for image in sglang["images"]], name
    # The stored width and height are the pixels SGLang processed: a token count cannot tell
    # a rotated image (it is symmetric), the grid can (an EXIF-rotated JPEG is not turned).
    for (width, height), image in zip(ours["sizes"], sglang["images"], strict=True):
        _, grid_h, grid_w = image["grid_thw"]
        if grid_h != grid_w:
            assert (grid_w > grid_h) == (width > height), (name, width, height, image)


@pytest.mark.parametrize("asset", sorted(RECORDED))
def test_client_requests_match_sglangs_processor(work: Path, asset: str) -> None:
    path = client_model_dir(work, asset)
    for case in RECORDED[asset]:
        check_case(path, case)


def test_the_recording_covers_the_corpus() -> None:
    """Every corpus image in some recorded prompt, for both tokenizers, several images in one
    prompt, and a refused request; so a change of corpus without a new recording fails here."""
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(IMAGES)
    for cases in RECORDED.values():
        used = {ref for case in cases for ref in case["refs"]}
        assert used == set(IMAGES)
        assert max(len(case["refs"]) for case in cases) >= 4
        assert any("error" in case["sglang"] for case in cases)
        counts = {image["tokens"] for case in cases for image in case["sglang"].get("images", [])}
        assert len(counts) >= 8  # sizes from one token to the per-image limit

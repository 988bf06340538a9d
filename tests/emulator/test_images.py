"""The emulator's Kimi-K2.5 image arithmetic replayed against SGLang 0.5.23's recorded answers
(``conformance/kimi_images.py``: SGLang's own ``navit_resize_config`` and
``_expand_image_token_ids``), and the stand-in model directories it serves images for."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from sglang_emulator.errors import GenerateValueError
from sglang_emulator.images import KimiImages, expand_ids, process

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kimi-images"
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"


def _fixture_model(tmp_path: Path, token_id: int) -> KimiImages:
    (tmp_path / "config.json").write_text(json.dumps({"media_placeholder_token_id": token_id}))
    processor = (FIXTURES / "preprocessor_config.json").read_text()
    (tmp_path / "preprocessor_config.json").write_text(processor)
    media = KimiImages.load(tmp_path)
    assert media is not None
    return media


def test_counts_and_expansions_are_sglangs(tmp_path: Path) -> None:
    recorded = json.loads((FIXTURES / "sglang-0.5.23.json").read_text(encoding="utf-8"))
    media = _fixture_model(tmp_path, recorded["image_token_id"])
    wrong = [
        c
        for c in recorded["counts"]
        if media.token_count(c["width"], c["height"]) != c["num_tokens"]
    ]
    assert not wrong and len(recorded["counts"]) > 300
    for case in recorded["expansions"]:
        if "error" in case:
            with pytest.raises(GenerateValueError) as err:
                expand_ids(case["ids"], recorded["image_token_id"], case["counts"])
            assert err.value.message == case["error"], case["name"]
        else:
            got = expand_ids(case["ids"], recorded["image_token_id"], case["counts"])
            assert got == case["expanded"], case["name"]


@pytest.mark.parametrize("asset", ["kimi-k2.5-mini", "kimi-k2.5-tiktoken"])
def test_bundled_models_serve_images_with_the_fixture_rules(asset: str) -> None:
    """The stand-ins ship the processor config the recording was made with."""
    media = KimiImages.load(ASSETS / asset)
    fixture = json.loads((FIXTURES / "preprocessor_config.json").read_text())["media_proc_cfg"]
    assert media is not None
    assert (
        media.patch_size,
        media.merge_kernel_size,
        media.in_patch_limit,
        media.patch_limit_on_one_side,
    ) == (
        fixture["patch_size"],
        fixture["merge_kernel_size"],
        fixture["in_patch_limit"],
        fixture["patch_limit_on_one_side"],
    )


def test_caller_identities_and_missing_processor_are_refused(tmp_path: Path) -> None:
    media = _fixture_model(tmp_path, 9)
    with pytest.raises(GenerateValueError, match="Caller-supplied multimodal hash"):
        process([1, 9], [{"url": "x", "hash": 3}], media)
    with pytest.raises(GenerateValueError, match=r"no Kimi-K2\.5 image processor"):
        process([1, 9], ["x"], None)
    assert process([1, 9], None, media) == ([1, 9], b"")  # no image_data: ids as they are


PROCESSOR = json.loads((FIXTURES / "processor-sglang-0.5.23.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("asset", sorted(PROCESSOR))
def test_real_image_bytes_expand_as_sglangs_processor_does(tmp_path: Path, asset: str) -> None:
    """Each recorded ``/generate`` request of ``conformance/kimi_processor.py`` (the corpus
    images as data URIs: PNG/JPEG/WEBP/GIF, EXIF, palette, alpha, CMYK, sizes at the limits)
    through the emulator's ``image_data`` path: the ids SGLang's own Kimi-K2.5 processor made,
    or its error message."""
    pad = json.loads((ASSETS / asset / "config.json").read_text())["media_placeholder_token_id"]
    media = _fixture_model(tmp_path, pad)
    corpus = FIXTURES / "corpus"
    mime = {".png": "png", ".jpg": "jpeg", ".webp": "webp", ".gif": "gif"}
    for case in PROCESSOR[asset]:
        uris = [
            f"data:image/{mime[Path(ref).suffix]};base64,"
            + base64.b64encode((corpus / ref).read_bytes()).decode()
            for ref in case["refs"]
        ]
        answer = case["sglang"]
        if "error" in answer:
            with pytest.raises(GenerateValueError) as err:
                process(case["prompt_ids"], uris, media)
            assert err.value.message == answer["error"], case["line"]["id"]
        else:
            ids, _ = process(case["prompt_ids"], uris, media)
            assert ids == answer["expanded_ids"], case["line"]["id"]

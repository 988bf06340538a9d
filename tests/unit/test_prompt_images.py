"""Image parts of an input line: read and checked while parsing, every bad kind a reject of the
line with its reason and where in the line it is (the runner adds file and line:
tests/integration/test_image_prompts.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from eagle3_datagen.inputs.images import MAX_IMAGE_BYTES
from eagle3_datagen.inputs.prompts import InputReject, Prompt, parse_prompt


def _save(path: Path, size: tuple[int, int], fmt: str = "PNG", mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format=fmt)
    path.write_bytes(out.getvalue())
    return out.getvalue()


def _line(*urls: str, kind: str = "image_url") -> bytes:
    parts: list[dict[str, object]] = [{"type": "text", "text": "look"}]
    for url in urls:
        parts.append(
            {"type": kind, "image_url": {"url": url}}
            if kind == "image_url"
            else {"type": kind, "image": url}
        )
    return json.dumps({"id": "x", "messages": [{"role": "user", "content": parts}]}).encode()


BAD = [
    ("missing.png", "image not found"),
    ("garbage.png", "unreadable image"),
    ("truncated.png", "unreadable image"),
    ("huge-bytes.png", "image too large"),
    ("huge-pixels.png", "image too large: 7100x7100 pixels"),
    ("pic.bmp", "unsupported image format BMP"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("data:image/png,raw", "must be base64"),
    ("https://example.com/a.png", "remote image URLs are not fetched"),
    ("a-folder", "not a regular file"),
]


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("images")
    _save(d / "ok.png", (30, 20))
    (d / "garbage.png").write_text("hello")
    (d / "truncated.png").write_bytes(_save(d / "t.png", (64, 64))[:60])
    (d / "huge-bytes.png").write_bytes(_save(d / "s.png", (8, 8)) + b"\0" * MAX_IMAGE_BYTES)
    _save(d / "huge-pixels.png", (7100, 7100), mode="1")
    _save(d / "pic.bmp", (8, 8), "BMP")
    (d / "a-folder").mkdir()
    return d


@pytest.mark.parametrize(("ref", "reason"), BAD)
def test_every_bad_image_kind_rejects_its_line(image_dir: Path, ref: str, reason: str) -> None:
    got = parse_prompt(_line("ok.png", ref), 7, image_dir)
    assert isinstance(got, InputReject)
    assert got.line == 7 and got.id == "x"
    assert got.reason.startswith("messages[0].content[2]: bad image: "), got.reason
    assert reason in got.reason


def test_an_image_part_without_a_url_is_rejected(image_dir: Path) -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": [{"type": "image"}]}]}).encode()
    got = parse_prompt(raw, 3, image_dir)
    assert isinstance(got, InputReject)
    assert got.reason == "messages[0].content[0]: image part without a URL"
    assert isinstance(parse_prompt(raw, 3), InputReject)  # the shape is checked without reading


def test_good_images_are_read_once_per_reference(image_dir: Path) -> None:
    got = parse_prompt(_line("ok.png", (image_dir / "ok.png").as_uri(), "ok.png"), 1, image_dir)
    assert isinstance(got, Prompt)
    assert sorted(got.images) == sorted(["ok.png", (image_dir / "ok.png").as_uri()])
    assert {(i.width, i.height, i.format) for i in got.images.values()} == {(30, 20, "PNG")}
    kimi = parse_prompt(_line("ok.png", kind="image"), 1, image_dir)
    assert isinstance(kimi, Prompt) and list(kimi.images) == ["ok.png"]
    # Planning parses without reading images: a missing file is only found when the batch runs.
    assert isinstance(parse_prompt(_line("missing.png"), 1), Prompt)

"""Every kind of bad image is a named reason; good ones come back with size, format, digest."""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path

import pytest
from PIL import Image

from eagle3_datagen.inputs.images import BadImage, read_image_ref


def _png(width: int, height: int, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, format=fmt)
    return out.getvalue()


def test_path_file_url_and_data_uri_read_the_same_image(tmp_path: Path) -> None:
    data = _png(37, 21)
    (tmp_path / "a b.png").write_bytes(data)
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    refs = ["a b.png", (tmp_path / "a b.png").as_uri(), uri]
    for ref in refs:
        image = read_image_ref(ref, tmp_path)
        assert (image.width, image.height, image.format) == (37, 21, "PNG")
        assert image.sha256 == hashlib.sha256(data).hexdigest()
        assert image.data == data


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: "missing.png", "image not found"),
        (lambda d: "not-an-image.png", "unreadable image"),
        (lambda d: "truncated.png", "unreadable image"),
        (lambda d: "big.png", "image too large"),
        (lambda d: "pic.bmp", "unsupported image format BMP"),
        (lambda d: "data:image/png;base64,@@@", "not valid base64"),
        (lambda d: "data:image/png,raw", "must be base64"),
        (lambda d: "https://example.com/x.png", "remote image URLs are not fetched"),
        (lambda d: str(d), "cannot read image"),
    ],
)
def test_each_bad_image_kind_is_named(tmp_path: Path, make: object, reason: str) -> None:
    (tmp_path / "not-an-image.png").write_text("hello", encoding="utf-8")
    (tmp_path / "truncated.png").write_bytes(_png(64, 64)[:60])
    (tmp_path / "big.png").write_bytes(_png(8, 8) + b"\0" * 2000)
    (tmp_path / "pic.bmp").write_bytes(_png(8, 8, "BMP"))
    ref = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(BadImage, match=reason) as caught:
        read_image_ref(ref, tmp_path, max_bytes=1000)
    assert "<_io." not in str(caught.value), caught.value  # no Python repr in a reject's reason


def test_an_unreadable_image_names_its_file_and_why(tmp_path: Path) -> None:
    (tmp_path / "not-an-image.png").write_text("hello", encoding="utf-8")
    with pytest.raises(BadImage) as caught:
        read_image_ref("not-an-image.png", tmp_path)
    assert str(caught.value) == (
        f"unreadable image: {tmp_path / 'not-an-image.png'}: not an image in a format Pillow "
        "reads (5 bytes)"
    )

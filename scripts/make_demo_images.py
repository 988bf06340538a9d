"""Write the demo's image partition in ``src/eagle3_datagen/assets/demo`` (committed; rerun to
change): a few small images drawn here with Pillow (nothing downloaded) and ``images.jsonl``.

The images are sized around the stand-in processor's limits (docs/images.md: 28-pixel merge
blocks, 256 patches per image, 24 patches on a side), so their token counts differ. Two lines
are planted bad images (a missing file, a file that is not an image), so the demo shows image
rejects with file, line and reason before any request.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parents[1] / "src" / "eagle3_datagen" / "assets" / "demo"
IMAGES = OUT / "images"
# name: (size, format, background, what is drawn)
PICTURES = {
    "red-square.png": ((64, 64), "PNG", (220, 40, 40), "square"),
    "blue-banner.jpg": ((300, 84), "JPEG", (40, 80, 220), "stripes"),
    "green-tower.webp": ((40, 420), "WEBP", (40, 160, 60), "stripes"),
    "chart.png": ((500, 380), "PNG", (250, 250, 250), "bars"),
}


def draw(size: tuple[int, int], background: tuple[int, int, int], kind: str) -> Image.Image:
    image = Image.new("RGB", size, background)
    pen = ImageDraw.Draw(image)
    w, h = size
    if kind == "square":
        pen.rectangle((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=(255, 255, 255))
    elif kind == "stripes":
        for i in range(0, max(w, h), 20):
            pen.line((i, 0, 0, i), fill=(255, 255, 255), width=4)
    else:
        for i, height in enumerate((120, 260, 180, 320, 90)):
            x = 40 + i * 90
            pen.rectangle((x, h - 20 - height, x + 60, h - 20), fill=(60, 60, 200))
    return image


def encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def _user(*parts: Any) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": p}
            if isinstance(p, str)
            else {"type": "image_url", "image_url": {"url": p[0]}}
            for p in parts
        ],
    }


def lines(data_uri: str) -> list[dict[str, Any]]:
    """The partition's prompts (image paths are relative to the JSONL file's folder)."""
    look = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "look", "arguments": '{"what": "chart"}'},
    }
    params = {"type": "object", "properties": {"what": {"type": "string"}}}
    function = {"name": "look", "description": "Look at a file.", "parameters": params}
    tool = {"type": "function", "function": function}
    return [
        {
            "id": "img-one",
            "messages": [_user("What is in this picture?", ("images/red-square.png",))],
        },
        {
            "id": "img-two",
            "messages": [
                _user(
                    ("images/blue-banner.jpg",),
                    "and",
                    ("images/green-tower.webp",),
                    "Which one is taller?",
                )
            ],
        },
        {"id": "img-chart", "messages": [_user("Summarise the chart.", ("images/chart.png",))]},
        {"id": "img-data-uri", "messages": [_user((data_uri,), "Describe it briefly.")]},
        {
            "id": "img-follow-up",
            "messages": [
                _user("What colour is it?", ("images/red-square.png",)),
                {"role": "assistant", "content": "Red, with a white square."},
                _user("And the square's size relative to the image?"),
            ],
        },
        {
            "id": "img-tool-result",
            "tools": [tool],
            "messages": [
                {"role": "user", "content": "Look at the chart and tell me the tallest bar."},
                {"role": "assistant", "content": "", "tool_calls": [look]},
                {
                    "role": "tool",
                    "tool_call_id": "call_0",
                    "content": [{"type": "image_url", "image_url": {"url": "images/chart.png"}}],
                },
            ],
        },
        {"id": "img-bad-missing", "messages": [_user("See", ("images/missing.png",))]},
        {"id": "img-bad-not-an-image", "messages": [_user("See", ("images/not-an-image.png",))]},
    ]


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, (size, fmt, background, kind) in PICTURES.items():
        (IMAGES / name).write_bytes(encode(draw(size, background, kind), fmt))
    (IMAGES / "not-an-image.png").write_text("this file is text, not a PNG\n")
    small = encode(draw((30, 20), (200, 200, 40), "square"), "PNG")
    data_uri = "data:image/png;base64," + base64.b64encode(small).decode()
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines(data_uri))
    (OUT / "images.jsonl").write_text(text)


if __name__ == "__main__":
    main()

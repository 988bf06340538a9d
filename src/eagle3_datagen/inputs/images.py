"""Resolve and check one image reference of a prompt, before anything reaches the server.

SGLang reads a path or ``file://`` URL on the server's own disk (docs/images.md), so the client
must read the image itself, send its bytes, and know its size (the token count depends on it).
A bad image is one line's problem: :class:`BadImage` carries the reason, and the line parser
turns it into a reject naming file and line (``inputs/prompts.py``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

# What SGLang's loader recognises by extension (sglang/srt/utils/common.py:2026).
SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 50_000_000


# Content parts that are an image: OpenAI's ``image_url`` (SGLang's chat path), and ``image`` as
# Kimi-K2.5's chat template accepts it (the reference under ``image``, ``url`` or ``image_url``).
IMAGE_PART_TYPES = ("image_url", "image")


class BadImage(ValueError):
    """One image of a line cannot be used; the message is the reject's reason."""


@dataclass(frozen=True)
class LoadedImage:
    """The bytes to send and what the record and the token count need about them."""

    data: bytes
    sha256: str
    width: int
    height: int
    format: str


def read_image_ref(url: str, base_dir: Path, max_bytes: int = MAX_IMAGE_BYTES) -> LoadedImage:
    """Reads a local path (relative to ``base_dir``), ``file://`` URL or ``data:`` URI."""
    if url.startswith("data:"):
        data = _decode_data_uri(url)
        source = "data URI"
    else:
        if url.startswith(("http://", "https://")):
            raise BadImage(f"remote image URLs are not fetched: {url[:80]}")
        path = Path(unquote(urlparse(url).path)) if url.startswith("file://") else Path(url)
        path = path if path.is_absolute() else base_dir / path
        try:
            size = path.stat().st_size
            if not path.is_file():
                raise BadImage(f"cannot read image {path}: not a regular file")
            if size > max_bytes:
                raise BadImage(f"image too large: {path} is {size} bytes (limit {max_bytes})")
            data = path.read_bytes()
            source = str(path)
        except FileNotFoundError:
            raise BadImage(f"image not found: {path}") from None
        except OSError as err:
            raise BadImage(f"cannot read image {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise BadImage(f"image too large: {len(data)} bytes (limit {max_bytes})")
    return _check_image(data, source)


def _decode_data_uri(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise BadImage("data URI must be base64 ('data:image/...;base64,...')")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("data URI is not valid base64") from None


def _check_image(data: bytes, source: str) -> LoadedImage:
    """``source`` (the path, or ``data URI``) names the image in a reject's reason."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt, (width, height) = image.format or "?", image.size
            if fmt not in SUPPORTED_FORMATS:
                raise BadImage(f"unsupported image format {fmt} (supported: {SUPPORTED_FORMATS})")
            if width * height > MAX_IMAGE_PIXELS:
                raise BadImage(f"image too large: {width}x{height} pixels")
            image.load()
    except BadImage:
        raise
    except UnidentifiedImageError:
        # PIL's own message names its BytesIO buffer (``<_io.BytesIO object at 0x...>``).
        raise BadImage(
            f"unreadable image: {source}: not an image in a format Pillow reads ({len(data)} bytes)"
        ) from None
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:
        raise BadImage(f"unreadable image: {source}: {err}") from None
    return LoadedImage(data, hashlib.sha256(data).hexdigest(), width, height, fmt)


def part_url(part: dict[str, Any]) -> str | None:
    """The image reference of an image content part, or None when it has none."""
    for key in ("image_url", "image", "url"):
        value = part.get(key)
        if isinstance(value, dict):
            value = value.get("url")
        if isinstance(value, str) and value:
            return value
    return None


def image_parts(messages: Sequence[Any]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(message index, part index, part)`` of every image part, in prompt order."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                    yield i, j, part


def image_refs(messages: Sequence[Any]) -> list[str]:
    """The image references of a message list in the order the template meets them."""
    return [part_url(part) or "" for _, _, part in image_parts(messages)]

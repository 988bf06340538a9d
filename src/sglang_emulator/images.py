"""``image_data`` on ``/generate`` for a Kimi-K2.5 model directory, as SGLang 0.5.23 treats it.

SGLang's Kimi-K2.5 processor keeps one ``media_placeholder_token_id`` per image in
``input_ids``, refuses a request whose placeholders and images differ in number, and expands
each placeholder to the image's token count (``navit_resize_config``, from the image's size and
the processor's ``media_proc_cfg``) before the model: the expanded ids are what the model sees
and what ``prompt_tokens`` counts (``sglang/srt/multimodal/processors/kimi_k25.py``:
``navit_resize_config`` 34-74, ``_expand_image_token_ids`` 85-110, the pairing check 564-604;
``kimi_common.py:107-118`` for caller-supplied identities). The emulator's own copy of that
arithmetic; tests replay SGLang's recorded answers against it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sglang_emulator.errors import GenerateValueError

_CALLER_IDENTITY_KEYS = ("hash", "pad_value", "pad_values", "identity")


@dataclass(frozen=True)
class KimiImages:
    """The model directory's ``media_placeholder_token_id`` and ``media_proc_cfg``."""

    placeholder_id: int
    patch_size: int
    merge_kernel_size: int
    in_patch_limit: int
    patch_limit_on_one_side: int
    fixed_output_tokens: int | None = None

    @classmethod
    def load(cls, model_dir: Path) -> KimiImages | None:
        """None when the directory is not a Kimi-K2.5 image model (no placeholder or no
        processor config)."""
        try:
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            processor = json.loads(
                (model_dir / "preprocessor_config.json").read_text(encoding="utf-8")
            )
            cfg = processor.get("media_proc_cfg", processor)
            return cls(
                int(config["media_placeholder_token_id"]),
                int(cfg["patch_size"]),
                int(cfg["merge_kernel_size"]),
                int(cfg["in_patch_limit"]),
                int(cfg["patch_limit_on_one_side"]),
                cfg.get("fixed_output_tokens"),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def token_count(self, width: int, height: int) -> int:
        """``navit_resize_config(...)["num_tokens"]``."""
        patch, side = self.patch_size, self.patch_limit_on_one_side
        s1 = math.sqrt(self.in_patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
        scale = min(1.0, s1, side * patch / width, side * patch / height)
        new_w = min(max(1, int(width * scale)), side * patch)
        new_h = min(max(1, int(height * scale)), side * patch)
        factor = self.merge_kernel_size * patch
        if self.fixed_output_tokens is not None:
            return int(self.fixed_output_tokens)
        pad_h, pad_w = (factor - new_h % factor) % factor, (factor - new_w % factor) % factor
        return ((new_h + pad_h) // factor) * ((new_w + pad_w) // factor)


def expand_ids(ids: list[int], image_token_id: int, counts: list[int]) -> list[int]:
    """``_expand_image_token_ids``: the i-th placeholder repeated ``counts[i]`` times."""
    found = sum(1 for t in ids if t == image_token_id)
    if found != len(counts):
        raise GenerateValueError(
            f"Expected {len(counts)} image placeholder token(s), found {found}."
        )
    out: list[int] = []
    it = iter(counts)
    for t in ids:
        if t == image_token_id:
            out.extend([t] * next(it))
        else:
            out.append(t)
    return out


def as_image_list(image_data: Any) -> list[Any]:
    """One request's images: a single item or a list of them (a list of lists is a batch)."""
    if image_data is None:
        return []
    items = image_data if isinstance(image_data, list) else [image_data]
    if any(isinstance(item, list) for item in items):
        raise GenerateValueError(
            "A list of image_data lists (batch request) is not supported by the SGLang emulator."
        )
    return items


def process(ids: list[int], image_data: Any, media: KimiImages | None) -> tuple[list[int], bytes]:
    """The ids the model sees and a digest of the images; ``ids`` unchanged without images."""
    items = as_image_list(image_data)
    if not items:
        return ids, b""  # no multimodal input: placeholders, if any, go to the model as they are
    if media is None:
        raise GenerateValueError(
            "image_data given, but the emulator's model directory has no Kimi-K2.5 image "
            "processor (config.json media_placeholder_token_id, preprocessor_config.json)"
        )
    for item in items:
        if isinstance(item, Mapping):
            for key in _CALLER_IDENTITY_KEYS:
                if key in item:
                    raise GenerateValueError(
                        f"Caller-supplied multimodal {key} is not supported for Kimi."
                    )
    found = sum(1 for t in ids if t == media.placeholder_id)
    if found != len(items):
        raise GenerateValueError(
            "Kimi image placeholders must map one-to-one to image data: "
            f"expected {len(items)}, found {found} token(s)"
        )
    digest = hashlib.sha256()
    counts = []
    for item in items:
        data = _image_bytes(item)
        width, height = _size(data)
        digest.update(hashlib.sha256(data).digest())
        counts.append(media.token_count(width, height))
    return expand_ids(ids, media.placeholder_id, counts), digest.digest()


def _image_bytes(item: Any) -> bytes:
    """``load_image``'s inputs the emulator reads: a data URI, base64, a local path or
    ``file://`` URL (the emulator shares the client's disk); not remote URLs."""
    url = item.get("url") if isinstance(item, Mapping) else item
    if isinstance(url, bytes):
        return url
    if not isinstance(url, str):
        raise GenerateValueError(f"Invalid image data: {type(url).__name__}")
    if url.startswith(("http://", "https://")):
        raise GenerateValueError("Remote image URLs are not supported by the SGLang emulator.")
    if url.startswith("file://") or url.lower().endswith(
        (".png", ".jpg", ".jpeg", ".webp", ".gif")
    ):
        path = unquote(urlparse(url).path) if url.startswith("file://") else url
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise GenerateValueError(f"Failed to load image {path}: {err}") from None
    payload = url.split(",", 1)[1] if url.startswith("data:") else url
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise GenerateValueError("Invalid image data: not base64") from None


def _size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception as err:  # Pillow raises several kinds for bad bytes
        raise GenerateValueError(f"Failed to load image: {err}") from None

"""The images of one turn's request: in placeholder order, counted, expanded, sent as bytes.

SGLang reads a path on its own disk and expands each placeholder on the server
(docs/images.md), so the client sends the images' bytes as data URIs in ``image_data`` and
computes the ids the model sees itself; the server's ``prompt_tokens`` then checks them.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Any

from eagle3_datagen.errors import ConfigError, TokenizerError
from eagle3_datagen.inputs.images import LoadedImage
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.kimi_image_tokens import KimiMedia, image_token_count, load_media

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class TurnImages:
    """One request's images in placeholder order and the prompt ids the model sees."""

    refs: list[str]
    images: list[LoadedImage]
    counts: list[int]
    expanded: list[int]

    @property
    def digests(self) -> list[str]:
        return [image.sha256 for image in self.images]

    def image_data(self) -> list[str]:
        """``image_data`` of the request: each image's bytes as a data URI."""
        return [
            f"data:{_MIME[i.format]};base64,{base64.b64encode(i.data).decode()}"
            for i in self.images
        ]

    def columns(self) -> list[dict[str, Any]]:
        """The record's ``images`` column: what identifies each image and what it cost."""
        return [
            {
                "ref": _short_ref(ref),
                "sha256": image.sha256,
                "width": image.width,
                "height": image.height,
                "format": image.format,
                "tokens": count,
            }
            for ref, image, count in zip(self.refs, self.images, self.counts, strict=True)
        ]


def _short_ref(ref: str) -> str:
    """A path or URL as the input gave it; a data URI only by its media type (its bytes are
    identified by the digest, not copied into every record)."""
    return ref.split(",", 1)[0] if ref.startswith("data:") else ref


@functools.cache
def _media(model_dir: str, pad_token_id: int | None) -> KimiMedia:
    return load_media(model_dir, pad_token_id)


def media_of(tokenizer: ChatTokenizer) -> KimiMedia:
    """The model's image rules, read once per tokenizer directory."""
    try:
        pad: int | None = tokenizer.token_id("<|media_pad|>")
    except TokenizerError:
        pad = None
    return _media(tokenizer.path, pad)


def turn_images(
    tokenizer: ChatTokenizer, prompt: Prompt, ids: list[int]
) -> TurnImages | str | None:
    """The turn's images; None when the turn holds none (an earlier turn of a line whose images
    come later: a text request, which SGLang takes as it is); or why the prompt and its images
    do not pair up (a reject reason)."""
    refs = tokenizer.image_order(prompt)
    if not refs:
        return None
    try:
        media = media_of(tokenizer)
    except ConfigError as err:
        return str(err)
    images = [prompt.images[ref] for ref in refs]
    counts = [image_token_count(i.width, i.height, media.rules) for i in images]
    try:
        expanded = media.expand(ids, [(i.width, i.height) for i in images])
    except ValueError as err:
        return f"the rendered prompt and its images do not pair up: {err}"
    return TurnImages(refs, images, counts, expanded)

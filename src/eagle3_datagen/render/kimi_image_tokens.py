"""How many prompt tokens a Kimi-K2.5 image becomes, by the model's own processor rules.

SGLang 0.5.23 expands each ``<|media_pad|>`` placeholder in ``input_ids`` to the image's token
count on the server (docs/images.md). The record must hold the ids the model saw, so the client
computes the same count from the image's size and the ``media_proc_cfg`` of the model
directory's processor config, and expands the placeholders the same way, failing as SGLang
fails when the placeholders and images do not pair up one to one.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.errors import ConfigError


@dataclass(frozen=True)
class KimiImageRules:
    """The ``media_proc_cfg`` settings that decide an image's token count."""

    patch_size: int
    merge_kernel_size: int
    in_patch_limit: int
    patch_limit_on_one_side: int
    fixed_output_tokens: int | None = None

    @classmethod
    def from_processor_config(cls, path: Path) -> KimiImageRules:
        """Reads ``media_proc_cfg`` from a ``preprocessor_config.json``-style file."""
        data = json.loads(path.read_text(encoding="utf-8"))
        cfg = data.get("media_proc_cfg", data)
        try:
            return cls(
                patch_size=int(cfg["patch_size"]),
                merge_kernel_size=int(cfg["merge_kernel_size"]),
                in_patch_limit=int(cfg["in_patch_limit"]),
                patch_limit_on_one_side=int(cfg["patch_limit_on_one_side"]),
                fixed_output_tokens=cfg.get("fixed_output_tokens"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: media_proc_cfg is missing or invalid: {exc!r}") from exc


def image_token_count(width: int, height: int, rules: KimiImageRules) -> int:
    """Tokens one ``width`` x ``height`` image takes: NaViT downscale, pad, merge.

    Same arithmetic as SGLang's ``navit_resize_config`` (kimi_k25.py), float steps included,
    so sizes at the limits round the same way.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if rules.fixed_output_tokens is not None:
        return int(rules.fixed_output_tokens)
    patch, side = rules.patch_size, rules.patch_limit_on_one_side
    s1 = math.sqrt(rules.in_patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
    scale = min(1.0, s1, side * patch / width, side * patch / height)
    new_w = min(max(1, int(width * scale)), side * patch)
    new_h = min(max(1, int(height * scale)), side * patch)
    factor = rules.merge_kernel_size * patch
    return math.ceil(new_h / factor) * math.ceil(new_w / factor)


def expand_image_placeholders(
    input_ids: Sequence[int], image_token_id: int, counts: Sequence[int]
) -> list[int]:
    """Repeats the i-th placeholder ``counts[i]`` times, as SGLang does before the model.

    Raises ValueError with SGLang's own message when placeholders and images differ in number.
    """
    found = sum(1 for token in input_ids if token == image_token_id)
    if found != len(counts):
        raise ValueError(f"Expected {len(counts)} image placeholder token(s), found {found}.")
    expanded: list[int] = []
    images = iter(counts)
    for token in input_ids:
        if token == image_token_id:
            expanded.extend([token] * next(images))
        else:
            expanded.append(token)
    return expanded


@dataclass(frozen=True)
class KimiMedia:
    """What the client needs of the model to count and expand images: the processor's rules
    (``preprocessor_config.json``) and the placeholder id (``config.json``'s
    ``media_placeholder_token_id``, which SGLang reads; else ``<|media_pad|>``'s id)."""

    rules: KimiImageRules
    placeholder_id: int

    def expand(self, input_ids: Sequence[int], sizes: Sequence[tuple[int, int]]) -> list[int]:
        """The ids the model sees for ``input_ids`` with images of ``sizes`` (width, height)."""
        counts = [image_token_count(w, h, self.rules) for w, h in sizes]
        return expand_image_placeholders(input_ids, self.placeholder_id, counts)


def load_media(model_dir: str, pad_token_id: int | None) -> KimiMedia:
    """The model directory's image rules; ConfigError when it has none (no image can be
    counted, so no image prompt can be sent)."""
    directory = Path(model_dir)
    processor = directory / "preprocessor_config.json"
    if not processor.is_file():
        raise ConfigError(
            f"{processor} not found: image prompts need the model's processor config "
            "(media_proc_cfg) to count image tokens"
        )
    rules = KimiImageRules.from_processor_config(processor)
    placeholder = pad_token_id  # the tokenizer's <|media_pad|>, unless config.json names one
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        placeholder = int(config["media_placeholder_token_id"])
    if placeholder is None:
        raise ConfigError(f"{directory}: no media_placeholder_token_id and no <|media_pad|>")
    return KimiMedia(rules, placeholder)

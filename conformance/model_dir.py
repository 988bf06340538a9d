"""A model directory SGLang's own config loader accepts, made from a bundled test tokenizer.

The bundled Kimi-style assets (`src/eagle3_datagen/assets/kimi-k2.5-*`) have a flat
`config.json` (`vocab_size` at the top). Kimi-K2.5's real config nests the language model under
`text_config`, and SGLang's `KimiK25Config` (sglang/srt/configs/kimi_k25.py:127-171) requires
that: its `vocab_size` is a read-only property of `text_config`, so the flat file fails to load
during `ServerArgs.resolve_once()` with "property 'vocab_size' of 'KimiK25Config' object has no
setter". This copies the tokenizer files and writes the config in the real layout (weights are
never read: the fake engine has no model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

_TEXT_KEYS = ("vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id")


def kimi_k25_layout(flat: dict[str, Any]) -> dict[str, Any]:
    """Kimi-K2.5's config.json shape: the language model's fields under `text_config`."""
    if isinstance(flat.get("text_config"), dict):
        return flat
    text = {k: flat[k] for k in _TEXT_KEYS if k in flat}
    text["model_type"] = "deepseek_v3"
    if "pad_token_id" in flat:
        text["pad_token_id"] = flat["pad_token_id"]
    out = {k: v for k, v in flat.items() if k not in ("vocab_size", "max_position_embeddings")}
    out["text_config"] = text
    return out


def make_model_dir(source: Path, dest: Path) -> Path:
    """Copy `source` (tokenizer + config) to `dest` with the config in Kimi-K2.5's layout."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name != "config.json":
            shutil.copy2(item, dest / item.name)
    flat = json.loads((source / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(kimi_k25_layout(flat), indent=2) + "\n")
    return dest

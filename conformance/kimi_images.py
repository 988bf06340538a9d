"""Image token counts and placeholder expansion as SGLang 0.5.23's Kimi-K2.5 processor does them.

    .venv-conformance/bin/python -m conformance.kimi_images [--out FILE]

Why: ``eagle3_datagen.render.kimi_image_tokens`` claims the count SGLang's Kimi-K2.5 processor
gives an image (``navit_resize_config`` in ``sglang/srt/multimodal/processors/kimi_k25.py``)
and the ids it expands a prompt to (``_expand_image_token_ids``, the path a pre-tokenized
``/generate`` request takes), failing where it fails. The oracle here is those functions of
SGLang itself, called on a corpus of image sizes (at and around every limit of the fixture
processor config ``tests/fixtures/kimi-images/preprocessor_config.json``, plus seeded random
ones) and of prompts with none, one and several placeholders, and mismatches. Not covered: the
HTTP ``/generate`` path with real ``image_data`` (docs/images.md says what is not yet proven).

The recording ``tests/fixtures/kimi-images/sglang-0.5.23.json`` is replayed in CI by
``tests/unit/test_kimi_image_tokens.py``, without SGLang.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from conformance.process import REPO

CONFIG = REPO / "tests/fixtures/kimi-images/preprocessor_config.json"
OUT = REPO / "tests/fixtures/kimi-images/sglang-0.5.23.json"
SEED = 24
IMAGE_TOKEN_ID = 163605


def sizes() -> list[tuple[int, int]]:
    """Sizes at and around each limit: merge factor 28, in_patch_limit 16x16, side 24x14."""
    edges = [1, 13, 14, 15, 27, 28, 29, 55, 56, 57, 223, 224, 225, 335, 336, 337, 1000, 4000]
    grid = [(w, h) for w in edges for h in edges]
    rng = random.Random(SEED)
    grid += [(rng.randint(1, 3000), rng.randint(1, 3000)) for _ in range(60)]
    return grid


def prompts() -> list[dict[str, Any]]:
    """Prompt ids with placeholders, each with per-image counts (some deliberately unpaired)."""
    p = IMAGE_TOKEN_ID
    return [
        {"name": "text_only", "ids": [1, 2, 3], "counts": []},
        {"name": "one_image", "ids": [1, p, 2], "counts": [4]},
        {"name": "image_first", "ids": [p, 7, 8], "counts": [1]},
        {"name": "image_last", "ids": [7, 8, p], "counts": [9]},
        {"name": "three_images", "ids": [1, p, 2, p, p, 3], "counts": [2, 5, 1]},
        {"name": "adjacent_sizes_differ", "ids": [p, p], "counts": [144, 3]},
        {"name": "more_placeholders", "ids": [1, p, p], "counts": [4]},
        {"name": "fewer_placeholders", "ids": [1, p], "counts": [4, 4]},
        {"name": "no_placeholder_one_image", "ids": [1, 2], "counts": [4]},
    ]


def record() -> dict[str, Any]:
    """Calls SGLang's own functions on the corpus and returns what they answered."""
    from conformance.stubs import install

    install()  # torchvision cannot load on a CPU box (conformance/stubs.py)
    from sglang.srt.multimodal.processors.kimi_k25 import (
        _expand_image_token_ids,
        navit_resize_config,
    )

    cfg = json.loads(CONFIG.read_text(encoding="utf-8"))["media_proc_cfg"]
    counts = []
    for width, height in sizes():
        out = navit_resize_config(
            width,
            height,
            cfg["patch_size"],
            cfg["merge_kernel_size"],
            cfg["in_patch_limit"],
            cfg["patch_limit_on_one_side"],
            cfg.get("fixed_output_tokens"),
        )
        counts.append({"width": width, "height": height, "num_tokens": out["num_tokens"]})
    expansions = []
    for case in prompts():
        try:
            ids = _expand_image_token_ids(case["ids"], IMAGE_TOKEN_ID, case["counts"])
            expansions.append({**case, "expanded": ids.reshape(-1).tolist()})
        except ValueError as exc:
            expansions.append({**case, "error": str(exc)})
    return {"image_token_id": IMAGE_TOKEN_ID, "counts": counts, "expansions": expansions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(json.dumps(record(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

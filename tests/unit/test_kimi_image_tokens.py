"""Our Kimi-K2.5 image token counts and placeholder expansion replayed against SGLang 0.5.23's
recorded answers (``conformance/kimi_images.py``; live in ``tests/conformance``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.render.kimi_image_tokens import (
    KimiImageRules,
    expand_image_placeholders,
    image_token_count,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kimi-images"
RULES = KimiImageRules.from_processor_config(FIXTURES / "preprocessor_config.json")


def check_recording(recorded: dict[str, Any]) -> None:
    """Every recorded count and expansion (or SGLang's error) is what ours gives."""
    for case in recorded["counts"]:
        ours = image_token_count(case["width"], case["height"], RULES)
        assert ours == case["num_tokens"], case
    token = recorded["image_token_id"]
    for case in recorded["expansions"]:
        if "error" in case:
            with pytest.raises(ValueError) as err:
                expand_image_placeholders(case["ids"], token, case["counts"])
            assert str(err.value) == case["error"], case["name"]
        else:
            expanded = expand_image_placeholders(case["ids"], token, case["counts"])
            assert expanded == case["expanded"], case["name"]


def test_recorded_sglang_answers_replay() -> None:
    recorded = json.loads((FIXTURES / "sglang-0.5.23.json").read_text(encoding="utf-8"))
    assert len(recorded["counts"]) > 300
    assert len({c["num_tokens"] for c in recorded["counts"]}) > 20
    check_recording(recorded)


def test_fixed_output_tokens_wins() -> None:
    rules = KimiImageRules(14, 2, 256, 24, fixed_output_tokens=64)
    assert image_token_count(5, 5000, rules) == 64


def test_processor_config_without_media_settings_is_named(tmp_path: Path) -> None:
    path = tmp_path / "preprocessor_config.json"
    path.write_text('{"media_proc_cfg": {"patch_size": 14}}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"preprocessor_config\.json: media_proc_cfg"):
        KimiImageRules.from_processor_config(path)

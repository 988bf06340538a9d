"""docs/config.md is generated from the config models (eagle3_datagen.config.reference): it must
match them, and describe every model and every key."""

from __future__ import annotations

from pathlib import Path

import pydantic

import eagle3_datagen.config as config
from eagle3_datagen.config.reference import COMMAND, render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"


def test_docs_config_md_is_current():
    assert DOC.read_text(encoding="utf-8") == render(), (
        f"docs/config.md is stale: the config models changed. Regenerate it with `{COMMAND}`"
    )


def test_every_config_model_and_key_is_described():
    text = render()
    models = [
        value
        for value in vars(config).values()
        if isinstance(value, type) and issubclass(value, pydantic.BaseModel)
    ]
    assert {m.__name__ for m in models} >= {"PipelineConfig", "ServerSpec", "Tier"}
    sections = text.split('<a id="')[1:]
    for model in models:
        section = next((s for s in sections if s.startswith(f'{model.__name__.lower()}"')), None)
        assert section is not None, f"docs/config.md has no section for {model.__name__}"
        for name, info in model.model_fields.items():
            row = next((r for r in section.splitlines() if r.startswith(f"| `{name}` |")), None)
            assert row is not None, f"{model.__name__}.{name} is missing from docs/config.md"
            assert (info.title or "") in row


def test_sections_follow_the_yaml_nesting():
    text = render()
    order = [line.split("](")[0] for line in text.splitlines() if line.startswith("- [")]
    assert order[0] == "- [top level"
    assert order.index("- [`server`") + 1 == order.index("- [`server.auto_concurrency`")
    assert order.index("- [`special_tokens`") + 1 == order.index("- [`special_tokens.tool_calls`")

"""A config from YAML or a mapping, with one clear line per problem (file, field, reason)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eagle3_datagen.config.pipeline import PipelineConfig
from eagle3_datagen.errors import ConfigError


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: ``file: field.path: reason``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        lines.append(f"{source}: {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a YAML config; relative paths resolve against the file's directory."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return parse_config(data, str(path)).resolve_paths(path.resolve().parent)

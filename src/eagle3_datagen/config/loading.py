"""A config from YAML or a mapping, with one clear line per problem (file, field, reason)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eagle3_datagen.config.pipeline import PipelineConfig
from eagle3_datagen.errors import ConfigError


def format_validation_error(err: ValidationError, source: str, text: str | None = None) -> str:
    """One line per field: ``file: field.path: reason``, or ``file:line: ...`` when the YAML
    ``text`` is given and the field is in it. Pydantic's own words are left out: the member
    tags of a union (``constrained-int``, ``literal['auto']``: one field, the alternatives
    joined with "or") and the ``Value error, `` before a validator's message."""
    root = _yaml_root(text)
    reasons: dict[tuple[Any, ...], list[str]] = {}
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not _union_tag(x))
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        said = reasons.setdefault(loc, [])
        if msg not in said:
            said.append(msg)
    lines = []
    for loc, msgs in reasons.items():
        field = ".".join(str(x) for x in loc) or "<root>"
        line = _yaml_line(root, loc)
        where = f"{source}:{line}" if line else source
        lines.append(f"{where}: {field}: {_either(msgs)}")
    return "\n".join(lines)


_UNION_TAG = re.compile(
    r"^(constrained-[a-z]+|[a-z]+(-[a-z]+)*\[.*\]|int|float|str|bool|bytes|list|dict|none)$"
)


def _union_tag(part: Any) -> bool:
    """A loc part that names a union member's type, not a field (``constrained-int``,
    ``literal['auto']``, ``function-after[...]``, ``int``)."""
    return isinstance(part, str) and bool(_UNION_TAG.match(part))


def _either(msgs: list[str]) -> str:
    """``Input should be A``, ``Input should be B`` -> ``Input should be A, or B``."""
    head, *rest = msgs
    prefix = "Input should be "
    alternatives = [m.removeprefix(prefix) if head.startswith(prefix) else m for m in rest]
    return ", or ".join([head, *alternatives])


def _yaml_root(text: str | None) -> yaml.Node | None:
    try:
        return yaml.compose(text) if text else None
    except yaml.YAMLError:
        return None


def _yaml_line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest node of ``loc`` the YAML holds (an unknown key: its own
    line; a missing one: its parent's)."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next((kv for kv in node.value if kv[0].value == str(part)), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def parse_config(data: Any, source: str = "<config>", text: str | None = None) -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, text)) from None


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
    return parse_config(data, str(path), text).resolve_paths(path.resolve().parent)

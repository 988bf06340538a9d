"""docs/config.md, generated from the config models: every section of the YAML and every key,
with its title, type, default and description, so the reference cannot drift from the code.

Regenerate with ``uv run python -m eagle3_datagen.config.reference > docs/config.md``
(tests/unit/test_config_reference.py fails while the file is stale).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from eagle3_datagen.config.pipeline import PipelineConfig

COMMAND = "uv run python -m eagle3_datagen.config.reference > docs/config.md"

_INTRO = f"""\
# Configuration reference

Every key of a run's YAML config, section by section in the order the YAML nests them. A key
left out takes its default; a key marked *required* must be given. Unknown keys are refused (a
typo is an error, not a silent default). The same models are the run form in the Prefect UI.

Generated from the pydantic models in `src/eagle3_datagen/config/`; do not edit by hand.
Regenerate with `{COMMAND}`.
"""

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_INT64 = (-(2**63), 2**63 - 1)


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _sections(
    model: type[BaseModel], path: str, title: str
) -> Iterator[tuple[type[BaseModel], str, str]]:
    """(model, YAML path, title) of ``model`` and every model nested in it, depth first in
    field order: the order a YAML file nests them."""
    yield model, path, title
    for name, info in model.model_fields.items():
        inner = _nested_model(info.annotation)
        if inner is not None:
            many = get_origin(_strip_none(info.annotation)) is list
            child = f"{path}.{name}" if path else name
            yield from _sections(inner, child + ("[]" if many else ""), info.title or name)


def _strip_none(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if _is_union(annotation) and len(args) == 1:
        return args[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (itself, optional, or a list of it), or None."""
    annotation = _strip_none(annotation)
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


_BOUND_KEYS = ("ge", "gt", "le", "lt", "min_length", "max_length", "allow_inf_nan")


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    """The bounds a field's metadata sets (``Field(ge=1)`` nested in ``Annotated`` too)."""
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, FieldInfo):
            found.update(_bounds(item.metadata))
            continue
        for key in _BOUND_KEYS:
            if (value := getattr(item, key, None)) is not None:
                found[key] = value
    return found


def _constraints(metadata: list[Any]) -> list[str]:
    """Bounds and lengths in words: ``≥ 1``, ``at least 1 item``, ``finite``."""
    found = _bounds(metadata)
    words: list[str] = []
    if (found.get("ge"), found.get("le")) == _INT64:
        words.append("64-bit signed")
        del found["ge"], found["le"]
    for key, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        if key in found:
            value = found[key]
            words.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    if "min_length" in found:
        n = found["min_length"]
        words.append(f"at least {n} item{'s' if n != 1 else ''}")
    if "max_length" in found:
        words.append(f"at most {found['max_length']} items")
    if found.get("allow_inf_nan") is False:
        words.append("finite")
    return words


def _type(annotation: Any) -> str:
    """A type as a YAML user reads it: ``integer (≥ 1)``, ``list of number``, a link."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        words = _constraints(list(args[1:]))
        base = _type(args[0])
        return f"{base} ({', '.join(words)})" if words else base
    if _is_union(annotation):
        return " or ".join(_type(a) for a in args)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        key, value = args
        return "mapping" if value is Any else f"mapping of {_type(key)} to {_type(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "*required*"
    factory = info.default_factory
    value = factory() if factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "*required*"
    if isinstance(value, BaseModel):
        return "its section's defaults"
    if value is None:
        return "empty"
    return f"`{json.dumps(to_jsonable_python(value), ensure_ascii=False)}`"


def _prose(text: str) -> str:
    """Text as Markdown: reST literals as Markdown's, and ``<think>`` outside a literal shown
    as written (not taken for an HTML tag)."""
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _cell(text: str) -> str:
    """Text fit for one table cell: one line, pipes escaped."""
    return " ".join(text.replace("|", "\\|").split())


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of a model's docstring."""
    return inspect.cleandoc(model.__doc__ or "").split("\n\n")[0]


def _field_row(name: str, info: FieldInfo) -> str:
    kind = _type(info.annotation)
    words = _constraints(info.metadata)
    if words:
        kind += f" ({', '.join(words)})"
    about = info.description
    if not about and (inner := _nested_model(info.annotation)) is not None:
        about = _summary(inner)  # a section without its own words: its model's
    cells = [f"`{name}`", _prose(info.title or ""), kind, _default(info), _prose(about or "")]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _section(model: type[BaseModel], path: str, title: str) -> str:
    heading = f"`{path}`: {title}" if path else f"Top level: {title}"
    doc = _prose(inspect.cleandoc(model.__doc__ or ""))
    lines = [f'<a id="{_anchor(model)}"></a>', f"## {heading}", "", f"Model `{model.__name__}`."]
    if doc:
        lines += ["", doc]
    lines += [
        "",
        "| Key | Title | Type | Default | Description |",
        "| --- | --- | --- | --- | --- |",
        *(_field_row(name, info) for name, info in model.model_fields.items()),
    ]
    return "\n".join(lines)


def render() -> str:
    """docs/config.md as it should read now: a list of the sections, then each one's table."""
    seen: set[type[BaseModel]] = set()
    contents, sections = [], []
    for model, path, title in _sections(PipelineConfig, "", "the run's config"):
        if model in seen:  # a model used twice is described where it first appears
            continue
        seen.add(model)
        where = f"`{path}`" if path else "top level"
        contents.append(f"- [{where}](#{_anchor(model)}): {title}")
        sections.append(_section(model, path, title))
    return "\n".join([_INTRO, *contents, "", "\n\n".join(sections)]) + "\n"


if __name__ == "__main__":
    print(render(), end="")

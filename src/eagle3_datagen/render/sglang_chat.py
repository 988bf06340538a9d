"""The request as SGLang 0.5.23's ``/v1/chat/completions`` hands it to the chat template.

Why: the deployed model sees prompts built by SGLang's chat path, which reshapes messages and
tools before the template runs (string tool-call arguments become objects, tools gain pydantic
defaults, ``None`` fields disappear, content parts are flattened ...). ``render: sglang_chat``
applies the same steps here, without importing SGLang, so the prompt ids equal the served ones.
Each step names the SGLang 0.5.23 code it mirrors (paths inside the wheel, under
``sglang/srt/``); docs/render.md lists them, and ``conformance/chat_render.py`` proves the result
against SGLang's own code.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any, Literal

import orjson

from eagle3_datagen.inputs.images import IMAGE_PART_TYPES, part_url

RenderReference = Literal["sglang_chat", "template"]
RENDER_REFERENCES: tuple[RenderReference, ...] = ("sglang_chat", "template")

# entrypoints/openai/protocol.py:746-751: roles of the generic message; "user" has its own class.
_GENERIC_ROLES = frozenset(
    {"system", "assistant", "tool", "function", "developer", "latest_reminder", "root"}
)
# protocol.py:754-767: the fields of ChatCompletionMessageGenericParam, in declaration order.
_GENERIC_FIELDS = (
    "content",
    "tool_call_id",
    "name",
    "phase",
    "reasoning_content",
    "tool_calls",
    "tools",
    "prefix",
)
# protocol.py:810-817: Function's fields in declaration order (``key_order`` is excluded).
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


# MEDIA_URL_PART_TYPES (parser/jinja_template_utils.py:16)
_MEDIA_URL_PARTS = ("image_url", "input_image", "video_url", "audio_url")


class SglangChatError(ValueError):
    """SGLang's chat path would refuse this request (HTTP 400); the message says why."""


def prepare(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    content_format: str,
    chat_template: str = "",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and tools exactly as SGLang passes them to ``apply_chat_template``."""
    if not messages:
        raise SglangChatError("Messages cannot be empty.")  # serving_chat.py:1105-1106
    dumped = [_dump_message(m, i) for i, m in enumerate(messages)]
    for i, message in enumerate(dumped):
        _parse_tool_call_arguments(message, i)  # serving_chat.py:2035-2044
    if tool_results_by_call(chat_template):
        dumped = canonical_tool_order(dumped)
    out = [_template_message(m, content_format) for m in dumped]
    out = _last_assistant_to_user(out)
    return out, _request_tools(tools)


def flat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """SGLang's second try when the template raised: tools without the OpenAI wrapper
    (serving_chat.py:2211-2215)."""
    if not tools:
        return None
    return [t.get("function", t) for t in tools]


# -- messages ------------------------------------------------------------------------------


def _dump_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """``msg.model_dump()`` of SGLang's message classes (protocol.py:754-806)."""
    role = message.get("role")
    if not isinstance(role, str):
        raise SglangChatError(f"message {index}: 'role' must be a string")
    if role == "user":
        content = message.get("content")
        if content is None:
            raise SglangChatError(f"message {index}: a user message needs content")
        return {"role": "user", "content": _dump_content(content, index)}
    lowered = role.lower()  # protocol.py:769-779: case-insensitive roles
    if lowered not in _GENERIC_ROLES:
        raise SglangChatError(f"message {index}: unknown role {role!r}")
    out: dict[str, Any] = {"role": lowered}
    for key in _GENERIC_FIELDS:
        value = message.get(key)
        if key == "content" and value is not None:
            value = _dump_content(value, index)
        elif key == "tool_calls" and value is not None:
            value = [_dump_tool_call(c, index) for c in _as_list(value, key, index)]
        elif key == "tools" and value is not None:
            value = [_dump_tool(t, index) for t in _as_list(value, key, index)]
        elif key in ("tool_call_id", "name", "reasoning_content") and not isinstance(
            value, str | None
        ):
            raise SglangChatError(f"message {index}: {key!r} must be a string")
        out[key] = value
    return out


def _as_list(value: Any, key: str, index: int) -> list[Any]:
    if not isinstance(value, list):
        raise SglangChatError(f"message {index}: {key!r} must be a list")
    return value


def _dump_content(content: Any, index: int) -> Any:
    """A string, or the list of content parts as their models dump them (protocol.py:585-600)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise SglangChatError(f"message {index}: content must be a string or a list of parts")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("thinking", "reasoning"):
            thinking, text = part.get("thinking"), part.get("text")
            if (thinking is None) == (text is None):
                raise SglangChatError(
                    f"message {index}: thinking parts require exactly one of 'thinking' or 'text'"
                )
            parts.append({"type": kind, "thinking": thinking, "text": text})
        elif kind == "image_url" and isinstance(part.get("image_url"), dict) and part_url(part):
            # ChatCompletionMessageContentImagePart (protocol.py:604-643): an object with a url
            parts.append({"type": "image_url", "image_url": {"url": part_url(part)}})
        elif kind in IMAGE_PART_TYPES:
            raise SglangChatError(
                f"message {index}: SGLang's chat path takes an image only as "
                '{"type": "image_url", "image_url": {"url": ...}} (render: template takes the '
                "parts as the chat template does)"
            )
        else:
            raise SglangChatError(
                f"message {index}: content part {kind!r} is not supported (text and images only)"
            )
    return parts


def _dump_tool_call(call: Any, index: int) -> dict[str, Any]:
    """``ToolCall.model_dump()`` (protocol.py:732-744): id, index, type, function{name, args}."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise SglangChatError(f"message {index}: a tool call needs a 'function' object")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | dict):
        raise SglangChatError(f"message {index}: tool call arguments must be a string or object")
    name = function.get("name")
    if name is not None and not isinstance(name, str):
        raise SglangChatError(f"message {index}: a tool call's name must be a string")
    call_id, position = call.get("id"), call.get("index")
    if call_id is not None and not isinstance(call_id, str):
        raise SglangChatError(f"message {index}: a tool call's id must be a string")
    if position is not None and (not isinstance(position, int) or isinstance(position, bool)):
        raise SglangChatError(f"message {index}: a tool call's index must be an integer")
    return {
        "id": call_id,
        "index": position,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _parse_tool_call_arguments(message: dict[str, Any], index: int) -> None:
    """``normalize_assistant_tool_call_arguments`` (serving_chat.py:181-215): string arguments of
    assistant tool calls become the JSON object they hold; anything else is a 400."""
    if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
        return
    for call in message["tool_calls"]:
        function = call["function"]
        if isinstance(function.get("arguments"), str):
            try:
                parsed = orjson.loads(function["arguments"])
            except orjson.JSONDecodeError:
                raise SglangChatError(
                    f"message {index}: Assistant tool call function.arguments must be valid JSON."
                ) from None
            if not isinstance(parsed, dict):
                raise SglangChatError(
                    f"message {index}: Assistant tool call function.arguments must be a JSON "
                    "object."
                )
            function["arguments"] = parsed


def _template_message(message: dict[str, Any], content_format: str) -> dict[str, Any]:
    """What ``_apply_jinja_template`` makes of one message (serving_chat.py:2131-2152):
    content ``None`` becomes "", ``None`` fields are dropped, parts are flattened per the
    template's content format (parser/jinja_template_utils.py:215-338), and a tool message's
    text parts are joined with spaces (serving_chat.py:159-178)."""
    msg = copy.deepcopy(message)
    if msg.get("content") is None:
        msg["content"] = ""
    content = msg["content"]
    if not isinstance(content, list):
        out = {k: v for k, v in msg.items() if v is not None}
    elif content_format == "openai":
        out = {k: v for k, v in msg.items() if v is not None and k != "content"}
        out["content"] = [
            {"type": "image"}
            if p.get("type") == "image_url"
            else {"type": "text", "text": p["text"]}
            for p in content
            if p.get("type") in ("text", "image_url")
        ]
    else:
        texts = [p["text"] for p in content if p.get("type") == "text"]
        msg["content"] = " ".join(texts) if texts else ""
        out = {k: v for k, v in msg.items() if v is not None}
    if out["role"] == "tool" and isinstance(out["content"], list):
        parts = out["content"]
        if all(p.get("type") == "text" for p in parts):
            out["content"] = " ".join(p.get("text", "") for p in parts)
    return out


def _last_assistant_to_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A final assistant message with string content becomes a user message, as without
    ``continue_final_message`` (serving_chat.py:513-549, called at 2158-2166)."""
    if messages and messages[-1].get("role") == "assistant":
        content = messages[-1].get("content")
        if isinstance(content, str):
            return [*messages[:-1], {"role": "user", "content": content}]
    return messages


# -- tools ---------------------------------------------------------------------------------


def _request_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``[tool.model_dump() for tool in request.tools]`` (serving_chat.py:1863-1871), passed
    only when there are tools (``tool_choice`` defaults to "auto" then, protocol.py:1076-1085),
    after the schema-type rewrite of ``_validate_request`` (serving_chat.py:1163-1171)."""
    if not tools:
        return None
    return [_dump_tool(t, None) for t in tools]


def _dump_tool(tool: Any, index: int | None) -> dict[str, Any]:
    """``Tool.model_dump()`` (protocol.py:810-856)."""
    where = "tools" if index is None else f"message {index}: tools"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        raise SglangChatError(f"{where}: a tool needs a 'function' object")
    if not isinstance(function.get("name"), str):
        raise SglangChatError(f"{where}: a tool's function needs a string 'name'")
    tool_defer = tool.get("defer_loading")
    fields = {k: copy.deepcopy(function.get(k)) for k in _FUNCTION_FIELDS}
    if tool_defer is not None and fields["defer_loading"] is None:
        fields["defer_loading"] = tool_defer  # Tool._propagate_defer_loading
    _normalize_schema_types(fields["parameters"])
    # Function._serialize: drop unset strict/defer_loading, keep the client's key order.
    if fields["defer_loading"] is None:
        del fields["defer_loading"]
    if fields["strict"] is None:
        del fields["strict"]
    order = [k for k in function if k in fields]
    dumped = {k: fields[k] for k in order + [k for k in fields if k not in order]}
    kind = tool.get("type", "function")
    return {"type": kind, "function": dumped, "defer_loading": tool_defer}


# function_call/utils.py:12-103: non-standard JSON Schema "type" names and what they become.
_STANDARD_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_TYPE_ALIASES = {
    **dict.fromkeys(
        (
            "str",
            "text",
            "varchar",
            "char",
            "enum",
            "uuid",
            "date",
            "datetime",
            "time",
            "timestamp",
            "binary",
            "blob",
            "bytea",
            "bytes",
            "varbinary",
        ),
        "string",
    ),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
_PREFIX_BOUNDARY = frozenset("0123456789[<( \t")
_PREFIX_RULES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)


def _normalize_type(raw: Any) -> Any:
    if not isinstance(raw, str) or raw in _STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in _STANDARD_TYPES:
        return base
    if base in _TYPE_ALIASES:
        return _TYPE_ALIASES[base]
    for prefixes, target in _PREFIX_RULES:
        for p in prefixes:
            if base == p or (
                len(base) > len(p) and base.startswith(p) and base[len(p)] in _PREFIX_BOUNDARY
            ):
                return target
    return raw


def _normalize_schema_types(schema: Any) -> None:
    """``normalize_json_schema_types`` (function_call/utils.py:113-175), in place."""
    if isinstance(schema, list):
        for item in schema:
            _normalize_schema_types(item)
        return
    if not isinstance(schema, dict):
        return
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, str):
            schema["type"] = _normalize_type(kind)
        elif isinstance(kind, list):
            unique: list[Any] = []
            for item in map(_normalize_type, kind):
                if item not in unique:
                    unique.append(item)
            schema["type"] = unique
    for key in _NESTED_MAPS:
        if isinstance(schema.get(key), dict):
            for value in schema[key].values():
                _normalize_schema_types(value)
    for key in _NESTED_LISTS:
        if isinstance(schema.get(key), list):
            for value in schema[key]:
                _normalize_schema_types(value)
    for key in _NESTED_ONE:
        if key in schema:
            _normalize_schema_types(schema[key])


# -- tool results with images ---------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def tool_results_by_call(chat_template: str) -> bool:
    """Whether the template may pair tool results with calls by ``tool_call_id``
    (``jinja_template_may_reorder_tool_results``, parser/jinja_template_utils.py:125-180):
    SGLang then orders a run of tool results holding media by call position
    (serving_chat.py:2126-2132). Kimi-K2.5's template reads ``message.tool_call_id``."""
    from jinja2 import nodes
    from transformers.utils.chat_template_utils import _compile_jinja_template

    if not chat_template:
        return False
    try:
        ast = _compile_jinja_template(chat_template).environment.parse(chat_template)
    except Exception:
        return False

    def is_id(node: Any) -> bool:
        return isinstance(node, nodes.Const) and node.value == "tool_call_id"

    if any(n.attr == "tool_call_id" for n in ast.find_all(nodes.Getattr)):
        return True
    if any(is_id(n.arg) for n in ast.find_all(nodes.Getitem)):
        return True
    for call in ast.find_all(nodes.Call):
        node = call.node
        if (
            isinstance(node, nodes.Getattr)
            and node.attr == "get"
            and is_id(next(iter(call.args), None))
        ):
            return True
    for flt in ast.find_all(nodes.Filter):
        if flt.name in ("map", "rejectattr", "selectattr") and (
            (flt.args and is_id(flt.args[0]))
            or any(k.key == "attribute" and is_id(k.value) for k in flt.kwargs)
        ):
            return True
    return False


def canonical_tool_order(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``_canonicalize_tool_message_order`` (serving_chat.py:892-917): each run of tool results
    after an assistant's tool calls, when it holds media, in the calls' order."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        out.append(message)
        index += 1
        calls = message.get("tool_calls") or []
        if message.get("role") != "assistant" or not calls:
            continue
        run = []
        while index < len(messages) and messages[index].get("role") in ("tool", "function"):
            run.append(messages[index])
            index += 1
        out.extend(_sort_tool_run(run, calls))
    return out


def _sort_tool_run(run: list[dict[str, Any]], calls: list[Any]) -> list[dict[str, Any]]:
    """``_sort_tool_message_run`` (serving_chat.py:851-890) without ``sort_text_runs``."""
    if len(run) < 2:
        return run
    call_ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
    if None in call_ids or len(set(call_ids)) != len(call_ids):
        return run
    result_ids = [m.get("tool_call_id") for m in run]
    if any(r not in call_ids for r in result_ids) or len(set(result_ids)) != len(result_ids):
        return run
    has_media = any(
        isinstance(m.get("content"), list)
        and any(isinstance(p, dict) and p.get("type") in _MEDIA_URL_PARTS for p in m["content"])
        for m in run
    )
    if not has_media:
        return run
    position = {call_id: i for i, call_id in enumerate(call_ids)}
    return sorted(run, key=lambda m: position[m["tool_call_id"]])


# -- the template's content format -----------------------------------------------------------


@functools.lru_cache(maxsize=8)
def content_format(chat_template: str) -> str:
    """'openai' (content parts kept as a list) or 'string' (parts joined), decided as
    ``detect_jinja_template_content_format`` does (parser/jinja_template_utils.py:83-117)."""
    if any(word in chat_template for word in ("image", "audio", "video", "vision")):
        return "openai"
    from jinja2 import nodes
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:  # the environment transformers renders with (SGLang parses with it too)
        ast = _compile_jinja_template(chat_template).environment.parse(chat_template)
    except Exception:  # any template transformers cannot compile: SGLang says "string"
        return "string"
    for loop in ast.find_all(nodes.For):
        if any(_iterates(loop.iter, var) for var in ("message", "msg", "m")):
            return "openai"
    return "string"


def _iterates(node: Any, var: str) -> bool:
    """``_is_var_or_elems_access(node, var, "content")`` (jinja_template_utils.py:54-69)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Filter):
        return node.node is not None and _iterates(node.node, var)
    if isinstance(node, nodes.Test):
        return _iterates(node.node, var)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _iterates(node.node, var)
    is_var = isinstance(getattr(node, "node", None), nodes.Name) and node.node.name == var
    if isinstance(node, nodes.Getitem):
        return is_var and isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, nodes.Getattr):
        return is_var and node.attr == "content"
    return False

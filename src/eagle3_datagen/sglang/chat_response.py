"""The assistant message SGLang 0.5.23's ``/v1/chat/completions`` returns for given output ids,
on a server launched with ``--reasoning-parser kimi_k2 --tool-call-parser kimi_k2``.

Why: in ``regenerate: all_turns`` each regenerated turn goes back into the next turn's history,
and a client of the deployed stack sends back exactly the message the server returned. That
message is made from text, not ids, in four steps, each copied here from SGLang's source
(paths inside the ``sglang`` wheel, relative to ``sglang/srt/``; proven against SGLang's own
code by ``conformance/chat_response.py``, replayed in CI from ``tests/fixtures``):

1. **Detokenization** with the request's settings. ``skip_special_tokens`` is true unless the
   request declares tools (``entrypoints/openai/serving_chat.py`` ``_process_messages``, ~1858:
   tools and ``tool_choice != "none"`` set it false); ``spaces_between_special_tokens`` is
   ``chat_template_kwargs.get("spaces_between_special_tokens", True)``
   (``entrypoints/openai/protocol.py`` ~1206). A matched stop token is dropped before decoding
   (``managers/detokenizer_manager.py`` ``trim_matched_stop``), and the text is what follows
   the decoded last 5 prompt ids (``schedule_batch.py`` ``init_incremental_detokenize``); ids
   at or past ``len(tokenizer)`` are decoded as id 0 (``_clamp_decode_ids``: never for a
   tokenizer whose ids are dense, as Kimi-K2.5's; the bundled tiktoken stand-in's are not). A
   fast tokenizer decodes with both settings (``batch_decode``); a Python one drops
   ``all_special_ids`` itself and ignores the spacing (``utils/patch_tokenizer.py``
   ``decode_without_hf_kwargs``): so which tokens vanish depends on the tokenizer.
2. **Reasoning** (``parser/reasoning_parser.py`` ``KimiK2Detector``, ``detect_and_parse``):
   with reasoning forced (thinking on), leading ``<think>`` are cut; the text before the first
   ``</think>`` is ``reasoning_content``; without ``</think>``, a ``<|tool_calls_section_begin|>``
   anywhere ends the reasoning (K2 can switch to a tool call without closing it), else it is
   all reasoning.
3. **Tool calls** (``function_call/kimik2_detector.py``, only when tools are declared): every
   ``<|tool_call_begin|> ID <|tool_call_argument_begin|> {...} <|tool_call_end|>`` in the
   answer; ``ID`` is ``[functions.]NAME:N`` (NAME may hold ``-`` and ``.``) or a bare counter
   ``N`` whose name is inferred from the declared tools; a call whose name cannot be found is
   dropped. ``content`` is the text before the section (the markup is dropped even when no
   call parses), unless the parser gave up (arguments JSON but not an object): then all of it.
4. **Ids**: ``functions.NAME:K``, K = the number of tool calls in the request's history plus
   the call's position (``serving_chat.py`` ``_process_tool_call_id``,
   ``_get_history_tool_calls_cnt``); the model's own counter is ignored.

The message is SGLang's ``ChatMessage`` as JSON with its null fields left out.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

THINK_START = "<think>"
THINK_END = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
# function_call/kimik2_detector.py ~72-90, verbatim.
_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<tool_call_id>[^\s<|]+)\s*<\|tool_call_argument_begin\|>"
    r"\s*(?P<function_arguments>\{.*?\})\s*<\|tool_call_end\|>",
    re.DOTALL,
)
_CALL_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")
_COUNTER = re.compile(r"^\d+$")
# managers/schedule_batch.py INIT_INCREMENTAL_DETOKENIZATION_OFFSET
_SURROGATE = 5


@dataclass(frozen=True, slots=True)
class ServedCall:
    """One tool call as SGLang returns it."""

    id: str
    name: str
    arguments: str  # the JSON text the model wrote, as SGLang's regex cut it


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What of a ``/v1/chat/completions`` request shapes its response message."""

    messages: Sequence[Message]
    tools: Sequence[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def effective_tools(self) -> list[Any]:
        """``_effective_tools``: the request's tools, then those of system/developer messages."""
        tools = list(self.tools or [])
        for m in self.messages:
            if m.get("role") in ("root", "system", "developer") and m.get("tools"):
                tools.extend(m["tools"])
        return tools

    @property
    def parses_tools(self) -> bool:
        return bool(self.effective_tools())

    @property
    def skip_special_tokens(self) -> bool:
        return not self.parses_tools

    @property
    def spaces_between_special_tokens(self) -> bool:
        return bool((self.chat_template_kwargs or {}).get("spaces_between_special_tokens", True))

    @property
    def force_reasoning(self) -> bool:
        """``_get_reasoning_from_request`` for ``reasoning_default="thinking"``: on unless the
        request says ``thinking: false``."""
        return (self.chat_template_kwargs or {}).get("thinking") is not False

    def history_tool_calls(self) -> int:
        """``_get_history_tool_calls_cnt``: tool calls of the history's assistant messages."""
        return sum(
            len(m.get("tool_calls") or [])
            for m in self.messages
            if isinstance(m, dict) and m.get("role") == "assistant"
        )


def detokenize(
    tok: Any,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    stop_matched: bool,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
) -> str:
    """The ``text`` SGLang's detokenizer gives a finished request (step 1 of the module doc)."""
    out = list(output_ids[:-1] if stop_matched and output_ids else output_ids)
    surr = list(prompt_ids[max(len(prompt_ids) - _SURROGATE, 0) :])
    size = _vocab_size(tok)
    if size:
        out = [i if 0 <= i < size else 0 for i in out]
        surr = [i if 0 <= i < size else 0 for i in surr]

    def decode(ids: list[int]) -> str:
        if not ids:
            return ""
        if getattr(tok, "is_fast", False):
            return str(
                tok.batch_decode(
                    [ids],
                    skip_special_tokens=skip_special_tokens,
                    spaces_between_special_tokens=spaces_between_special_tokens,
                )[0]
            )
        if skip_special_tokens:
            special = getattr(tok, "all_special_ids_set", None) or tok.all_special_ids
            ids = [i for i in ids if i not in set(special)]
        return str(tok.decode(ids))

    return decode(surr + out)[len(decode(surr)) :]


@functools.lru_cache(maxsize=8)
def _vocab_size(tok: Any) -> int | None:
    """``DetokenizerManager.init_tokenizer``: ``len(tokenizer)``, else its ``vocab_size``."""
    try:
        return len(tok)
    except TypeError:
        return getattr(tok, "vocab_size", None)


def split_reasoning(text: str, force_reasoning: bool) -> tuple[str | None, str]:
    """``(reasoning_content, rest)`` as SGLang's ``kimi_k2`` reasoning parser splits ``text``."""
    if not (force_reasoning or THINK_START in text):
        return None, text
    while text.startswith(THINK_START):
        text = text[len(THINK_START) :]
    if THINK_END not in text:
        cut = text.find(SECTION_BEGIN)
        if cut != -1:
            return text[:cut], text[cut:]
        return text, ""
    reasoning, _, rest = text.partition(THINK_END)
    return reasoning, rest


def _schema_properties(schema: Any) -> dict[str, Any]:
    """``function_call/utils.py`` ``get_schema_properties``: top-level properties, else those of
    ``anyOf``/``oneOf``/``allOf`` branches."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        return properties
    merged: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for branch in branches:
                for key, value in _schema_properties(branch).items():
                    merged.setdefault(key, value)
    return merged


def _tool_properties(tool: Any) -> tuple[str | None, set[str]]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict):
        return None, set()
    return fn.get("name"), set(_schema_properties(fn.get("parameters") or {}))


def _infer_name(tools: Sequence[Any], arguments: str) -> str | None:
    """``KimiK2Detector._infer_tool_name``: the only tool, else the best key overlap."""
    if len(tools) == 1:
        return _tool_properties(tools[0])[0]
    try:
        keys = set(json.loads(arguments).keys())  # AttributeError (not an object) propagates
    except (json.JSONDecodeError, TypeError):
        return None
    best, best_score = None, -1
    for tool in tools:
        name, props = _tool_properties(tool)
        if not props:
            continue
        score = len(keys & props) - len(keys - props)
        if score > best_score:
            best, best_score = name, score
    return best


def parse_tool_calls(
    text: str, tools: Sequence[Any], history_calls: int
) -> tuple[str, list[ServedCall] | None]:
    """``(content, calls)``: calls None when there is no section, or none of its calls parses
    (SGLang then returns the text before the section, markup dropped), or the parser gave up
    (the whole text)."""
    if SECTION_BEGIN not in text or not tools:
        return text, None
    content = text[: text.find(SECTION_BEGIN)]
    calls: list[ServedCall] = []
    try:
        for call_id, arguments in _CALL.findall(text):
            m = _CALL_ID.match(call_id)
            if m is not None:
                name: str | None = m.group("name")
            elif _COUNTER.match(call_id):
                name = _infer_name(tools, arguments)
            else:
                name = None
            if name is None:
                continue
            calls.append(
                ServedCall(f"functions.{name}:{history_calls + len(calls)}", name, arguments)
            )
    except AttributeError:  # arguments JSON but not an object: SGLang's detector gives up
        return text, None
    return content, calls or None


def served_message(
    tok: Any,
    request: ChatRequest,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    stop_matched: bool,
) -> tuple[Message, list[ServedCall] | None]:
    """The assistant message SGLang returns for ``output_ids`` (nulls left out), and its calls
    (None when the answer has no tool call SGLang parses)."""
    text = detokenize(
        tok,
        prompt_ids,
        output_ids,
        stop_matched=stop_matched,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
    )
    reasoning, answer = split_reasoning(text, request.force_reasoning)
    calls = None
    if request.parses_tools:
        answer, calls = parse_tool_calls(
            answer, request.effective_tools(), request.history_tool_calls()
        )
    message: Message = {"role": "assistant", "content": answer}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "index": i,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
    return message, calls

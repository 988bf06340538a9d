"""Multi-turn regeneration and several samples: which turns a line gives, and how each turn's
prompt is built from the model's own earlier turns.

``regenerate: all_turns`` regenerates every assistant turn of a conversation in order. The prompt
of turn k is the chat template over the conversation so far, in which every earlier assistant
turn is the model's own output turned back into a message the way a serving stack returns it
(:func:`assistant_message`): SGLang's ``kimi_k2`` reasoning parser gives ``reasoning_content``
(the text before ``</think>``) and the content after it, its ``kimi_k2`` tool-call parser cuts
the content at ``<|tool_calls_section_begin|>`` and returns each call's id (``functions.NAME:IDX``),
name and arguments; a client sends that message back as it came. What the model then sees is up
to the template (Kimi-K2.5's drops the reasoning of turns before the last user message). The
output ids stored for each turn stay exactly what the server returned.

A tool result in the data answers the data's own call. When the model's calls differ from the
data's (names, arguments, or their number), the data's tool results no longer answer them, so
the conversation stops after that turn (:func:`tool_call_divergence`); a turn cut at
``max_tokens`` or rejected ends it too. speculators' multi-turn regeneration does the same in
spirit (vllm-project/speculators PR #693 regenerates each turn on the on-policy prefix; PR #750
splices the i-th cached tool result in after a tool-name check and truncates the conversation
otherwise).

Record ids: ``<id>`` for ``last`` with one sample; ``#s<n>`` is added when a partition has
several samples, then ``#t<k>`` with ``all_turns`` (``conv-7#s1#t2``: sample 1, third generated
turn). ``n`` and ``k`` count from 0 and are stored in the ``sample`` and ``turn`` columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.token_ids import TokenIds

Message = dict[str, Any]

# SGLang's KimiK2Detector: a call header is ``functions.NAME:IDX`` (``functions.`` optional).
_CALL_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.]+):(?P<index>\d+)$")

# Why a conversation ended before its last turn (summary keys).
STOP_TOOL_CALL = "tool_call_diverged"
STOP_TRUNCATED = "truncated"
STOP_REJECTED = "turn_rejected"


@dataclass(frozen=True, slots=True)
class TurnSlot:
    """One turn to generate: ``messages[:history_end]`` of the data come before it, and
    ``data`` is the data's assistant message it replaces (None for the open last turn)."""

    index: int
    history_end: int
    data: Message | None


def plan_turns(prompt: Prompt, regenerate: str) -> list[TurnSlot]:
    """The turns a line gives: the last one only, or every assistant turn and the last one.

    ``prompt.messages`` no longer holds a trailing assistant message (it is the reply the last
    turn regenerates). An assistant message with nothing before it is kept as data.
    """
    last = TurnSlot(0, len(prompt.messages), None)
    if regenerate != "all_turns":
        return [last]
    slots = [
        TurnSlot(k, i, m)
        for k, (i, m) in enumerate(
            (i, m) for i, m in enumerate(prompt.messages) if m.get("role") == "assistant" and i
        )
    ]
    slots.append(TurnSlot(len(slots), len(prompt.messages), None))
    return slots


def first_turn(prompt: Prompt, regenerate: str) -> Prompt:
    """The prompt of a line's first generated turn (the line itself for ``last``)."""
    end = plan_turns(prompt, regenerate)[0].history_end
    if end == len(prompt.messages):
        return prompt
    return Prompt(prompt.id, prompt.line, prompt.messages[:end], prompt.tools)


def record_id(base: str, turn: int, sample: int, *, turns: bool, samples: int) -> str:
    """The id of one generated turn (see the module docstring)."""
    rid = base
    if samples > 1:
        rid += f"#s{sample}"
    if turns:
        rid += f"#t{turn}"
    return rid


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text the model wrote


def _cut(seq: Sequence[int], token: int) -> tuple[Sequence[int], Sequence[int]] | None:
    try:
        i = list(seq).index(token)
    except ValueError:
        return None
    return seq[:i], seq[i + 1 :]


def parse_tool_calls(
    section: Sequence[int], ids: TokenIds, decode: Callable[[Sequence[int]], str]
) -> list[ToolCall] | None:
    """The calls of one tool-call section (between its begin and end tokens); None when one
    is malformed (SGLang's parser would drop it, so no client could answer it)."""
    assert ids.tools is not None
    t = ids.tools
    calls: list[ToolCall] = []
    rest = list(section)
    while rest:
        if rest[0] != t.call_begin:
            if decode(rest[:1]).strip():
                return None
            rest = rest[1:]  # whitespace between calls
            continue
        header_args = _cut(rest[1:], t.call_end)
        if header_args is None:
            return None
        body, rest = list(header_args[0]), list(header_args[1])
        split = _cut(body, t.argument_begin)
        if split is None:
            return None
        call_id = decode(split[0]).strip()
        m = _CALL_ID.match(call_id)
        arguments = decode(split[1]).strip()
        if m is None or not (arguments.startswith("{") and arguments.endswith("}")):
            return None
        calls.append(ToolCall(call_id, m.group("name"), arguments))
    return calls


def assistant_message(
    output_ids: Sequence[int], ids: TokenIds, decode: Callable[[Sequence[int]], str]
) -> tuple[Message, list[ToolCall] | None]:
    """The model's turn as the assistant message a client sends back, and its tool calls
    (None when a call could not be parsed).

    ``reasoning_content`` is the text before ``</think>`` (a leading ``<think>`` dropped when
    the model opens the block itself), ``content`` what follows up to the tool-call section or
    the stop token, not stripped (SGLang's parsers do not strip either).
    """
    out = list(output_ids)
    if out and out[-1] in ids.stop_ids:
        out = out[:-1]
    message: Message = {"role": "assistant"}
    if ids.thinking != "none":
        parts = _cut(out, ids.think_end)
        if parts is not None:
            reasoning = list(parts[0])
            if reasoning and reasoning[0] == ids.think_start:
                reasoning = reasoning[1:]
            message["reasoning_content"] = decode(reasoning)
            out = list(parts[1])
    calls: list[ToolCall] | None = []
    if ids.tools is not None:
        section = _cut(out, ids.tools.section_begin)
        if section is not None:
            out = list(section[0])
            body = list(section[1])
            if ids.tools.section_end in body:
                body = body[: body.index(ids.tools.section_end)]
            calls = parse_tool_calls(body, ids, decode)
    message["content"] = decode(out)
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return message, calls


def _json_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _data_calls(message: Message) -> list[tuple[Any, Any, Any]]:
    """``(name, arguments, id)`` of each call of a data message (OpenAI or flat shape)."""
    out = []
    for tc in message.get("tool_calls") or []:
        if not isinstance(tc, dict):
            continue
        fn = tc["function"] if isinstance(tc.get("function"), dict) else tc
        out.append((fn.get("name"), _json_value(fn.get("arguments")), tc.get("id")))
    return out


def _show(name: Any, args: Any) -> str:
    text = args if isinstance(args, str) else orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    return f"{name}({text if isinstance(text, str) else text.decode()})"


def tool_call_divergence(data: Message | None, calls: list[ToolCall] | None) -> str | None:
    """Why the model's calls do not match the data's turn (None when they do): the same
    calls in the same order, same names, arguments equal as JSON values."""
    if calls is None:
        return "the model's tool-call section could not be parsed"
    want = [(n, a) for n, a, _ in _data_calls(data or {})]
    got = [(c.name, _json_value(c.arguments)) for c in calls]
    if want == got:
        return None
    shown_want = ", ".join(_show(n, a) for n, a in want) or "no tool"
    shown_got = ", ".join(_show(n, a) for n, a in got) or "no tool"
    return f"the data called {shown_want}, the model called {shown_got}"


def continue_history(
    history: list[Message],
    model_message: Message,
    calls: list[ToolCall],
    slot: TurnSlot,
    next_slot: TurnSlot,
    messages: list[Message],
) -> list[Message]:
    """The conversation before ``next_slot``: the history, the model's turn, then the data's
    messages up to the next assistant turn. Tool results that answer the data's call i answer
    the model's call i instead (same name and arguments, by then), as a client would reply."""
    ids = {d_id: c.id for (_, _, d_id), c in zip(_data_calls(slot.data or {}), calls,
                                                  strict=False) if d_id}  # fmt: skip
    following = []
    for m in messages[slot.history_end + 1 : next_slot.history_end]:
        if m.get("role") == "tool" and m.get("tool_call_id") in ids:
            m = {**m, "tool_call_id": ids[m["tool_call_id"]]}
        following.append(m)
    return [*history, model_message, *following]

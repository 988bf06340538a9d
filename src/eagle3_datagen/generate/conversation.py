"""Multi-turn regeneration and several samples: which turns a line gives, and how each turn's
prompt is built from the model's own earlier turns.

``regenerate: all_turns`` regenerates every assistant turn of a conversation in order. The prompt
of turn k is the chat template over the conversation so far, in which every earlier assistant
turn is the message SGLang 0.5.23's ``/v1/chat/completions`` (``kimi_k2`` reasoning and tool-call
parsers) would have returned for the model's output ids, as a client sends it back
(:func:`served_turn`, sglang/chat_response.py): text detokenized with the request's settings,
``reasoning_content`` and ``content`` split by the reasoning parser, tool calls with SGLang's ids
``functions.NAME:K`` (K counts the calls in the history). What the model then sees is up to the
render (Kimi-K2.5's template drops the reasoning of turns before the last user message). The
output ids stored for each turn stay exactly what the server returned.

A tool result in the data answers the data's own call. When the model's calls equal the data's
(names, and arguments as JSON values), the data's results follow, addressed to the ids SGLang
returned for the model's calls; when they differ (names, arguments, or their number), the data's
tool results no longer answer them, so the conversation stops after that turn
(:func:`tool_call_divergence`); a turn cut at ``max_tokens`` or rejected ends it too.
speculators' multi-turn regeneration does the same in spirit (vllm-project/speculators PR #693
regenerates each turn on the on-policy prefix; PR #750 splices the i-th cached tool result in
after a tool-name check and truncates the conversation otherwise).

Record ids: ``<id>`` for ``last`` with one sample; ``#s<n>`` is added when a partition has
several samples, then ``#t<k>`` with ``all_turns`` (``conv-7#s1#t2``: sample 1, third generated
turn). ``n`` and ``k`` count from 0 and are stored in the ``sample`` and ``turn`` columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.sglang.chat_response import ChatRequest, ServedCall, served_message

Message = dict[str, Any]

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
    return dataclasses.replace(prompt, messages=prompt.messages[:end])


@dataclass(frozen=True, slots=True)
class TurnAt:
    """Which record a turn makes: its id, turn index and sample index."""

    id: str
    turn: int
    sample: int


def record_id(base: str, turn: int, sample: int, *, turns: bool, samples: int) -> str:
    """The id of one generated turn (see the module docstring)."""
    rid = base
    if samples > 1:
        rid += f"#s{sample}"
    if turns:
        rid += f"#t{turn}"
    return rid


def served_turn(
    tokenizer: ChatTokenizer,
    prompt: Prompt,
    history: Sequence[Message],
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_type: str,
) -> tuple[Message, list[ServedCall] | None]:
    """The model's turn as SGLang 0.5.23's chat path returns it to a client that sent
    ``history``, the line's tools and its chat_template_kwargs (sglang/chat_response.py), and
    the calls it returns."""
    request = ChatRequest(history, prompt.tools, tokenizer.kwargs_for(prompt))
    return served_message(
        tokenizer.tok, request, prompt_ids, output_ids, stop_matched=finish_type == "stop"
    )


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


def tool_call_divergence(data: Message | None, calls: list[ServedCall] | None) -> str | None:
    """Why the model's calls, as SGLang returns them, do not match the data's turn (None when
    they do): the same calls in the same order, same names, arguments equal as JSON values."""
    calls = calls or []
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
    calls: list[ServedCall],
    slot: TurnSlot,
    next_slot: TurnSlot,
    messages: list[Message],
) -> list[Message]:
    """The conversation before ``next_slot``: the history, the model's turn, then the data's
    messages up to the next assistant turn. Tool results that answer the data's call i answer
    the model's call i instead, by the id SGLang returned for it (same name and arguments, by
    then), as a client would reply; a result without an id (data whose calls have none) takes
    the id of the call at its position."""
    data_ids = [d_id for _, _, d_id in _data_calls(slot.data or {})]
    ids = {d_id: c.id for d_id, c in zip(data_ids, calls, strict=False) if d_id}
    following, position = [], 0
    for m in messages[slot.history_end + 1 : next_slot.history_end]:
        if m.get("role") == "tool":
            if m.get("tool_call_id") in ids:
                m = {**m, "tool_call_id": ids[m["tool_call_id"]]}
            elif not m.get("tool_call_id") and position < len(calls):
                m = {**m, "tool_call_id": calls[position].id}
            position += 1
        following.append(m)
    return [*history, model_message, *following]

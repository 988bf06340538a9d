"""Token-level validation of one generation: is it well-formed training data?

No other EAGLE-3 data tool checks tokens (they check text, or nothing). These rules catch what
silently poisons a drafter: a reasoning block that never closed, a turn that never ended, a role
token leaking into the output, a tool call cut in half, an aborted request stored as data.

Inputs are plain ids and counts, so the same rules run live in the pipeline and offline on a
finished dataset (``eagle3-datagen validate``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from eagle3_datagen.config import ValidationPolicy
from eagle3_datagen.render.token_ids import TokenIds, ToolIds
from eagle3_datagen.sglang.chat_response import SECTION_BEGIN, parse_tool_calls


@dataclass(frozen=True, slots=True)
class ToolCallCheck:
    """What reading the calls as text needs: the tokenizer's decode (special tokens kept) and
    the request's declared tools. Live runs have both; offline checks of stored records do not
    (tools are not stored), so they check the tokens only."""

    decode: Callable[[Sequence[int]], str]
    tools: Sequence[Any] | None


@dataclass(slots=True)
class Verdict:
    """The outcome for one record: accepted, or the reasons (code, detail) it was not."""

    reasons: list[tuple[str, str]] = field(default_factory=list)
    truncated: bool = False
    think_end_index: int = -1  # position of </think> in output_ids, -1 when absent

    @property
    def accepted(self) -> bool:
        return not self.reasons

    def fail(self, code: str, detail: str) -> None:
        self.reasons.append((code, detail))

    @property
    def reason_text(self) -> str:
        return "; ".join(f"{c}: {d}" for c, d in self.reasons)


def validate_output(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    finish_type: str,
    finish_matched: int | str | None,
    prompt_tokens: int,
    completion_tokens: int,
    ids: TokenIds,
    policy: ValidationPolicy,
    tool_check: ToolCallCheck | None = None,
    thinking: bool | None = None,
) -> Verdict:
    """Apply every rule; all failures are reported, not just the first.

    ``thinking``: the line's mode (docs/modes.md) switches reasoning on (True) or off (False);
    its prompt must then end as that mode's generation prompt does. None: the prompt decides.

    ``finish_matched`` is what the server said stopped a ``stop`` finish: a token id, or None
    when it is not known (offline checks of stored records). With ``tool_check``, a tool-call
    section must also be one SGLang's ``kimi_k2`` tool-call parser returns in full.

    The rules run top to bottom in the order the docs give them.
    """
    v = Verdict(truncated=finish_type == "length")
    n = len(output_ids)
    if _no_generation(finish_type, n, v):
        return v
    _check_counts(len(prompt_ids), n, prompt_tokens, completion_tokens, v)
    last = output_ids[-1]
    # Where each special token sits, found in one pass plus one scan per token present: the
    # rules below read these few positions, never the ids again (a long answer is thousands).
    pos = _positions(output_ids, _specials(ids))
    if finish_type == "stop":
        _check_stop(finish_matched, last, ids, v)
    body_len = n - 1 if last == ids.end_of_turn else n
    _check_turn_tokens(output_ids, pos, body_len, ids, v)
    if thinking is not None and ids.thinking == "prompt":
        _check_mode(prompt_ids, thinking, ids, v)
    answer_start = _check_thinking(prompt_ids, output_ids, pos, ids, v)
    if ids.tools is not None:
        _check_tool_calls(output_ids, pos, answer_start, ids.tools, v)
        if tool_check is not None and v.accepted and not v.truncated:
            _check_served_calls(output_ids, pos, ids.tools, tool_check, v)
    if (
        policy.require_answer
        and not v.truncated
        and answer_start is not None
        and answer_start >= body_len
    ):
        v.fail("empty_answer", "nothing after the reasoning block")
    if v.truncated and policy.truncation == "reject":
        v.fail("truncated", f"hit max_new_tokens after {n} tokens")
    return v


def _no_generation(finish_type: str, n: int, v: Verdict) -> bool:
    """True (with the reason in ``v``) when there is no generation to check: the request was
    aborted, finished for an unknown reason, or returned no tokens."""
    if finish_type == "abort":
        v.fail("aborted", "the server aborted the request")
        return True
    if finish_type not in ("stop", "length"):
        v.fail("bad_finish_reason", f"unknown finish_reason type {finish_type!r}")
        return True
    if n == 0:
        v.fail("empty_output", "the server returned no output tokens")
        return True
    return False


def _check_counts(
    sent: int, n: int, prompt_tokens: int, completion_tokens: int, v: Verdict
) -> None:
    """The server counted exactly the prompt ids sent and the output ids returned."""
    if prompt_tokens != sent:
        v.fail(
            "prompt_token_mismatch",
            f"server counted {prompt_tokens} prompt tokens, we sent {sent}",
        )
    if completion_tokens != n:
        v.fail(
            "completion_token_mismatch",
            f"completion_tokens={completion_tokens} but {n} output ids",
        )


def _check_stop(finish_matched: int | str | None, last: int, ids: TokenIds, v: Verdict) -> None:
    """A ``stop`` finish ended on a generated stop token: the end-of-turn, the last id."""
    if finish_matched is not None and (
        not isinstance(finish_matched, int) or isinstance(finish_matched, bool)
    ):
        # We send no stop strings, so a string here is SGLang's own verdict: "NaN happened"
        # means it replaced an out-of-vocabulary sample with a stop or EOS id.
        v.fail(
            "stop_not_a_token",
            f"finished on {finish_matched!r}, not on a stop token id: the last id "
            f"{last} was put there by the server, not generated",
        )
    elif isinstance(finish_matched, int) and finish_matched != last:
        v.fail(
            "stop_mismatch",
            f"matched stop {finish_matched} is not the last id {last}",
        )
    if last != ids.end_of_turn:
        v.fail(
            "no_end_of_turn",
            f"finished on {finish_matched!r}, last id {last}, "
            f"not the end-of-turn token {ids.end_of_turn}",
        )


def _check_turn_tokens(
    output_ids: Sequence[int],
    pos: dict[int, list[int]],
    body_len: int,
    ids: TokenIds,
    v: Verdict,
) -> None:
    """No end-of-turn before the last id, and no role or turn token anywhere."""
    inside = [i for i in pos.get(ids.end_of_turn, ()) if i < body_len]
    if inside:
        v.fail("end_of_turn_inside", f"end-of-turn token at position {inside[0]}")
    roles = _merged(pos, ids.role_ids)
    if roles:
        v.fail(
            "role_token_in_output",
            f"role/turn token {output_ids[roles[0]]} at position {roles[0]}",
        )


@functools.lru_cache(maxsize=16)
def _specials(ids: TokenIds) -> frozenset[int]:
    """Every token a rule looks for: think, end-of-turn, role and tool-call tokens."""
    tools = ids.tools.all if ids.tools is not None else frozenset()
    return frozenset({ids.think_start, ids.think_end, ids.end_of_turn}) | ids.role_ids | tools


def _positions(output_ids: Sequence[int], tokens: frozenset[int]) -> dict[int, list[int]]:
    """The positions of each of ``tokens`` that occurs in ``output_ids`` (ascending)."""
    return {tok: _where(output_ids, (tok,)) for tok in tokens.intersection(output_ids)}


def _merged(pos: dict[int, list[int]], tokens: AbstractSet[int]) -> list[int]:
    """The positions of any of ``tokens``, ascending."""
    return sorted(itertools.chain.from_iterable(pos.get(t, ()) for t in tokens))


def _where(output_ids: Sequence[int], tokens: Iterable[int]) -> list[int]:
    """Positions of ``tokens`` in ``output_ids``, scanned at C speed (``list.index``).

    Why: a Python loop over every output id costs ~0.3 us per id per rule, i.e. milliseconds
    per record for long generations; the tokens searched for are rare.
    """
    found: list[int] = []
    for tok in tokens:
        i = -1
        while True:
            try:
                i = output_ids.index(tok, i + 1)
            except ValueError:
                break
            found.append(i)
    found.sort()
    return found


def _check_mode(prompt_ids: Sequence[int], thinking: bool, ids: TokenIds, v: Verdict) -> None:
    """The prompt ends as the mode's generation prompt: an empty reasoning block for instant
    mode, an open one for thinking mode (a template that ignores the kwarg is caught here)."""
    closed = list(prompt_ids[-2:]) == [ids.think_start, ids.think_end]
    if not thinking and not closed:
        v.fail(
            "mode_mismatch",
            "instant mode (thinking: false), but the prompt does not end with an empty "
            "reasoning block: does the chat template honour thinking?",
        )
    elif thinking and closed:
        v.fail("mode_mismatch", "thinking mode, but the prompt ends with an empty reasoning block")


def _check_thinking(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    pos: dict[int, list[int]],
    ids: TokenIds,
    v: Verdict,
) -> int | None:
    """Check the reasoning block; return where the answer starts (None: still reasoning)."""
    starts = pos.get(ids.think_start, [])
    ends = pos.get(ids.think_end, [])
    if ends:
        v.think_end_index = ends[0]
    mode = ids.thinking
    if mode == "none":
        if starts or ends:
            v.fail(
                "unexpected_think_token",
                "think tokens in the output of a non-thinking model",
            )
        return 0
    if mode == "prompt":
        if list(prompt_ids[-2:]) == [ids.think_start, ids.think_end]:
            # Thinking switched off by the template (e.g. thinking=False): answer only.
            if starts or ends:
                v.fail("unexpected_think_token", "think tokens in output with thinking off")
            return 0
        if not prompt_ids or prompt_ids[-1] != ids.think_start:
            v.fail(
                "prompt_not_thinking",
                "the prompt does not end with the think-start token",
            )
            return 0
        if starts:
            v.fail("think_start_in_output", f"think-start token at position {starts[0]}")
    else:  # "output": the model opens the block itself, as its first token
        if not output_ids or output_ids[0] != ids.think_start:
            v.fail("no_think_start", "the output does not begin with the think-start token")
        if len(starts) > 1:
            v.fail(
                "think_start_in_output",
                f"think-start token again at position {starts[1]}",
            )
    if len(ends) > 1:
        v.fail("think_end_count", f"{len(ends)} think-end tokens (expected exactly one)")
    if not ends:
        section = _tool_section_start(pos, ids)
        if section is not None:
            # SGLang's kimi_k2 reasoning parser: without </think>, a tool-call section ends
            # the reasoning (reasoning_parser.py KimiK2Detector, tool_start_token).
            return section
        if not v.truncated:
            v.fail(
                "think_end_count",
                "no think-end token: the reasoning block never closed",
            )
        return None
    return ends[0] + 1


def _tool_section_start(pos: dict[int, list[int]], ids: TokenIds) -> int | None:
    """Where a tool-call section begins, when the reasoning is ended by one (no </think>)."""
    if ids.tools is None or ids.tools.section_begin not in pos:
        return None
    return pos[ids.tools.section_begin][0]


def _check_tool_calls(
    output_ids: Sequence[int],
    pos: dict[int, list[int]],
    answer_start: int | None,
    t: ToolIds,
    v: Verdict,
) -> None:
    """Sections are balanced; each call is begin, argument-begin, end; several calls allowed."""
    positions = _merged(pos, t.all)
    if not positions:
        return
    if answer_start is None or positions[0] < answer_start:
        v.fail(
            "tool_call_in_reasoning",
            f"tool-call token at position {positions[0]} before the reasoning block closed",
        )
        return
    # states: 0 outside, 1 in section, 2 in call name, 3 in arguments
    state, calls = 0, 0
    expected = {
        0: {t.section_begin: 1},
        1: {t.call_begin: 2, t.section_end: 0},
        2: {t.argument_begin: 3},
        3: {t.call_end: 1},
    }
    for i in positions:
        tok = output_ids[i]
        nxt = expected[state].get(tok)
        if nxt is None:
            v.fail(
                "malformed_tool_call",
                f"unexpected tool-call token {tok} at position {i}",
            )
            return
        if state == 1 and tok == t.section_end and calls == 0:
            v.fail("malformed_tool_call", f"empty tool-call section closed at position {i}")
            return
        if tok == t.call_end:
            calls += 1
        if tok == t.section_begin:
            calls = 0
        state = nxt
    if state != 0 and not v.truncated:
        v.fail(
            "malformed_tool_call",
            "tool-call section not closed before the end of the turn",
        )


def _check_served_calls(
    output_ids: Sequence[int],
    pos: dict[int, list[int]],
    t: ToolIds,
    check: ToolCallCheck,
    v: Verdict,
) -> None:
    """Every call of a well-formed section is one SGLang's ``kimi_k2`` tool-call parser returns:
    a call it drops (an id that is neither ``[functions.]NAME:N`` nor a counter it can name,
    arguments that are not one ``{...}``) or a section in a request without tools (SGLang does
    not parse it) would reach the client as something else than the call the model made."""
    if t.section_begin not in pos:
        return
    start = pos[t.section_begin][0]
    if not check.tools:
        v.fail(
            "tool_call_undeclared",
            f"tool-call section at position {start} in a request "
            "that declares no tools: SGLang's kimi_k2 parser does not parse it",
        )
        return
    text = check.decode(output_ids[start:])
    if SECTION_BEGIN not in text:
        return  # not Kimi's markup: SGLang's kimi_k2 parser is not the reference
    wrote = sum(1 for i in pos.get(t.call_end, ()) if i >= start)
    _, served = parse_tool_calls(text[text.find(SECTION_BEGIN) :], check.tools, 0)
    if served is None or len(served) != wrote:
        got = ", ".join(c.name for c in served or []) or "none"
        v.fail(
            "tool_call_dropped",
            f"SGLang's kimi_k2 parser returns {len(served or [])} of "
            f"the {wrote} calls the model wrote (parsed: {got}): {text[:300]!r}",
        )

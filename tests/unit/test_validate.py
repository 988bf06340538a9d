"""Every validation rule, driven by hand-made token sequences over the bundled tokenizer."""

from __future__ import annotations

import pytest

from eagle3_datagen.config import SpecialTokens, ValidationPolicy
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.validate.tokens import ToolCallCheck, Verdict, validate_output

KEEP = ValidationPolicy()


@pytest.fixture(scope="module")
def ids(chat_tokenizer: ChatTokenizer) -> TokenIds:
    return TokenIds.resolve(chat_tokenizer, SpecialTokens())


@pytest.fixture(scope="module")
def t(chat_tokenizer: ChatTokenizer) -> dict[str, int]:
    names = [
        "<think>",
        "</think>",
        "<|im_end|>",
        "[EOS]",
        "<|im_user|>",
        "<|im_assistant|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ]
    return {n: chat_tokenizer.token_id(n) for n in names}


def run(
    ids: TokenIds,
    prompt: list[int],
    out: list[int],
    finish: str = "stop",
    policy: ValidationPolicy = KEEP,
    prompt_tokens: int | None = None,
) -> Verdict:
    return validate_output(
        prompt,
        out,
        finish_type=finish,
        finish_matched=out[-1] if finish == "stop" and out else None,
        prompt_tokens=len(prompt) if prompt_tokens is None else prompt_tokens,
        completion_tokens=len(out),
        ids=ids,
        policy=policy,
    )


def codes(v: Verdict) -> list[str]:
    return [c for c, _ in v.reasons]


def thinking_prompt(t: dict[str, int]) -> list[int]:
    return [5, 6, 7, t["<think>"]]


def test_well_formed_kimi_output_is_accepted(ids: TokenIds, t: dict[str, int]) -> None:
    v = run(ids, thinking_prompt(t), [10, 11, t["</think>"], 12, 13, t["<|im_end|>"]])
    assert v.accepted and not v.truncated and v.think_end_index == 2


@pytest.mark.parametrize(
    ("out_fn", "finish", "code"),
    [
        (lambda t: [10, t["</think>"], 12], "stop", "no_end_of_turn"),
        (lambda t: [10, t["</think>"], 12, t["[EOS]"]], "stop", "no_end_of_turn"),
        (lambda t: [10, 11, 12, t["<|im_end|>"]], "stop", "think_end_count"),
        (
            lambda t: [10, t["</think>"], 11, t["</think>"], 12, t["<|im_end|>"]],
            "stop",
            "think_end_count",
        ),
        (
            lambda t: [t["<think>"], 10, t["</think>"], 12, t["<|im_end|>"]],
            "stop",
            "think_start_in_output",
        ),
        (lambda t: [10, t["</think>"], t["<|im_end|>"]], "stop", "empty_answer"),
        (
            lambda t: [10, t["</think>"], 1, t["<|im_user|>"], 2, t["<|im_end|>"]],
            "stop",
            "role_token_in_output",
        ),
        (
            lambda t: [10, t["<|im_end|>"], 11, t["</think>"], 12, t["<|im_end|>"]],
            "stop",
            "end_of_turn_inside",
        ),
        (lambda t: [10, t["</think>"], 12, t["<|im_end|>"]], "abort", "aborted"),
        (lambda t: [], "stop", "empty_output"),
    ],
)
def test_each_rule_rejects(
    ids: TokenIds, t: dict[str, int], out_fn, finish: str, code: str
) -> None:
    v = run(ids, thinking_prompt(t), out_fn(t), finish=finish)
    assert code in codes(v), v.reasons


def test_truncated_inside_reasoning_is_kept_flagged_or_rejected(
    ids: TokenIds, t: dict[str, int]
) -> None:
    out = [10, 11, 12, 13]
    kept = run(ids, thinking_prompt(t), out, finish="length")
    assert kept.accepted and kept.truncated and kept.think_end_index == -1
    rejected = run(
        ids, thinking_prompt(t), out, finish="length", policy=ValidationPolicy(truncation="reject")
    )
    assert codes(rejected) == ["truncated"]


def test_prompt_token_count_must_match(ids: TokenIds, t: dict[str, int]) -> None:
    v = run(ids, thinking_prompt(t), [10, t["</think>"], 12, t["<|im_end|>"]], prompt_tokens=3)
    assert codes(v) == ["prompt_token_mismatch"]


def test_prompt_must_open_thinking_in_prompt_mode(ids: TokenIds, t: dict[str, int]) -> None:
    v = run(ids, [5, 6, 7], [10, t["</think>"], 12, t["<|im_end|>"]])
    assert "prompt_not_thinking" in codes(v)


def test_thinking_switched_off_by_template(ids: TokenIds, t: dict[str, int]) -> None:
    prompt = [5, t["<think>"], t["</think>"]]
    assert run(ids, prompt, [12, 13, t["<|im_end|>"]]).accepted
    assert "unexpected_think_token" in codes(
        run(ids, prompt, [12, t["</think>"], 1, t["<|im_end|>"]])
    )


def test_r1_style_thinking_in_output(chat_tokenizer: ChatTokenizer, t: dict[str, int]) -> None:
    ids = TokenIds.resolve(chat_tokenizer, SpecialTokens(thinking="output"))
    good = [t["<think>"], 10, t["</think>"], 12, t["<|im_end|>"]]
    assert run(ids, [5, 6], good).accepted
    assert "no_think_start" in codes(run(ids, [5, 6], [10, t["</think>"], 12, t["<|im_end|>"]]))


def test_no_thinking_model(chat_tokenizer: ChatTokenizer, t: dict[str, int]) -> None:
    ids = TokenIds.resolve(chat_tokenizer, SpecialTokens(thinking="none"))
    assert run(ids, [5], [12, 13, t["<|im_end|>"]]).accepted
    assert "unexpected_think_token" in codes(run(ids, [5], [12, t["</think>"], t["<|im_end|>"]]))


def call(t: dict[str, int], name: int = 20) -> list[int]:
    return [
        t["<|tool_call_begin|>"],
        name,
        21,
        t["<|tool_call_argument_begin|>"],
        30,
        31,
        t["<|tool_call_end|>"],
    ]


def section(t: dict[str, int], *calls: list[int]) -> list[int]:
    body = [x for c in calls for x in c]
    return [t["<|tool_calls_section_begin|>"], *body, t["<|tool_calls_section_end|>"]]


@pytest.mark.parametrize("n_calls", [1, 2, 3])
def test_tool_call_sections_with_one_or_several_calls(
    ids: TokenIds, t: dict[str, int], n_calls: int
) -> None:
    out = [
        10,
        t["</think>"],
        12,
        *section(t, *[call(t, 20 + i) for i in range(n_calls)]),
        t["<|im_end|>"],
    ]
    assert run(ids, thinking_prompt(t), out).accepted


def test_tool_call_only_answer_is_not_empty(ids: TokenIds, t: dict[str, int]) -> None:
    out = [10, t["</think>"], *section(t, call(t)), t["<|im_end|>"]]
    assert run(ids, thinking_prompt(t), out).accepted


@pytest.mark.parametrize(
    "broken",
    [
        lambda t: [t["<|tool_calls_section_begin|>"], *call(t)],  # section never closed
        lambda t: [t["<|tool_calls_section_begin|>"], t["<|tool_calls_section_end|>"]],  # empty
        lambda t: call(t),  # call outside a section
        lambda t: [
            t["<|tool_calls_section_begin|>"],
            t["<|tool_call_begin|>"],
            20,
            t["<|tool_call_end|>"],
            t["<|tool_calls_section_end|>"],
        ],  # no argument-begin
        lambda t: [
            t["<|tool_calls_section_begin|>"],
            t["<|tool_call_begin|>"],
            t["<|tool_call_begin|>"],
            t["<|tool_calls_section_end|>"],
        ],  # nested call
    ],
)
def test_malformed_tool_calls_are_rejected(ids: TokenIds, t: dict[str, int], broken) -> None:
    out = [10, t["</think>"], 12, *broken(t), t["<|im_end|>"]]
    assert "malformed_tool_call" in codes(run(ids, thinking_prompt(t), out))


def test_tool_call_inside_reasoning_is_rejected(ids: TokenIds, t: dict[str, int]) -> None:
    out = [10, *section(t, call(t)), t["</think>"], 12, t["<|im_end|>"]]
    assert "tool_call_in_reasoning" in codes(run(ids, thinking_prompt(t), out))


def test_truncated_inside_a_tool_call_is_allowed_when_keeping(
    ids: TokenIds, t: dict[str, int]
) -> None:
    out = [10, t["</think>"], t["<|tool_calls_section_begin|>"], t["<|tool_call_begin|>"], 20]
    v = run(ids, thinking_prompt(t), out, finish="length")
    assert v.accepted and v.truncated


def test_a_tool_section_may_end_the_reasoning_without_think_end(
    ids: TokenIds, t: dict[str, int]
) -> None:
    # SGLang's kimi_k2 reasoning parser: without </think>, the section ends the reasoning.
    out = [10, 11, *section(t, call(t)), t["<|im_end|>"]]
    v = run(ids, thinking_prompt(t), out)
    assert v.accepted, v.reasons
    assert v.think_end_index == -1
    # A </think> after the section puts the section inside the reasoning.
    late = [10, *section(t, call(t)), t["</think>"], 12, t["<|im_end|>"]]
    assert "tool_call_in_reasoning" in codes(run(ids, thinking_prompt(t), late))
    # Without a section, a reasoning block that never closed stays a reject.
    assert "think_end_count" in codes(run(ids, thinking_prompt(t), [10, 11, t["<|im_end|>"]]))


@pytest.mark.parametrize(
    ("header", "arguments", "code"),
    [
        ("functions.get-weather:0", '{"city": "Paris"}', None),  # names may hold '-'
        ("3", '{"city": "Paris"}', None),  # a bare counter, named from the declared tool
        ("get weather", '{"city": "Paris"}', "tool_call_dropped"),  # id with a space
        ("functions.get_weather:0", '["Paris"]', "tool_call_dropped"),  # not an object
    ],
)
def test_calls_are_checked_as_sglangs_parser_reads_them(
    chat_tokenizer: ChatTokenizer, ids: TokenIds, header: str, arguments: str, code: str | None
) -> None:
    from tests.support.prompts import WEATHER_TOOL

    text = (
        f"r</think><|tool_calls_section_begin|><|tool_call_begin|>{header}"
        f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
        "<|tool_calls_section_end|><|im_end|>"
    )
    out = chat_tokenizer.tok.encode(text, add_special_tokens=False)
    prompt = [5, 6, 7, chat_tokenizer.token_id("<think>")]

    def check(tools: list[dict] | None) -> Verdict:
        return validate_output(
            prompt,
            out,
            finish_type="stop",
            finish_matched=out[-1],
            prompt_tokens=len(prompt),
            completion_tokens=len(out),
            ids=ids,
            policy=KEEP,
            tool_check=ToolCallCheck(chat_tokenizer.decode, tools),
        )

    assert codes(check([WEATHER_TOOL])) == ([code] if code else [])
    assert codes(check(None)) == ["tool_call_undeclared"]

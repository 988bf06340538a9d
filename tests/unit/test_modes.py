"""Serving modes: config checks (file:line), the assignment by line id, a line's own mode."""

from collections import Counter
from pathlib import Path

import pytest

from eagle3_datagen.config import PipelineConfig, SpecialTokens, ValidationPolicy, load_config
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.inputs.modes import apply_mode, assign_mode
from eagle3_datagen.inputs.prompts import InputReject, Prompt, parse_prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.validate.tokens import validate_output

CONFIG = """\
model:
  path: /models/m
  chat_template_kwargs: {a: 1}
  modes:
    thinking: {}
    instant: {thinking: false}
partitions:
  - name: p1
    input: prompts.jsonl
    tier: SHORT
    modes: {thinking: 0.6, instant: 0.4}
"""


def load(tmp_path: Path, text: str) -> PipelineConfig:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return load_config(path)


def test_modes_load(tmp_path: Path) -> None:
    cfg = load(tmp_path, CONFIG)
    assert cfg.model.modes == {"thinking": {}, "instant": {"thinking": False}}
    assert cfg.partitions[0].modes == {"thinking": 0.6, "instant": 0.4}


@pytest.mark.parametrize(
    ("old", "new", "line", "needle"),
    [
        ("instant: 0.4", "instant: 0.3", 11, "mode shares sum to 0.9, not 1"),
        ("instant: 0.4}", "instant: 0.4, fast: 0.0}", 11, "mode 'fast' is not declared"),
        ("instant: {thinking", "custom: {thinking", 4, "reserved"),
    ],
)
def test_bad_modes_name_file_line_and_reason(
    tmp_path: Path, old: str, new: str, line: int, needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, CONFIG.replace(old, new))
    assert f"cfg.yaml:{line}:" in str(err.value)
    assert needle in str(err.value)


def test_assignment_is_stable_and_follows_the_shares() -> None:
    shares = {"thinking": 0.6, "instant": 0.4}
    ids = [f"line-{i}" for i in range(2000)]
    first = [assign_mode(i, shares) for i in ids]
    assert first == [assign_mode(i, dict(shares)) for i in ids]
    # The same mixture listed in another order (the fingerprint cannot tell) assigns the same.
    assert first == [assign_mode(i, {"instant": 0.4, "thinking": 0.6}) for i in ids]
    counts = Counter(first)
    assert abs(counts["thinking"] / 2000 - 0.6) < 0.04
    assert abs(counts["instant"] / 2000 - 0.4) < 0.04
    assert set(assign_mode(i, {"a": 0.0, "b": 1.0}) for i in ids) == {"b"}
    assert assign_mode("x", {}) == "default"


def _prompt(line: str) -> Prompt:
    parsed = parse_prompt(line.encode(), 3)
    assert isinstance(parsed, Prompt)
    return parsed


MODES = {"thinking": {}, "instant": {"thinking": False}}
MSG = '"messages": [{"role": "user", "content": "hi"}]'


def test_a_line_names_its_mode_or_carries_kwargs() -> None:
    named = apply_mode(_prompt('{"id": "a", "mode": "instant", ' + MSG + "}"), MODES, None)
    assert isinstance(named, Prompt)
    assert (named.mode, named.kwargs) == ("instant", {"thinking": False})
    raw = '{"id": "a", "chat_template_kwargs": {"thinking": false, "x": 1}, ' + MSG + "}"
    custom = apply_mode(_prompt(raw), MODES, {"thinking": 1.0})
    assert isinstance(custom, Prompt)
    assert (custom.mode, custom.kwargs) == ("custom", {"thinking": False, "x": 1})
    both = '{"id": "a", "mode": "thinking", "chat_template_kwargs": {"x": 1}, ' + MSG + "}"
    merged = apply_mode(_prompt(both), MODES, None)
    assert isinstance(merged, Prompt) and (merged.mode, merged.kwargs) == ("thinking", {"x": 1})
    plain = apply_mode(_prompt('{"id": "a", ' + MSG + "}"), MODES, None)
    assert isinstance(plain, Prompt) and (plain.mode, plain.kwargs) == ("default", {})


def test_an_undeclared_mode_is_a_reject_naming_the_line() -> None:
    bad = apply_mode(_prompt('{"id": "a", "mode": "fast", ' + MSG + "}"), MODES, None)
    assert isinstance(bad, InputReject) and bad.line == 3
    assert "mode 'fast' is not declared in model.modes (declared: instant, thinking)" in bad.reason
    wrong = parse_prompt(('{"chat_template_kwargs": [1], ' + MSG + "}").encode(), 4)
    assert (
        isinstance(wrong, InputReject)
        and "'chat_template_kwargs' must be an object" in wrong.reason
    )


def test_each_line_renders_with_its_modes_kwargs(chat_tokenizer: ChatTokenizer) -> None:

    tok = chat_tokenizer
    lines = [
        '{"id": "t", "mode": "thinking", ' + MSG + "}",
        '{"id": "i", "mode": "instant", ' + MSG + "}",
        '{"id": "c", "chat_template_kwargs": {"add_generation_prompt": false}, ' + MSG + "}",
    ]
    prompts = [
        p for line in lines if isinstance(p := apply_mode(_prompt(line), MODES, None), Prompt)
    ]
    assert len(prompts) == 3
    thinking, instant, bad = tok.render(prompts)
    assert isinstance(thinking, list) and isinstance(instant, list)
    think, end = tok.token_id("<think>"), tok.token_id("</think>")
    assert thinking[-1] == think
    assert instant[-2:] == [think, end]
    assert instant[:-1] == thinking  # the same prompt, the instant generation prompt after it
    # Like SGLang's chat path, a kwarg that repeats a named argument fails the request.
    assert isinstance(bad, RenderError) and "add_generation_prompt" in bad.reason


def _verdict(tok: ChatTokenizer, prompt: list[int], out: list[int], thinking: bool) -> list[str]:
    ids = TokenIds.resolve(tok, SpecialTokens())
    v = validate_output(
        prompt,
        out,
        finish_type="stop",
        finish_matched=out[-1],
        prompt_tokens=len(prompt),
        completion_tokens=len(out),
        ids=ids,
        policy=ValidationPolicy(),
        thinking=thinking,
    )
    return [code for code, _ in v.reasons]


def test_each_mode_has_its_rules(chat_tokenizer: ChatTokenizer) -> None:
    tok = chat_tokenizer
    think, end, eot = (tok.token_id(s) for s in ("<think>", "</think>", "<|im_end|>"))
    word = tok.tok.encode("ok", add_special_tokens=False)
    open_prompt, closed_prompt = [*word, think], [*word, think, end]
    # Instant: the prompt closes the block; the answer opens and closes none.
    assert _verdict(tok, closed_prompt, [*word, eot], thinking=False) == []
    assert "unexpected_think_token" in _verdict(
        tok, closed_prompt, [*word, end, *word, eot], thinking=False
    )
    assert "unexpected_think_token" in _verdict(
        tok, closed_prompt, [think, *word, eot], thinking=False
    )
    # A template that ignored thinking: false gave the thinking prompt.
    assert "mode_mismatch" in _verdict(tok, open_prompt, [*word, end, *word, eot], thinking=False)
    # Thinking: the block closes exactly once.
    assert _verdict(tok, open_prompt, [*word, end, *word, eot], thinking=True) == []
    assert "think_end_count" in _verdict(tok, open_prompt, [*word, eot], thinking=True)
    assert "think_end_count" in _verdict(
        tok, open_prompt, [*word, end, *word, end, eot], thinking=True
    )
    assert "mode_mismatch" in _verdict(tok, closed_prompt, [*word, eot], thinking=True)


def test_the_card_names_the_modes_and_each_mixture() -> None:
    from eagle3_datagen.report.dataset_card import _provenance

    content = {
        "modes": MODES,
        "generation": {"p": {"modes": {"thinking": 0.6, "instant": 0.4}}, "q": {"samples": 1}},
    }
    text = _provenance({"fingerprint": {"content": content}})
    assert (
        "| serving modes (docs/modes.md) | `thinking {}, instant {'thinking': False}; "
        "p: thinking 0.6, instant 0.4` |"
    ) in text
    assert "serving modes" not in _provenance({"fingerprint": {"content": {}}})

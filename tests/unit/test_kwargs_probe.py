"""The template tried on each kwargs set before any request: refused model or mode kwargs stop
the plan, named; a line's refused set comes back with why, for that line's reject; sets it
renders pass."""

from __future__ import annotations

import re
from typing import Any

import pytest

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.generate.kwargs_probe import check_kwargs, refusal
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from tests.support import TOKENIZER_DIR

MODES = {"thinking": {}, "instant": {"thinking": False}}


def test_kwargs_the_template_renders_pass() -> None:
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    assert refusal(tok, {"thinking": False}) is None
    lines = {"a": (3, "instant", {}), "b": (9, None, {"thinking": True})}
    assert check_kwargs(tok, MODES, {"thinking": 0.5, "instant": 0.5}, lines) == {}


def test_refused_model_and_mode_kwargs_are_named() -> None:
    # tokenize is passed by name too (as SGLang's chat path does): repeating it is refused.
    model = ChatTokenizer(str(TOKENIZER_DIR), chat_template_kwargs={"tokenize": True})
    with pytest.raises(ConfigError, match=r"^model\.chat_template_kwargs: .*tokenize"):
        check_kwargs(model, MODES, None, {})
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    modes = {**MODES, "odd": {"add_generation_prompt": False}}
    with pytest.raises(
        ConfigError, match=re.escape('model.modes.odd {"add_generation_prompt":false}')
    ):
        check_kwargs(tok, modes, {"thinking": 0.5, "odd": 0.5}, {})
    # Unassigned by the mixture (share 0) and named by no line: never rendered, not refused.
    assert check_kwargs(tok, modes, {"thinking": 1.0, "odd": 0.0}, {}) == {}
    # Named by a line: the mode is at fault (every line naming it would fail), not the line.
    lines: dict[str, tuple[int, str | None, dict[str, Any]]] = {
        "a": (3, "instant", {}),
        "b": (7, "odd", {}),
    }
    with pytest.raises(ConfigError, match=re.escape("model.modes.odd ")):
        check_kwargs(tok, modes, {"thinking": 1.0}, lines)


def test_a_lines_refused_kwargs_come_back_with_why() -> None:
    """Only the line is at fault: its set, under its key, with the reason its reject gives;
    the other lines' sets pass."""
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    lines: dict[str, tuple[int, str | None, dict[str, Any]]] = {
        "ok": (3, "instant", {}),
        "bad": (7, None, {"add_generation_prompt": False}),
    }
    refused = check_kwargs(tok, MODES, {"thinking": 1.0}, lines)
    assert list(refused) == ["bad"]
    assert refused["bad"].startswith('chat_template_kwargs {"add_generation_prompt":false}: ')
    assert "SGLang's chat path passes to the chat template itself" in refused["bad"]


def test_a_lines_template_and_return_dict_are_refused_as_sglang_refuses_them() -> None:
    """SGLang 0.5.23 answers 400 to a request's own ``chat_template`` and 500 to
    ``return_dict`` (it passes it by name); recorded in tests/unit/test_sglang_chat_kwargs.py."""
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    reason = refusal(tok, {"chat_template": "{{ 'x' }}"})
    assert reason is not None and "Request-supplied chat_template is not allowed" in reason
    for value in (True, False):
        reason = refusal(tok, {"return_dict": value})
        assert reason is not None and "return_dict" in reason
    refused = check_kwargs(tok, MODES, None, {"a": (4, "instant", {"return_dict": True})})
    assert refused["a"].startswith("mode 'instant' chat_template_kwargs"), refused

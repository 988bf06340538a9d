"""The chat template tried once on each set of kwargs a partition renders with, before any
request.

Why: kwargs the template refuses (a key SGLang's chat path also passes by name, a value the
template raises on) fail every request that uses them, as SGLang refuses them. The model's or
a mode's would fail every line of the partition: the plan stops, naming the config's key,
before any request. A line's own (its kwargs, or its kwargs over the mode it names) fail only
that line, as SGLang's answer to that one request would: the line is rejected as ``bad_input``
naming its file, line and reason (the same reject as kwargs that are no object), and the rest
of the partition runs (docs/modes.md). The probe is a one-message conversation, so a refusal
there is the kwargs', not a line's content: a failure that depends on a line's own messages
stays that line's ``template_error`` reject.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError

PROBE = [{"role": "user", "content": "Hello"}]


def refusal(tokenizer: ChatTokenizer, kwargs: Mapping[str, Any]) -> str | None:
    """Why the template refuses ``kwargs`` over the model's on the probe; None if it renders."""
    probe = Prompt(id="kwargs-probe", line=0, messages=PROBE, tools=None, kwargs=dict(kwargs))
    [rendered] = tokenizer.render([probe])
    return rendered.reason if isinstance(rendered, RenderError) else None


def _text(kwargs: Mapping[str, Any]) -> str:
    return orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS).decode()


def check_kwargs(
    tokenizer: ChatTokenizer,
    modes: Mapping[str, Mapping[str, Any]],
    shares: Mapping[str, float] | None,
    lines: Mapping[str, tuple[int, str | None, dict[str, Any]]],
) -> dict[str, str]:
    """Raise :class:`ConfigError` on the model's kwargs (``model.chat_template_kwargs``) or a
    mode's (each the partition's mixture assigns or a line names) that the template refuses,
    naming it; return why the template refuses each line's set (``InputScan.kwargs_lines``'
    keys: a named mode with the line's own kwargs) that it refuses, for those lines' rejects."""
    reason = refusal(tokenizer, {})
    if reason is not None:
        raise ConfigError(f"model.chat_template_kwargs: {reason}")
    named = {mode for _, mode, _ in lines.values() if mode is not None and mode in modes}
    assigned = {n for n, share in (shares or {}).items() if share > 0}
    for name in sorted(assigned | named):
        reason = refusal(tokenizer, modes[name])
        if reason is not None:
            raise ConfigError(f"model.modes.{name} {_text(modes[name])}: {reason}")
    refused: dict[str, str] = {}
    for key, (_, mode, own) in lines.items():
        kwargs = {**(modes.get(mode, {}) if mode is not None else {}), **own}
        reason = refusal(tokenizer, kwargs)
        if reason is not None:
            named_mode = f"mode {mode!r} " if mode is not None else ""
            refused[key] = f"{named_mode}chat_template_kwargs {_text(kwargs)}: {reason}"
    return refused

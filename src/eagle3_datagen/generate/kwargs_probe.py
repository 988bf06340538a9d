"""The chat template tried once on each set of kwargs a partition renders with, before any
request.

Why: kwargs the template refuses (a key SGLang's chat path also passes by name, a value the
template raises on) fail every line that uses them, so they are bad input to stop on with the
file, line and reason (docs/modes.md), not a stream of per-line rejects found batch by batch
while the server generates the rest. The probe is a one-message conversation, so a refusal
there is the kwargs', not a line's content: a failure that depends on a line's own messages
stays that line's ``template_error`` reject.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import ConfigError, InputFileError
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
    path: str | Path,
    modes: Mapping[str, Mapping[str, Any]],
    shares: Mapping[str, float] | None,
    lines: Mapping[str, tuple[int, str | None, dict[str, Any]]],
) -> None:
    """Raise on the first kwargs set the template refuses: the model's own
    (``model.chat_template_kwargs``), each mode the partition's mixture assigns, then each
    line's (``InputScan.kwargs_lines``: a named mode, its own kwargs, or both), naming it."""
    reason = refusal(tokenizer, {})
    if reason is not None:
        raise ConfigError(f"model.chat_template_kwargs: {reason}")
    for name in sorted(n for n, share in (shares or {}).items() if share > 0):
        reason = refusal(tokenizer, modes[name])
        if reason is not None:
            raise ConfigError(f"model.modes.{name} {_text(modes[name])}: {reason}")
    for line, mode, own in lines.values():
        kwargs = {**(modes.get(mode, {}) if mode is not None else {}), **own}
        reason = refusal(tokenizer, kwargs)
        if reason is not None:
            named = f"mode {mode!r} " if mode is not None else ""
            raise InputFileError(
                f"{path}:{line}: {named}chat_template_kwargs {_text(kwargs)}: {reason}"
            )

"""Serving modes: which named set of chat-template kwargs each line is rendered with.

Why a line's mode is a pure function of its id: a resumed or re-run partition must give every
line the same mode (its prompt ids, and so its records, depend on it), whatever the batch size
or the order lines are read in. Precedence (docs/modes.md): a line's own ``"mode"``, else its
raw ``"chat_template_kwargs"`` (mode ``custom``), else the partition's mixture by id, else
``default``. The kwargs of the mode, then the line's own, go over ``model.chat_template_kwargs``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from eagle3_datagen.inputs.prompts import InputReject, Prompt

DEFAULT_MODE = "default"  # no mode declared or assigned: model.chat_template_kwargs alone
CUSTOM_MODE = "custom"  # a line's raw chat_template_kwargs without a mode name
RESERVED_MODES = frozenset({DEFAULT_MODE, CUSTOM_MODE})


def mode_point(line_id: str) -> float:
    """A number in [0, 1) fixed by the line id: the first 8 bytes of its SHA-256."""
    digest = hashlib.sha256(line_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_mode(line_id: str, shares: Mapping[str, float]) -> str:
    """The mode of a line under a mixture: its point against the shares, cumulated in the
    order of the modes' names (the last mode takes what rounding leaves). Not the order the
    config lists them in: the fingerprint compares the mixture as a mapping, so listing the
    same shares in another order must not move a line to another mode."""
    if not shares:
        return DEFAULT_MODE
    point, total = mode_point(line_id), 0.0
    names = sorted(shares)
    for name in names:
        total += shares[name]
        if point < total:
            return name
    return next((n for n in reversed(names) if shares[n] > 0), names[-1])


def apply_mode(
    prompt: Prompt,
    modes: Mapping[str, Mapping[str, Any]],
    shares: Mapping[str, float] | None,
) -> Prompt | InputReject:
    """The prompt with its mode and the kwargs over the model's, or a reject naming why."""
    if prompt.mode is not None and prompt.mode not in modes:
        declared = ", ".join(sorted(modes)) or "none"
        return InputReject(
            prompt.line,
            f"mode {prompt.mode!r} is not declared in model.modes (declared: {declared})",
            "",
            prompt.id,
        )
    if prompt.mode is not None:
        name = prompt.mode
    elif prompt.kwargs:
        name = CUSTOM_MODE
    else:
        name = assign_mode(prompt.id, shares or {})
    kwargs = {**modes.get(name, {}), **prompt.kwargs}
    return dataclasses.replace(prompt, mode=name, kwargs=kwargs)


def thinking_of(kwargs: Mapping[str, Any]) -> bool | None:
    """Whether the kwargs switch reasoning on (True) or off (False); None when they do not
    say (the prompt's own shape decides, as before modes existed)."""
    value = kwargs.get("thinking")
    return value if isinstance(value, bool) else None


def recorded_thinking(
    mode: str | None, base: Mapping[str, Any], modes: Mapping[str, Mapping[str, Any]]
) -> bool | None:
    """A stored record's reasoning switch from its ``mode`` column and the fingerprint's
    kwargs; None for a ``custom`` line (its own kwargs are not stored) or no mode."""
    if mode is None or mode == CUSTOM_MODE or (mode != DEFAULT_MODE and mode not in modes):
        return None
    return thinking_of({**base, **modes.get(mode, {})})

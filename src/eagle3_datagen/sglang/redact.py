"""The one rule for secrets: which names hold one, and how to hide them in commands and text.

Used for the launch command we log and store in pidfiles, the server's own output copied to
its log, the server's ``launch_command`` and ``server_args`` as reported by ``/server_info``.
A secret is hidden two ways: by name (a flag or key that holds one, whatever its value) and by
value (the key we know, wherever it appears).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "***"

# Name parts that mark a secret. "token" only as a whole word and not a unit: --max-total-tokens,
# --tokenizer-path, skip_tokenizer_init and --decode-ms-per-token are facts; --hf-token and
# auth_token are secrets.
_SECRET_SUBSTRINGS = ("key", "secret", "password", "passwd", "credential")
_SECRET_WORDS = frozenset({"token", "auth"})
_UNIT_PREFIX = "per"
_WHITESPACE = re.compile(r"(\s+)")


def is_secret_name(name: str) -> bool:
    """True for a flag (``--admin-api-key``) or key (``hf_token``) whose value may be a secret."""
    lowered = name.lower().lstrip("-")
    if any(s in lowered for s in _SECRET_SUBSTRINGS):
        return True
    words = re.split(r"[_\-.]", lowered)
    return any(
        word in _SECRET_WORDS and (i == 0 or words[i - 1] != _UNIT_PREFIX)
        for i, word in enumerate(words)
    )


def _hide_values(text: str, secrets: Sequence[str], mask: str) -> str:
    for secret in secrets:
        text = text.replace(secret, mask)
    return text


def redact_argv(
    argv: Sequence[str], secrets: Iterable[str] = (), mask: str = REDACTED
) -> list[str]:
    """``argv`` with the value of every secret flag (``--api-key K``, ``--api-key=K``) masked.

    Any occurrence of the given ``secrets`` is masked too, so a key passed in an unexpected
    place (an extra arg, an env-style argument) is hidden as well.
    """
    known = [s for s in secrets if s]
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(mask)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if arg.startswith("--") and is_secret_name(name):
            if eq:
                out.append(f"{name}={mask}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(_hide_values(arg, known, mask))
    return out


def redact_text(text: str, secrets: Iterable[str] = (), mask: str = REDACTED) -> str:
    """A command *string* or log line with secret flag values and known secrets hidden.

    The text is split at whitespace and read as an argv, so the rule is :func:`redact_argv`'s.
    """
    known = [s for s in secrets if s]
    parts = _WHITESPACE.split(_hide_values(text, known, mask))
    words = [i for i in range(0, len(parts), 2) if parts[i]]
    for i, word in zip(words, redact_argv([parts[i] for i in words], mask=mask), strict=True):
        parts[i] = word
    return "".join(parts)

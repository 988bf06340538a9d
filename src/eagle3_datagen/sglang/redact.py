"""Hiding secrets in command lines, shared by the launcher and the emulator.

Kept free of heavy imports so the emulator (which starts often in tests) stays quick to start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# Flags whose value is a secret: --api-key, --admin-api-key, --hf-token, --*-secret, --*-password.
SECRET_FLAG = re.compile(
    r"^--(?:[a-z0-9-]*-)?(?:api-key|key|token|secret|password|passwd)$|^--[a-z0-9-]*secret",
    re.IGNORECASE,
)


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = (), mask: str = "***") -> list[str]:
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
        if arg.startswith("--") and SECRET_FLAG.match(name):
            if eq:
                out.append(f"{name}={mask}")
            else:
                out.append(arg)
                hide_next = True
            continue
        for secret in known:
            arg = arg.replace(secret, mask)
        out.append(arg)
    return out

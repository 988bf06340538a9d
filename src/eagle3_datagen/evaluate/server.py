"""Whether a server can measure a draft: it speculates, losslessly, with a draft that fits.

Why: eval's number is the draft's acceptance on the target. A server without speculation
reports none; a lossy one (accept thresholds below 1, a simulated accept length) reports a
number that is not the draft's; a draft whose vocabulary or hidden size differs from the
target's cannot be the one trained on this data. Each is refused with the cause in one line.
What cannot be checked from here (a draft directory on another machine) is said, not guessed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from eagle3_datagen.errors import PreflightError, ServerError
from eagle3_datagen.sglang.spec_preflight import check_draft_dir, check_draft_fits
from eagle3_datagen.sglang.speculative import SpeculativeSettings, lossy_reasons


def speculating(info: Mapping[str, Any], url: str) -> SpeculativeSettings:
    """The server's speculative settings; a server that does not speculate is refused."""
    if info.get("speculative_algorithm") is None:
        raise PreflightError(
            f"{url} does not speculate (/server_info speculative_algorithm is "
            f"{info.get('speculative_algorithm')!r}): launch it with --speculative-algorithm "
            "EAGLE3 --speculative-draft-model-path DRAFT"
        )
    return SpeculativeSettings.from_server_info(info)


def check_lossless(info: Mapping[str, Any], url: str, samplings: Iterable[dict[str, Any]]) -> None:
    """Refuse a server (or a request sampling) under which acceptance is not the draft's."""
    seen: set[str] = set()
    reasons: list[str] = []
    for sampling in samplings:
        key = json.dumps(
            {k: v for k, v in sampling.items() if k != "sampling_seed"}, sort_keys=True
        )
        if key in seen:
            continue
        seen.add(key)
        reasons.extend(r for r in lossy_reasons(info, sampling=sampling) if r not in reasons)
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise PreflightError(f"{url} speculates lossily: {reasons[0]}{more}")


def check_draft(info: Mapping[str, Any], draft: str | None, target: str | None = None) -> list[str]:
    """The draft fits the target (vocabulary, hidden size: ``sglang/spec_preflight.py``) where
    this machine can read both configs; returns what could not be checked.

    ``draft`` given explicitly must be a readable directory; otherwise the server's
    ``speculative_draft_model_path`` is used when it is a directory here.
    """
    if draft is not None:
        draft_dir = check_draft_dir(draft, "--draft")
    else:
        reported = info.get("speculative_draft_model_path")
        if not reported or not Path(str(reported)).expanduser().is_dir():
            return [
                f"draft fit not checked: the server's draft {reported!r} is not a directory "
                "here (pass --draft DIR)"
            ]
        draft_dir = Path(str(reported)).expanduser()
    target_dir = Path(str(target or info.get("model_path") or "")).expanduser()
    missing = [
        f"{what} {d / 'config.json'}"
        for what, d in (("draft", draft_dir), ("target", target_dir))
        if not (d / "config.json").is_file()
    ]
    if missing:
        return [f"draft fit not checked: no readable {' nor '.join(missing)}"]
    check_draft_fits(draft_dir, target_dir)
    return []


async def unreachable(url: str, err: BaseException) -> ServerError:
    """``cannot reach URL: <cause>`` for a server that gave no answer: the OS's own reason for
    a plain TCP connection to it (refused, unknown host), else the client's."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    why = str(err)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), 10.0)
    except TimeoutError:
        why = "no answer within 10 s"
    except OSError as os_err:
        why = (os.strerror(os_err.errno) if os_err.errno else str(os_err)).lower()
    else:
        writer.close()
    return ServerError(f"cannot reach {url}: {why}")

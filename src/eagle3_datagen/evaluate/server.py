"""Whether a server can measure a draft: it speculates, losslessly, with a draft that fits.

Why: eval's number is the draft's acceptance on the target. A server without speculation
reports none; a lossy one (accept thresholds below 1, a simulated accept length) reports a
number that is not the draft's; a draft whose vocabulary or hidden size differs from the
target's cannot be the one trained on this data. Each is refused with the cause in one line.
What cannot be checked from here (a draft directory on another machine) is said, not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from eagle3_datagen.errors import PreflightError
from eagle3_datagen.sglang.speculative import SpeculativeSettings, lossy_reasons

# Where Hugging Face configs keep the sizes: top level, a multimodal model's text config,
# speculators' draft config.
_NESTED = ("text_config", "transformer_layer_config")


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
        key = json.dumps({k: v for k, v in sampling.items() if k != "sampling_seed"}, sort_keys=1)
        if key in seen:
            continue
        seen.add(key)
        reasons.extend(r for r in lossy_reasons(info, sampling=sampling) if r not in reasons)
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise PreflightError(f"{url} speculates lossily: {reasons[0]}{more}")


def _sizes(config: Mapping[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    for where in (config, *(config.get(k) for k in _NESTED)):
        if isinstance(where, Mapping):
            for key in ("vocab_size", "hidden_size"):
                if isinstance(where.get(key), int):
                    found.setdefault(key, where[key])
    return found


def read_config(directory: Path, what: str) -> dict[str, Any]:
    """A model directory's ``config.json``; a missing or unreadable one is an error naming it."""
    if not directory.is_dir():
        raise PreflightError(f"{what} directory {directory}: does not exist or is not a directory")
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise PreflightError(f"{what} directory {directory}: cannot read config.json: {err}")
    return data if isinstance(data, dict) else {}


def check_draft_fits(
    info: Mapping[str, Any], draft: str | Path | None, target: str | Path | None
) -> list[str]:
    """Compare the draft's vocabulary and hidden size with the target's, from their
    ``config.json`` where this machine can read them; returns what could not be checked.

    ``draft`` given explicitly must be a readable directory; otherwise the server's
    ``speculative_draft_model_path`` is used when it is a directory here.
    """
    if draft is None:
        reported = info.get("speculative_draft_model_path")
        draft = reported if reported and Path(str(reported)).is_dir() else None
    target = target or info.get("model_path")
    if draft is None:
        return ["draft fit not checked: the draft directory is not readable here (pass --draft)"]
    draft_sizes = _sizes(read_config(Path(draft), "draft"))
    if not target or not Path(str(target)).is_dir():
        return [f"draft fit not checked: the target {target!r} is not a directory here"]
    target_sizes = _sizes(read_config(Path(str(target)), "target"))
    unchecked = []
    for key in ("vocab_size", "hidden_size"):
        d, t = draft_sizes.get(key), target_sizes.get(key)
        if d is None or t is None:
            unchecked.append(f"{key} not checked: not in the {'draft' if d is None else 'target'}"
                             " config.json")
        elif d != t:
            raise PreflightError(
                f"draft {draft} does not fit the target {target}: {key} {d} != {t}"
            )
    return unchecked

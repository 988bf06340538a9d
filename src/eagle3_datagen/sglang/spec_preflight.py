"""Pre-flight checks of a speculating server: lossless, and a draft that fits the target.

Why: speculation is worth measuring only when it leaves the data alone. SGLang has knobs under
which the tokens are no longer the target's own distribution (docs/sglang-speculative.md,
section 5; :func:`~eagle3_datagen.sglang.speculative.lossy_reasons`), so such a server is
refused with the first reason. A draft directory that is missing, unreadable, or made for
another target (its vocabulary or hidden size differ) would fail SGLang's load after minutes of
loading the target, or measure nothing; it is refused before the launch, in one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from eagle3_datagen.config import ModelSpec, Sampling, ServerSpec
from eagle3_datagen.errors import PreflightError, ServerError
from eagle3_datagen.sglang.speculative import lossy_reasons

# config.json fields a draft must share with its target: the token ids it proposes and the
# hidden states it reads (EAGLE-3 feeds the target's hidden states to the draft).
_FIT_FIELDS = ("vocab_size", "hidden_size")


def refuse_lossy(
    url: str,
    server_info: Mapping[str, Any],
    server: ServerSpec,
    sampling: Sampling,
    temperatures: Iterable[float] = (),
) -> None:
    """Refuse a server whose speculation changes the distribution, naming the first cause.

    A server this run launches has a known environment (ours plus ``server.env``); an attached
    one shows its own only with ``SGLANG_EXPOSE_OWN_ENV_VARS=1``. ``temperatures``: the
    partitions' sample temperatures; the highest one is checked (greedy is lossless anywhere).
    """
    if server_info.get("speculative_algorithm") is None:
        return
    env = {**os.environ, **server.env} if server.mode == "launch" else {}
    params = sampling.model_dump()
    params["temperature"] = max([sampling.temperature, *temperatures])
    try:
        reasons = lossy_reasons(server_info, env, params)
    except ServerError as err:  # a speculative_* field this reader needs is missing
        raise PreflightError(f"the server at {url}: {err}") from None
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise PreflightError(
            f"the server at {url} speculates lossily, so its tokens are not the target's own "
            f"distribution: {reasons[0]}{more}"
        )


def speculation_line(server_info: Mapping[str, Any]) -> str | None:
    """The server's speculative settings in words, for the run's log; None when it does not
    speculate."""
    if server_info.get("speculative_algorithm") is None:
        return None
    get = server_info.get
    return (
        f"the server speculates: {get('speculative_algorithm')} with the draft "
        f"{get('speculative_draft_model_path')}, {get('speculative_num_steps')} steps, topk "
        f"{get('speculative_eagle_topk')}, {get('speculative_num_draft_tokens')} draft tokens "
        "(lossless; each record keeps its acceptance)"
    )


def check_draft_dir(path: str, where: str = "server.speculative.draft_model_path") -> Path:
    """The draft directory, which must exist and be readable."""
    draft = Path(path).expanduser()
    if not draft.exists():
        raise PreflightError(f"{where} {path}: no such directory")
    if not draft.is_dir():
        raise PreflightError(f"{where} {path}: not a directory")
    if not os.access(draft, os.R_OK | os.X_OK):
        raise PreflightError(f"{where} {path}: not readable")
    return draft


def _dims(config_path: Path) -> dict[str, Any]:
    """The fit fields of a config.json (a multimodal target keeps them in ``text_config``);
    empty when there is no readable config."""
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    nested = data.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    return {f: data.get(f, text.get(f)) for f in _FIT_FIELDS if data.get(f, text.get(f))}


def check_draft_fits(draft_dir: Path, target_dir: Path) -> None:
    """Refuse a draft whose ``vocab_size`` or ``hidden_size`` differs from the target's, where
    both config.json files are readable and say it (a reduced draft vocabulary is
    ``draft_vocab_size``, not ``vocab_size``)."""
    draft, target = _dims(draft_dir / "config.json"), _dims(target_dir / "config.json")
    for name in _FIT_FIELDS:
        if name in draft and name in target and draft[name] != target[name]:
            raise PreflightError(
                f"the draft at {draft_dir} does not fit the target {target_dir}: its "
                f"config.json has {name} {draft[name]}, the target's {target[name]}"
            )


def check_before_launch(server: ServerSpec, model: ModelSpec) -> None:
    """Launch mode: the configured draft is a readable directory that fits the model (with a
    config.json for SGLang; the emulator takes any directory)."""
    if server.speculative is None:
        return
    draft = check_draft_dir(server.speculative.draft_model_path)
    if server.engine == "sglang" and not (draft / "config.json").is_file():
        raise PreflightError(
            f"server.speculative.draft_model_path {draft}: no config.json (SGLang reads it "
            "while resolving its arguments, before it loads anything)"
        )
    check_draft_fits(draft, Path(model.path).expanduser())


def check_attached_draft(server_info: Mapping[str, Any], model: ModelSpec) -> None:
    """Attach mode: the server's draft, where this machine can read it, fits the model."""
    path = server_info.get("speculative_draft_model_path")
    if server_info.get("speculative_algorithm") is None or not path:
        return
    draft = Path(str(path)).expanduser()
    if draft.is_dir():
        check_draft_fits(draft, Path(model.path).expanduser())

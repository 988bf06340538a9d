"""The baseline an eval is compared with, the gate, and eval's line in the dataset's history.

A nightly asks "is tonight's data worse than before?": the baseline is an earlier eval's JSON,
or the last eval in the dataset's ``history.jsonl`` that passed its gate (``--baseline
history``), and the gate fails when the accept length dropped by more than ``max_drop`` (tokens
per verify step, absolute). Eval lines in the history carry ``"kind": "eval"``; the generation
runs' table (``eagle3-datagen history``) shows partitions only, so it is unchanged by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.report.history import append_history, read_history

KIND = "eval"
HISTORY_BASELINE = "history"
# What an eval's history line keeps of its JSON (the slices stay in the JSON file).
_HISTORY_KEYS = (
    "started",
    "ended",
    "dataset",
    "server",
    "split",
    "records",
    "accept_length",
    "tokens_per_verify",
    "position_acceptance",
    "gate",
)


@dataclass(frozen=True, slots=True)
class Baseline:
    source: str  # the JSON path, or "history.jsonl (<started>)"
    accept_length: float


def load_baseline(spec: str, dataset: str | Path) -> Baseline | None:
    """The baseline ``spec`` names: an eval JSON, or ``history``: the last recorded eval that
    passed its gate, so a regression keeps failing night after night until it is fixed (None
    when there is none yet: the first night has nothing to compare with)."""
    if spec == HISTORY_BASELINE:
        evals = [
            e
            for e in read_history(dataset)
            if e.get("kind") == KIND and (e.get("gate") or {}).get("ok", True)
        ]
        if not evals:
            return None
        last = evals[-1]
        return Baseline(f"history.jsonl ({last.get('started')})", _accept(last, "history.jsonl"))
    path = Path(spec)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"baseline {path}: no such file") from None
    except (OSError, orjson.JSONDecodeError) as err:
        raise DatasetError(f"baseline {path}: cannot read: {err}") from None
    return Baseline(str(path), _accept(data, str(path)))


def _accept(data: Any, where: str) -> float:
    value = data.get("accept_length") if isinstance(data, dict) else None
    if not isinstance(value, int | float):
        raise DatasetError(f"baseline {where}: no accept_length (not an eval result)")
    return float(value)


def gate(accept_length: float, baseline: Baseline | None, max_drop: float) -> dict[str, Any]:
    """The gate's verdict: ``ok`` and a one-line ``reason``."""
    if baseline is None:
        return {"ok": True, "reason": "no baseline to compare with", "max_drop": max_drop}
    drop = baseline.accept_length - accept_length
    verdict = {
        "ok": drop <= max_drop,
        "baseline": baseline.source,
        "baseline_accept_length": baseline.accept_length,
        "drop": round(drop, 4),
        "max_drop": max_drop,
    }
    change = (
        f"accept length {accept_length:.3f} vs {baseline.accept_length:.3f} in {baseline.source}"
    )
    verdict["reason"] = (
        f"{change}: dropped {drop:.3f} > the allowed {max_drop}"
        if drop > max_drop
        else f"{change}: within the allowed drop of {max_drop}"
    )
    return verdict


def record_in_history(dataset: str | Path, result: dict[str, Any]) -> Path:
    """Append the eval's line to the dataset's ``history.jsonl``."""
    entry = {"kind": KIND, **{k: result.get(k) for k in _HISTORY_KEYS}}
    by_partition = (result.get("slices") or {}).get("partition", {})
    entry["partitions_accept_length"] = {k: s["accept_length"] for k, s in by_partition.items()}
    return append_history(dataset, entry)

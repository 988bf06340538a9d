"""The baseline an eval is compared with, the gate, and eval's line in the dataset's history.

A nightly asks "is tonight's data worse than before?": the baseline is an earlier eval's JSON,
or the last eval in the dataset's ``history.jsonl`` whose gate passed (``--baseline history``).
The gate compares means *and* intervals (95 % bootstrap over held-out conversations):

- ``passed``: the accept length dropped by at most ``max_drop`` (tokens per verify step);
- ``failed``: it dropped by more, and the two intervals are apart (tonight's upper end below
  the baseline's lower end): a drop beyond noise;
- ``inconclusive``: it dropped by more, but the intervals overlap: the held-out set cannot tell
  that drop from noise. Reported as such (a warning, exit 0), not failed: a nightly that
  fails on noise teaches its operator to ignore it. It never becomes the next baseline, so a
  real drop that creeps night by night is still measured against the last clean pass and fails
  once it is beyond noise.

A baseline without an interval (an eval from before them) is compared by means alone, and the
verdict says so. Eval lines in the history carry ``"kind": "eval"``.
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
    "heldout",
    "overlap",
    "accept_length",
    "accept_length_ci95",
    "tokens_per_verify",
    "position_acceptance",
    "gate",
)


PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"


@dataclass(frozen=True, slots=True)
class Baseline:
    source: str  # the JSON path, or "history.jsonl (<started>)"
    accept_length: float
    ci95: tuple[float, float] | None = None  # None: an eval from before intervals


def _passed(entry: dict[str, Any]) -> bool:
    g = entry.get("gate") or {}
    return bool(g.get("verdict", PASSED if g.get("ok", True) else FAILED) == PASSED)


def load_baseline(spec: str, dataset: str | Path) -> Baseline | None:
    """The baseline ``spec`` names: an eval JSON, or ``history``: the last recorded eval that
    passed its gate, so a regression keeps failing night after night until it is fixed (None
    when there is none yet: the first night has nothing to compare with)."""
    if spec == HISTORY_BASELINE:
        evals = [e for e in read_history(dataset) if e.get("kind") == KIND and _passed(e)]
        if not evals:
            return None
        last = evals[-1]
        where = f"history.jsonl ({last.get('started')})"
        return Baseline(where, _accept(last, "history.jsonl"), _ci(last))
    path = Path(spec)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"baseline {path}: no such file") from None
    except (OSError, orjson.JSONDecodeError) as err:
        raise DatasetError(f"baseline {path}: cannot read: {err}") from None
    return Baseline(str(path), _accept(data, str(path)), _ci(data))


def _ci(data: Any) -> tuple[float, float] | None:
    value = data.get("accept_length_ci95") if isinstance(data, dict) else None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int | float) for v in value)
    ):
        return (float(value[0]), float(value[1]))
    return None


def _accept(data: Any, where: str) -> float:
    value = data.get("accept_length") if isinstance(data, dict) else None
    if not isinstance(value, int | float):
        raise DatasetError(f"baseline {where}: no accept_length (not an eval result)")
    return float(value)


def gate(
    accept_length: float,
    ci95: tuple[float, float],
    baseline: Baseline | None,
    max_drop: float,
) -> dict[str, Any]:
    """The gate's verdict: ``verdict`` (passed, failed, inconclusive), ``ok`` (False only when
    failed) and a one-line ``reason``."""
    if baseline is None:
        return {
            "ok": True,
            "verdict": PASSED,
            "reason": "no baseline to compare with",
            "max_drop": max_drop,
        }
    drop = baseline.accept_length - accept_length
    here = f"{accept_length:.3f} [{ci95[0]:.3f}, {ci95[1]:.3f}]"
    there = f"{baseline.accept_length:.3f}" + (
        f" [{baseline.ci95[0]:.3f}, {baseline.ci95[1]:.3f}]" if baseline.ci95 else ""
    )
    change = f"accept length {here} vs {there} in {baseline.source}"
    if drop <= max_drop:
        verdict, why = PASSED, f"within the allowed drop of {max_drop}"
    elif baseline.ci95 is None:
        verdict = FAILED
        why = f"dropped {drop:.3f} > the allowed {max_drop} (the baseline has no interval: means)"
    elif ci95[1] < baseline.ci95[0]:
        verdict = FAILED
        why = f"dropped {drop:.3f} > the allowed {max_drop}, beyond noise (the intervals are apart)"
    else:
        verdict = INCONCLUSIVE
        why = (
            f"dropped {drop:.3f} > the allowed {max_drop}, but the intervals overlap: not "
            "distinguishable from noise on this held-out set (not failed; not a baseline)"
        )
    return {
        "ok": verdict != FAILED,
        "verdict": verdict,
        "reason": f"{change}: {why}",
        "baseline": baseline.source,
        "baseline_accept_length": baseline.accept_length,
        "baseline_accept_length_ci95": list(baseline.ci95) if baseline.ci95 else None,
        "drop": round(drop, 4),
        "max_drop": max_drop,
    }


def record_in_history(dataset: str | Path, result: dict[str, Any]) -> Path:
    """Append the eval's line to the dataset's ``history.jsonl``."""
    entry = {"kind": KIND, **{k: result.get(k) for k in _HISTORY_KEYS}}
    by_partition = (result.get("slices") or {}).get("partition", {})
    entry["partitions_accept_length"] = {k: s["accept_length"] for k, s in by_partition.items()}
    return append_history(dataset, entry)

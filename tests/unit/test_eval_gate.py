"""The eval gate compares means and 95 % intervals: a drop past the margin fails only when the
intervals are apart; one the held-out set cannot tell from noise is 'inconclusive' (reported,
not failed) and never becomes the next baseline."""

from __future__ import annotations

from pathlib import Path

import orjson

from eagle3_datagen.evaluate.gate import Baseline, gate, load_baseline
from eagle3_datagen.report.history import append_history


def test_a_drop_within_the_margin_passes() -> None:
    verdict = gate(2.45, (2.40, 2.50), Baseline("b.json", 2.50, (2.45, 2.55)), 0.1)
    assert (verdict["ok"], verdict["verdict"]) == (True, "passed")
    assert "within the allowed drop of 0.1" in verdict["reason"]


def test_a_drop_beyond_noise_fails() -> None:
    verdict = gate(2.20, (2.15, 2.25), Baseline("b.json", 2.50, (2.45, 2.55)), 0.1)
    assert (verdict["ok"], verdict["verdict"]) == (False, "failed")
    assert "beyond noise" in verdict["reason"] and "[2.150, 2.250]" in verdict["reason"]


def test_a_drop_the_intervals_cannot_tell_from_noise_is_inconclusive() -> None:
    verdict = gate(2.30, (2.00, 2.60), Baseline("b.json", 2.50, (2.20, 2.80)), 0.1)
    assert (verdict["ok"], verdict["verdict"]) == (True, "inconclusive")
    assert "not distinguishable from noise" in verdict["reason"]


def test_a_baseline_without_an_interval_is_compared_by_means() -> None:
    verdict = gate(2.30, (2.00, 2.60), Baseline("old.json", 2.50), 0.1)
    assert verdict["verdict"] == "failed" and "no interval: means" in verdict["reason"]


def test_only_a_passed_eval_is_the_next_baseline(tmp_path: Path) -> None:
    def line(accept: float, verdict: str) -> dict[str, object]:
        return {
            "kind": "eval",
            "started": f"2026-12-0{1 + int(accept)}",
            "accept_length": accept,
            "accept_length_ci95": [accept - 0.1, accept + 0.1],
            "gate": {"ok": verdict != "failed", "verdict": verdict},
        }

    for entry in (line(2.5, "passed"), line(3.0, "inconclusive"), line(4.0, "failed")):
        append_history(tmp_path, entry)
    base = load_baseline("history", tmp_path)
    assert base is not None and (base.accept_length, base.ci95) == (2.5, (2.4, 2.6))
    (tmp_path / "b.json").write_bytes(orjson.dumps({"accept_length": 2.0}))
    assert load_baseline(str(tmp_path / "b.json"), tmp_path) == Baseline(
        str(tmp_path / "b.json"), 2.0, None
    )

"""The real lab's tables (trainers/lab/real_tables.py) over a work directory written by hand:
the learning curve at the same epochs and at the full draft's compute, each smaller set read
against all the records with its interval, and the select rules read against random only.
Pure Python (the project's interval code), no torch.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

LAB = Path(__file__).resolve().parents[2] / "trainers" / "lab"
IDS = [f"r{i}" for i in range(16)]


def _real_tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lab_real_tables", LAB / "real_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(n)))


def _draft(accepted: int) -> dict:
    """Every held-out prompt: 20 verify steps, committing 20 + ``accepted`` tokens (varied a
    little per prompt so the bootstrap has a spread)."""
    groups = [[20 + accepted + i % 2, 20] for i in range(len(IDS))]
    return {"groups": groups, "mismatches": 0}


@pytest.fixture
def real(tmp_path: Path) -> Path:
    real = tmp_path / "real"
    accepted = {"untrained": 0, "original": 4, "regenerated": 10}
    accepted |= {"random-0.25": 3, "random-0.5": 6, "random+full-0.25": 5, "random+full-0.5": 10}
    accepted |= {"flatness-0.5": 6}
    drafts = {f"{name}-{s}": _draft(a) for name, a in accepted.items() for s in (0, 1, 2)}
    measured = {
        "ids": IDS,
        "max_new_tokens": 32,
        "reference_breaks": 0,
        "live_prompts": 0,
        "live_reference_differs": 0,
        "plain": {"tokens": 64, "seconds": 4.0},
        "drafts": drafts,
    }
    real.mkdir()
    (real / "measure-1.json").write_text(json.dumps(measured))
    (real / "generate.json").write_text(json.dumps({"seconds": 10, "threads": 2}))
    _rows(real / "regenerated" / "speculators.jsonl", 40)
    _rows(real / "regenerated" / "speculators.validation.jsonl", len(IDS))
    for f, n in (("0.25", 10), ("0.5", 20)):
        for s in (0, 1, 2):
            _rows(real / f"sub-random-{f}-s{s}" / "speculators.jsonl", n)
    _rows(real / "sub-flatness-0.5" / "speculators.jsonl", 20)
    target = tmp_path / "target"
    target.mkdir()
    (target / "lab-target.json").write_text(json.dumps({"name": "T", "parameters": 1000}))
    return real


def test_a_smaller_set_at_the_full_drafts_compute_is_read_against_all_the_records(
    real: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary_path = real.parent / "summary.json"
    _real_tables().main(str(summary_path), str(real), str(real.parent / "target"))
    summary = json.loads(summary_path.read_text())
    curve = {r["fraction"]: r for r in summary["learning_curve"]}
    assert set(curve) == {0.25, 0.5, 1.0} and curve[0.5]["train_rows"] == 20
    same = {r["fraction"]: r for r in summary["learning_curve_same_compute"]}
    # half the records trained as long as all of them accepts as much: no difference
    assert same[0.5]["verdict"] == "no difference" and same[0.5]["train_rows"] == 20
    low, high = same[0.5]["ci95_vs_full"]
    assert low <= 0 <= high
    # a quarter trained as long still falls short: the data, not the steps
    assert same[0.25]["verdict"] == "worse" and same[0.25]["ci95_vs_full"][1] < 0
    rules = [(r["rule"], r["fraction"]) for r in summary["selection_real"]]
    assert rules == [("flatness", 0.5)]  # random+full is no select rule
    assert summary["selection_real"][0]["verdict"] == "no difference"
    out = capsys.readouterr().out
    assert "as many steps as all the records" in out and "2 threads" in out

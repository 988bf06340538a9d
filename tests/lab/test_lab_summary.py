"""The lab's summary and gates over a work directory written by hand: the keys the docs name,
mean ± sd over seeds, a difference called "no difference" only where its interval holds 0,
the lossless count against the reference, and the CI gates' one-line failures. Pure Python
(the project's interval code), no torch.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

LAB = Path(__file__).resolve().parents[2] / "trainers" / "lab"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"lab_{name}", LAB / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(ids: dict[str, list[int]], accepted: dict[str, int], verify: int = 10) -> dict:
    """measure.py's shape: per output its ids and (committed tokens, verify steps)."""
    outputs: list[dict[str, Any]] = [
        {"id": k, "output_ids": v, "accept": [verify + accepted[k], verify]} for k, v in ids.items()
    ]
    total = sum(o["accept"][0] for o in outputs) / sum(o["accept"][1] for o in outputs)
    summary = dict.fromkeys(
        ("verify_ct", "num_correct_drafts", "completion_tokens", "accept_rate"), 0
    )
    return {
        "records": len(outputs),
        "accept_length": total,
        "summary": {**summary, "position_conditional": []},
        "outputs": outputs,
    }


@pytest.fixture
def work(tmp_path: Path) -> Path:
    prompts = [f"p{i}" for i in range(12)]
    ids = {p: [i, i + 1] for i, p in enumerate(prompts)}
    (tmp_path / "reference.json").write_text(
        json.dumps({"records": 12, "outputs": [{"id": k, "output_ids": v} for k, v in ids.items()]})
    )
    (tmp_path / "measure-plain.json").write_text(json.dumps(_run(ids, dict.fromkeys(ids, 0))))
    for seed in (0, 1, 2):
        # untrained accepts nothing; regenerated 8-10 more per prompt than original
        runs = {
            "untrained": _run(ids, dict.fromkeys(ids, 0)),
            "original": _run(ids, {p: 2 + (i + seed) % 3 for i, p in enumerate(prompts)}),
            "regenerated": _run(ids, {p: 12 + (i * seed) % 3 for i, p in enumerate(prompts)}),
        }
        if seed == 1:  # one output of one seed differs from the reference
            runs["original"]["outputs"][3]["output_ids"] = [99]
        for name, run in runs.items():
            (tmp_path / f"measure-{name}-seed{seed}.json").write_text(json.dumps(run))
    return tmp_path


def test_summary_reports_seeds_intervals_and_mismatches(work: Path) -> None:
    summary = _module("summary")
    summary.main(str(work / "summary.json"), str(work), "0 1 2", "main")
    out = json.loads((work / "summary.json").read_text())
    assert out["heldout_records"] == 12 and out["seeds"] == [0, 1, 2]
    assert set(out["accept_length"]) == {"untrained", "original", "regenerated"}
    assert out["accept_length"]["untrained"] == 1.0
    spread = out["accept_length_seeds"]["regenerated"]
    assert spread["seeds"] == 3 and spread["sd"] > 0
    assert spread["mean"] == pytest.approx(sum(spread["values"]) / 3, abs=1e-3)
    low, high = spread["ci95"]
    assert low <= spread["mean"] <= high
    diff = out["difference"]["regenerated_minus_original"]
    assert diff["verdict"] == "higher" and diff["ci95"][0] > 0 and diff["prompts"] == 12
    assert out["lossless_mismatches"] == 1
    assert out["lossless_mismatches_by_draft"] == {"untrained": 0, "original": 1, "regenerated": 0}


def test_a_difference_whose_interval_holds_zero_is_no_difference(work: Path) -> None:
    summary = _module("summary")
    a = [json.loads((work / f"measure-original-seed{s}.json").read_text()) for s in (0, 1, 2)]
    b = [json.loads((work / f"measure-original-seed{s}.json").read_text()) for s in (2, 0, 1)]
    diff = summary.difference(a, b)
    assert diff["verdict"] == "no difference" and diff["ci95"][0] <= 0 <= diff["ci95"][1]


def test_a_same_compute_row_is_compared_with_the_same_compute_random(work: Path) -> None:
    """RULE+compute against random+compute (the same steps), never the same-epochs random."""
    ids = {f"p{i}": [i, i + 1] for i in range(12)}
    folder = work / "selection"
    folder.mkdir()
    for seed in (0, 1, 2):
        for row, extra in (("random", 6), ("random+compute", 2), ("flatness+compute", 3)):
            run = _run(ids, {p: extra + (i + seed) % 2 for i, p in enumerate(ids)})
            (folder / f"{row}-seed{seed}.json").write_text(json.dumps(run))
    summary = _module("summary")
    summary.main(str(work / "summary.json"), str(work), "0 1 2", "main selection")
    table = json.loads((work / "summary.json").read_text())["selection_table"]
    rows = {r["rule"]: r for r in table}
    row = rows["flatness+compute"]
    assert row["budget"] == "compute" and row["keep"] == 0.5
    # +1 accepted per prompt over random+compute (it would be -3 against the same-epochs random)
    assert row["ci95_vs_random"]["verdict"] == "higher" and row["ci95_vs_random"]["mean"] > 0
    assert "ci95_vs_random" not in rows["random+compute"]


def test_a_full_compute_random_half_as_good_as_all_the_data_reads_as_no_difference(
    work: Path,
) -> None:
    """LAB_SELECTION_BUDGET=full: random+full against the full draft is the data-rich test
    (the regenerated draft accepts 12-14 per prompt here); RULE+full is read against it."""
    ids = {f"p{i}": [i, i + 1] for i in range(12)}
    folder = work / "selection"
    folder.mkdir()
    for seed in (0, 1, 2):
        random_half = {p: 12 + (i * ((seed + 1) % 3)) % 3 for i, p in enumerate(ids)}
        rows = {"random+full": random_half, "deviation+full": {p: 4 for p in ids}}
        for row, accepted in rows.items():
            (folder / f"{row}-seed{seed}.json").write_text(json.dumps(_run(ids, accepted)))
    summary = _module("summary")
    summary.main(str(work / "summary.json"), str(work), "0 1 2", "main selection")
    table = json.loads((work / "summary.json").read_text())["selection_table"]
    rows_out = {r["rule"]: r for r in table}
    random = rows_out["random+full"]
    assert random["budget"] == "full" and random["ci95_vs_full"]["verdict"] == "no difference"
    deviation = rows_out["deviation+full"]
    assert deviation["ci95_vs_random"]["verdict"] == "lower"


def _gates(tmp_path: Path, summary: dict) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    return subprocess.run(
        [sys.executable, str(LAB / "gates.py"), str(path)], capture_output=True, text=True
    )


def test_gates_pass_and_fail_with_one_line_each(tmp_path: Path) -> None:
    good = _gates(tmp_path, {"lossless_mismatches": 0, "accept_length": {"untrained": 1.004}})
    assert good.returncode == 0 and "lab gates passed" in good.stdout
    bad = _gates(tmp_path, {"lossless_mismatches": 2, "accept_length": {"untrained": 1.3}})
    assert bad.returncode == 1
    lines = bad.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "lossless_mismatches is 2, not 0" in lines[0]
    assert "accept_length.untrained is 1.300, not below 1.1" in lines[1]
    missing = _gates(tmp_path, {"lossless_mismatches": 0, "accept_length": {}})
    assert missing.returncode == 1 and "untrained draft was not measured" in missing.stdout

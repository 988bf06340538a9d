"""benchmarks/RESULTS.md as run_all.py writes it: newest first, trimmed, header kept."""

from __future__ import annotations

from pathlib import Path

from benchmarks import results_md
from benchmarks.run_all import Figure, markdown

TABLE = markdown([Figure("c", "peak RSS, big / small", "1.05x", "<= 1.5x", ok=True)])


def machine(date: str) -> dict[str, object]:
    return {
        "host": "gpu-node-7",
        "nproc": 2,
        "cpu": "AMD EPYC",
        "python": "3.11.7",
        "date": date,
        "loadavg_start": [0.7, 0.6, 0.5],
        "loadavg_end": [1.2, 0.9, 0.6],
    }


def test_an_entry_says_when_where_and_the_figures() -> None:
    text = results_md.entry(machine("2026-12-03 10:00 UTC"), "full", 1.0, TABLE)
    assert text.startswith(
        "## 2026-12-03 10:00 UTC: full run, gpu-node-7, 2 cores, AMD EPYC, Python 3.11.7\n"
    )
    assert "Load average 0.7 at the start, 1.2 at the end." in text
    assert "| (c) | peak RSS, big / small | 1.05x | <= 1.5x | **PASS** |" in text
    assert "scale 0.5" in results_md.entry(machine("d"), "quick", 0.5, TABLE)


def test_prepend_puts_the_newest_first_and_keeps_the_header(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    for day in ("01", "02", "03"):
        results_md.prepend(path, results_md.entry(machine(f"2026-12-{day}"), "full", 1, TABLE))
    header, entries = results_md.split(path.read_text())
    assert header.startswith("# Benchmark results")
    days = [e.splitlines()[0][:13] for e in entries]
    assert days == ["## 2026-12-03", "## 2026-12-02", "## 2026-12-01"]
    assert all(TABLE in e for e in entries)


def test_prepend_trims_to_the_latest_runs(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("# My own header\n\nKept as written.\n")
    for n in range(1, 6):
        results_md.prepend(path, f"## run {n}\n\nfigures {n}", keep=3)
    header, entries = results_md.split(path.read_text())
    assert header == "# My own header\n\nKept as written."
    assert entries == ["## run 5\n\nfigures 5", "## run 4\n\nfigures 4", "## run 3\n\nfigures 3"]


def test_the_repository_file_parses_newest_first() -> None:
    header, entries = results_md.split(results_md.DEFAULT_PATH.read_text())
    assert header.startswith("# Benchmark results") and 1 <= len(entries) <= results_md.KEEP
    dates = [e.split(":", 1)[0].removeprefix("## ") for e in entries]
    assert dates == sorted(dates, reverse=True)

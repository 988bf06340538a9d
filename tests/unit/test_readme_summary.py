"""The README's performance line is the latest full run of benchmarks/RESULTS.md, not prose."""

from __future__ import annotations

from benchmarks import readme_summary, results_md
from benchmarks.run_all import Figure, markdown


def machine(date: str) -> dict[str, object]:
    return {"host": "h", "nproc": 2, "cpu": "c", "python": "3.11.7", "date": date}


def test_the_readme_line_agrees_with_results_md() -> None:
    want = readme_summary.summary(results_md.DEFAULT_PATH.read_text())
    assert readme_summary.current(readme_summary.README.read_text()) == want, (
        "README.md's performance summary is stale: uv run python -m benchmarks.readme_summary"
    )


def test_the_line_is_the_latest_full_run_with_its_misses() -> None:
    full = markdown(
        [
            *(Figure(p, "ratio", "1.0x", "<= 1.1x", ok=True) for p in "abdef"),
            Figure("c", "peak RSS, big / small", "1.05x (260 / 248 MB)", "<= 1.15x", ok=True),
            Figure("g", "client CPU per record", "3.62 ms; later 3.29 ms", "<= 1 ms", ok=False),
        ]
    )
    part_c = markdown([Figure("c", "peak RSS, big / small", "1.3x", "<= 1.15x", ok=False)])
    quick = markdown([Figure("c", "peak RSS, big / small", "1.90x", "<= 1.15x", ok=False)])
    text = ""
    for date, mode, table in (
        ("2026-12-01 16:52 UTC", "full", full),
        ("2026-12-05 01:00 UTC", "quick", quick),
        ("2026-12-05 02:00 UTC", "full", part_c),  # --only c: not a full run
    ):
        entry = results_md.entry(machine(date), mode, 1.0, table)
        text = f"# Benchmark results\n\n{entry}\n\n" + text.removeprefix("# Benchmark results\n\n")
    line = readme_summary.summary(text)
    assert line == (
        "Latest full run (2026-12-01 16:52 UTC): 6 of 7 figures at their targets; below "
        "target: (g) client CPU per record 3.62 ms against <= 1 ms."
    )
    assert readme_summary.summary("# Benchmark results\n") == "No full benchmark run recorded yet."


def test_replace_keeps_everything_outside_the_markers() -> None:
    text = f"a\n{readme_summary.BEGIN}\nold\n{readme_summary.END}\nb\n"
    new = readme_summary.replace(text, "new line")
    assert new == f"a\n{readme_summary.BEGIN}\nnew line\n{readme_summary.END}\nb\n"
    assert readme_summary.current(new) == "new line"

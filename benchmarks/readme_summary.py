"""The README's one-line performance summary, made from ``benchmarks/RESULTS.md``'s latest full run.

Why: a hand-written summary goes stale the day a figure slips; this one is regenerated from
the entry the benchmark itself wrote, and ``tests/unit/test_readme_summary.py`` fails when the
README's line and RESULTS.md disagree.

    uv run python -m benchmarks.readme_summary           # rewrite the README's line
    uv run python -m benchmarks.readme_summary --check   # exit 1 if it is not current

``run_all.py`` rewrites it after each full run that lands in the default RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks import results_md

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- performance summary: benchmarks/readme_summary.py -->", "<!-- end -->"
PARTS = "abcdefg"  # the figures of a full run (h, the price of logprobs, came later)
_ROW = re.compile(r"^\| \((\w)\) \| (.+?) \| (.+?) \| (.+?) \| \*\*(PASS|MISS)\*\*")


def summary(results_text: str) -> str:
    """One line: the latest full run's date, how many figures reached their targets, and
    the measured value of each that did not. A full-size run of some parts only (``--only``)
    is not a full run."""
    _, entries = results_md.split(results_text)
    for entry in entries:
        heading = entry.splitlines()[0].removeprefix("## ")
        rows = [m.groups() for line in entry.splitlines() if (m := _ROW.match(line))]
        if ": full run" in heading and {r[0] for r in rows} >= set(PARTS):
            break
    else:
        return "No full benchmark run recorded yet."
    date = heading.split(": ", 1)[0]
    passed = sum(verdict == "PASS" for *_, verdict in rows)
    missed = "; ".join(
        f"({part}) {name} {_first(value)} against {target}"
        for part, name, value, target, verdict in rows
        if verdict == "MISS"
    )
    line = f"Latest full run ({date}): {passed} of {len(rows)} figures at their targets"
    return line + (f"; below target: {missed}." if missed else ".")


def _first(value: str) -> str:
    """The measured value without the notes a row may carry after it (``;`` or `` (``)."""
    return re.split(r";| \(", value, maxsplit=1)[0].strip()


def replace(readme_text: str, line: str) -> str:
    """The README with ``line`` between the summary's markers."""
    start, end = readme_text.index(BEGIN) + len(BEGIN), readme_text.index(END)
    return readme_text[:start] + "\n" + line + "\n" + readme_text[end:]


def current(readme_text: str) -> str:
    """The summary line the README carries now."""
    return readme_text[readme_text.index(BEGIN) + len(BEGIN) : readme_text.index(END)].strip()


def update(readme: Path = README, results: Path = results_md.DEFAULT_PATH) -> bool:
    """Rewrite ``readme``'s summary from ``results``; True if it changed."""
    text = readme.read_text()
    new = replace(text, summary(results.read_text()))
    if new != text:
        readme.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if the README's line is stale")
    args = p.parse_args(argv)
    if args.check:
        want = summary(results_md.DEFAULT_PATH.read_text())
        if current(README.read_text()) != want:
            print(f"README.md's performance summary is stale; it should read:\n{want}")
            return 1
        return 0
    print("README.md updated" if update() else "README.md already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())

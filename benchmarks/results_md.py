"""``benchmarks/RESULTS.md``: the figures of the latest benchmark runs, newest first.

``run_all.py`` prepends one entry per run (when, where, the figures table) and keeps the
latest :data:`KEEP`, so the measured numbers live in one file the benchmark itself writes, not
in prose that goes stale. An entry is everything from its ``## `` heading to the next one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

KEEP = 10
DEFAULT_PATH = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = """\
# Benchmark results

Written by `benchmarks/run_all.py` (a full run, or any run given `--results PATH`): one entry
per run, newest first, the latest {keep} kept. Each figure is set against its target; what each
one measures is in `docs/performance.md`. Ratios compare across hosts; absolute CPU figures
only within one host and one sitting (the machines are shared and noisy).
"""


def entry(machine: dict[str, Any], mode: str, scale: float, table: str) -> str:
    """One run's entry: a heading with when and where, the load, then the figures table."""
    where = ", ".join(
        str(part)
        for part in (
            machine.get("host"),
            f"{machine.get('nproc', '?')} cores",
            machine.get("cpu"),
            f"Python {machine.get('python', '?')}",
        )
        if part
    )
    run = f"{mode} run" + (f", scale {scale:g}" if scale != 1 else "")
    lines = [f"## {machine['date']}: {run}, {where}", ""]
    start, end = machine.get("loadavg_start"), machine.get("loadavg_end")
    if start and end:
        lines += [f"Load average {start[0]:.1f} at the start, {end[0]:.1f} at the end.", ""]
    return "\n".join([*lines, table.strip(), ""])


def split(text: str) -> tuple[str, list[str]]:
    """The file's header and its entries, in file order (newest first)."""
    header, entries, current = [], [], None
    for line in text.splitlines():
        if line.startswith("## "):
            current = [line]
            entries.append(current)
        elif current is not None:
            current.append(line)
        else:
            header.append(line)
    return "\n".join(header).strip(), ["\n".join(e).strip() for e in entries]


def prepend(path: Path, new_entry: str, keep: int = KEEP) -> None:
    """Put ``new_entry`` first in ``path`` (made with the standard header if missing) and drop
    all but the newest ``keep`` entries."""
    header, entries = split(path.read_text()) if path.exists() else ("", [])
    header = header or HEADER.format(keep=keep).strip()
    kept = [new_entry.strip(), *entries][:keep]
    path.write_text("\n\n".join([header, *kept]) + "\n")

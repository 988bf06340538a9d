"""Nights side by side: one line per run in ``<output>/history.jsonl``, read back as a table.

Each run's own numbers (tok/s, records, rates, output lengths, wall time) exist only inside the
run: its summary artifact, its log. A nightly operator asks "is tonight slower than last week?",
so at the end of every run the flow appends one JSON line with the run's numbers per partition,
and ``eagle3-datagen history DIR...`` (and the run's history table artifact) shows them run by
run. Output lengths are those of the batches this run committed (an earlier night's batches
are not counted again), read from their commit markers. ``eagle3-datagen eval`` appends its
own lines (``"kind": "eval"``); they read as a second table (date, draft, accept length with
its 95 % interval, gate verdict), the one place a nightly's data and its draft's score meet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.report.acceptance import read_acceptance, summary_dict
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.write.shards import BatchSummary, PartitionOutput

HISTORY = "history.jsonl"

# The table's columns: (key of a row, header).
COLUMNS: list[tuple[str, str]] = [
    ("started", "started (UTC)"),
    ("run", "run"),
    ("partition", "partition"),
    ("status", "status"),
    ("records", "records"),
    ("accept_rate", "lines ok"),
    ("reject_rate", "rejected"),
    ("truncation_rate", "truncated"),
    ("tok_s", "tok/s"),
    ("output_p50", "out p50"),
    ("output_p90", "out p90"),
    ("wall", "wall"),
]
# Shown only when some run's partition had a speculating server: tokens per verify step, a
# speculative figure (not the share of lines accepted, "lines ok").
SPEC_COLUMN = ("spec_accept_length", "spec accept len")
EVAL_KIND = "eval"
EVAL_COLUMNS: list[tuple[str, str]] = [
    ("started", "eval started (UTC)"),
    ("draft", "draft"),
    ("records", "held-out records"),
    ("accept_length", "accept len [95% CI]"),
    ("gate", "gate"),
]


def _pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def partition_numbers(output_dir: str | Path, name: str, meter: RunMeter) -> dict[str, Any]:
    """One partition's numbers in this run: its counters, and the output lengths of the
    batches it committed (not those an earlier run committed)."""
    progress = meter.progress(name)
    if progress is None:
        return {"records": 0, "rejected": 0, "lines": 0}
    out = PartitionOutput(output_dir, name)
    lengths: list[int] = []
    for index in sorted(progress.committed):
        try:
            marker = BatchSummary.from_json(orjson.loads(out.marker_path(index).read_bytes()))
        except (OSError, orjson.JSONDecodeError, TypeError):
            continue  # removed since (an --overwrite of another run)
        lengths.extend(marker.output_lengths)
    accepted, rejected = progress.accepted, progress.rejected
    return {
        "lines": progress.lines,
        "records": accepted,
        "rejected": rejected,
        "accept_rate": _rate(accepted, accepted + rejected),
        "reject_rate": _rate(rejected, accepted + rejected),
        "truncation_rate": _rate(progress.truncated, accepted),
        "output_tokens": progress.output_tokens,
        "tok_s": progress.tok_s_shown(),
        # Three decimals: a short partition (a resumed night's last batch) must not read 0.0 s.
        "wall_s": round(progress.elapsed(), 3),
        "output_p50": _pct(lengths, 0.5),
        "output_p90": _pct(lengths, 0.9),
        **_acceptance(out, progress.committed),
    }


def _acceptance(out: PartitionOutput, committed: list[int]) -> dict[str, Any]:
    """Acceptance over the batches this run committed, with its slices; nothing when their
    records have no spec fields."""
    paths = [p for p in map(out.shard_path, sorted(committed)) if p.exists()]
    acc = read_acceptance(paths)
    if acc is None:
        return {}
    return {
        "spec_accept_length": summary_dict(acc.overall)["accept_length"],
        "acceptance": acc.to_dict(),
    }


def history_entry(
    output_dir: str | Path,
    meter: RunMeter,
    statuses: dict[str, str],
    *,
    run_id: str,
    run_name: str,
    started: datetime,
    ended: datetime,
    deployment: str | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """The run's line of the history: who, when, and each partition's numbers; ``attempt``
    counts the run's attempts (a run retried from the UI writes one line per attempt)."""
    return {
        "run_id": run_id,
        "run_name": run_name,
        "attempt": attempt,
        "deployment": deployment,
        "started": started.isoformat(timespec="seconds"),
        "ended": ended.isoformat(timespec="seconds"),
        "wall_s": round((ended - started).total_seconds(), 1),
        "partitions": {
            name: {"status": status, **partition_numbers(output_dir, name, meter)}
            for name, status in statuses.items()
        },
    }


def append_history(output_dir: str | Path, entry: dict[str, Any]) -> Path:
    """Append the run's line (one ``write`` with ``O_APPEND``: concurrent fan-out jobs' lines
    do not interleave)."""
    path = Path(output_dir) / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, orjson.dumps(entry) + b"\n")
    finally:
        os.close(fd)
    return path


def read_history(output_dir: str | Path) -> list[dict[str, Any]]:
    """The runs recorded in ``output_dir``, oldest first; a torn last line is skipped."""
    try:
        data = (Path(output_dir) / HISTORY).read_bytes()
    except FileNotFoundError:
        return []
    entries = []
    for line in data.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _fmt_rate(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


def _fmt_wall(seconds: Any) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(float(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def final_attempts(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries without those a later attempt of the same flow run superseded (a retried
    run reads as its final attempt), oldest first."""
    ordered = sorted(entries, key=lambda e: str(e.get("started", "")))
    last = {e.get("run_id"): i for i, e in enumerate(ordered)}
    return [e for i, e in enumerate(ordered) if not e.get("run_id") or last[e.get("run_id")] == i]


def _run_label(entry: dict[str, Any]) -> str:
    name = str(entry.get("run_name") or entry.get("run_id") or "-")
    attempt = int(entry.get("attempt") or 1)
    return f"{name} (attempt {attempt})" if attempt > 1 else name


def history_rows(
    entries: Iterable[dict[str, Any]],
    partitions: Iterable[str] | None = None,
    *,
    all_attempts: bool = False,
) -> list[dict[str, Any]]:
    """One row per run and partition, oldest first, formatted for a table; of a retried run,
    only its final attempt unless ``all_attempts``."""
    wanted = set(partitions) if partitions else None
    entries = [e for e in entries if e.get("kind") != EVAL_KIND]
    speculated = any(
        "spec_accept_length" in p for e in entries for p in (e.get("partitions") or {}).values()
    )
    rows = []
    for entry in sorted(
        entries if all_attempts else final_attempts(entries),
        key=lambda e: str(e.get("started", "")),
    ):
        for name, p in (entry.get("partitions") or {}).items():
            if wanted is not None and name not in wanted:
                continue
            rows.append(
                {
                    "started": str(entry.get("started", "-"))[:16].replace("T", " "),
                    "run": _run_label(entry),
                    "partition": name,
                    "status": p.get("status", "-"),
                    "records": p.get("records", 0),
                    "accept_rate": _fmt_rate(p.get("accept_rate")),
                    "reject_rate": _fmt_rate(p.get("reject_rate")),
                    "truncation_rate": _fmt_rate(p.get("truncation_rate")),
                    "tok_s": "-" if p.get("tok_s") is None else round(p["tok_s"]),
                    "output_p50": "-" if p.get("output_p50") is None else p["output_p50"],
                    "output_p90": "-" if p.get("output_p90") is None else p["output_p90"],
                    "wall": _fmt_wall(p.get("wall_s")),
                }
            )
            if speculated:
                length = p.get("spec_accept_length")
                rows[-1]["spec_accept_length"] = "-" if length is None else f"{length:.2f}"
    return rows


def _accept_with_ci(entry: dict[str, Any]) -> str:
    value, ci = entry.get("accept_length"), entry.get("accept_length_ci95")
    if value is None:
        return "-"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{value:.3f} (no interval)"


def _verdict(entry: dict[str, Any]) -> str:
    gate = entry.get("gate") or {}
    verdict = gate.get("verdict") or ("passed" if gate.get("ok", True) else "failed")
    return "FAILED" if verdict == "failed" else str(verdict)


def eval_rows(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per recorded eval, oldest first: when, which draft, on how many held-out
    records, its accept length with the interval, the gate's verdict."""
    rows = []
    evals = [e for e in entries if e.get("kind") == EVAL_KIND]
    for e in sorted(evals, key=lambda e: str(e.get("started", ""))):
        server = e.get("server") or {}
        held = e.get("heldout") or {}
        records = e.get("records", "-")
        rows.append(
            {
                "started": str(e.get("started", "-"))[:16].replace("T", " "),
                "draft": server.get("draft_model_path") or "-",
                "records": f"{records} ({held['conversations']} conv.)" if held else records,
                "accept_length": _accept_with_ci(e),
                "gate": _verdict(e),
            }
        )
    return rows


def latest_eval_markdown(entries: Iterable[dict[str, Any]]) -> str | None:
    """The dataset card's section on the last recorded eval (None when there is none)."""
    evals = [e for e in entries if e.get("kind") == EVAL_KIND]
    if not evals:
        return None
    e = max(evals, key=lambda e: str(e.get("started", "")))
    row = eval_rows([e])[0]
    gate = e.get("gate") or {}
    return (
        "## Latest eval\n\n"
        f"`eagle3-datagen eval` on {row['started']} UTC: a draft's accept length on this "
        "dataset's held-out split (tokens per verify step, 95 % bootstrap interval over "
        "held-out conversations; every eval: `eagle3-datagen history DIR --evals`).\n\n"
        "| draft | held-out records | accept length [95% CI] | gate |\n|---|---|---|---|\n"
        f"| `{row['draft']}` | {row['records']} | {row['accept_length']} | {row['gate']} |\n\n"
        f"{gate.get('reason', '')}"
    ).rstrip()


def history_text(rows: list[dict[str, Any]], columns: list[tuple[str, str]] | None = None) -> str:
    """The rows as an aligned plain-text table (the CLI's output)."""
    if not rows:
        return "no runs recorded"
    if columns is None:
        columns = [*COLUMNS, SPEC_COLUMN] if SPEC_COLUMN[0] in rows[0] else COLUMNS
    cells = [[h for _, h in columns]] + [[str(r[k]) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def ui_history_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history_rows`` for the UI's table artifact: the figures first, on screen in a 1400 px
    window, and the run last by its short name (a datagen run's name before its ': ', which
    repeats the partitions and the start the row has its own columns for)."""
    out = []
    for row in rows:
        run = str(row.get("run", "-"))
        name, sep, rest = run.partition(": ")
        attempt = rest[rest.rfind(" (attempt ") :] if sep and rest.endswith(")") else ""
        short = (name + attempt) if sep else run
        out.append({**{k: v for k, v in row.items() if k != "run"}, "run": short[:40]})
    return out

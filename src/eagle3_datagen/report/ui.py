"""What the Prefect UI shows about a run, as plain data: summary rows, alarm text, messages.

The flows hand these to Prefect's artifact and state APIs; keeping the wording here makes it
testable without a Prefect server and keeps the flows thin.
"""

from __future__ import annotations

import math
from typing import Any

from eagle3_datagen.report.throughput import ThroughputChange

SUMMARY_KEY = "datagen-summary"
THROUGHPUT_KEY = "throughput-alarm"


def artifact_key(prefix: str, name: str) -> str:
    """An artifact key (Prefect allows only ``[a-z0-9-]``) made from a partition name."""
    return prefix + "-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_percent(done: int, total: int) -> float:
    """0-100 for a progress artifact; 0 while the total is unknown."""
    return min(100.0, 100.0 * done / total) if total > 0 else 0.0


def batch_failure_message(label: str, partition: str, err: BaseException) -> str:
    """``generate[part/0002]: <cause>``: what a failed batch task's state says in the UI.

    Our errors' messages say what happened; others (KeyError, httpx...) need their type. The
    runner's messages start with ``partition P, ``, which the label already says.
    """
    cause = str(err).strip()
    if not type(err).__module__.startswith("eagle3_datagen"):
        cause = f"{type(err).__name__}: {cause}" if cause else type(err).__name__
    cause = cause.removeprefix(f"partition {partition}, ")
    return f"generate[{label}]: {cause or type(err).__name__}"


def summary_row(
    name: str,
    status: str,
    summary: dict[str, Any] | None,
    timing: tuple[float, float] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """One partition's row of the run summary table (strings where a human reads them)."""
    s = summary or {}
    reasons = s.get("rejects_by_reason") or {}
    wall, tok_s = timing if timing is not None else (s.get("wall_s"), s.get("output_tok_s"))
    return {
        "partition": name,
        "status": status,
        "input_lines": s.get("input_lines", 0),
        "accepted": s.get("accepted", 0),
        "rejected": s.get("rejected", 0),
        "rejected_by_reason": ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "-",
        "truncation_rate": f"{100 * s.get('truncation_rate', 0.0):.1f}%",
        "output_tokens": s.get("output_tokens", 0),
        "tok_per_s": round(tok_s) if tok_s is not None else "-",
        "wall_time": format_duration(wall),
        "error": (error or "")[:300],
    }


def summary_description(rows: list[dict[str, Any]], output_dir: str) -> str:
    failed = [r["partition"] for r in rows if r["status"] != "completed"]
    accepted = sum(int(r["accepted"]) for r in rows)
    head = f"{len(rows)} partitions, {accepted} records accepted, output {output_dir}"
    return head + (f"; FAILED: {', '.join(failed)}" if failed else "")


def throughput_markdown(change: ThroughputChange, run_name: str) -> str:
    """The alarm artifact: what dipped, by how much, and what to look at."""
    if change.kind == "recovered":
        return (
            f"# Throughput recovered: {run_name}\n\n"
            f"{change.summary()}.\n\n"
            "| | tok/s |\n|---|---|\n"
            f"| now (over {change.window_s:.0f} s) | {change.rate_tok_s:.0f} |\n"
            f"| lowest in the dip | {change.lowest_tok_s or 0:.0f} |\n"
            f"| expected | {change.expected_tok_s:.0f} |\n"
        )
    return (
        f"# Throughput low: {run_name}\n\n"
        f"**{change.shortfall:.0%} below expected** after {format_duration(change.elapsed_s)} "
        "of generation.\n\n"
        "| | tok/s |\n|---|---|\n"
        f"| measured (last {change.window_s:.0f} s, all partitions) | "
        f"{change.rate_tok_s:.0f} |\n"
        f"| expected | {change.expected_tok_s:.0f} |\n"
        f"| alarm threshold | {change.threshold_tok_s:.0f} |\n\n"
        "Check the server log (`<output>/logs/server-<port>.log`): batch size and KV-cache use, "
        "prefill/decode balance, tiers' concurrency against the server's "
        "`--max-running-requests`, and retries in the partitions' progress lines.\n"
    )


_STATE_PREFIXES = (
    "Flow run encountered an exception: ",
    "Task run encountered an exception ",
)


def failure_reason(message: str | None, fallback: str) -> str:
    """A failed state's message without Prefect's preamble, for the parent's own message."""
    text = (message or "").strip()
    for prefix in _STATE_PREFIXES:
        text = text.removeprefix(prefix)
    text = text.removeprefix("PartitionFailed: ")
    return " ".join(text.split()) or fallback


def run_failure_message(failed: dict[str, str], total: int) -> str:
    """The parent's Failed message: which partitions, and why each."""
    names = ", ".join(failed)
    reasons = "; ".join(why if name in why else f"{name}: {why}" for name, why in failed.items())
    return f"{len(failed)} of {total} partitions failed ({names}): {reasons}"

"""What a run shows about itself, as plain text and rows: summary rows, alarm text, failure
messages.

The flows hand these to the orchestrator's artifact, event and state APIs; keeping the wording
here makes it testable without a server and keeps the flows thin. What follows the
orchestrator's own formats (its state messages, event resources, artifact keys and links) is
``eagle3_datagen_flows.prefect_text``.
"""

from __future__ import annotations

import asyncio
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.throughput import RunMeter, ThroughputChange
from eagle3_datagen.write.manifest import summarize_on_disk

SUMMARY_KEY = "datagen-summary"
THROUGHPUT_KEY = "throughput-alarm"
THROUGHPUT_EVENT_PREFIX = "eagle3-datagen.throughput"


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

    Our errors' messages say what happened; others (KeyError, aiohttp's...) need their type. The
    runner's messages start with ``partition P, ``, which the label already says.
    """
    cause = str(err).strip()
    if not type(err).__module__.startswith("eagle3_datagen"):
        cause = f"{type(err).__name__}: {cause}" if cause else type(err).__name__
    cause = cause.removeprefix(f"partition {partition}, ")
    return f"generate[{label}]: {cause or type(err).__name__}"


def on_disk_text(on_disk: dict[str, Any], input_lines: int) -> str:
    """What the output directory holds for a partition, all runs together."""
    done = int(on_disk.get("input_lines", 0))
    if not done:
        return "nothing"
    return (
        f"{done} of {input_lines} lines: {on_disk.get('accepted', 0)} accepted, "
        f"{on_disk.get('rejected', 0)} rejected"
    )


def summary_row(
    name: str,
    status: str,
    this_run: dict[str, Any] | None,
    *,
    input_lines: int,
    on_disk: dict[str, Any] | None = None,
    error: str | None = None,
    failed_batches: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """One partition's row of the run summary table: this run's numbers only.

    ``input_lines`` is the partition's size whatever happened; what the output directory holds
    from every run is the separate ``on_disk`` column. ``failed_batches`` (count, link) turns
    the error cell into a link to the partition's failed-batches table (cells are markdown).
    """
    s = this_run or {}
    reasons = s.get("rejects_by_reason") or {}
    wall, tok_s = s.get("wall_s"), s.get("output_tok_s")
    text = " ".join((error or "").split())[:300]
    if failed_batches is not None:
        count, link = failed_batches
        label = f"{count} failed batch" + ("es" if count != 1 else "")
        text = f"[{label}]({link}): {text}" if text else f"[{label}]({link})"
    # What an operator reads first (status, what is on disk, why not) leads; this run's
    # numbers follow.
    return {
        "partition": name,
        "status": status,
        "on_disk": on_disk_text(on_disk, input_lines) if on_disk is not None else "-",
        "error": text,
        "input_lines": input_lines,
        "accepted": s.get("accepted", 0),
        "rejected": s.get("rejected", 0),
        "rejected_by_reason": ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "-",
        "truncation_rate": f"{100 * s.get('truncation_rate', 0.0):.1f}%",
        "output_tokens": s.get("output_tokens", 0),
        "tok_per_s": round(tok_s) if tok_s is not None else "-",
        "wall_time": format_duration(wall),
    }


def summary_rows(
    output_dir: str,
    names: list[str],
    completed: set[str],
    errors: dict[str, str],
    meter: RunMeter,
    failed_batches: dict[str, tuple[int, str]] | None = None,
    reused: set[str] | None = None,
) -> list[dict[str, Any]]:
    """The run summary table: one row per partition, this run's numbers and what is on disk;
    a partition an earlier attempt completed reads ``reused``."""
    rows = []
    for name in names:
        status = REUSED if name in (reused or set()) else partition_status(name, completed, errors)
        progress = meter.progress(name)
        this_run = progress.this_run() if progress is not None else None
        size = meter.sizes.get(name) or (progress.total_lines if progress is not None else 0)
        rows.append(
            summary_row(
                name,
                status,
                this_run,
                input_lines=size,
                on_disk=summarize_on_disk(output_dir, name),
                error=errors.get(name),
                failed_batches=(failed_batches or {}).get(name),
            )
        )
    return rows


def partition_summary(output_dir: str, partition: str, progress: Progress | None) -> dict[str, Any]:
    """A partition's totals from disk (every run), with this run's wall time, output rate and
    the lines it kept from earlier runs (their batches were committed already)."""
    summary = summarize_on_disk(output_dir, partition)
    if progress is not None:
        summary["wall_s"] = round(progress.elapsed(), 1)
        summary["output_tok_s"] = progress.tok_s_shown()
        summary["reused_lines"] = progress.skipped_lines
    return summary


EMULATED = "EMULATED: the bundled SGLang emulator made these tokens, not SGLang (test data)"


def summary_description(
    rows: list[dict[str, Any]], output_dir: str, *, emulated: bool = False
) -> str:
    """The summary's one line: partitions, records, output, what failed; data the emulator
    made says so first (the UI shows no dataset card)."""
    failed = [r["partition"] for r in rows if r["status"] not in ("completed", REUSED, CANCELLED)]
    cancelled = [r["partition"] for r in rows if r["status"] == CANCELLED]
    accepted = sum(int(r["accepted"]) for r in rows)
    head = f"{len(rows)} partitions, {accepted} records accepted in this run, output {output_dir}"
    if emulated:
        head = f"{EMULATED}; {head}"
    if cancelled:
        head += f"; CANCELLED: {', '.join(cancelled)}"
    return head + (f"; FAILED: {', '.join(failed)}" if failed else "")


EVAL_EMULATED = "EMULATED: the bundled SGLang emulator answered, not SGLang (test figures)"
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")


def _markdown_text(line: str) -> str:
    """``line`` as literal markdown text: paths' underscores and ``<128`` shown as written."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", line)


def eval_description(verdict: str, *, emulated: bool) -> str:
    """The eval artifact's description: the gate's verdict first, then whether the emulator
    answered (the Artifacts page shows only this line)."""
    return f"{verdict}; {EVAL_EMULATED}" if emulated else verdict


def eval_markdown(
    verdict: str, lines: list[str], evals_table: list[str], dataset: str, *, emulated: bool
) -> str:
    """The eval artifact: the verdict as its first line, then the result as a list that wraps
    (a code block's long lines run off-screen at 1400 px), the ``by ...`` slices nested, then
    the dataset's evals as ``history --evals`` prints them (a narrow table, kept aligned)."""
    out = [f"**{_markdown_text(verdict)}**", ""]
    if emulated:
        out += [_markdown_text(EVAL_EMULATED), ""]
    for line in lines:
        indent = "    " if line.startswith("  ") else ""
        out.append(f"{indent}- {_markdown_text(line.strip())}")
    if evals_table:
        out += ["", f"The dataset's evals (`eagle3-datagen history {dataset} --evals`):", ""]
        out += [f"    {line}" for line in evals_table]
    return "\n".join(out)


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


def throughput_log_line(change: ThroughputChange) -> str:
    """The alarm transition as the run's log says it."""
    if change.kind == "low":
        return f"throughput alarm: {change.summary()}"
    return f"throughput alarm cleared: {change.summary()}"


def run_failure_message(failed: dict[str, str], total: int) -> str:
    """The parent's Failed message: which partitions, and why each."""
    names = ", ".join(failed)
    reasons = "; ".join(why if name in why else f"{name}: {why}" for name, why in failed.items())
    return f"{len(failed)} of {total} partitions failed ({names}): {reasons}"


def failed_partition_entry(name: str, state_type: str, message: str | None) -> dict[str, Any]:
    """The manifest entry of a partition whose subflow did not complete."""
    return {"partition": name, "status": state_type.lower(), "error": message}


CANCELLED = "cancelled"
# A partition an earlier attempt of a retried run completed: not run again.
REUSED = "reused"


def attempt_line(attempt: int) -> str:
    """An attempt's first log line: the Logs tab shows all attempts of a retried run in one
    stream, oldest first, so the latest one's start must be findable."""
    if attempt <= 1:
        return "attempt 1 of this run"
    return (
        f"attempt {attempt} of this run (a retry): the lines above this one are earlier "
        "attempts'; this attempt's follow"
    )


def reused_line(partition: str, on_disk: dict[str, Any], sub_name: str) -> str:
    """Why a retried run does not run a partition again."""
    return (
        f"{partition}: reused: completed by an earlier attempt ({sub_name}); on disk "
        f"{int(on_disk.get('input_lines', 0))} lines: {on_disk.get('accepted', 0)} accepted, "
        f"{on_disk.get('rejected', 0)} rejected"
    )


def stopped_reason(err: BaseException, *, cancelled: bool = False) -> str:
    """Why partitions that had not finished when the run stopped did not finish; a run that
    was cancelled (from the UI, Ctrl-C, SIGTERM) says so, not the signal's number."""
    if cancelled:
        return f"{CANCELLED}: a rerun finishes it"
    return f"run stopped before it finished: {str(err) or type(err).__name__}"


def partition_status(name: str, completed: set[str], errors: dict[str, str]) -> str:
    """completed, cancelled, failed or not run."""
    if name in completed:
        return "completed"
    if name not in errors:
        return "not run"
    return CANCELLED if errors[name].startswith(CANCELLED) else "failed"


def partition_plan_line(
    partition: str, lines: int, batches: int, tier: str, concurrency: int | str, max_tokens: int
) -> str:
    """The partition's first log line: how much work, and under which tier."""
    return (
        f"{partition}: {lines} lines in {batches} batches, "
        f"tier {tier} (concurrency {concurrency}, max_tokens {max_tokens})"
    )


def partition_failure_message(partition: str, failures: list[BaseException], batches: int) -> str:
    """The partition subflow's Failed message: how many batches, and the first cause."""
    return (
        f"{len(failures)} of {batches} batches of partition {partition} failed; "
        f"first: {failures[0]}"
    )


def fanout_failure_message(failed: dict[str, str | None], total: int) -> str:
    """The fan-out's Failed message: which partition jobs, and each one's state message."""
    detail = "; ".join(f"{name}: {why or 'no state'}" for name, why in failed.items())
    return f"{len(failed)} of {total} partition jobs failed: {detail}"


CAUSE_CHARS = 300  # a cause cell's width at most; the whole reason is in the batch's log


def failed_batch_row(
    label: str, first_line: int, count: int, err: BaseException, attempts: int
) -> dict[str, Any]:
    """One row of a partition's failed-batches table: what an operator decides on first
    (status, why, how often tried: on screen in a 1400 px window), then which lines."""
    cause = " ".join(str(err).split()) or type(err).__name__
    cause = cause.removeprefix(f"generate[{label}]: ")
    if len(cause) > CAUSE_CHARS:
        cause = cause[: CAUSE_CHARS - 1] + "…"
    cancelled = isinstance(err, asyncio.CancelledError) or "Cancel" in type(err).__name__
    return {
        "status": "cancelled" if cancelled else "failed",
        "cause": cause,
        "attempts": attempts,
        "batch": label,
        "first_line": first_line,
        "last_line": first_line + count - 1,
    }


def run_failed_batch_row(partition_link: str, row: dict[str, Any]) -> dict[str, Any]:
    """A partition table's row in the parent's table: the partition (a link to its own table)
    after the row's status, cause and attempts, and the batch as its number alone (its label
    repeats the partition's name)."""
    lead: dict[str, Any] = {k: row[k] for k in ("status", "cause", "attempts") if k in row}
    rest = {k: v for k, v in row.items() if k not in lead and k != "batch"}
    batch = str(row.get("batch", "")).rpartition("/")[2]
    return {**lead, "partition": partition_link, "batch": batch, **rest}


def failed_batches_description(partition: str, rows: list[dict[str, Any]], batches: int) -> str:
    return (
        f"{partition}: {len(rows)} of {batches} batches failed after their retries; rerun the "
        "same command to generate only what is missing"
    )


def run_failed_batches_description(rows: list[dict[str, Any]]) -> str:
    """The parent's failed-batches table: how many, in which partitions, what to do."""
    parts = sorted({str(r.get("partition", "")).split("]")[0].lstrip("[") for r in rows})
    return (
        f"{len(rows)} failed batches in this attempt ({', '.join(parts)}); each partition's "
        "table is linked; rerun or retry to generate only what is missing"
    )


# How a description starts once a later attempt or run replaced what the artifact says.
SUPERSEDED = "Superseded"


def superseded_description(by: str, was: str) -> str:
    """A failed-batches table that a later success replaced: who replaced it, and what it said."""
    head = f"{SUPERSEDED} by {by}: all batches committed"
    return f"{head}; was: {was}" if was else head


RUN_PROGRESS_KEY = "datagen-progress"


def run_progress_markdown(meter: RunMeter, states: dict[str, str]) -> str:
    """The parent's live table (a progress artifact's description): one line per partition."""
    rows = [
        "| partition | state | lines | % | tok/s | retried errors | ETA |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, size in meter.sizes.items():
        progress = meter.progress(name)
        state = states.get(name, "waiting")
        if progress is None:
            rows.append(f"| {name} | {state} | 0/{size} | 0% | - | - | - |")
            continue
        pct = progress_percent(progress.done, size or progress.total_lines)
        eta = progress.eta() if state in ("running", "waiting") else "-"  # none once it ended
        rows.append(
            f"| {name} | {state} | {progress.done}/{size or progress.total_lines} | {pct:.0f}% | "
            f"{progress.tok_s_shown():.0f} | {progress.errors} | {eta} |"
        )
    return "\n".join(rows)


FAILED_BATCHES_PREFIX = "failed-batches"
DATA_PREFIX = "data"
PROGRESS_PREFIX = "progress"


_GENERATED_NAME = re.compile(r"[a-z]+-[a-z]+")


def keeps_name(name: str | None) -> bool:
    """Whether a flow run's name was given by a person (the deployment form's run name,
    ``--flow-run-name``) or by an earlier attempt of the run, so it stays: every name but
    Prefect's generated ``adjective-animal`` (two lowercase words joined by a hyphen)."""
    return bool(name) and not _GENERATED_NAME.fullmatch(name or "")


def partition_run_name(partition: str, when: datetime) -> str:
    """A partition subflow's name: ``partition-B1_glaive 2026-11-29 02:00Z``."""
    return f"partition-{partition} {when:%Y-%m-%d %H:%M}Z"


def eval_run_name(dataset: str, when: datetime) -> str:
    """An eval flow run's name: ``eval synth_100k/datagen 2026-11-29 02:00Z`` (the dataset
    directory's last two parts: a nightly's output is often ``<dataset>/datagen``)."""
    parts = Path(dataset.rstrip("/") or "dataset").parts[-2:]
    return f"eval {'/'.join(parts)} {when:%Y-%m-%d %H:%M}Z"


def run_name(source: str | None, config: Any, partitions: list[str] | None, when: datetime) -> str:
    """A flow run name that says what ran: ``kimi-k2.5: B1_glaive+B2_code 2026-11-29 02:00Z``.

    ``source`` is the deployment's name; without one, the output directory's name. ``config``
    is the run's config parameter, a model or its JSON form.
    """
    cfg = config.model_dump() if hasattr(config, "model_dump") else dict(config or {})
    names = list(partitions or [p.get("name", "?") for p in cfg.get("partitions") or []])
    what = source or Path(str(cfg.get("output_dir") or "datagen")).name
    shown = "+".join(names[:3]) + (f"+{len(names) - 3} more" if len(names) > 3 else "")
    return f"{what}: {shown or 'all'} {when:%Y-%m-%d %H:%M}Z"

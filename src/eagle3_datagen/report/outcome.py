"""A run's outcome: which partitions completed, why the others did not, and which failure is the
run's reason.

The parent flow only records what happened (a partition's final state, the fault that stopped
an exception that stopped the run, a manifest it could not write); this object decides what the
run's final state, its manifest entries, its summary table and its progress table then say. One
policy in one place, tested without an orchestrator.
"""

from __future__ import annotations

from typing import Any

from eagle3_datagen.errors import DatagenError, RunFailed
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import (
    CANCELLED,
    REUSED,
    failed_partition_entry,
    partition_status,
    run_failure_message,
    stopped_reason,
    summary_rows,
)


class RunOutcome:
    """What happened to each partition of one run, and what the run says about it."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.completed: set[str] = set()
        self.errors: dict[str, str] = {}  # partition -> why it did not complete
        self.results: dict[str, dict[str, Any]] = {}  # partition -> its manifest entry
        # The progress table's state column; the live table reads it while the run runs.
        self.states: dict[str, str] = {}
        # The first fault no retry can fix (a server lost for good, a full disk...): it stopped
        # every partition.
        self.stop: DatagenError | None = None
        self.reused: set[str] = set()  # completed by an earlier attempt of a retried run

    def started(self) -> None:
        self.states.update({name: "running" for name in self.names if name not in self.reused})

    def partition_completed(self, name: str, summary: dict[str, Any]) -> None:
        self.completed.add(name)
        self.results[name] = {**summary, "status": "completed"}
        self.states[name] = "completed"

    def partition_reused(self, name: str, on_disk: dict[str, Any]) -> None:
        """An earlier attempt of this run completed ``name`` and its data is on disk: it counts
        as completed, and every table says it was reused (no numbers of this attempt)."""
        self.partition_completed(name, on_disk)
        self.reused.add(name)
        self.states[name] = REUSED

    def partition_failed(
        self, name: str, state_type: str, reason: str, message: str | None
    ) -> None:
        """A partition whose subflow ended ``state_type`` (FAILED, CRASHED...) because of
        ``reason`` (its state message without the orchestrator's preamble)."""
        self.errors[name] = reason
        self.results[name] = failed_partition_entry(name, state_type, message)
        self.states[name] = state_type.lower()

    def partition_cancelled(self, name: str, message: str | None) -> None:
        """A partition whose subflow ended Cancelled: the run was stopped before it finished."""
        self.errors[name] = stopped_reason(RuntimeError(message), cancelled=True)
        self.results[name] = failed_partition_entry(name, CANCELLED, message)
        self.states[name] = CANCELLED

    def stopped_by(self, error: DatagenError | None) -> None:
        """A fault no retry can fix stopped every partition (the server lost for good, a full
        disk, a changed input, a refused key): it is the run's reason."""
        if error is not None:
            self.stop = error

    def stopped(self, err: BaseException, *, cancelled: bool = False) -> None:
        """The run stopped on ``err`` (``cancelled``: someone stopped it): every partition not
        completed says so, unless it already has its own reason."""
        for name in self.names:
            if name not in self.completed:
                self.errors.setdefault(name, stopped_reason(err, cancelled=cancelled))

    def cancelled_message(self) -> str:
        """A stopped run's state message: which partitions had completed, what a rerun does."""
        done = [name for name in self.names if name in self.completed]
        left = [name for name in self.names if name not in self.completed]
        finished = f" ({', '.join(done)})" if done else ""
        return (
            f"stopped before it finished: {len(done)} of {len(self.names)} partitions "
            f"completed{finished}; a rerun finishes {', '.join(left)}"
        )

    def manifest_failure_is_consequence(self) -> bool:
        """Whether a manifest that cannot be written is only a consequence (logged, a rerun
        rewrites it) rather than the run's reason: a full disk fails a shard first, and that
        shard's error is the reason."""
        return bool(self.errors) or self.stop is not None

    def final_states(self) -> dict[str, str]:
        """The progress table's last word: a partition still "running" failed when the run
        holds a reason for it, and did not run otherwise."""
        final = {name: self.states.get(name, "not run") for name in self.names}
        for name, state in final.items():
            if state == "running":
                final[name] = partition_status(name, self.completed, self.errors)
        return final

    def summary_rows(
        self, output_dir: str, meter: RunMeter, failed_batches: dict[str, tuple[int, str]]
    ) -> list[dict[str, Any]]:
        return summary_rows(
            output_dir, self.names, self.completed, self.errors, meter, failed_batches, self.reused
        )

    def failure(self) -> DatagenError | None:
        """The run's one reason to fail, or None: the fault that stopped the run over the
        partitions' own."""
        if self.stop is not None:
            return self.stop
        if self.errors:
            return RunFailed(run_failure_message(self.errors, len(self.names)))
        return None

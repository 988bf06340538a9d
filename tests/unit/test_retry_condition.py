"""Prefect retries a batch only for what a retry can fix (the batch task's retry_condition_fn)."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.states import Failed, State

from eagle3_datagen.errors import (
    BatchFailed,
    BatchTaskFailed,
    InputFileError,
    OutputWriteError,
    RetriesExhaustedError,
    ServerLost,
)
from eagle3_datagen_tasks.batch import generate_batch, retry_delay_s, retry_if_it_can_help


def _as_task_raises(cause: BaseException) -> BaseException:
    """The chain the runner and the task build: BatchTaskFailed <- BatchFailed <- cause."""
    try:
        try:
            try:
                raise cause
            except Exception as err:
                raise BatchFailed(f"partition p, line 3: {err}") from err
        except Exception as err:
            raise BatchTaskFailed(f"generate[p/0000]: {err}") from err
    except BatchTaskFailed as err:
        return err


@pytest.mark.parametrize(
    ("cause", "retried"),
    [
        (RetriesExhaustedError("request failed after 6 attempts: HTTP 503"), True),
        (ServerLost("server http://h:1 lost for good"), False),
        (
            OutputWriteError("/out/p/part-00000.parquet: cannot write: No space left on device"),
            False,
        ),
        (InputFileError("/in.jsonl: cannot read input"), False),
        (ValueError("a bug"), False),
    ],
)
def test_only_request_failures_are_retried(cause: BaseException, retried: bool) -> None:
    err = _as_task_raises(cause)
    state: State[Any] = Failed(data=err)
    assert retry_if_it_can_help(generate_batch, None, state) is retried  # type: ignore[arg-type]


def test_the_batch_task_carries_the_condition_through_with_options() -> None:
    task = generate_batch.with_options(retries=3, retry_delay_seconds=[1, 2, 3])
    assert task.retry_condition_fn is retry_if_it_can_help


@pytest.mark.parametrize(("attempt", "wait"), [(1, 0.0), (2, 10.0), (3, 60.0), (5, 60.0)])
def test_a_retry_waits_the_configured_delay_the_last_repeating(attempt: int, wait: float) -> None:
    assert retry_delay_s([10.0, 60.0], attempt) == wait

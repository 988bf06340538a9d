"""One ERROR line, no traceback, for a failure the pipeline expects and explains in its message.

Prefect's engines log a failed task run twice at ERROR (``Task run failed with exception ...
Retries are exhausted`` with the whole chained traceback, then ``Finished in state Failed(...)``)
and a failed flow run once with its traceback. For a batch out of retries, an HTTP error or a
lost server, that traceback is some 50 lines of aiohttp and engine frames whose last line the
message already says; eleven of them for seven failed batches bury the lines that matter. This
filter, on Prefect's run loggers, makes such a failure:

* one ERROR line: the engine's own line with the cause, without its traceback;
* the traceback at DEBUG (logged where DEBUG is: ``PREFECT_LOGGING_LEVEL=DEBUG``);
* its ``Finished in state Failed(...)`` line (task run or flow run: it repeats the cause) at
  INFO, so an eval whose gate failed, or a failed partition, reads as one ERROR line.

A failure that is not ours to expect (a bug: a ``KeyError`` in a batch) keeps its traceback.
"""

from __future__ import annotations

import logging

from eagle3_datagen.errors import is_expected

TASK_RUNS = "prefect.task_runs"
FLOW_RUNS = "prefect.flow_runs"
FINISHED_FAILED = "Finished in state Failed"


class ExpectedFailures(logging.Filter):
    """Applied by the logger itself (before any handler): console and API see the same."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()  # task runs whose failure already has its ERROR line

    def filter(self, record: logging.LogRecord) -> bool:
        run_key = "task_run_id" if record.name == TASK_RUNS else "flow_run_id"
        task_run = str(getattr(record, run_key, ""))
        if task_run in self._said and str(record.msg).startswith(FINISHED_FAILED):
            self._said.discard(task_run)
            record.levelno, record.levelname = logging.INFO, "INFO"
            return True
        err = record.exc_info[1] if record.exc_info else None
        if err is None or record.levelno < logging.ERROR or not is_expected(err):
            return True
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(logging.DEBUG):
            trace = logging.makeLogRecord(record.__dict__)
            trace.levelno, trace.levelname = logging.DEBUG, "DEBUG"
            trace.msg, trace.args = "the traceback of the failure below", ()
            logger.handle(trace)
        record.exc_info, record.exc_text = None, None
        if record.name in (TASK_RUNS, FLOW_RUNS) and task_run:
            self._said.add(task_run)
        return True


def install() -> None:
    """Put the filter on Prefect's task-run and flow-run loggers, once per process."""
    for name in (TASK_RUNS, FLOW_RUNS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFailures) for f in logger.filters):
            logger.addFilter(ExpectedFailures())

"""One line, no traceback, for a failure the pipeline expects and explains in its message.

Prefect's engines log a failed task run twice at ERROR (``Task run failed with exception ...
Retries are exhausted`` with the whole chained traceback, then ``Finished in state Failed(...)``)
and a failed flow run once with its traceback. For a batch out of retries, an HTTP error or a
lost server, that traceback is some 50 lines of aiohttp and engine frames whose last line the
state message already says; eleven of them for seven failed batches bury the one line that
matters. This filter, on Prefect's run loggers, turns such a record into:

* for a task run: the traceback record becomes DEBUG (kept, with its traceback, where DEBUG is
  logged), so ``Finished in state Failed('... generate[part/0002]: line 33: ...')`` is the
  batch's one ERROR line;
* for a flow run: the same ERROR line without its traceback (the raise site of a
  ``PartitionFailed`` or ``RunFailed`` says nothing more).

A failure that is not ours to expect (a bug: ``KeyError`` in a batch) keeps its traceback.
"""

from __future__ import annotations

import logging

from eagle3_datagen.errors import is_expected

TASK_RUNS = "prefect.task_runs"
FLOW_RUNS = "prefect.flow_runs"


class ExpectedFailures(logging.Filter):
    """Applied by the logger itself (before any handler): console and API see the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is None or record.levelno < logging.ERROR or not is_expected(err):
            return True
        if record.name == TASK_RUNS:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(TASK_RUNS).isEnabledFor(logging.DEBUG)
        record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Put the filter on Prefect's task-run and flow-run loggers, once per process."""
    for name in (TASK_RUNS, FLOW_RUNS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFailures) for f in logger.filters):
            logger.addFilter(ExpectedFailures())

"""The terminal of a command-line run: a log record without its traceback, a message as one
line.

Prefect logs every failed task and flow with its traceback (a batch that failed is four levels
deep), to the terminal and to the API alike. A person at a terminal needs what happened, one
line each, and the run's reason as the last line; the tracebacks stay in the flow run's log on
the Prefect API (the UI's Logs tab, ``uv run prefect flow-run logs <id>``), which formats each
record with its own handler before the console sees it.
"""

from __future__ import annotations

import logging


def one_line(text: str) -> str:
    """A message as one terminal line (whitespace runs folded, at most 2000 characters)."""
    return " ".join(str(text).split())[:2000]


class OneLineFormatter(logging.Formatter):
    """Another formatter's output without the exception text or stack."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def quiet_console_tracebacks() -> None:
    """Make Prefect's console handlers print no traceback (idempotent); the API
    handler, which keeps the traceback, is left as it is."""
    import prefect.main  # noqa: F401  (sets Prefect's logging up; later setups are incremental)

    for handler in _console_handlers():
        if not isinstance(handler.formatter, OneLineFormatter):
            handler.setFormatter(OneLineFormatter(handler.formatter or logging.Formatter()))


def _console_handlers() -> list[logging.Handler]:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(
            logger
            for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger)
        ),
    ]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)]


def stopping_now(signum: int) -> None:
    """Ctrl-C or SIGTERM: one line says the run is stopping; what each batch, subflow and the
    server say while they stop (Prefect logs every end that is not Completed at ERROR) goes to
    the flow run's log on the Prefect API, not to the terminal, which ends with the stop's
    one line."""
    import signal
    import sys

    name = signal.Signals(signum).name
    print(
        f"eagle3-datagen: {name}: stopping: cancelling the batches in flight, then closing the run",
        file=sys.stderr,
        flush=True,
    )
    for handler in _console_handlers():
        handler.setLevel(logging.CRITICAL + 1)

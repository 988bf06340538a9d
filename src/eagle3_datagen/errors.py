"""Every error type the pipeline raises, in one place.

Our exception hierarchy::

    DatagenError
    ├── ConfigError            bad config file or value (names file, field, reason)
    ├── TokenizerError         tokenizer cannot be loaded, or a special token is not one token
    ├── InputFileError         a partition's prompts file is missing or unreadable
    ├── OutputConflictError    the output directory holds data made under another fingerprint
    ├── OutputLockedError      another run holds a partition of the output directory
    ├── OutputWriteError       the output cannot be written (disk full, quota): path and cause
    ├── DatasetError           a finished dataset cannot be read back (validate, export)
    ├── ServerError            the server is unusable: the run cannot go on
    │   ├── ServerStartupError     died or never became healthy
    │   ├── ServerLost             gone for good mid-run: attached, a whole pool, or after
    │   │                          max_relaunches
    │   ├── AuthenticationError    the server refuses our API key (HTTP 401/403); also a
    │   │                          RequestError (it carries the status)
    │   └── PreflightError         up, but configured against our needs (e.g. reasoning parser)
    ├── RequestError           one /generate request failed
    │   ├── RetryableRequestError  transport error, timeout, 429, 5xx: try again
    │   ├── RejectedRequestError   4xx such as "prompt too long": never retried, record rejected
    │   └── RetriesExhaustedError  every try the retry policy allows failed
    └── RunError               a unit of the run failed; what Prefect shows as a Failed state
        ├── BatchFailed            a batch could not finish (the library's runner)
        ├── BatchTaskFailed        the same, as the batch task's message (names the task)
        ├── PartitionFailed        some batches of a partition failed after their retries
        ├── RunFailed              some partitions of a run failed
        └── FanOutFailed           some partition jobs of a fan-out did not complete

Prefect retries a batch only when :func:`retry_can_fix` says so: requests that used up their
tries against a flaky server may succeed later; a server lost for good, a refused API key, a
full or read-only disk, an input file gone or changed will not. Such a cause
(:func:`final_cause`) stops the whole run, every partition, at once: see
``sglang/supervisor.py`` (the run's one stop).

Per-line input problems and chat-template failures are not exceptions: they become reject
records (see ``write/records.py``; the renderer returns a ``RenderError`` value per prompt).
"""

from __future__ import annotations

from typing import Any


class DatagenError(Exception):
    """Base class for all errors of this package."""


class ConfigError(DatagenError):
    """The configuration is invalid; the message names the file, the field and the reason."""


class TokenizerError(DatagenError):
    """The tokenizer cannot serve this pipeline."""


class InputFileError(DatagenError):
    """A partition's input file cannot be read at all (as opposed to one bad line)."""


class OutputConflictError(DatagenError):
    """The output directory already holds data that must not be mixed with this run's."""


class OutputLockedError(DatagenError):
    """Another run is writing a partition of the output directory; the message names it."""


class OutputWriteError(DatagenError):
    """A file of the output could not be written (no space left, quota, permissions); the
    message names the file and the cause. Nothing half written is left visible."""


class DatasetError(DatagenError):
    """A finished dataset cannot be read back or exported; the message names the file."""


class ServerError(DatagenError):
    """The SGLang server cannot be used; retrying a request will not help."""


class ServerStartupError(ServerError):
    """The launched server died or missed its health deadline."""


class ServerLost(ServerError):
    """The server stopped answering and will not come back: an attached server missed the
    health deadline, or a launched one was lost again after ``max_relaunches``. The message
    names the server, when it last answered, and the last error."""


class PreflightError(ServerError):
    """The server runs with settings that would corrupt or waste the run."""


class RequestError(DatagenError):
    """One /generate request failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthenticationError(RequestError, ServerError):
    """The server refused our API key (HTTP 401/403): every request will be refused alike, so
    no retry can help; a key rotated under a running run stops it."""


class RetryableRequestError(RequestError):
    """A transient failure: connection refused or reset, timeout, HTTP 429 or 5xx."""


class RejectedRequestError(RequestError):
    """The server refused the request (HTTP 4xx); retrying the same request cannot succeed."""


class RetriesExhaustedError(RequestError):
    """A request failed on every try its retry policy allows; the message has the last error."""


class RunError(DatagenError):
    """A unit of the run (batch, partition, run, fan-out) failed; the message says which and why.

    The flows and tasks raise these so that a Failed state in the Prefect UI explains itself.
    """


class BatchFailed(RunError):
    """A batch could not finish; the message names partition, line and cause."""


class BatchTaskFailed(RunError):
    """A batch task failed; its message (the task run's state message) names partition, batch
    and cause."""


class PartitionFailed(RunError):
    """Some batches of a partition failed; the message names the partition and the first.

    It carries the partition's failed-batches rows (and the id of the table that shows them,
    once written) to the parent run, which lists them all in its own table."""

    def __init__(
        self, message: str, rows: list[dict[str, Any]] | None = None, table_id: Any = None
    ) -> None:
        super().__init__(message)
        self.rows = rows or []
        self.table_id = table_id


class RunFailed(RunError):
    """Some partitions failed; the message names each and why."""


class EvalGateFailed(RunError):
    """A draft's held-out accept length dropped past the gate's margin from its baseline."""


class FanOutFailed(RunError):
    """Some partition jobs did not complete; the message names them."""


# What a later try can fix: a request that used up its tries on a flaky or overloaded server.
_RETRYABLE: tuple[type[BaseException], ...] = (RetriesExhaustedError, RetryableRequestError)
# What no retry can fix, wherever it sits in the chain of causes.
_FINAL: tuple[type[BaseException], ...] = (
    ServerLost,
    AuthenticationError,
    OutputWriteError,
    OutputConflictError,
    OutputLockedError,
    InputFileError,
    ConfigError,
    TokenizerError,
)


def _chain(err: BaseException) -> list[BaseException]:
    seen: set[int] = set()
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return chain


def final_cause(err: BaseException) -> DatagenError | None:
    """The error in ``err``'s chain of causes that no retry can fix (the first such), or None.

    Such a cause fails every batch of every partition alike (a lost server, a refused key, a
    full disk, a changed input), so the run stops at the first one instead of failing its
    batches one by one.
    """
    for e in _chain(err):
        if isinstance(e, _FINAL):
            assert isinstance(e, DatagenError)
            return e
    return None


def retry_can_fix(err: BaseException) -> bool:
    """Whether retrying the batch that raised ``err`` can succeed, from its chain of causes.

    Only request failures are worth another try; anything else (a lost server, a full disk, a
    bug) would fail again after the retry delay, only later.
    """
    chain = _chain(err)
    if any(isinstance(e, _FINAL) for e in chain):
        return False
    return any(isinstance(e, _RETRYABLE) for e in chain)


def is_expected(err: BaseException) -> bool:
    """Whether ``err`` is a failure the pipeline describes in its message (a request out of
    tries, a lost server, a full disk, a failed batch or partition), not a bug: its traceback
    tells an operator nothing the message does not. A wrapper (``RunError``) around anything
    else, say a ``KeyError``, is a bug and keeps its traceback."""
    chain = _chain(err)
    if any(isinstance(e, DatagenError) and not isinstance(e, RunError) for e in chain):
        return True
    return isinstance(chain[-1], DatagenError)

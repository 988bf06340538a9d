"""Server pidfiles, process-group killing and orphan reaping.

Why a pidfile: Prefect runs ``on_cancellation``/``on_crashed`` hooks in the *runner* process,
which never held the ``Popen`` handle, and a SIGKILLed flow process runs no ``finally`` at all.
So every launched server is recorded on disk (keyed by the run key, e.g. the flow-run id) and
whoever comes next, a hook or the next run, can find and kill it.

Why start times: pids are recycled. Each record holds the kernel start time of the server and of
its owner (``/proc/<pid>/stat`` field 22), and nothing is killed unless the live process with
that pid has the same start time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_datagen.processes import pid_alive, process_start_time, read_stat

_log = logging.getLogger(__name__)

_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
PIDFILE_SUFFIX = ".json"
DEFAULT_KILL_GRACE_S = 10.0


# --------------------------------------------------------------------------- /proc inspection


def same_process(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` is alive and is the process recorded with ``start_time`` (not a reuse)."""
    if not pid_alive(pid):
        return False
    if start_time is None:  # recorded without /proc: the best we can do is "alive"
        return True
    return process_start_time(pid) == start_time


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = read_stat(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def terminate_group(pgid: int, *, grace_s: float, poll_s: float = 0.1) -> bool:
    """SIGTERM the process group, wait up to ``grace_s`` for it to empty, then SIGKILL it.

    Returns True if the group is empty at the end. The caller must have checked that ``pgid``
    is still the group it launched (see :func:`same_process`).
    """

    def signal_group(sig: signal.Signals) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            _log.warning("no permission to signal process group %d", pgid)
            return False
        return True

    if not group_members(pgid) or not signal_group(signal.SIGTERM):
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(poll_s)
    _log.warning("process group %d still running after %.0f s; sending SIGKILL", pgid, grace_s)
    signal_group(signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(poll_s)
    return not group_members(pgid)


# --------------------------------------------------------------------------- pidfile records


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """What a pidfile holds: enough to find, verify and kill one launched server."""

    pid: int
    pgid: int
    start_time: int | None  # /proc/<pid>/stat starttime of the server
    owner_pid: int
    owner_start_time: int | None  # same for the process that launched it
    owner_run_key: str
    cmd: list[str]  # redacted: never holds the API key
    started_at: str  # ISO-8601 UTC, for humans
    log_path: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRecord:
        return cls(
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            start_time=_opt_int(data.get("start_time")),
            owner_pid=int(data["owner_pid"]),
            owner_start_time=_opt_int(data.get("owner_start_time")),
            owner_run_key=str(data["owner_run_key"]),
            cmd=[str(x) for x in data.get("cmd", [])],
            started_at=str(data.get("started_at", "")),
            log_path=str(data.get("log_path", "")),
        )

    def server_alive(self) -> bool:
        return same_process(self.pid, self.start_time)

    def owner_alive(self) -> bool:
        return same_process(self.owner_pid, self.owner_start_time)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def pidfile_path(state_dir: str | Path, run_key: str) -> Path:
    """``<state_dir>/<run_key>.json``; characters unsafe in a file name become ``_``."""
    safe = _UNSAFE_KEY_CHARS.sub("_", run_key) or "_"
    return Path(state_dir) / f"{safe}{PIDFILE_SUFFIX}"


def write_record(path: Path, record: ServerRecord) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json(), encoding="utf-8")
    os.replace(tmp, path)


def read_record(path: Path) -> ServerRecord | None:
    """The record in ``path``, or None when it is missing or unreadable (logged)."""
    try:
        return ServerRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        _log.warning("ignoring unreadable server pidfile %s: %s", path, err)
        return None


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def kill_record(record: ServerRecord, *, grace_s: float = DEFAULT_KILL_GRACE_S) -> bool:
    """Kill the server group of ``record`` if it is still the same process; True if killed.

    When the leader has exited but group members (e.g. SGLang's scheduler processes) remain,
    the group is still killed: Linux does not hand out a pid while a process group uses it as
    its id, so the members belong to our server.
    """
    if record.server_alive():
        terminate_group(record.pgid, grace_s=grace_s)
        return True
    if not pid_alive(record.pid) and group_members(record.pgid):
        terminate_group(record.pgid, grace_s=grace_s)
        return True
    return False


# --------------------------------------------------------------------------- public API


def kill_recorded(
    state_dir: str | Path, run_key: str, *, grace_s: float = DEFAULT_KILL_GRACE_S
) -> int | None:
    """Kill the server launched under ``run_key`` and remove its pidfile; return its pid.

    This is what Prefect's ``on_cancellation``/``on_crashed`` hooks call: it works from any
    process, kills regardless of whether the owner is alive, and is a no-op (None) when there
    is no record or the recorded server is already gone.
    """
    path = pidfile_path(state_dir, run_key)
    record = read_record(path)
    if record is None:
        return None
    killed = kill_record(record, grace_s=grace_s)
    _remove(path)
    if killed:
        _log.info("killed SGLang server pid %d of run %s", record.pid, run_key)
        return record.pid
    return None


def reap_orphans(state_dir: str | Path, *, grace_s: float = DEFAULT_KILL_GRACE_S) -> list[int]:
    """Kill every recorded server whose owner process is gone; return the killed pids.

    Pidfiles of servers that are already gone are removed too. Servers whose owner still runs
    (another live run sharing the output directory) are left alone.
    """
    directory = Path(state_dir)
    if not directory.is_dir():
        return []
    killed: list[int] = []
    for path in sorted(directory.glob(f"*{PIDFILE_SUFFIX}")):
        record = read_record(path)
        if record is None or record.owner_alive():
            continue
        if kill_record(record, grace_s=grace_s):
            _log.warning(
                "killed orphaned SGLang server pid %d (run %s, owner pid %d is gone)",
                record.pid,
                record.owner_run_key,
                record.owner_pid,
            )
            killed.append(record.pid)
        _remove(path)
    return killed

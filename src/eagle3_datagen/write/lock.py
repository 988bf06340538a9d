"""One writer per partition of an output directory: a lock file naming who holds it.

Two runs writing one partition at once keep the data correct (a batch is committed whole, by
whichever run finishes it first) but do the same generations twice. So a run takes
``<output>/_locks/<partition>.lock`` for every partition it runs before the server starts, and
a second run refuses at once, naming the holder (host, pid, flow run), or waits if asked. Locks
are per partition because the jobs of a fan-out share one directory, each with its own
partition.

The lock is created with ``O_CREAT | O_EXCL`` (atomic, also on NFS v3+), and its holder renews a
lease by touching the file's mtime every ``lease_s / 4`` seconds. A lock is stale when its
holder is gone: the pid no longer runs on this host (or is another process now: its start
time differs), or, on another host, the lease was not renewed for ``lease_s``. A stale lock is
taken over under a second exclusive file (``.takeover``), which re-reads the lock before
removing it, so two runs that find the same stale lock cannot both win, and a fresh lock
created meanwhile is never removed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import orjson

from eagle3_datagen.errors import OutputLockedError
from eagle3_datagen.processes import pid_alive, process_start_time

LOCKS_DIR = "_locks"
DEFAULT_LEASE_S = 120.0
# A takeover takes milliseconds; a .takeover file older than this belongs to a taker that died.
_TAKEOVER_STALE_S = 30.0


def _proc_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, Linux), to tell a reused pid."""
    start = process_start_time(pid)
    return None if start is None else str(start)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lock: written into the lock file as JSON."""

    host: str
    pid: int
    pid_start: str | None
    run_id: str
    run_name: str
    acquired_at: str
    token: str

    @classmethod
    def me(cls, run_id: str, run_name: str) -> Holder:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            pid_start=_proc_start(pid),
            run_id=run_id,
            run_name=run_name,
            acquired_at=datetime.now(UTC).isoformat(timespec="seconds"),
            token=uuid.uuid4().hex,
        )

    def describe(self) -> str:
        run = f"flow run {self.run_name!r} ({self.run_id})" if self.run_id else "a run"
        return f"{run}, pid {self.pid} on host {self.host}, since {self.acquired_at}"


def read_holder(path: Path) -> tuple[Holder | None, float] | None:
    """The lock's holder (None when its content is unreadable) and its mtime; None: no lock."""
    try:
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        raw: dict[str, Any] = orjson.loads(data)
        return Holder(**raw), mtime
    except (orjson.JSONDecodeError, TypeError):
        return None, mtime  # torn by a crash between create and write: stale once the lease ends


def stale_reason(holder: Holder | None, mtime: float, lease_s: float) -> str | None:
    """Why the lock's holder is gone, or None while it may still be running."""
    age = time.time() - mtime
    if holder is not None and holder.host == socket.gethostname():
        if not pid_alive(holder.pid):
            return f"pid {holder.pid} no longer runs on {holder.host}"
        start = _proc_start(holder.pid)
        if holder.pid_start and start and start != holder.pid_start:
            return f"pid {holder.pid} on {holder.host} is another process now"
        return None
    if age > lease_s:
        return f"its lease was not renewed for {age:.0f} s (lease {lease_s:.0f} s)"
    return None


class PartitionLocks:
    """The locks of a run's partitions in one output directory; a context manager.

    ``wait_s`` 0 refuses at once when a partition is held; a positive number waits that long
    (None: for ever) for the holder to finish. ``notes`` collects what a caller should log
    (stale locks taken over, waits).
    """

    def __init__(
        self,
        output_dir: str | Path,
        partitions: Iterable[str],
        *,
        run_id: str = "",
        run_name: str = "",
        wait_s: float | None = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
        poll_s: float = 1.0,
    ) -> None:
        self.dir = Path(output_dir) / LOCKS_DIR
        self.names = sorted(set(partitions))
        self.me = Holder.me(run_id, run_name)
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.notes: list[str] = []
        self.lost: list[str] = []  # partitions whose lock another run took over
        self._held: list[Path] = []
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def path(self, partition: str) -> Path:
        return self.dir / f"{partition}.lock"

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(self) -> list[str]:
        """Take every partition's lock (all or none); return the notes. Raises
        :class:`OutputLockedError` naming the holders when one stays held."""
        self.dir.mkdir(parents=True, exist_ok=True)
        deadline = None if self.wait_s is None else time.monotonic() + self.wait_s
        announced = False
        while True:
            held_by = self._try_all()
            if not held_by:
                self._start_renewing()
                return self.notes
            if deadline is not None and time.monotonic() >= deadline:
                raise OutputLockedError(self._refusal(held_by))
            if not announced:
                announced = True
                self.notes.append(f"waiting for {self._refusal(held_by, waiting=True)}")
            time.sleep(self.poll_s)

    def _refusal(self, held_by: dict[str, Holder | None], *, waiting: bool = False) -> str:
        lines = [
            f"{name} by {h.describe() if h else 'an unreadable lock (a run that crashed?)'}"
            for name, h in held_by.items()
        ]
        what = f"{self.dir.parent} is in use by another run: partition " + "; ".join(lines)
        if waiting:
            return what
        return (
            f"{what}. Wait for it to finish, stop it, or rerun with a wait for the lock "
            f"(lock_wait_s); its lock file is {self.path(next(iter(held_by)))}"
        )

    def _try_all(self) -> dict[str, Holder | None]:
        """Try each lock in order; on any held one, release those taken and say who holds."""
        held_by: dict[str, Holder | None] = {}
        for name in self.names:
            holder = self._try_one(self.path(name))
            if holder is not None:
                held_by[name] = holder[0]
        if held_by:
            self._release_all()
        return held_by

    def _try_one(self, path: Path) -> tuple[Holder | None] | None:
        """Create the lock, or take it over when stale; None when ours, else (holder,)."""
        for _ in range(3):
            if self._create(path):
                return None
            found = read_holder(path)
            if found is None:
                continue  # released between our create and our read: try again
            holder, mtime = found
            if holder is not None and holder.run_id and holder.run_id == self.me.run_id:
                reason: str | None = "it is an earlier attempt of this flow run"
            else:
                reason = stale_reason(holder, mtime, self.lease_s)
            if reason is None:
                return (holder,)
            if self._take_over(path, holder, reason):
                return None
        found = read_holder(path)
        return (found[0] if found else None,)

    def _create(self, path: Path) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, orjson.dumps(asdict(self.me)))
            os.fsync(fd)
        finally:
            os.close(fd)
        self._held.append(path)
        return True

    def _take_over(self, path: Path, holder: Holder | None, reason: str) -> bool:
        """Remove a stale lock and create ours, one taker at a time; False if we lost."""
        guard = path.with_name(path.name + ".takeover")
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - guard.stat().st_mtime > _TAKEOVER_STALE_S:
                    guard.unlink()
            return False
        os.close(fd)
        try:
            again = read_holder(path)
            if again is not None and again[0] != holder:
                return False  # replaced since we read it: not the stale lock any more
            path.unlink(missing_ok=True)
            if not self._create(path):
                return False
        finally:
            guard.unlink(missing_ok=True)
        who = holder.describe() if holder is not None else "an unreadable lock"
        self.notes.append(f"took over the stale lock {path} of {who}: {reason}")
        return True

    # -- holding and releasing ---------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="lock-lease", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            self.renew()

    def renew(self) -> None:
        """Touch each held lock that is still ours; note the ones another run took over."""
        for path in list(self._held):
            found = read_holder(path)
            if found is None or found[0] is None or found[0].token != self.me.token:
                self._held.remove(path)
                self.lost.append(path.stem)
                continue
            with contextlib.suppress(OSError):
                os.utime(path)

    def _release_all(self) -> None:
        for path in self._held:
            found = read_holder(path)
            if found is not None and found[0] is not None and found[0].token == self.me.token:
                path.unlink(missing_ok=True)
        self._held.clear()

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        self._release_all()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

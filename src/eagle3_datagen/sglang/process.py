"""Run the launched server as a process we can always kill, its output copied to its log.

The contract: the launched server never outlives the flow run that launched it. Three layers
make that true, from the most to the least graceful:

1. :class:`ServerProcess` is a context manager whose exit stops the whole process group
   (SGLang forks scheduler/detokenizer processes; killing only the leader would orphan them).
2. On Linux the server gets SIGTERM when the launching thread dies (``PR_SET_PDEATHSIG``), which
   covers a SIGKILLed flow process.
3. A JSON pidfile lets Prefect hooks in another process (:func:`.orphans.kill_recorded`) and the
   next run (:func:`.orphans.reap_orphans`) kill what is left.
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime as dt
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from eagle3_datagen.config import ModelSpec, ServerSpec
from eagle3_datagen.errors import ServerStartupError
from eagle3_datagen.processes import process_start_time
from eagle3_datagen.sglang.launch_command import build_launch_command, format_command
from eagle3_datagen.sglang.orphans import (
    ServerRecord,
    pidfile_path,
    terminate_group,
    write_record,
)
from eagle3_datagen.sglang.redact import REDACTED, redact_argv, redact_text

_log = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_S = 30.0

_PR_SET_PDEATHSIG = 1


# --------------------------------------------------------------------------- paths


def server_state_dir(output_dir: str | Path) -> Path:
    """Where server pidfiles live: ``<output>/.state/servers``."""
    return Path(output_dir) / ".state" / "servers"


def server_log_path(output_dir: str | Path, port: int) -> Path:
    """Where the server's stdout+stderr go: ``<output>/logs/server-<port>.log``."""
    return Path(output_dir) / "logs" / f"server-{port}.log"


# --------------------------------------------------------------------------- process


def ensure_port_free(host: str, port: int) -> None:
    """Refuse to launch onto a port something already answers on.

    Otherwise the health gate could pass on *that* server (an orphan of an earlier run, or
    someone else's) while ours is still loading, and the run would use the wrong server.
    """
    probe = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    try:
        with socket.create_connection((probe, port), timeout=1.0):
            pass
    except OSError:
        return
    raise ServerStartupError(
        f"port {port} on {probe} is already in use; stop that server (an orphan of an earlier "
        "run is killed by reap_orphans on the same output directory) or choose another port"
    )


def _parent_death_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent dies.

    Everything is resolved before the fork; the child only calls prctl. If the parent died
    between fork and prctl the signal would never come, so the child checks and exits.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        # prctl is variadic and reads unsigned longs: declare them, or the upper bits are junk.
        prctl.argtypes = [ctypes.c_int, *([ctypes.c_ulong] * 4)]
        prctl.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _redacting_pump(pipe: IO[bytes], out: IO[bytes], secrets: list[bytes]) -> None:
    """Copy the server's output to its log with secrets replaced, one line at a time.

    Splitting at ``\n`` and ``\r`` (progress bars) never cuts a key in two, since keys hold
    neither. Only a run of over 1 MiB without a line break is written in pieces.
    """
    fd = pipe.fileno()
    buf = b""

    def emit(data: bytes) -> None:
        for secret in secrets:
            data = data.replace(secret, REDACTED.encode())
        try:
            out.write(data)
            out.flush()
        except (OSError, ValueError):  # log closed by stop(): nothing left to keep
            pass

    try:
        while chunk := os.read(fd, 65536):
            buf += chunk
            cut = max(buf.rfind(b"\n"), buf.rfind(b"\r"))
            if cut >= 0:
                emit(buf[: cut + 1])
                buf = buf[cut + 1 :]
            elif len(buf) > 1 << 20:
                emit(buf)
                buf = b""
    except OSError:
        pass
    finally:
        if buf:
            emit(buf)
        pipe.close()


class ServerProcess:
    """One launched server: its own process group, a log file and a pidfile.

    Use it as a context manager (``with`` or ``async with``); exit always stops the server.
    With ``address`` (set by :meth:`for_spec`), start refuses a port that is already taken.
    ``pdeathsig=None`` (auto) enables the parent-death signal only on the main thread, because
    Linux sends it when the *thread* that forked exits, and a worker thread (e.g. one of
    Prefect's sync-task threads) may end long before the run does.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        log_path: str | Path,
        state_dir: str | Path,
        run_key: str,
        env: Mapping[str, str] | None = None,
        secrets: Iterable[str] = (),
        grace_s: float = DEFAULT_STOP_GRACE_S,
        pdeathsig: bool | None = None,
        address: tuple[str, int] | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.address = address
        self.log_path = Path(log_path)
        self.state_dir = Path(state_dir)
        self.run_key = run_key
        self.pidfile = pidfile_path(self.state_dir, run_key)
        self.grace_s = grace_s
        self._env = dict(env or {})
        self._secrets = [s for s in secrets if s]
        self._pdeathsig = pdeathsig
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()
        #: Byte offset where this launch's output starts in the (appended) log file.
        self.log_offset = 0

    @classmethod
    def for_spec(
        cls,
        server: ServerSpec,
        model: ModelSpec,
        *,
        output_dir: str | Path,
        run_key: str,
        api_key: str | None = None,
        python: str = sys.executable,
        grace_s: float = DEFAULT_STOP_GRACE_S,
        pdeathsig: bool | None = None,
    ) -> ServerProcess:
        """The usual way in: command, log path and state dir all derived from the config."""
        return cls(
            build_launch_command(server, model, python, api_key=api_key),
            log_path=server_log_path(output_dir, server.port),
            state_dir=server_state_dir(output_dir),
            run_key=run_key,
            env=server.env,
            secrets=[api_key] if api_key else [],
            grace_s=grace_s,
            pdeathsig=pdeathsig,
            address=(server.host, server.port),
        )

    # -- properties

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.pid

    @property
    def pgid(self) -> int:
        return self.pid  # start_new_session makes the server its group's leader

    @property
    def display_cmd(self) -> str:
        return format_command(self.cmd, self._secrets)

    def redact(self, text: str) -> str:
        """``text`` (e.g. a server log line) with this server's secrets hidden."""
        return redact_text(text, self._secrets)

    def poll(self) -> int | None:
        """The exit code if the server has exited, else None."""
        return None if self._proc is None else self._proc.poll()

    @property
    def returncode(self) -> int | None:
        return self.poll()

    # -- lifecycle

    def start(self) -> ServerProcess:
        """Launch the server and write its pidfile. Returns self."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        if self.address is not None:
            ensure_port_free(*self.address)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        header = f"\n=== {started_at} run {self.run_key}: {self.display_cmd}\n"
        self._log_file.write(header.encode())
        self._log_file.flush()
        self.log_offset = self._log_file.tell()
        pdeathsig = self._pdeathsig
        if pdeathsig is None:
            pdeathsig = threading.current_thread() is threading.main_thread()
        preexec = _parent_death_preexec() if pdeathsig else None
        env = {**os.environ, **self._env}
        try:
            self._proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                # With a secret, output goes through a redacting pump: SGLang logs its
                # ServerArgs (api_key included) at startup.
                stdout=subprocess.PIPE if self._secrets else self._log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own session and process group: killpg gets them all
                preexec_fn=preexec,  # runs after setsid in the child
                close_fds=True,
            )
        except OSError as err:
            self._close_log()
            raise ServerStartupError(f"cannot start {self.display_cmd}: {err}") from err
        if self._proc.stdout is not None:
            self._pump = threading.Thread(
                target=_redacting_pump,
                args=(self._proc.stdout, self._log_file, [s.encode() for s in self._secrets]),
                name=f"server-log-{self._proc.pid}",
                daemon=True,
            )
            self._pump.start()
        record = ServerRecord(
            pid=self._proc.pid,
            pgid=self._proc.pid,
            start_time=process_start_time(self._proc.pid),
            owner_pid=os.getpid(),
            owner_start_time=process_start_time(os.getpid()),
            owner_run_key=self.run_key,
            cmd=redact_argv(self.cmd, self._secrets),
            started_at=started_at,
            log_path=str(self.log_path),
        )
        try:
            write_record(self.pidfile, record)
        except OSError:
            self.stop()
            raise
        _log.info(
            "started server pid %d: %s (log %s)",
            self._proc.pid,
            self.display_cmd,
            self.log_path,
        )
        return self

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period; remove the pidfile.

        Idempotent and safe to call from any thread. Returns the server's exit code.
        """
        with self._lock:
            proc = self._proc
            if proc is None or self._stopped:
                return None if proc is None else proc.returncode
            grace = self.grace_s if grace_s is None else grace_s
            # Our own child: until we reap it, its pid (= the pgid) cannot be reused.
            terminate_group(proc.pid, grace_s=grace)
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                _log.error("server pid %d did not exit after SIGKILL", proc.pid)
            self._stopped = True
            if self._pump is not None:
                self._pump.join(timeout=5.0)  # EOF once the whole group is gone
            self._close_log()
            self.pidfile.unlink(missing_ok=True)
            _log.info("stopped server pid %d (exit code %s)", proc.pid, proc.returncode)
            return proc.returncode

    async def astop(self, grace_s: float | None = None) -> int | None:
        """:meth:`stop` without blocking the event loop."""
        return await asyncio.to_thread(self.stop, grace_s)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Shielded: a cancelled flow must still wait for the server to be gone.
        task = asyncio.ensure_future(self.astop())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

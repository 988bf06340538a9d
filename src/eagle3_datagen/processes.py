"""What the kernel says of a pid: alive (a zombie is not), and when it started (a reused pid
starts later). Shared by the server's pidfiles (``sglang/orphans.py``) and the output locks
(``write/lock.py``), which both must not mistake an exited or recycled process for their own.
Also a free port for a process to listen on (a launched server, the demo, a temporary Prefect
server, the tests)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def read_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 is field 3, the state).

    The command name is in parentheses and may itself hold spaces or ')', hence the rpartition.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    _, _, rest = raw.rpartition(")")
    fields = rest.split()
    return fields if len(fields) >= 20 else None


def process_start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` in clock ticks since boot; None if there is no such pid."""
    fields = read_stat(pid)
    return int(fields[19]) if fields else None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie has exited; only its entry is left)."""
    fields = read_stat(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # No /proc (not Linux): cannot tell zombies apart; assume alive when signalable.
    return not Path("/proc/self/stat").exists()

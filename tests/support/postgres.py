"""A throwaway PostgreSQL cluster (the database a production Prefect server runs on).

The cluster lives in a temporary directory, listens on 127.0.0.1 on a free port with ``trust``
auth, and is stopped by its pid. ``initdb`` and ``postgres`` refuse to run as root, so as root
they run as the ``postgres`` user (the child switches user itself, so its pid is postgres's own).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import free_port, stop_process


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<N>/bin`` that has ``initdb`` and ``postgres``."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    found = [b for b in found if (b / "postgres").exists()]
    return found[-1] if found else None


def missing_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if postgres_bin() is None:
        return (
            "PostgreSQL binaries not found (/usr/lib/postgresql/*/bin/initdb);"
            " apt-get install postgresql"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run initdb/postgres as"
    return None


def _as_owner() -> dict[str, Any]:
    """Popen arguments that run a child as ``postgres`` when we are root."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


@dataclass
class Postgres:
    """A cluster in ``root``, on ``port``; ``stop`` and ``start`` it like a restart would."""

    bindir: Path
    root: Path
    port: int
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.root / "postgres.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(self.root / "data"),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.root}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                **_as_owner(),
            )
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres did not start:\n{(self.root / 'postgres.log').read_text()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGINT by pid ("fast" shutdown: ends open sessions), SIGKILL after 30 s."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            stop_process(self.proc, 30)
            self.proc = None


@contextlib.contextmanager
def running_postgres(database: str = "prefect") -> Iterator[Postgres]:
    """A fresh cluster with database ``database``; ``.url`` is its SQLAlchemy asyncpg URL."""
    bindir = postgres_bin()
    assert bindir is not None, missing_reason()
    root = Path(tempfile.mkdtemp(prefix="e2e-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            "prefect",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=root,
        **_as_owner(),
    )
    pg = Postgres(bindir, root, free_port())
    pg.url = f"postgresql+asyncpg://prefect@127.0.0.1:{pg.port}/{database}"
    try:
        pg.start()
        subprocess.run(
            [
                str(bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(pg.port),
                "-U",
                "prefect",
                database,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)

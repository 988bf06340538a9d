"""What a command knows of Prefect's home before it imports Prefect (seconds): what it will
wait for, the local database, and the lock around a temporary server's first start there.

Its first start on a new Prefect home creates and migrates the SQLite database; two commands
started at once both migrated it and one died (``duplicate column name: infra_overrides``).
Prefect locks its migrations only within one process, so each start holds a file lock beside
the database until its server answers: the second start waits for the first, then finds the
database made. Importing Prefect takes seconds, and its temporary server 15-60 s more:
:func:`waiting_line` says so before either, from the environment alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def _settings_files() -> list[Path]:
    """The files besides the environment where Prefect may read its API URL or database."""
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    profiles = os.environ.get("PREFECT_PROFILES_PATH") or str(home / "profiles.toml")
    return [Path(profiles), Path(".env"), Path("prefect.toml"), Path("pyproject.toml")]


def _may_set_api_or_database(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace").lower()
    except OSError:
        return False
    if path.name == "pyproject.toml" and "tool.prefect" not in text:
        return False  # Prefect reads only its [tool.prefect] tables there
    return any(word in text for word in ("api_url", "connection_url", "[api]", "[server", "api."))


def glance_local_database() -> Path | None:
    """The local database Prefect's temporary server would use, told without importing Prefect
    (seconds): None unless neither the environment nor a settings file (profiles, .env,
    prefect.toml, pyproject.toml) may set an API URL or database."""
    if any(
        key.endswith(("API_URL", "DATABASE_CONNECTION_URL", "_PROFILE"))
        for key in os.environ
        if key.startswith("PREFECT_")
    ):
        return None
    if any(_may_set_api_or_database(path) for path in _settings_files()):
        return None
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    return home / "prefect.db"


def waiting_line() -> str:
    """What a run waits for before its flow starts, for the command's first line."""
    api = os.environ.get("PREFECT_API_URL")
    if api:
        return f"checking the config and inputs, then starting the run on the Prefect API at {api}"
    return (
        "checking the config and inputs, then starting Prefect's temporary server (15-60 s; "
        "with PREFECT_API_URL set to a running server it is at once)"
    )


@contextlib.contextmanager
def first_start_lock(database: Path | None) -> Iterator[None]:
    """Held while a temporary server starts on ``database`` (its migrations): one start at a
    time per database, across processes; released when this process ends, however it ends."""
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    lock = database.parent / f".{database.name}.eagle3-datagen-start.lock"
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"eagle3-datagen: waiting for another command's Prefect temporary server to "
                f"finish starting on {database}",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

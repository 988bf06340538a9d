"""What a command tells of Prefect before importing it (seconds): the local database when
nothing may point Prefect elsewhere, else nothing (the slow, exact path decides); and the lock
that makes one temporary server's first start wait for another's (real processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eagle3_datagen_cli.prefect_home import first_start_lock, glance_local_database


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import os

    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_local_database_is_told_only_when_nothing_may_move_it(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert glance_local_database() == clean / "home" / "prefect.db"
    (clean / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert glance_local_database() == clean / "home" / "prefect.db"  # not Prefect's table
    (clean / "prefect.toml").write_text('[api]\nurl = "http://x:4200/api"\n')
    assert glance_local_database() is None
    (clean / "prefect.toml").unlink()
    monkeypatch.setenv("PREFECT_API_URL", "http://x:4200/api")
    assert glance_local_database() is None


_HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eagle3_datagen_cli.prefect_home import first_start_lock

    with first_start_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def test_a_second_start_waits_for_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "home" / "prefect.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(database), "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with first_start_lock(database):
            # Only once the other process let go.
            assert holder.wait(30) == 0
        said = capsys.readouterr().err
        assert said.startswith("eagle3-datagen: waiting for another command's Prefect"), said
    finally:
        holder.kill()
        holder.wait()
    with first_start_lock(database):  # free again: no wait, nothing said
        pass
    assert capsys.readouterr().err == ""

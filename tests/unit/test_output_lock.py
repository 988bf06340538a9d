"""The output directory's partition locks, held and contested by real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from eagle3_datagen.errors import OutputLockedError
from eagle3_datagen.write.lock import LOCKS_DIR, PartitionLocks
from tests.support import wait_until

# A run in another process: takes the locks, says so, holds them for HOLD_S, then releases.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from eagle3_datagen.write.lock import PartitionLocks
    from eagle3_datagen.errors import OutputLockedError
    out, parts, run_id, hold_s, wait_s, start_at = sys.argv[1:7]
    time.sleep(max(0.0, float(start_at) - time.time()))  # takers start together
    locks = PartitionLocks(out, parts.split(","), run_id=run_id, run_name="night-" + run_id,
                           wait_s=float(wait_s), poll_s=0.05)
    try:
        locks.acquire()
    except OutputLockedError as err:
        print("refused", err, flush=True)
        sys.exit(3)
    print("held", flush=True)
    time.sleep(float(hold_s))
    locks.release()
    print("released", flush=True)
    """
)


def _holder(
    out: Path, parts: str, run_id: str, hold_s: float = 60, wait_s: float = 0, start_at: float = 0
) -> subprocess.Popen[str]:
    args = [str(out), parts, run_id, str(hold_s), str(wait_s), str(start_at)]
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, *args],
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_held(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"


def test_second_run_refuses_at_once_naming_the_holder(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "a,b", "run-1")
    try:
        _wait_held(proc)
        t0 = time.monotonic()
        with pytest.raises(OutputLockedError) as caught:
            PartitionLocks(tmp_path, ["b", "c"], run_id="run-2").acquire()
        assert time.monotonic() - t0 < 2
        msg = str(caught.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}" in msg
        assert "flow run 'night-run-1' (run-1)" in msg
        assert "partition b by" in msg and "partition a" not in msg
        # All or none: c was free but is not left locked by the refused run.
        assert not (tmp_path / LOCKS_DIR / "c.lock").exists()
        # Another partition of the same directory (a fan-out's other job) is free.
        with PartitionLocks(tmp_path, ["c"], run_id="run-3"):
            assert (tmp_path / LOCKS_DIR / "c.lock").exists()
        assert not (tmp_path / LOCKS_DIR / "c.lock").exists()
    finally:
        proc.kill()
        proc.wait()


def test_waits_for_the_holder_when_asked(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "a", "run-1", hold_s=1.5)
    try:
        _wait_held(proc)
        locks = PartitionLocks(tmp_path, ["a"], run_id="run-2", wait_s=30, poll_s=0.05)
        t0 = time.monotonic()
        notes = locks.acquire()
        waited = time.monotonic() - t0
        assert proc.wait(timeout=10) == 0
        assert 0.5 < waited < 10
        assert notes[0].startswith(f"waiting for {tmp_path} is in use by another run")
        held = orjson.loads((tmp_path / LOCKS_DIR / "a.lock").read_bytes())
        assert held["pid"] == os.getpid() and held["run_id"] == "run-2"
        locks.release()
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "a", "run-1")
    _wait_held(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / LOCKS_DIR / "a.lock").exists()  # a killed run releases nothing
    with PartitionLocks(tmp_path, ["a"], run_id="run-2") as locks:
        assert len(locks.notes) == 1
        assert f"pid {proc.pid} no longer runs" in locks.notes[0]
        assert "night-run-1" in locks.notes[0]


def test_lock_of_a_killed_run_not_yet_reaped_is_taken_over(tmp_path: Path) -> None:
    """A holder killed but not yet waited for (a zombie: its parent, e.g. a worker, has not
    reaped it) has exited: its lock is stale, though its pid still answers signal 0."""
    proc = _holder(tmp_path, "a", "run-1")
    _wait_held(proc)
    os.kill(proc.pid, signal.SIGKILL)
    stat = Path(f"/proc/{proc.pid}/stat")
    wait_until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", timeout_s=30)
    os.kill(proc.pid, 0)  # still signalable: the old check counted it alive
    try:
        with PartitionLocks(tmp_path, ["a"], run_id="run-2") as locks:
            assert f"pid {proc.pid} no longer runs" in locks.notes[0]
    finally:
        proc.wait()


def _foreign_lock(out: Path, name: str, age_s: float) -> Path:
    path = out / LOCKS_DIR / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {
        "host": "gpu-node-7",
        "pid": 4242,
        "pid_start": "1",
        "run_id": "r-7",
        "run_name": "nightly-7",
        "acquired_at": "2026-11-30T01:00:00+00:00",
        "token": "t",
    }
    path.write_bytes(orjson.dumps(holder))
    now = time.time()
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_other_hosts_lock_is_held_while_its_lease_is_renewed(tmp_path: Path) -> None:
    _foreign_lock(tmp_path, "a", age_s=5)
    with pytest.raises(OutputLockedError, match="pid 4242 on host gpu-node-7"):
        PartitionLocks(tmp_path, ["a"], lease_s=60).acquire()
    _foreign_lock(tmp_path, "a", age_s=120)
    with PartitionLocks(tmp_path, ["a"], lease_s=60) as locks:
        assert "lease was not renewed for 120 s" in locks.notes[0]


def test_holder_renews_its_lease_and_notices_a_takeover(tmp_path: Path) -> None:
    locks = PartitionLocks(tmp_path, ["a"], lease_s=0.4)
    locks.acquire()
    path = tmp_path / LOCKS_DIR / "a.lock"
    old = time.time() - 100
    os.utime(path, (old, old))
    wait_until(lambda: path.stat().st_mtime > old + 50, timeout_s=30)  # the renewer touched it
    _foreign_lock(tmp_path, "a", age_s=0)  # another run took it over
    wait_until(lambda: locks.lost, timeout_s=30)
    assert locks.lost == ["a"]
    locks.release()
    assert path.exists()  # the other run's lock is not ours to remove


def test_only_one_of_many_takers_wins_a_stale_lock(tmp_path: Path) -> None:
    dead = _holder(tmp_path, "a", "run-0")
    _wait_held(dead)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    start_at = time.time() + 4  # after every taker has imported the module
    takers = [_holder(tmp_path, "a", f"run-{i}", 3, 0, start_at) for i in range(1, 6)]
    outs = []
    for proc in takers:
        out, _ = proc.communicate(timeout=60)
        outs.append(out.split()[0])
    assert outs.count("held") == 1, outs
    assert outs.count("refused") == 4, outs

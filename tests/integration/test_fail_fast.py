"""One rule for every fault no retry can fix: the run stops every partition within the health
deadline + 30 s, with one message naming the cause, and retries no batch for it.

Each test runs the CLI as a child process with two partitions against real emulator processes,
injects one fault once requests flow, and measures from the fault to the run's exit. The faults
are real: servers killed, a real tmpfs filled up, the output directory bind-mounted read-only
(both need root and ``mount``; skipped otherwise), the input file deleted or rewritten, the
server restarted with another API key.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.emulator import EmulatorProcess, read_ledger
from tests.support.pipeline import CliRun, base_config
from tests.support.prompts import prompt_line, write_prompts

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.slow]

HEALTH_DEADLINE_S = 10
BOUND_S = HEALTH_DEADLINE_S + 30
SLOW_EMULATOR = ("--emu-running-slots", "8", "--emu-decode-ms-per-token", "1")


def _config(tmp_path: Path, url: str, **server: Any) -> tuple[dict[str, Any], Path]:
    """Two partitions of 1200 lines each (batches of 8) attached to ``url``."""
    data = base_config(tmp_path, write_prompts(tmp_path / "a.jsonl", 1200, words=20))
    write_prompts(tmp_path / "b.jsonl", 1200, words=20, first=5000)
    data["server"] = {
        "mode": "attach",
        "url": url,
        "recovery_check_s": HEALTH_DEADLINE_S,
        "request_timeout_s": 30,
        **server,
    }
    data["tiers"][0]["concurrency"] = 8
    data["partitions"] = [
        {"name": "a", "input": str(tmp_path / "a.jsonl"), "tier": "SHORT"},
        {"name": "b", "input": str(tmp_path / "b.jsonl"), "tier": "SHORT"},
    ]
    data["batch_size"] = 8
    return data, tmp_path / "run.yaml"


def _start(data: dict[str, Any], cfg: Path, tmp_path: Path) -> CliRun:
    cfg.write_text(yaml.safe_dump(data))
    return CliRun(cfg, tmp_path / "run.log")


def _generated(*ledgers: Path, n: int = 40) -> Callable[[], bool]:
    """Both partitions under way: ``n`` answers each (rids are ``run:partition:line:try``)."""

    def enough() -> bool:
        per: dict[str, int] = {}
        for ledger in ledgers:
            for e in read_ledger(ledger):
                part = e["rid"].split(":")[1]
                per[part] = per.get(part, 0) + 1
        return per.get("a", 0) >= n and per.get("b", 0) >= n

    return enough


def _fails_fast(run: CliRun, since: float, cause: str) -> str:
    """The run exits non-zero within the bound of ``since``, once naming ``cause``, with no
    batch retried for it; returns its output."""
    status = run.wait(BOUND_S + 60)
    took = time.monotonic() - since
    out = run.log.read_text(errors="replace")
    assert status != 0, out[-3000:]
    print(f"stopped {took:.1f} s after the fault ({cause!r})")
    assert took <= BOUND_S, f"the run took {took:.0f} s to stop:\n{out[-3000:]}"
    assert out.count("stopping every partition") == 1, out[-3000:]
    stop_line = next(line for line in out.splitlines() if "stopping every partition" in line)
    assert cause in stop_line, stop_line
    assert "AwaitingRetry" not in out, "a batch was retried for a fault no retry can fix"
    assert cause in out.splitlines()[-1] or cause in out[-2000:], out[-3000:]
    return out


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Mount points made by a test; unmounted (lazily) at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    made: list[Path] = []
    yield made
    for mnt in reversed(made):
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _mount(made: list[Path], *args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    made.append(Path(args[-1]))


def _remount_read_only(mnt: Path) -> None:
    """``mount -o remount,bind,ro``; the kernel refuses it ("mount point is busy") while a
    file opened through the new bind mount is open for writing (a shard the run is writing
    right then), so it is tried again until that file is closed."""
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], capture_output=True)
        if done.returncode == 0 or time.monotonic() > deadline or b"busy" not in done.stderr:
            break
        time.sleep(0.05)
    assert done.returncode == 0, done.stderr


def test_every_server_of_a_pool_lost(tmp_path: Path, emulator_factory: Any) -> None:
    ledgers = [tmp_path / "l1.jsonl", tmp_path / "l2.jsonl"]
    emus: list[EmulatorProcess] = [
        emulator_factory(*SLOW_EMULATOR, ledger=ledger) for ledger in ledgers
    ]
    for emu in emus:
        emu.wait_ready()
    data, cfg = _config(tmp_path, ",".join(e.url for e in emus))
    run = _start(data, cfg, tmp_path)
    try:
        run.wait_while_running(_generated(*ledgers), timeout_s=180)
        for emu in emus:
            os.kill(emu.proc.pid, signal.SIGKILL)
        out = _fails_fast(run, time.monotonic(), "every server of the pool")
    finally:
        if run.proc.poll() is None:  # a run that hung must not outlive its test
            run.proc.kill()
            run.proc.wait(30)
    assert all(e.url in out for e in emus)


def test_a_full_disk(tmp_path: Path, emulator_factory: Any, mounts: list[Path]) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount(mounts, "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk))
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*SLOW_EMULATOR, ledger=ledger).wait_ready()
    data, cfg = _config(tmp_path, emu.url)
    data["output_dir"] = str(disk / "out")
    # Made before the run: on a fast machine the run's own files may fill the 16 MB before the
    # test gets to it, and creating a file on a full tmpfs fails too.
    # Unbuffered: a write cut short by the full disk leaves nothing to flush at close (a
    # buffered file raised ENOSPC again there when the run took some of the space first).
    with (disk / "filler").open("wb", buffering=0) as fh:
        run = _start(data, cfg, tmp_path)
        run.wait_while_running(_generated(ledger), timeout_s=180)
        with pytest.raises(OSError) as full:
            while True:  # until the disk is full, whatever the run writes meanwhile
                fh.write(b"\0" * (1 << 20))
        assert full.value.errno == errno.ENOSPC, full.value
    _fails_fast(run, time.monotonic(), "No space left on device")


def test_a_read_only_output_directory(
    tmp_path: Path, emulator_factory: Any, mounts: list[Path]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*SLOW_EMULATOR, ledger=ledger).wait_ready()
    data, cfg = _config(tmp_path, emu.url)
    out = tmp_path / "out"
    run = _start(data, cfg, tmp_path)
    run.wait_while_running(_generated(ledger), timeout_s=180)
    # What the kernel does to a file system after an I/O error (errors=remount-ro): files
    # open for writing keep working, every new write is refused.
    _mount(mounts, "--bind", str(out), str(out))
    _remount_read_only(out)
    _fails_fast(run, time.monotonic(), "Read-only file system")


def test_an_input_file_deleted(tmp_path: Path, emulator_factory: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*SLOW_EMULATOR, ledger=ledger).wait_ready()
    data, cfg = _config(tmp_path, emu.url)
    run = _start(data, cfg, tmp_path)
    run.wait_while_running(_generated(ledger), timeout_s=180)
    (tmp_path / "b.jsonl").unlink()
    _fails_fast(run, time.monotonic(), f"{tmp_path / 'b.jsonl'}: cannot read input")


def test_an_input_file_changed(tmp_path: Path, emulator_factory: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*SLOW_EMULATOR, ledger=ledger).wait_ready()
    data, cfg = _config(tmp_path, emu.url)
    run = _start(data, cfg, tmp_path)
    run.wait_while_running(_generated(ledger), timeout_s=180)
    # Rewritten in place (same name), every line another prompt: no batch reads what was planned.
    (tmp_path / "a.jsonl").write_text("".join(prompt_line(i, 21) + "\n" for i in range(1200)))
    _fails_fast(run, time.monotonic(), f"{tmp_path / 'a.jsonl'}: changed while partition 'a'")


def test_the_server_back_with_another_api_key(
    tmp_path: Path, emulator_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAILFAST_KEY", "first-key")
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*SLOW_EMULATOR, "--api-key", "first-key", ledger=ledger).wait_ready()
    data, cfg = _config(tmp_path, emu.url, api_key_env="FAILFAST_KEY")
    run = _start(data, cfg, tmp_path)
    run.wait_while_running(_generated(ledger), timeout_s=180)
    # Restarted where it was, with a rotated key: every request is refused from now on.
    killed = time.monotonic()
    os.kill(emu.proc.pid, signal.SIGKILL)
    emu.proc.wait()
    emulator_factory(*SLOW_EMULATOR, "--api-key", "rotated-key", port=emu.port).wait_ready()
    _fails_fast(run, killed, "API key")

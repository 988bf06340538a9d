"""Real processes, real HTTP: the emulator launched as the engine, gated, checked and stopped."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eagle3_datagen.errors import PreflightError, ServerStartupError
from eagle3_datagen.processes import pid_alive, process_start_time
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.health import wait_until_healthy
from eagle3_datagen.sglang.launch_command import build_launch_command, resolve_api_key
from eagle3_datagen.sglang.orphans import (
    ServerRecord,
    kill_recorded,
    reap_orphans,
    write_record,
)
from eagle3_datagen.sglang.preflight import preflight
from eagle3_datagen.sglang.process import ServerProcess, server_log_path, server_state_dir
from tests.support import TOKENIZER_DIR, free_port
from tests.support.servers import Cleanup, emulator_spec, model_spec, wait_gone

pytestmark = pytest.mark.timeout(60)


async def test_normal_start_passes_gate_and_preflight(tmp_path: Path, cleanup: Cleanup) -> None:
    spec = emulator_spec(free_port())
    sp = cleanup.server(
        ServerProcess.for_spec(spec, model_spec(), output_dir=tmp_path, run_key="run-1")
    )
    async with sp:
        pidfile = json.loads(sp.pidfile.read_text())
        assert pidfile["pid"] == pidfile["pgid"] == sp.pid
        assert pidfile["owner_pid"] == os.getpid()
        assert pidfile["owner_run_key"] == "run-1"
        assert pidfile["start_time"] == process_start_time(sp.pid)
        assert pidfile["cmd"][1:3] == ["-m", "sglang_emulator"]
        assert os.getpgid(sp.pid) == sp.pid  # its own process group
        async with SGLangClient(spec.base_url) as client:
            waited = await wait_until_healthy(client, deadline_s=30, process=sp)
            assert waited < 30
            facts = await preflight(client, server=spec, model=model_spec())
        assert facts.context_length > 0
        assert facts.version
        assert facts.server_args["tp_size"] == 8
        assert facts.fits(facts.context_length, 1) is not None
        pid = sp.pid
    # __aexit__ stopped it: no process, no pidfile.
    assert not pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not sp.pidfile.exists()
    assert sp.stop() == sp.returncode  # idempotent
    assert server_log_path(tmp_path, spec.port).exists()


async def test_slow_start_passes_and_reports_progress(
    tmp_path: Path, cleanup: Cleanup, caplog: pytest.LogCaptureFixture
) -> None:
    spec = emulator_spec(free_port(), "--emu-startup-refuse-s", "2", "--emu-startup-503-s", "2")
    sp = cleanup.server(
        ServerProcess.for_spec(spec, model_spec(), output_dir=tmp_path, run_key="slow")
    )
    log = logging.getLogger("test.slow")
    with caplog.at_level(logging.INFO, logger="test.slow"), sp:
        waited = await wait_until_healthy(
            spec.base_url, deadline_s=30, process=sp, progress_every_s=1.0, logger=log
        )
    assert waited >= 3.5
    progress = [r.getMessage() for r in caplog.records if "waiting for server" in r.getMessage()]
    assert len(progress) >= 2, caplog.text
    assert any("log: (no output yet)" not in m for m in progress), progress


async def test_death_during_startup_raises_with_exit_code_and_log(
    tmp_path: Path, cleanup: Cleanup
) -> None:
    message = "RuntimeError: CUDA out of memory (emulated)"
    spec = emulator_spec(free_port(), "--emu-die-during-startup", message)
    sp = cleanup.server(
        ServerProcess.for_spec(spec, model_spec(), output_dir=tmp_path, run_key="dies")
    )
    started = time.monotonic()
    with sp, pytest.raises(ServerStartupError) as info:
        await wait_until_healthy(spec.base_url, deadline_s=30, process=sp)
    assert time.monotonic() - started < 20  # at once, not at the deadline
    text = str(info.value)
    assert "exited with code 1" in text
    assert message in text


async def test_deadline_names_elapsed_time(tmp_path: Path) -> None:
    with pytest.raises(ServerStartupError, match=r"not healthy after 1 s \(deadline 1 s"):
        await wait_until_healthy(
            f"http://127.0.0.1:{free_port()}", deadline_s=1.0, log_path=tmp_path / "none.log"
        )


async def test_reasoning_parser_fails_preflight(tmp_path: Path, cleanup: Cleanup) -> None:
    spec = emulator_spec(free_port())
    cmd = [*build_launch_command(spec, model_spec()), "--reasoning-parser", "kimi_k2"]
    sp = cleanup.server(
        ServerProcess(
            cmd, log_path=tmp_path / "s.log", state_dir=server_state_dir(tmp_path), run_key="rp"
        )
    )
    with sp:
        async with SGLangClient(spec.base_url) as client:
            await wait_until_healthy(client, deadline_s=30, process=sp)
            with pytest.raises(PreflightError, match="--reasoning-parser kimi_k2"):
                await preflight(client, server=spec, model=model_spec())


def test_stop_kills_the_whole_group_and_escalates(tmp_path: Path, cleanup: Cleanup) -> None:
    """A server that ignores SIGTERM and has a child: stop() SIGKILLs the group after grace."""
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print('CHILD-PID', child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    sp = cleanup.server(
        ServerProcess(
            [sys.executable, "-c", script],
            log_path=tmp_path / "s.log",
            state_dir=tmp_path / "state",
            run_key="stubborn",
            grace_s=0.5,
        )
    )
    sp.start()
    deadline = time.monotonic() + 10
    child = None
    while child is None and time.monotonic() < deadline:
        for line in (tmp_path / "s.log").read_text().splitlines():
            if line.startswith("CHILD-PID "):
                child = cleanup.pid(int(line.split()[1]))
        time.sleep(0.05)
    assert child is not None and pid_alive(child)
    started = time.monotonic()
    code = sp.stop()
    assert code == -signal.SIGKILL
    assert time.monotonic() - started < 5
    assert wait_gone(child, 2.0)
    assert not pid_alive(sp.pid)
    assert sp.stop() == code  # idempotent


def test_server_output_is_redacted(tmp_path: Path, cleanup: Cleanup) -> None:
    """Real SGLang logs ``server_args=ServerArgs(..., api_key='...')``; the log must not keep it."""
    key = "sk-e3test-echo-0123456789"
    script = (
        "import sys\n"
        "print('server_args=ServerArgs(api_key=%r)' % sys.argv[-1], flush=True)\n"
        "sys.stderr.write('loading 50%\\rloading 100% ' + sys.argv[-1] + '\\n')\n"
        "sys.stdout.write('no newline at the end ' + sys.argv[-1])\n"
    )
    sp = cleanup.server(
        ServerProcess(
            [sys.executable, "-c", script, "--api-key", key],
            log_path=tmp_path / "s.log",
            state_dir=tmp_path / "state",
            run_key="echo",
            secrets=[key],
        )
    )
    with sp:
        assert sp._proc is not None
        assert sp._proc.wait(timeout=10) == 0
    text = (tmp_path / "s.log").read_bytes().decode()  # keep the \r
    assert key not in text
    assert "server_args=ServerArgs(api_key='***')" in text
    assert "loading 50%\rloading 100% ***" in text
    assert text.endswith("no newline at the end ***")


def test_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        sp = ServerProcess.for_spec(
            emulator_spec(port), model_spec(), output_dir=tmp_path, run_key="busy"
        )
        with pytest.raises(ServerStartupError, match=f"port {port} .* already in use"):
            sp.start()
    assert not sp.pidfile.exists()


def test_kill_recorded_from_another_process_view(tmp_path: Path, cleanup: Cleanup) -> None:
    """What a Prefect hook does: knows only the state dir and the run key."""
    spec = emulator_spec(free_port())
    sp = cleanup.server(
        ServerProcess.for_spec(spec, model_spec(), output_dir=tmp_path, run_key="flow-run-42")
    )
    sp.start()
    assert kill_recorded(server_state_dir(tmp_path), "flow-run-42", grace_s=5) == sp.pid
    assert wait_gone(sp.pid, 2.0)
    assert not sp.pidfile.exists()
    assert kill_recorded(server_state_dir(tmp_path), "flow-run-42") is None
    sp.stop()  # still fine afterwards


OWNER = """
import sys, time
from eagle3_datagen.config import ModelSpec, ServerSpec
from eagle3_datagen.sglang.process import ServerProcess
out, port, pdeath, model = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
sp = ServerProcess.for_spec(ServerSpec(engine="emulator", port=port), ModelSpec(path=model),
                            output_dir=out, run_key="owner-run", pdeathsig=pdeath)
sp.start()
print(sp.pid, flush=True)
time.sleep(120)
"""


def _start_owner(
    tmp_path: Path, cleanup: Cleanup, pdeathsig: bool
) -> tuple[subprocess.Popen[str], int]:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER,
            str(tmp_path),
            str(free_port()),
            "1" if pdeathsig else "0",
            str(TOKENIZER_DIR),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    cleanup.pid(owner.pid)
    assert owner.stdout is not None
    server_pid = cleanup.pid(int(owner.stdout.readline()))
    assert pid_alive(server_pid)
    return owner, server_pid


def test_reap_orphans_kills_server_of_sigkilled_owner(tmp_path: Path, cleanup: Cleanup) -> None:
    owner, server_pid = _start_owner(tmp_path, cleanup, pdeathsig=False)
    state = server_state_dir(tmp_path)
    assert reap_orphans(state) == []  # owner alive: not an orphan
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    time.sleep(0.3)  # a gap, not a wait: whatever would kill the server on its own has its chance
    assert pid_alive(server_pid)  # nothing else killed it
    assert reap_orphans(state, grace_s=5) == [server_pid]  # the next run
    assert wait_gone(server_pid, 2.0)
    assert list(state.glob("*.json")) == []


def test_parent_death_signal_stops_server(tmp_path: Path, cleanup: Cleanup) -> None:
    owner, server_pid = _start_owner(tmp_path, cleanup, pdeathsig=True)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert wait_gone(server_pid, 10.0)
    # The stale pidfile is cleaned up by the next run without killing anything.
    assert reap_orphans(server_state_dir(tmp_path)) == []
    assert list(server_state_dir(tmp_path).glob("*.json")) == []


def test_recycled_pid_is_never_killed(tmp_path: Path, cleanup: Cleanup) -> None:
    """A record whose pid now belongs to another process (other start time) is dropped only."""
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    cleanup.pid(bystander.pid)
    start = process_start_time(bystander.pid)
    assert start is not None
    state = tmp_path / "state"
    write_record(
        state / "old.json",
        ServerRecord(
            pid=bystander.pid,
            pgid=bystander.pid,
            start_time=start - 1,
            owner_pid=bystander.pid,
            owner_start_time=start - 1,
            owner_run_key="old",
            cmd=[],
            started_at="",
            log_path="",
        ),
    )
    assert reap_orphans(state, grace_s=1) == []
    assert kill_recorded(state, "old") is None
    assert pid_alive(bystander.pid)
    bystander.kill()
    bystander.wait()


async def test_api_key_never_leaks(
    tmp_path: Path,
    cleanup: Cleanup,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = "sk-e3test-0123456789abcdef"
    monkeypatch.setenv("E3_TEST_API_KEY", key)
    spec = emulator_spec(free_port(), api_key_env="E3_TEST_API_KEY")
    api_key = resolve_api_key(spec)
    assert api_key == key
    sp = cleanup.server(
        ServerProcess.for_spec(
            spec, model_spec(), output_dir=tmp_path, run_key="keyed", api_key=api_key
        )
    )
    with caplog.at_level(logging.DEBUG), sp:
        pidfile_text = sp.pidfile.read_text()
        async with SGLangClient(spec.base_url, api_key=api_key) as client:
            await wait_until_healthy(client, deadline_s=30, process=sp, progress_every_s=0.2)
            facts = await preflight(client, server=spec, model=model_spec(), api_key=api_key)
        # As SGLang 0.5.23 does, the emulator reports the key in plaintext: only our
        # pre-flight's sanitize keeps it out of the facts that reach the manifest and logs.
        raw = httpx.get(
            f"{spec.base_url}/server_info", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert raw["api_key"] == key and key in raw["launch_command"]
        assert key in str(raw["internal_states"])
        r = httpx.post(
            f"{spec.base_url}/generate",
            json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
        )
        assert r.status_code == 401
        r = httpx.post(
            f"{spec.base_url}/generate",
            json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200
    assert key in sp.cmd  # it is passed to the server...
    assert key not in sp.display_cmd  # ...and shown nowhere
    assert key not in pidfile_text and "***" in pidfile_text
    assert key not in server_log_path(tmp_path, spec.port).read_text()
    assert key not in repr(facts)
    assert key not in caplog.text

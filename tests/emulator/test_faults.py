"""Ledger, fault injection, crash, queueing and the latency model's stats."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sglang_emulator.ledger import input_ids_sha256
from tests.support import wait_until
from tests.support.emulator import EmulatorFactory, EmulatorProcess

BODY: dict[str, Any] = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 64}}


def _status(emu: EmulatorProcess, body: dict[str, Any] = BODY) -> str:
    try:
        return str(emu.client.post("/generate", json=body, timeout=5.0).status_code)
    except httpx.TransportError:
        return "reset"


def test_ledger_equals_responses(
    emu: EmulatorProcess, ledger_path: Path, prompt: list[int]
) -> None:
    sent = {}
    for i in range(5):
        body = {"input_ids": prompt, "rid": f"ledger-{i}", "sampling_params": {"sampling_seed": i}}
        sent[f"ledger-{i}"] = emu.generate(body)
    sent["ledger-b"] = emu.generate({"input_ids": prompt[:-1], "rid": "ledger-b"})
    lines = [orjson.loads(x) for x in ledger_path.read_bytes().splitlines()]
    mine = {x["rid"]: x for x in lines if x["rid"].startswith("ledger-")}
    assert set(mine) == set(sent)
    for rid, out in sent.items():
        rec = mine[rid]
        assert rec["output_ids"] == out["output_ids"]
        assert rec["finish_reason"] == out["meta_info"]["finish_reason"]
        assert rec["prompt_tokens"] == out["meta_info"]["prompt_tokens"]
        assert set(rec) == {
            "rid",
            "input_ids_sha256",
            "prompt_tokens",
            "output_ids",
            "finish_reason",
            "ts",
        }
    assert mine["ledger-0"]["input_ids_sha256"] == input_ids_sha256(prompt)
    assert mine["ledger-b"]["input_ids_sha256"] == input_ids_sha256(prompt[:-1])


FAULT_FLAGS = [
    "--emu-fault-400-rate",
    "0.12",
    "--emu-fault-500-rate",
    "0.12",
    "--emu-fault-503-rate",
    "0.12",
    "--emu-fault-reset-rate",
    "0.12",
    "--emu-fault-abort-rate",
    "0.12",
]


def _outcome(emu: EmulatorProcess, body: dict[str, Any] = BODY) -> str:
    try:
        r = emu.client.post("/generate", json=body, timeout=5.0)
    except httpx.TransportError:
        return "reset"
    if r.status_code == 200:
        return str(r.json()["meta_info"]["finish_reason"]["type"])
    if r.status_code == 503:
        assert r.json()["code"] == 503
    return str(r.status_code)


def test_faults_are_seeded_and_spare_health_checks(emu_factory: EmulatorFactory) -> None:
    a, b, c = emu_factory.start_many(
        [*FAULT_FLAGS, "--emu-fault-seed", "11", "--random-seed", "0"],
        [*FAULT_FLAGS, "--emu-fault-seed", "11", "--random-seed", "0"],
        [*FAULT_FLAGS, "--emu-fault-seed", "12", "--random-seed", "0"],
    )
    seq = [_outcome(a) for _ in range(60)]
    assert {"400", "500", "503", "reset", "abort"} <= set(seq)
    assert set(seq) <= {"400", "500", "503", "reset", "abort", "stop", "length"}
    # health gates and the pipeline's preflight request are never faulted (nor drawn for)
    for _ in range(10):
        assert a.client.get("/health").status_code == 200
        assert _outcome(b, {**BODY, "rid": "preflight-1"}) in ("stop", "length")
        assert _outcome(b, {**BODY, "rid": "HEALTH_CHECK_x"}) in ("stop", "length")
    assert [_outcome(b) for _ in range(60)] == seq
    assert [_outcome(c) for _ in range(60)] != seq
    faults = a.client.get("/emulator/stats").json()["faults"]
    assert sum(faults.values()) == sum(1 for x in seq if x not in ("stop", "length"))


def test_abort_fault_returns_partial_output(
    emu: EmulatorProcess, emu_factory: EmulatorFactory, prompt: list[int]
) -> None:
    clean, faulty = emu, emu_factory.start("--emu-fault-abort-rate", "1")
    sp = {"max_new_tokens": 500, "sampling_seed": 1}
    full = clean.generate({"input_ids": prompt, "sampling_params": sp})["output_ids"]
    out = faulty.generate({"input_ids": prompt, "sampling_params": sp})
    assert out["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    ids = out["output_ids"]
    assert len(ids) < len(full) and ids == full[: len(ids)]
    assert out["meta_info"]["completion_tokens"] == len(ids)


def test_hang_fault_holds_the_request(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start("--emu-fault-hang-rate", "1", "--emu-hang-s", "0.6")
    slow = emu_factory.start("--emu-fault-hang-rate", "1", "--emu-hang-s", "3600", wait=False)
    t0 = time.monotonic()
    assert _status(emu) == "200"
    assert time.monotonic() - t0 >= 0.6
    try:
        emu.client.post("/generate", json=BODY, timeout=0.3)
        raise AssertionError("expected the request to hang past the client timeout")
    except httpx.ReadTimeout:
        pass
    slow.wait_ready()

    def hold() -> None:
        try:
            httpx.post(f"{slow.url}/generate", json=BODY, timeout=10)
        except httpx.TransportError:
            pass

    holder = threading.Thread(target=hold)
    holder.start()
    wait_until(lambda: slow.client.get("/emulator/stats").json()["faults"].get("hang") == 1)
    t0 = time.monotonic()
    assert slow.stop() == 0  # SIGTERM does not wait out a request hung for an hour
    assert time.monotonic() - t0 < 5
    holder.join(10)


def test_crash_after_n_requests(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start("--emu-crash-after", "3")
    assert _status(emu, {**BODY, "rid": "preflight"}) == "200"  # exempt: not counted
    assert [_status(emu), _status(emu)] == ["200", "200"]
    assert _status(emu) == "reset"
    assert emu.proc.wait(5) == 1
    assert "--emu-crash-after" in emu.stderr


@pytest.fixture(scope="module")
def slow_emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """2 decode slots, 2 queue places, 10 ms per output token, prefill at 1000 tokens/s."""
    factory = EmulatorFactory(tmp_path_factory.mktemp("slow"))
    yield factory.start(
        "--emu-running-slots",
        "2",
        "--emu-decode-ms-per-token",
        "10",
        "--emu-prefill-tokens-per-s",
        "1000",
        "--max-queued-requests",
        "2",
    )
    factory.stop_all()


def test_queue_full_duplicate_rid_and_stats(slow_emu: EmulatorProcess, prompt: list[int]) -> None:
    emu = slow_emu
    emu.client.post("/emulator/reset_stats")
    sp = {"max_new_tokens": 100, "ignore_eos": True}  # 1 s of decode each
    results: dict[str, Any] = {}

    def call(rid: str) -> None:
        body = {"input_ids": prompt, "rid": rid, "sampling_params": sp}
        with httpx.Client(base_url=emu.url, timeout=30) as c:  # one connection per thread
            results[rid] = c.post("/generate", json=body)

    threads = [threading.Thread(target=call, args=(f"job-{i}",)) for i in range(4)]
    for t in threads:
        t.start()

    def all_in() -> bool:
        stats = emu.client.get("/emulator/stats").json()
        return bool(stats["running"] + stats["queued"] == 4)

    wait_until(all_in)
    stats = emu.client.get("/emulator/stats").json()
    assert stats["running"] == 2 and stats["queued"] == 2 and stats["slots"] == 2
    dup = emu.client.post("/generate", json={"input_ids": prompt, "rid": "job-0"})
    assert dup.status_code == 400
    assert dup.json() == {"error": {"message": "Duplicate request ID detected: job-0"}}
    full = emu.client.post("/generate", json={"input_ids": prompt, "rid": "one-too-many"})
    assert full.status_code == 503
    assert full.json() == {
        "object": "error",
        "message": "The request queue is full.",
        "type": "503",
        "param": None,
        "code": 503,
    }
    for t in threads:
        t.join(30)
    for r in results.values():
        assert r.status_code == 200
        out = r.json()
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 100}
        assert len(out["output_ids"]) == 100
    stats = emu.client.get("/emulator/stats").json()
    assert stats["peak_running"] == 2 and stats["peak_queued"] == 2
    assert stats["running"] == 0 and stats["queued"] == 0
    assert stats["slot_busy_s"] >= 4 * 1.0  # four requests held a slot for 1 s of decode each
    assert stats["finish_types"] == {"length": 4}
    reset = emu.client.post("/emulator/reset_stats").json()
    assert reset["requests"] == 0 and reset["slot_busy_s"] == 0.0


def test_latency_model_paces_requests(slow_emu: EmulatorProcess) -> None:
    emu = slow_emu
    emu.client.post("/emulator/reset_stats")
    body = {"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    t0 = time.monotonic()
    emu.generate(body)
    assert time.monotonic() - t0 >= 0.1 + 0.4  # 100 tokens at 1000/s + 40 x 10 ms
    stats = emu.client.get("/emulator/stats").json()
    assert stats["output_tokens"] == 40 and stats["slots"] == 2 and stats["requests"] == 1
    assert stats["elapsed_s"] > 0.5 and 0.45 < stats["slot_busy_s"] < 1.0

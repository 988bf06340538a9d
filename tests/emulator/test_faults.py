"""Ledger, fault injection, crash, abort and the latency model's stats."""

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

from .conftest import Emu, EmuFactory

BODY: dict[str, Any] = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 64}}


def _status(emu: Emu, body: dict[str, Any] = BODY) -> str:
    try:
        return str(emu.client.post("/generate", json=body, timeout=5.0).status_code)
    except httpx.TransportError:
        return "reset"


def test_ledger_equals_responses(emu: Emu, ledger_path: Path, prompt: list[int]) -> None:
    sent = {}
    for i in range(5):
        body = {"input_ids": prompt, "rid": f"ledger-{i}", "sampling_params": {"sampling_seed": i}}
        sent[f"ledger-{i}"] = emu.generate(body)
    batch = emu.generate({"input_ids": [prompt, prompt[:-1]], "rid": "ledger-b"})
    sent.update({o["meta_info"]["id"]: o for o in batch})
    lines = [orjson.loads(x) for x in ledger_path.read_bytes().splitlines()]
    mine = {x["rid"]: x for x in lines if x["rid"].startswith("ledger-")}
    assert set(mine) == set(sent)
    for rid, out in sent.items():
        rec = mine[rid]
        assert rec["output_ids"] == out["output_ids"]
        assert rec["finish_reason"] == out["meta_info"]["finish_reason"]
        assert rec["prompt_tokens"] == out["meta_info"]["prompt_tokens"]
        assert set(rec) == {"rid", "input_ids_sha256", "prompt_tokens", "output_ids",
                            "finish_reason", "ts"}  # fmt: skip
    assert mine["ledger-0"]["input_ids_sha256"] == input_ids_sha256(prompt)
    assert mine["ledger-b_1"]["input_ids_sha256"] == input_ids_sha256(prompt[:-1])


FAULT_FLAGS = [
    "--emu-fault-400-rate", "0.12", "--emu-fault-500-rate", "0.12",
    "--emu-fault-503-rate", "0.12", "--emu-fault-reset-rate", "0.12",
    "--emu-fault-abort-rate", "0.12",
]  # fmt: skip


def _outcome(emu: Emu, body: dict[str, Any] = BODY) -> str:
    try:
        r = emu.client.post("/generate", json=body, timeout=5.0)
    except httpx.TransportError:
        return "reset"
    if r.status_code == 200:
        return str(r.json()["meta_info"]["finish_reason"]["type"])
    if r.status_code == 503:
        assert r.json()["code"] == 503
    return str(r.status_code)


def test_faults_are_seeded_and_spare_health_checks(emu_factory: EmuFactory) -> None:
    a, b, c = emu_factory.start_many(
        [*FAULT_FLAGS, "--emu-fault-seed", "11"],
        [*FAULT_FLAGS, "--emu-fault-seed", "11"],
        [*FAULT_FLAGS, "--emu-fault-seed", "12"],
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
    emu: Emu, emu_factory: EmuFactory, prompt: list[int]
) -> None:
    clean, faulty = emu, emu_factory.start("--emu-fault-abort-rate", "1")
    sp = {"max_new_tokens": 500, "sampling_seed": 1}
    full = clean.generate({"input_ids": prompt, "sampling_params": sp})["output_ids"]
    out = faulty.generate({"input_ids": prompt, "sampling_params": sp})
    assert out["meta_info"]["finish_reason"] == {
        "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
    }  # fmt: skip
    ids = out["output_ids"]
    assert len(ids) < len(full) and ids == full[: len(ids)]
    assert out["meta_info"]["completion_tokens"] == len(ids)


def test_hang_fault_holds_the_request(emu_factory: EmuFactory) -> None:
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
    time.sleep(0.2)
    t0 = time.monotonic()
    assert slow.stop() == 0  # SIGTERM does not wait out a request hung for an hour
    assert time.monotonic() - t0 < 5
    holder.join(10)


def test_crash_after_n_requests(emu_factory: EmuFactory) -> None:
    emu = emu_factory.start("--emu-crash-after", "3")
    assert _status(emu, {**BODY, "rid": "preflight"}) == "200"  # exempt: not counted
    assert [_status(emu), _status(emu)] == ["200", "200"]
    assert _status(emu) == "reset"
    assert emu.proc.wait(5) == 1
    assert "--emu-crash-after" in emu.stderr


@pytest.fixture(scope="module")
def slow_emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    """2 decode slots, 2 queue places, 10 ms per output token, prefill at 1000 tokens/s."""
    factory = EmuFactory(tmp_path_factory.mktemp("slow"))
    yield factory.start(
        "--emu-running-slots", "2", "--emu-decode-ms-per-token", "10",
        "--emu-prefill-tokens-per-s", "1000", "--max-queued-requests", "2",
    )  # fmt: skip
    factory.stop_all()


def test_abort_request_and_stats(slow_emu: Emu, prompt: list[int]) -> None:
    emu = slow_emu
    emu.client.post("/emulator/reset_stats")
    sp = {"max_new_tokens": 100, "ignore_eos": True}
    results: dict[str, Any] = {}

    def call(rid: str) -> None:
        body = {"input_ids": prompt, "rid": rid, "sampling_params": sp}
        results[rid] = emu.client.post("/generate", json=body)

    threads = [threading.Thread(target=call, args=(f"job-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = emu.client.get("/emulator/stats").json()
        if stats["running"] + stats["queued"] == 4:
            break
        time.sleep(0.01)
    assert stats["running"] == 2 and stats["queued"] == 2 and stats["slots"] == 2
    time.sleep(0.3)
    dup = emu.client.post("/generate", json={"input_ids": prompt, "rid": "job-0"})
    assert dup.status_code == 400 and "Duplicate request ID" in dup.json()["error"]["message"]
    full = emu.client.post("/generate", json={"input_ids": prompt, "rid": "one-too-many"})
    assert full.status_code == 503
    assert full.json() == {"object": "error", "message": "The request queue is full.",
                           "type": "503", "param": None, "code": 503}  # fmt: skip
    assert emu.client.post("/abort_request", json={"rid": "job-"}).status_code == 200
    for t in threads:
        t.join(10)
    reasons = {}
    for rid, r in results.items():
        assert r.status_code == 200
        out = r.json()
        reasons[rid] = out["meta_info"]["finish_reason"]["message"]
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(out["output_ids"]) < 100
    assert sorted(reasons.values()) == ["Abort in waiting queue"] * 2 + ["Aborted"] * 2
    stats = emu.client.get("/emulator/stats").json()
    assert stats["peak_running"] == 2 and stats["peak_queued"] == 2
    assert stats["running"] == 0 and stats["queued"] == 0
    assert 0.4 < stats["slot_busy_s"] < 1.5  # two slots busy for about 0.3 s each
    assert stats["finish_types"] == {"abort": 4}
    reset = emu.client.post("/emulator/reset_stats").json()
    assert reset["requests"] == 0 and reset["slot_busy_s"] == 0.0


def test_latency_model_paces_requests(slow_emu: Emu) -> None:
    emu = slow_emu
    emu.client.post("/emulator/reset_stats")
    body = {"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    t0 = time.monotonic()
    emu.generate(body)
    assert time.monotonic() - t0 >= 0.1 + 0.4  # 100 tokens at 1000/s + 40 x 10 ms
    stats = emu.client.get("/emulator/stats").json()
    assert stats["output_tokens"] == 40 and stats["slots"] == 2 and stats["requests"] == 1
    assert stats["elapsed_s"] > 0.5 and 0.45 < stats["slot_busy_s"] < 1.0


def test_stream_abort_mid_generation(slow_emu: Emu, prompt: list[int]) -> None:
    emu = slow_emu
    body = {"input_ids": prompt, "rid": "stream-abort", "stream": True,
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}  # fmt: skip
    # Its own connection: the fixture's client may be busy in this thread when the timer fires.
    abort = {"rid": "stream-"}
    threading.Timer(0.4, lambda: httpx.post(f"{emu.url}/abort_request", json=abort)).start()
    with (
        httpx.Client(base_url=emu.url, timeout=10) as c,
        c.stream("POST", "/generate", json=body) as r,
    ):
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    n = len(final["output_ids"])
    assert 10 < n < 100  # about 0.35 s of 10 ms tokens
    assert all(c["output_ids"] == final["output_ids"][: len(c["output_ids"])] for c in chunks)

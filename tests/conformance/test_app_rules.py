"""What SGLang 0.5.23's real app answers for the cases our client depends on."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conformance.process import REPO, RealAppProcess, model_dir
from tests.conformance import requires_sglang
from tests.support import health_codes

requires_sglang()
pytestmark = pytest.mark.conformance

KEY = "conformance-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
STOP = 664  # <|im_end|> of the bundled Kimi-style tokenizer ([EOS] is 663)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAppProcess]:
    work = tmp_path_factory.mktemp("real-app")
    proc = RealAppProcess(
        work,
        "--context-length",
        "4096",
        "--api-key",
        KEY,
        "--max-running-requests",
        "2",
        "--max-queued-requests",
        "1",
    )
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def post(app: RealAppProcess, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{app.url}/generate", json=body, headers=AUTH, timeout=30.0, **kw)


def test_stop_token_kept_and_counted(app: RealAppProcess) -> None:
    r = post(
        app,
        {
            "input_ids": [1, 2, 3],
            "rid": "ok-1",
            "sampling_params": {
                "max_new_tokens": 4000,
                "stop_token_ids": [STOP],
                "ignore_eos": False,
            },
        },
    )
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": STOP}
    assert body["output_ids"][-1] == STOP
    assert meta["completion_tokens"] == len(body["output_ids"])
    assert meta["prompt_tokens"] == 3
    entry = [a for a in app.answers() if a["rid"] == "ok-1"]
    assert entry and entry[0]["output_ids"] == body["output_ids"]


def test_length_finish(app: RealAppProcess) -> None:
    r = post(app, {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3}})
    meta = r.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert len(r.json()["output_ids"]) == 3


@pytest.mark.parametrize(
    ("n_in", "max_new", "status", "text"),
    [
        (3996, 100, 200, None),
        (3996, 101, 400, "Requested token count exceeds the model's maximum context length"),
        (4096, 1, 400, "The input (4096 tokens) is longer than the model's context length"),
        (4089, 1, 200, None),
        (4090, 1, 400, "Input length (4090 tokens) exceeds the maximum allowed length (4090"),
    ],
)
def test_length_rule_at_its_edges(
    app: RealAppProcess, n_in: int, max_new: int, status: int, text: str | None
) -> None:
    r = post(app, {"input_ids": [7] * n_in, "sampling_params": {"max_new_tokens": max_new}})
    assert r.status_code == status, r.text
    if text:
        assert text in r.json()["error"]["message"]


def test_each_kind_of_400(app: RealAppProcess) -> None:
    contract = post(app, {"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "foo": 1}})
    assert contract.status_code == 400
    assert isinstance(contract.json()["error"], str) and "foo" in contract.json()["error"]
    verify = post(app, {"input_ids": [1], "sampling_params": {"repetition_penalty": 0.0}})
    assert verify.status_code == 400
    assert "repetition_penalty" in verify.json()["error"]["message"]
    malformed = httpx.post(
        f"{app.url}/generate",
        content=b'{"input_ids": [1,',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert malformed.status_code == 400
    assert malformed.json()["object"] == "error" and malformed.json()["code"] == 400


def test_api_key(app: RealAppProcess) -> None:
    assert httpx.get(f"{app.url}/server_info").status_code == 401
    assert httpx.get(f"{app.url}/server_info", headers={"Authorization": "Bearer no"}).json() == {
        "error": "Unauthorized"
    }
    # /health* needs no key (utils/auth.py): our health gate cannot see a wrong key there.
    assert httpx.get(f"{app.url}/health", timeout=25).status_code == 200


def test_out_of_vocabulary_input_ids_are_accepted(app: RealAppProcess) -> None:
    r = post(app, {"input_ids": [10**6, 1], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200


def test_nan_substitution_is_a_string_matched_stop(app: RealAppProcess) -> None:
    r = post(
        app,
        {
            "input_ids": [1, 2],
            "rid": "x-conformance:nan",
            "sampling_params": {
                "max_new_tokens": 50,
                "stop_token_ids": [STOP],
                "ignore_eos": False,
            },
        },
    )
    body = r.json()
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "NaN happened"}
    assert body["output_ids"][-1] == STOP  # the substituted id looks like a real end of turn


def _send_in_thread(app: RealAppProcess, body: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(post(app, body)), daemon=True)
    t.start()
    return t, out


def test_duplicate_rid_in_flight_then_abort(app: RealAppProcess) -> None:
    body = {
        "input_ids": [1, 2],
        "rid": "dup-conformance:hold",
        "sampling_params": {"max_new_tokens": 5},
    }
    t, first = _send_in_thread(app, body)
    time.sleep(1.0)
    second = post(app, body)
    assert second.status_code == 400
    assert second.json()["error"]["message"] == (
        "Duplicate request ID detected: dup-conformance:hold"
    )
    # An exact rid: in single-tokenizer mode a rid the TokenizerManager does not hold is
    # dropped before the scheduler's prefix match (tokenizer_manager.py:2246-2253).
    httpx.post(f"{app.url}/abort_request", json={"rid": "dup-conformance:hold"}, headers=AUTH)
    t.join(10)
    assert first[0].status_code == 200
    assert first[0].json()["meta_info"]["finish_reason"]["type"] == "abort"


def test_queue_full_503(app: RealAppProcess) -> None:
    holds = [
        _send_in_thread(
            app,
            {
                "input_ids": [1],
                "rid": f"q{i}-conformance:hold",
                "sampling_params": {"max_new_tokens": 2},
            },
        )
        for i in range(3)  # 2 running + 1 waiting
    ]
    time.sleep(1.5)
    r = post(app, {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 503
    assert r.json()["message"] == "The request queue is full."
    for i in range(3):
        httpx.post(f"{app.url}/abort_request", json={"rid": f"q{i}-conformance:hold"}, headers=AUTH)
    for t, _ in holds:
        t.join(10)


def test_startup_refused_then_503_then_200(real_app: Any) -> None:
    proc = real_app("--fake-load-s", "3", "--fake-warmup-delay-s", "4")
    seen = health_codes(proc.url, timeout_s=120, request_timeout_s=25, interval_s=0.2)
    assert seen == [0, 503, 200], seen


def _server_info(proc: RealAppProcess) -> dict[str, Any]:
    return dict(httpx.get(f"{proc.url}/server_info", timeout=10).json())


def test_random_seed_resolved_per_launch(real_app: Any) -> None:
    a, b = real_app(), real_app()
    c = real_app("--random-seed", "1234")
    seeds = [_server_info(p.wait_ready())["random_seed"] for p in (a, b, c)]
    assert seeds[0] != seeds[1]
    assert seeds[2] == 1234
    info = _server_info(c)
    assert info["launch_command"].endswith("--random-seed 1234")
    assert isinstance(info["internal_states"], list) and info["version"] == "0.5.23"


def _parse(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance.server",
            "--model-path",
            str(model_dir(tmp_path)),
            *flags,
            "--fake-load-s",
            "600",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_unknown_flag_exits_2(tmp_path: Path) -> None:
    done = _parse(tmp_path, "--no-such-flag", "1")
    assert done.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag 1" in done.stderr

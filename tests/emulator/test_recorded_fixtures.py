"""The emulator replays what SGLang 0.5.23's real app answered (tests/fixtures/sglang-0.5.23,
recorded by conformance/record.py) and must agree on the status, the body's shape (keys and value
types, recursively) and the exact text our client reads (error messages, finish_reason,
meta_info's counts and id).

Each fixture's launch flags are the emulator's, with two stand-ins for the real app's CPU fake:
requests it held in flight (rid ``...conformance:hold``) are held here by a slow decode, and the
abort it got from ``/abort_request`` comes from the emulator's abort fault.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.sglang.chat_response import ChatRequest, served_message
from eagle3_datagen.sglang.client import GenerateResult, _error_message, generate_body
from eagle3_datagen.sglang.load import parse_loads
from eagle3_datagen.sglang.logprobs import NO_MASS
from eagle3_datagen.validate.logprobs import check_logprobs
from eagle3_datagen.validate.tokens import Verdict
from tests.support import REPO, TOKENIZER_DIR, health_codes, wait_until
from tests.support.emulator import EmulatorFactory, EmulatorProcess

FIXTURES = REPO / "tests" / "fixtures" / "sglang-0.5.23"
KEY = "replay-key"
HOLD = "conformance:hold"
# The real app's fake holds these rids until aborted; the emulator holds them by decoding slowly.
SLOW = ["--emu-decode-ms-per-token", "3000"]
ABORT = ["--emu-fault-abort-rate", "1"]
# The regenerated conversations' turns (generate_all_turns_*, generate_sample_*) script a tool
# call the real app answered within 51 tokens ('stop'); the emulator draws its reasoning length
# before the call, so it is kept short enough that the call fits the request's 256 new tokens
# (otherwise a long draw answers 'length' where the real app said 'stop').
SHORT_REASONING = ["--emu-mean-output-tokens", "48", "--emu-output-sigma", "0"]
# Harness flags of the recording and the emulator's flags for the same start-up phases.
STARTUP = {
    "--fake-load-s": "--emu-startup-refuse-s",
    "--fake-warmup-delay-s": "--emu-startup-503-s",
}
# What SGLang reports that the emulator does not: the server_info keys of SGLang's ~550 server
# args the pipeline never reads; the check is that every key the emulator sends is SGLang's.
SUBSET_PATHS = {"/server_info"}
EMULATOR_ONLY_KEYS = {"emulator"}
# null in the recording only because the CPU fake has no real scheduler: it has no start-up to
# time (on a GPU a dict of phase timings) and reports max_running_requests unresolved (SGLang's
# scheduler always resolves it to an int).
HARNESS_NULL = {"startup_time", "effective_max_running_requests_per_dp"}
# The CPU fake's scheduler reports only its own state per DP rank; SGLang's scheduler puts the
# resolved server args there too (managers/scheduler_components/internal_state.py:45-75), as
# the emulator does: there, every recorded key must be present, and more are allowed.
SCHEDULER_STATE = "internal_states[0]"


def load(kind: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text())
        if data["kind"] == kind:
            out.append((path.stem, data))
    return out


def substitute(value: Any) -> Any:
    return json.loads(json.dumps(value).replace("<api-key>", KEY))


def shape(value: Any) -> Any:
    """Keys and value types, recursively (a list: the set of its elements' shapes)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        shapes: list[Any] = []
        for v in value:
            s = shape(v)
            if s not in shapes:
                shapes.append(s)
        return shapes
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number" if isinstance(value, float) else "int"
    return "null" if value is None else type(value).__name__


def assert_same_shape(real: Any, emu: Any, where: str, subset: bool = False) -> None:
    if isinstance(real, dict) and isinstance(emu, dict) and where.endswith(SCHEDULER_STATE):
        assert set(real) <= set(emu), f"{where}: keys missing: {sorted(set(real) - set(emu))}"
        for k in set(real):
            if not (k in HARNESS_NULL and real[k] is None):
                assert_same_shape(real[k], emu[k], f"{where}.{k}")
        return
    if isinstance(real, dict) and isinstance(emu, dict):
        extra = set(emu) - set(real) - EMULATOR_ONLY_KEYS
        assert not extra, f"{where}: keys SGLang does not send: {sorted(extra)}"
        if not subset:
            missing = set(real) - set(emu)
            assert not missing, f"{where}: keys missing: {sorted(missing)}"
        for k in set(real) & set(emu):
            if k in HARNESS_NULL and real[k] is None:
                continue
            assert_same_shape(real[k], emu[k], f"{where}.{k}", subset)
        return
    if isinstance(real, list) and isinstance(emu, list):
        for r in real[:1]:
            for e in emu[:1]:
                assert_same_shape(r, e, f"{where}[0]", subset)
        return
    r, e = shape(real), shape(emu)
    if {r, e} == {"int", "number"}:
        return  # JSON numbers: 0.0 and 0 are one type to a reader
    assert r == e, f"{where}: SGLang sends {r} ({real!r}), the emulator {e} ({emu!r})"


def client_view(status: int, body: Any, text: str | None) -> dict[str, Any]:
    """What our client reads from an answer (sglang/client.py)."""
    if status != 200:
        raw = json.dumps(body).encode() if body is not None else (text or "").encode()
        return {"message": _normalise_message(_error_message(raw))}
    if not isinstance(body, dict) or "meta_info" not in body:
        return {}
    meta = body["meta_info"]
    finish = meta["finish_reason"]
    return {
        "id": meta["id"],
        "finish_type": finish["type"],
        "finish_message": finish.get("message"),
        "prompt_tokens": meta["prompt_tokens"],
        "completion_tokens_is_len": meta["completion_tokens"] == len(body["output_ids"]),
    }


def _normalise_message(message: str) -> str:
    """Volatile parts of FastAPI's validation text: the traceback and the parser's offsets."""
    message = message.split("\n\n")[0]
    message = re.sub(r"\('body', \d+\)", "('body', N)", message)
    return re.sub(r"'ctx': \{'error': '[^']*'\}", "'ctx': {'error': E}", message)


@pytest.fixture(scope="module")
def kimi() -> ChatTokenizer:
    return ChatTokenizer(str(TOKENIZER_DIR))


def sglang_parsed() -> dict[str, dict[str, Any]]:
    """SGLang's own chat response to the real app's recorded answers (``recorded_<fixture>``
    cases of ``conformance/chat_response.py``): its request and the message it returned."""
    doc = json.loads((FIXTURES / "chat-response" / "kimi-k2.5-mini.json").read_text())
    prefix = "recorded_"
    return {c["name"][len(prefix) :]: c for c in doc["cases"] if c["name"].startswith(prefix)}


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls", [])
    ]


def our_calls(tok: ChatTokenizer, case: dict[str, Any], output_ids: list[int]) -> Any:
    """The calls our pipeline carries into the next turn for ``output_ids`` (the message
    sglang/chat_response.py builds, as SGLang's chat path would return it)."""
    req = case["request"]
    message, _ = served_message(
        tok.tok,
        ChatRequest(req["messages"], req["tools"]),
        case["prompt_ids"],
        output_ids,
        stop_matched=True,
    )
    return calls_of(message)


def _in_flight(url: str, headers: dict[str, str]) -> int:
    """Requests the server holds, running or queued (its ``/v1/loads``)."""
    load = parse_loads(httpx.get(f"{url}/v1/loads", headers=headers, timeout=5.0).content)
    return load.running + load.queued


def send(url: str, req: dict[str, Any]) -> httpx.Response:
    kw: dict[str, Any] = {"headers": req.get("headers", {}), "timeout": 60.0}
    if "body" in req:
        kw["json"] = req["body"]
    elif "body_text" in req:
        kw["content"] = req["body_text"].encode()
        kw["headers"] = {**kw["headers"], "content-type": "application/json"}
    return httpx.request(req["method"], f"{url}{req['path']}", **kw)


def replay_flags(name: str, fixture: dict[str, Any]) -> tuple[str, ...]:
    flags = list(substitute(fixture["launch_args"]))
    if "abort_rid" in fixture:
        flags += ABORT
    elif "background" in fixture:
        flags += SLOW
    elif name.startswith(("generate_all_turns_", "generate_sample_")):
        flags += SHORT_REASONING
    return tuple(flags)


@pytest.fixture(scope="module")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, ...], Any]]:
    """One emulator per distinct set of replay flags, started together."""
    factory = EmulatorFactory(tmp_path_factory.mktemp("replay"))
    wanted = sorted({replay_flags(n, f) for n, f in load("http")})
    started = {flags: factory.start(*flags, wait=False) for flags in wanted}
    yield {flags: emu.wait_ready() for flags, emu in started.items()}
    factory.stop_all()


@pytest.mark.parametrize(("name", "fixture"), load("http"), ids=[n for n, _ in load("http")])
def test_http_answer_agrees(
    emulators: dict[tuple[str, ...], EmulatorProcess],
    kimi: ChatTokenizer,
    name: str,
    fixture: dict[str, Any],
) -> None:
    emu = emulators[replay_flags(name, fixture)]
    request = substitute(fixture["request"])
    held: list[threading.Thread] = []
    background = substitute(fixture.get("background", []))
    for bg in background:
        t = threading.Thread(target=send, args=(emu.url, bg), daemon=True)
        t.start()
        held.append(t)
    if held:  # the request meets them in the server (running or queued), as it did in SGLang
        headers = background[0].get("headers", {})
        wait_until(lambda: _in_flight(emu.url, headers) >= len(held), timeout_s=30)
    got = send(emu.url, request)
    for t in held:
        t.join(30)
    real = fixture["response"]
    try:
        body: Any = got.json()
    except ValueError:
        body = None
    assert got.status_code == real["status"], got.text
    assert_same_shape(real["body"], body, name, subset=request["path"] in SUBSET_PATHS)
    assert client_view(got.status_code, body, got.text) == client_view(
        real["status"], real["body"], real.get("body_text")
    )
    # A turn whose prompt scripts the model's tool calls ([[call ...]], the regenerated
    # conversations' turn 0): SGLang's own kimi_k2 parser, run on the real app's answer
    # (recorded by conformance/chat_response.py), returns calls; the emulator's answer, read as
    # the pipeline reads it, must give the same names and arguments. Other outputs are random.
    sglang = sglang_parsed().get(name)
    if sglang is not None:
        assert sglang["output_ids"] == real["body"]["output_ids"]
        assert calls_of(sglang["message"]), name
        assert our_calls(kimi, sglang, body["output_ids"]) == calls_of(sglang["message"])


def logprob_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(n, f) for n, f in load("http") if f["request"].get("body", {}).get("return_logprob")]


def read_logprobs(body: dict[str, Any], top_k: int) -> GenerateResult:
    """An answer as our client reads it, its logprobs checked as the pipeline checks them."""
    result = GenerateResult.from_json(body, top_k)
    n = len(result.output_ids)
    assert result.output_logprobs is not None and len(result.output_logprobs) == n
    assert result.logprob_ids == result.output_ids  # scored on the output's own ids
    assert all(v is not None and NO_MASS < v <= 0.0 for v in result.output_logprobs)
    if top_k == 0:
        assert result.top_logprob_ids is None and result.top_logprobs is None
    else:
        assert result.top_logprob_ids is not None and result.top_logprobs is not None
        assert len(result.top_logprob_ids) == len(result.top_logprobs) == n
        for ids, lps in zip(result.top_logprob_ids, result.top_logprobs, strict=True):
            assert 1 <= len(ids) == len(lps) <= top_k and len(set(ids)) == len(ids)
            assert lps == sorted(lps, reverse=True) and lps[-1] > NO_MASS
    verdict = Verdict()
    check_logprobs(
        result.output_ids,
        result.output_logprobs,
        verdict,
        scored_ids=result.logprob_ids,
        top_ids=result.top_logprob_ids,
        top_logprobs=result.top_logprobs,
        top_k=top_k,
    )
    assert verdict.accepted, verdict.reason_text
    return result


@pytest.mark.parametrize(("name", "fixture"), logprob_cases(), ids=[n for n, _ in logprob_cases()])
def test_our_client_reads_sglang_s_logprobs(
    emulators: dict[tuple[str, ...], EmulatorProcess], name: str, fixture: dict[str, Any]
) -> None:
    """The recorded request is what our client sends for a ``logprobs: {top_k: K}`` partition,
    and our parser reads SGLang's real answer to it (and the emulator's) as the pipeline
    needs: a logprob per output id, on those ids, top-K rows highest first."""
    body = fixture["request"]["body"]
    top_k = body["top_logprobs_num"]
    assert body == generate_body(
        body["input_ids"], body["sampling_params"], body["rid"], None, top_k
    )
    real = fixture["response"]["body"]
    meta = real["meta_info"]
    assert meta["input_token_logprobs"] == [] and meta.get("input_top_logprobs", []) == []
    assert meta["output_token_logprobs_length"] == len(real["output_ids"])
    got = read_logprobs(real, top_k)
    if top_k > 0:  # SGLang sends K entries a row; its zero-probability ones clamped
        rows = meta["output_top_logprobs"]
        assert all(len(row) == top_k for row in rows)
        clamped = sum(t[0] == NO_MASS for row in rows for t in row)
        assert sum(top_k - len(ids) for ids in got.top_logprob_ids or []) == clamped
        assert all(t[0] is not None for row in rows for t in row)  # never null
        if body["sampling_params"]["temperature"] == 0.0:  # greedy: the top token, no clamp
            assert [row[0][1] for row in rows] == real["output_ids"] and clamped == 0
    emu = emulators[replay_flags(name, fixture)]
    answer = send(emu.url, substitute(fixture["request"])).json()
    read_logprobs(answer, top_k)
    if top_k > 0:
        assert all(len(row) == top_k for row in answer["meta_info"]["output_top_logprobs"])


def test_health_during_startup_agrees(emu_factory: EmulatorFactory) -> None:
    [(_, fixture)] = load("health_startup")
    flags = list(fixture["launch_args"])
    harness = fixture["harness_args"]
    for flag, value in zip(harness[::2], harness[1::2], strict=True):
        flags += [STARTUP[flag], value]
    emu = emu_factory.start(*flags, wait=False)
    seen = health_codes(emu.url, timeout_s=60, request_timeout_s=5, interval_s=0.1)
    assert seen == fixture["statuses"]


@pytest.mark.parametrize(("name", "fixture"), load("launch"), ids=[n for n, _ in load("launch")])
def test_refused_launch_agrees(name: str, fixture: dict[str, Any]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_emulator",
            "--model-path",
            str(TOKENIZER_DIR),
            *fixture["launch_args"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == fixture["exit_code"]
    error = done.stderr.strip().splitlines()[-1].split(": error: ", 1)[1]
    real = fixture["error"]
    if " could match " in real:  # the candidates are listed in parser order: compare as sets
        head, _, names = real.partition(" could match ")
        got_head, _, got_names = error.partition(" could match ")
        assert got_head == head
        assert set(got_names.split(", ")) == set(names.split(", "))
    else:
        assert error == real


def test_every_case_our_client_depends_on_is_recorded() -> None:
    names = {p.stem for p in FIXTURES.glob("*.json")}
    for needed in (
        "generate_success",
        "generate_stop",
        "generate_length",
        "generate_abort",
        "error_contract_unknown_key",
        "error_prompt_too_long",
        "error_total_over_context",
        "error_verify_repetition_penalty",
        "error_duplicate_rid",
        "error_malformed_json",
        "auth_wrong_key",
        "auth_missing_key",
        "auth_health_exempt",
        "error_queue_full",
        "health_startup",
        "server_info",
        "model_info",
        "v1_models",
        # regenerate: all_turns and samples: N (generate/converse.py)
        "generate_all_turns_tool_call",
        "generate_all_turns_after_tool_result",
        "generate_all_turns_after_follow_up",
        "generate_sample_0_turn_0",
        "generate_sample_2_turn_0",
        # logprobs: {top_k: K} (sglang/logprobs.py)
        "generate_logprobs_top3_stop",
        "generate_logprobs_top3_greedy_length",
        "generate_logprobs_top0_stop",
    ):
        assert needed in names

"""Record what SGLang 0.5.23's real app answers, as JSON fixtures the emulator's tests replay.

    .venv-conformance/bin/python -m conformance.record [--out tests/fixtures/sglang-0.5.23]

Starts the real app (`conformance/process.py`: SGLang's FastAPI app under its own uvicorn set-up,
the CPU fake engine behind it) and writes one file per case: the request (method, path, headers,
body) and the response (status, body), plus the launch flags it was served with. The API key
never appears: in launch flags, headers and bodies it is the placeholder ``<api-key>``. Paths,
ids, timings and the drawn seed are kept as the real app sent them; the replay test
(`tests/emulator/test_recorded_fixtures.py`) normalises them.

Fixture kinds: ``http`` (one request; ``background`` lists requests held in flight first, for
the duplicate-rid and queue-full cases, and ``abort_rid`` a held rid aborted after sending),
``health_startup`` (the `/health` statuses seen from launch to ready, 0 = refused) and
``launch`` (a command SGLang's parser refuses: exit status and its error line).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from conformance.process import ASSETS, REPO, RealAppProcess, model_dir
from conformance.record_logprobs import record_logprobs

KEY = "conformance-recording-key"
PLACEHOLDER = "<api-key>"
STOP = 664  # <|im_end|> of the bundled Kimi-style tokenizer
MAIN_FLAGS = [
    "--context-length",
    "4096",
    "--api-key",
    KEY,
    "--max-running-requests",
    "2",
    "--max-queued-requests",
    "1",
    "--random-seed",
    "1234",
]
FLAG_TABLE = REPO / "src" / "sglang_emulator" / "sglang_flags.tsv"


def _scrub(value: Any) -> Any:
    """The value with the API key replaced by the placeholder, everywhere in it."""
    text = json.dumps(value)
    return json.loads(text.replace(KEY, PLACEHOLDER))


def _auth(kind: str = "key") -> dict[str, str]:
    return {
        "key": {"Authorization": f"Bearer {KEY}"},
        "wrong": {"Authorization": "Bearer no"},
        "none": {},
    }[kind]


class Recorder:
    def __init__(self, out: Path, work: Path) -> None:
        self.out = out
        self.work = work
        self.written: list[str] = []

    def write(self, name: str, fixture: dict[str, Any]) -> None:
        path = self.out / f"{name}.json"
        path.write_text(json.dumps(_scrub(fixture), indent=1, sort_keys=False) + "\n")
        self.written.append(path.name)

    def send(
        self, app: RealAppProcess, req: dict[str, Any], timeout: float = 60.0
    ) -> dict[str, Any]:
        kw: dict[str, Any] = {"headers": req.get("headers", {}), "timeout": timeout}
        if "body" in req:
            kw["json"] = req["body"]
        elif "body_text" in req:
            kw["content"] = req["body_text"].encode()
            kw["headers"] = {**kw["headers"], "content-type": "application/json"}
        r = httpx.request(req["method"], f"{app.url}{req['path']}", **kw)
        try:
            body: Any = r.json()
        except ValueError:
            body = None
        return {"status": r.status_code, "body": body, "body_text": None if body else r.text}

    def http(
        self,
        app: RealAppProcess,
        name: str,
        about: str,
        request: dict[str, Any],
        *,
        background: list[dict[str, Any]] | None = None,
        abort_rid: str | None = None,
    ) -> None:
        """One request (after `background` ones are in flight) and what the app answered."""
        held: list[threading.Thread] = []
        answers: list[dict[str, Any]] = []
        for bg in background or []:
            t = threading.Thread(target=lambda b=bg: answers.append(self.send(app, b)))
            t.start()
            held.append(t)
        if held:
            time.sleep(1.5)
        if abort_rid is not None:
            t = threading.Thread(target=lambda: answers.append(self.send(app, request)))
            t.start()
            time.sleep(1.0)
            httpx.post(f"{app.url}/abort_request", json={"rid": abort_rid}, headers=_auth())
            t.join(30)
            response = answers.pop()
        else:
            response = self.send(app, request)
        for bg in background or []:
            rid = bg["body"].get("rid")
            httpx.post(f"{app.url}/abort_request", json={"rid": rid}, headers=_auth())
        for t in held:
            t.join(30)
        fixture: dict[str, Any] = {
            "kind": "http",
            "about": about,
            "launch_args": _launch_args(app),
            "request": request,
            "response": response,
        }
        if background:
            fixture["background"] = background
        if abort_rid is not None:
            fixture["abort_rid"] = abort_rid
        self.write(name, fixture)


def _launch_args(app: RealAppProcess) -> list[str]:
    """The app's flags as recorded: no model path, host or port (the replay picks its own)."""
    return app.argv[6:]  # --model-path P --host H --port N come first (conformance/process.py)


def _gen(rid: str | None, ids: list[int], auth: str = "key", **sampling: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": sampling}
    if rid is not None:
        body["rid"] = rid
    return {"method": "POST", "path": "/generate", "headers": _auth(auth), "body": body}


def _get(path: str, auth: str = "key") -> dict[str, Any]:
    return {"method": "GET", "path": path, "headers": _auth(auth)}


def record_main_app(rec: Recorder) -> None:
    """The cases served by one app launched with ``MAIN_FLAGS``, in the order they are sent."""
    with RealAppProcess(rec.work, *MAIN_FLAGS) as app:
        _record_generations(rec, app)
        _record_refused_requests(rec, app)
        _record_refused_sends(rec, app)
        _record_auth(rec, app)
        _record_accepted_and_info(rec, app)
        record_regeneration(rec, app)
        record_logprobs(rec, app, _auth())


def _record_generations(rec: Recorder, app: RealAppProcess) -> None:
    """Generations: a stop token, the pipeline's request shape, max_new_tokens, an abort."""
    stop: dict[str, Any] = {
        "max_new_tokens": 4000,
        "stop_token_ids": [STOP],
        "ignore_eos": False,
    }
    rec.http(
        app,
        "generate_stop",
        "a stop token ends the output and stays in output_ids",
        _gen("rec-stop", [1, 2, 3], **stop),
    )
    rec.http(
        app,
        "generate_success",
        "the pipeline's request shape: every sampling key it sends",
        _gen(
            "rec-success",
            [1, 2, 3, 4],
            max_new_tokens=64,
            temperature=0.7,
            top_p=0.95,
            top_k=50,
            min_p=0.0,
            repetition_penalty=1.0,
            stop_token_ids=[STOP],
            ignore_eos=False,
            skip_special_tokens=False,
            no_stop_trim=True,
        ),
    )
    rec.http(
        app,
        "generate_length",
        "max_new_tokens reached",
        _gen("rec-length", [5, 6], max_new_tokens=3),
    )
    rec.http(
        app,
        "generate_abort",
        "a request aborted while running: HTTP 200, finish_reason abort",
        _gen("rec-conformance:hold", [1, 2], max_new_tokens=5),
        abort_rid="rec-conformance:hold",
    )


def _record_refused_requests(rec: Recorder, app: RealAppProcess) -> None:
    """Refused for what they ask: the request contract, the context length, sampling checks."""
    rec.http(
        app,
        "error_contract_unknown_key",
        "an unknown sampling key: the strict request contract's plain-string error",
        _gen("rec-contract", [1], max_new_tokens=1, foo=1),
    )
    rec.http(
        app,
        "error_contract_wrong_type",
        "a wrong JSON type in the contract",
        _gen("rec-type", [1], max_new_tokens="three"),
    )
    rec.http(
        app,
        "error_prompt_too_long",
        "an input as long as the context (ValueError)",
        _gen("rec-too-long", [7] * 4096, max_new_tokens=1),
    )
    rec.http(
        app,
        "error_total_over_context",
        "input + max_new_tokens over the context",
        _gen("rec-total", [7] * 3996, max_new_tokens=101),
    )
    rec.http(
        app,
        "error_input_over_max_req_input_len",
        "the scheduler's input-length abort (max_req_input_len), a 400",
        _gen("rec-max-input", [7] * 4090, max_new_tokens=1),
    )
    rec.http(
        app,
        "error_verify_repetition_penalty",
        "SamplingParams.verify: repetition_penalty must be in (0, 2]",
        _gen("rec-verify", [1], max_new_tokens=1, repetition_penalty=0.0),
    )
    rec.http(
        app,
        "error_verify_temperature",
        "SamplingParams.verify: temperature >= 0",
        _gen("rec-verify-t", [1], max_new_tokens=1, temperature=-1.0),
    )


def _record_refused_sends(rec: Recorder, app: RealAppProcess) -> None:
    """Refused for how or when they come: a rid in flight, a body that is not JSON, a full queue."""
    held = _gen("rec-dup-conformance:hold", [1, 2], max_new_tokens=5)
    rec.http(app, "error_duplicate_rid", "a rid still in flight", held, background=[held])
    rec.http(
        app,
        "error_malformed_json",
        "a body that is not JSON",
        {
            "method": "POST",
            "path": "/generate",
            "headers": _auth(),
            "body_text": '{"input_ids": [1,',
        },
    )
    rec.http(
        app,
        "error_queue_full",
        "2 running + 1 queued already: 503",
        _gen("rec-queue-4", [1], max_new_tokens=2),
        background=[_gen(f"rec-q{i}-conformance:hold", [1], max_new_tokens=2) for i in range(3)],
    )


def _record_auth(rec: Recorder, app: RealAppProcess) -> None:
    """The API key: wrong, missing, and /health's exemption."""
    rec.http(
        app,
        "auth_wrong_key",
        "a wrong API key",
        _gen("rec-wrong", [1], auth="wrong", max_new_tokens=1),
    )
    rec.http(app, "auth_missing_key", "no API key", _get("/server_info", auth="none"))
    rec.http(app, "auth_health_exempt", "/health needs no key", _get("/health", auth="none"))


def _record_accepted_and_info(rec: Recorder, app: RealAppProcess) -> None:
    """Out-of-vocabulary input ids (accepted), then the info endpoints."""
    rec.http(
        app,
        "oov_input_ids_accepted",
        "input ids outside the vocabulary are not checked",
        _gen("rec-oov", [10**6, 1], max_new_tokens=2),
    )
    rec.http(app, "server_info", "GET /server_info", _get("/server_info"))
    rec.http(app, "model_info", "GET /model_info", _get("/model_info"))
    rec.http(app, "v1_models", "GET /v1/models", _get("/v1/models"))


# A ``regenerate: all_turns`` + ``samples: 3`` partition, as the pipeline builds its requests
# (generate/converse.py): a seed, so every record carries its own sampling_seed, and one temperature
# per sample (0.0 is greedy).
REGEN_RUN = "rec0a1b2c3d-9f0e"  # request_id's run part: the run id and a token per batch run
REGEN_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# Three assistant turns: a tool call (the fake model makes it: ``[[call ...]]``, see
# sglang_emulator/fake_model.py), the answer after the tool result, a reply to a follow-up. The
# fake model's turns 1 and 2 call no tool for exactly this text (its calls are drawn from the
# prompt), so the conversation goes on to turn 2.
REGEN_LINE: dict[str, Any] = {
    "id": "conv-12",
    "tools": [REGEN_TOOL],
    "messages": [
        {"role": "user", "content": 'Weather in Paris? [[call get_weather {"city": "Paris"}]]'},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": '{"temp_c": 18, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 18 C in Paris."},
        {"role": "user", "content": "And should I take a coat tomorrow?"},
        {"role": "assistant", "content": "Yes, a light one."},
    ],
}


class Regeneration:
    """The requests of one line of a ``regenerate: all_turns``, ``samples: 3`` partition, built
    with the pipeline's own functions: rendering, record ids, sampling, seeds and rids."""

    def __init__(self) -> None:
        from eagle3_datagen.config import PipelineConfig
        from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
        from eagle3_datagen.render.token_ids import TokenIds

        self.config = PipelineConfig.model_validate(
            {
                "model": {"path": str(ASSETS / "kimi-k2.5-mini")},
                "sampling": {"seed": 7},
                "tiers": [{"name": "T", "concurrency": 4, "max_tokens": 256}],
                "partitions": [
                    {
                        "name": "p",
                        "input": "in.jsonl",
                        "tier": "T",
                        "regenerate": "all_turns",
                        "samples": 3,
                        "temperatures": [0.0, 0.6, 1.0],
                    }
                ],
                "output_dir": "out",
            }
        )
        self.partition = self.config.partitions[0]
        self.tokenizer = ChatTokenizer(self.config.model.path)
        self.ids = TokenIds.resolve(self.tokenizer, self.config.special_tokens)
        self.sampling = self.config.sampling.to_sglang(
            self.config.tiers[0].max_tokens, list(self.ids.stop_ids)
        )

    def prompt(self, line: int = 12) -> Any:
        from eagle3_datagen.inputs.prompts import parse_prompt

        return parse_prompt(REGEN_LINE, line)

    def request(
        self, prompt: Any, ids: list[int], turn: int, sample: int, *, turns: bool = True
    ) -> dict[str, Any]:
        """The /generate request of one turn of one sample (PartitionRunner._sampling and
        _generate: the sample's temperature, the record's seed, the rid with its id suffix)."""
        from eagle3_datagen.generate.conversation import record_id
        from eagle3_datagen.sglang.client import request_id

        rec_id = record_id(prompt.id, turn, sample, turns=turns, samples=self.partition.samples)
        sampling = dict(self.sampling)
        sampling["temperature"] = self.partition.temperature(
            sample, self.config.sampling.temperature
        )
        seed = self.config.sampling.request_seed(rec_id)
        assert seed is not None
        sampling["sampling_seed"] = seed
        rid = request_id(
            REGEN_RUN, self.partition.name, f"{prompt.line}{rec_id[len(prompt.id) :]}", 0
        )
        body = {"input_ids": ids, "sampling_params": sampling, "rid": rid}
        return {"method": "POST", "path": "/generate", "headers": _auth(), "body": body}

    def render(self, prompt: Any, messages: list[dict[str, Any]]) -> list[int]:
        from eagle3_datagen.inputs.prompts import Prompt

        [ids] = self.tokenizer.render([Prompt(prompt.id, prompt.line, messages, prompt.tools)])
        assert isinstance(ids, list), ids
        return ids


def record_regeneration(rec: Recorder, app: RealAppProcess) -> None:
    """What ``regenerate: all_turns`` and ``samples`` send: sample 1's three turns in order,
    each on the model's own earlier turns (its tool-call section, then the data's tool result,
    then a user follow-up), and the first turn of all three samples (temperatures 0.0, 0.6, 1.0,
    one sampling_seed each)."""
    from eagle3_datagen.generate.conversation import (
        continue_history,
        plan_turns,
        served_turn,
        tool_call_divergence,
    )

    regen = Regeneration()
    prompt = regen.prompt()
    slots = plan_turns(prompt, "all_turns")
    assert len(slots) == 3, slots
    history = prompt.messages[: slots[0].history_end]
    names = (
        "generate_all_turns_tool_call",
        "generate_all_turns_after_tool_result",
        "generate_all_turns_after_follow_up",
    )
    abouts = (
        "regenerate: all_turns, sample 1 (temperature 0.6, its own sampling_seed), turn 0: "
        "the model answers with a tool-call section; rid ...#s1#t0",
        "turn 1: the prompt holds the model's own turn 0 (reasoning, content, its tool call) "
        "and the data's tool result answering the model's call id; rid ...#s1#t1",
        "turn 2: the prompt holds the model's turns 0 and 1 (their reasoning dropped by the "
        "template before the last user message) and a user follow-up; rid ...#s1#t2",
    )
    for pos, slot in enumerate(slots):
        ids = regen.render(prompt, history)
        request = regen.request(prompt, ids, slot.index, 1)
        rec.http(app, names[pos], abouts[pos], request)
        if pos + 1 == len(slots):
            break
        answer = json.loads((rec.out / f"{names[pos]}.json").read_text())["response"]
        output_ids = answer["body"]["output_ids"]
        finish = answer["body"]["meta_info"]["finish_reason"]["type"]
        message, calls = served_turn(
            regen.tokenizer, history, prompt.tools, ids, output_ids, finish
        )
        diverged = tool_call_divergence(slot.data, calls)
        assert diverged is None, f"{names[pos]}: the conversation would stop: {diverged}"
        history = continue_history(
            history, message, calls or [], slot, slots[pos + 1], prompt.messages
        )
    first = regen.render(prompt, prompt.messages[: slots[0].history_end])
    for sample in (0, 2):
        temperature = regen.partition.temperature(sample, 0.0)
        rec.http(
            app,
            f"generate_sample_{sample}_turn_0",
            f"sample {sample} of 3 of the same "
            f"prompt: temperature {temperature}"
            f"{' (greedy)' if temperature == 0.0 else ''}, its own sampling_seed; "
            f"rid ...#s{sample}#t0",
            regen.request(prompt, first, 0, sample),
        )


def record_unseeded(rec: Recorder) -> None:
    with RealAppProcess(rec.work, "--context-length", "4096") as app:
        rec.http(
            app,
            "server_info_unseeded",
            "no --random-seed: SGLang draws one per launch",
            _get("/server_info", auth="none"),
        )


def record_startup(rec: Recorder) -> None:
    app = RealAppProcess(rec.work, "--fake-load-s", "3", "--fake-warmup-delay-s", "4")
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and 200 not in seen:
            try:
                code = httpx.get(f"{app.url}/health", timeout=25).status_code
            except httpx.TransportError:
                code = 0
            if not seen or seen[-1] != code:
                seen.append(code)
            time.sleep(0.2)
    finally:
        app.stop()
    rec.write(
        "health_startup",
        {
            "kind": "health_startup",
            "about": "GET /health from launch to ready: refused (0), 503 during warm-up, 200",
            "launch_args": [],
            "harness_args": ["--fake-load-s", "3", "--fake-warmup-delay-s", "4"],
            "statuses": seen,
        },
    )


def record_launch(rec: Recorder, name: str, about: str, *flags: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance.server",
            "--model-path",
            str(model_dir(rec.work)),
            *flags,
            "--fake-load-s",
            "600",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    rec.write(
        name,
        {
            "kind": "launch",
            "about": about,
            "launch_args": list(flags),
            "exit_code": done.returncode,
            "error": errors[-1].split(": error: ", 1)[1] if errors else None,
        },
    )


def write_flag_table(path: Path) -> int:
    """Every flag of SGLang's own parser with how many values it takes, for the emulator's
    parser (`sglang_emulator/args.py`): it refuses what SGLang refuses and resolves
    abbreviations against the same names."""
    from conformance import stubs

    stubs.install()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    lines = [
        "# SGLang 0.5.23's launch_server flags: NARGS<TAB>FLAG [ALIAS...] (written by "
        "conformance/record.py; 0 = a switch, 1 = one value)"
    ]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        nargs = 1 if action.nargs is None else action.nargs
        lines.append(f"{nargs}\t{' '.join(action.option_strings)}")
    path.write_text("\n".join(lines) + "\n")
    return len(lines) - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="conformance.record", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "sglang-0.5.23")
    p.add_argument("--flags-out", type=Path, default=FLAG_TABLE)
    p.add_argument(
        "--only",
        choices=["logprobs"],
        help="record only these cases (the logprobs requests; conformance/record_logprobs.py)",
    )
    args = p.parse_args(argv)
    if args.only == "logprobs":
        args.out.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="conformance-record-"))
        rec = Recorder(args.out, work)
        try:
            with RealAppProcess(work, *MAIN_FLAGS) as app:
                record_logprobs(rec, app, _auth())
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"wrote {', '.join(rec.written)} to {args.out}")
        return 0
    print(f"{write_flag_table(args.flags_out)} SGLang flags written to {args.flags_out}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conformance-record-"))
    rec = Recorder(args.out, work)
    try:
        record_launch(
            rec, "launch_unknown_flag", "an unknown flag: argparse exits 2", "--no-such-flag", "1"
        )
        record_launch(
            rec, "launch_ambiguous_prefix", "an ambiguous abbreviation (allow_abbrev)", "--max", "2"
        )
        record_main_app(rec)
        record_unseeded(rec)
        record_startup(rec)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {len(rec.written)} fixtures to {args.out}: {', '.join(rec.written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

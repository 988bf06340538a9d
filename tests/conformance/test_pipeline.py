"""The whole pipeline, attach mode, against SGLang 0.5.23's real app: records token-exact
against the fake engine's own log, and a rerun after a server restart resumes, sending nothing;
every turn regenerated and several samples per prompt, token-exact with unique rids, each
turn's prompt the one SGLang's own chat path builds for that conversation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conformance.process import RealAppProcess
from conformance.record import REGEN_LINE, REGEN_TOOL
from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from tests.support import TOKENIZER_DIR  # noqa: E402
from tests.support.pipeline import CliRun, records  # noqa: E402
from tests.support.prompts import write_prompts  # noqa: E402

PARTITIONS = ("p_alpha", "p_beta", "p_gamma")


def _config(tmp_path: Path, url: str) -> Path:
    inputs = [
        write_prompts(tmp_path / f"{n}.jsonl", 12, first=100 * i) for i, n in enumerate(PARTITIONS)
    ]
    cfg: dict[str, Any] = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {"mode": "attach", "url": url, "request_timeout_s": 60},
        "tiers": [{"name": "SHORT", "concurrency": 8, "max_tokens": 1024}],
        "partitions": [
            {"name": name, "input": str(path), "tier": "SHORT"}
            for name, path in zip(PARTITIONS, inputs, strict=True)
        ],
        "output_dir": str(tmp_path / "out"),
        "batch_size": 5,
        "retries": {"max_attempts": 4, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _generation_answers(app: RealAppProcess) -> list[dict[str, Any]]:
    """The log minus the pre-flight smoke requests and SGLang's own (text) warm-up."""
    return [a for a in app.answers() if not a["rid"].startswith("preflight") and not a["from_text"]]


def test_attach_run_is_token_exact_and_resumes_after_restart(
    tmp_path: Path, prefect_backend: None
) -> None:
    log = tmp_path / "answers.jsonl"
    app = RealAppProcess(tmp_path, log=log).wait_ready()
    config = _config(tmp_path, app.url)
    try:
        first = CliRun(config, tmp_path / "run1.log")
        assert first.wait() == 0, first.output()
        answers = {a["rid"]: a for a in _generation_answers(app)}
        total = 0
        for name in PARTITIONS:
            for rec in records(tmp_path / "out", name).values():
                total += 1
                got = answers[rec["rid"]]
                assert list(rec["output_ids"]) == got["output_ids"], rec["id"]
                assert list(rec["prompt_ids"]) == got["input_ids"], rec["id"]
        assert total > 0
        sent_before = len(_generation_answers(app))
    finally:
        app.stop()

    # A restarted server: the same flags, so a new random_seed drawn by SGLang.
    app2 = RealAppProcess(tmp_path, port=app.port, log=log).wait_ready()
    try:
        second = CliRun(config, tmp_path / "run2.log")
        code = second.wait()
        assert code == 0, f"the rerun after a server restart was refused:\n{second.output()}"
        assert len(_generation_answers(app2)) == sent_before, "the rerun sent prompts again"
    finally:
        app2.stop()


def test_two_runs_never_reuse_a_rid(tmp_path: Path, prefect_backend: None) -> None:
    """SGLang refuses a rid it still holds (tokenizer_manager.py:3833-3837), so rids must be
    unique per run: two runs of the same prompts (two output dirs) share none."""
    app = RealAppProcess(tmp_path).wait_ready()
    try:
        config = _config(tmp_path, app.url)
        assert CliRun(config, tmp_path / "a.log").wait() == 0
        first = {a["rid"] for a in _generation_answers(app)}
        cfg = yaml.safe_load(config.read_text())
        cfg["output_dir"] = str(tmp_path / "out-2")
        config.write_text(yaml.safe_dump(cfg))
        assert CliRun(config, tmp_path / "b.log").wait() == 0
        second = {a["rid"] for a in _generation_answers(app)} - first
        reused = first & {a["rid"] for a in _generation_answers(app)[len(first) :]}
    finally:
        app.stop()
    assert second, "the second run sent nothing"
    assert not reused, f"rids reused across runs: {sorted(reused)[:5]}"


def _conversation(cid: str, city: str, result: str) -> dict[str, Any]:
    """Three assistant turns: a tool call the fake model makes too (its ``[[call ...]]``
    script), the answer after the tool result, a reply to a follow-up."""
    args = json.dumps({"city": city})
    return {
        "id": cid,
        "tools": [REGEN_TOOL],
        "messages": [
            {"role": "user", "content": f"Weather in {city}? [[call get_weather {args}]]"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": args},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_7", "content": result},
            {"role": "assistant", "content": f"It is 18 C in {city}."},
            {"role": "user", "content": "And should I take a coat tomorrow?"},
            {"role": "assistant", "content": "Yes, a light one."},
        ],
    }


def _prompts_sglang_chat_builds(
    tmp_path: Path, rows: list[dict[str, Any]], recs: dict[str, dict[str, Any]]
) -> dict[str, list[int]]:
    """Record id -> the prompt ids SGLang 0.5.23's ``/v1/chat/completions`` builds for that turn.

    A second real app, launched as Kimi-K2.5 is deployed (kimi_k2 reasoning and tool-call
    parsers), answers each turn with the record's output ids (``--fake-outputs``, by rid); the
    message it returns (reasoning, content, tool calls with its ids) goes into the next turn's
    request, followed by the data's messages up to the next assistant turn, a tool result
    answering the data's call i now answering SGLang's call i, as a client replies.
    """
    outputs = tmp_path / "chat-outputs.json"
    outputs.write_text("{}")
    scripted: dict[str, list[int]] = {}
    built: dict[str, list[int]] = {}
    flags = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
    app = RealAppProcess(tmp_path, *flags, "--fake-outputs", str(outputs)).wait_ready()
    try:
        for row in rows:
            messages = row["messages"][:-1]  # the last reply is the one the last turn makes
            slots = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i]
            slots.append(len(messages))
            for sample in (0, 1):
                history = messages[: slots[0]]
                for turn, end in enumerate(slots):
                    rec_id = f"{row['id']}#s{sample}#t{turn}"
                    if rec_id not in recs:
                        break
                    rid = f"chat-render:{rec_id}"
                    scripted[rid] = list(recs[rec_id]["output_ids"])
                    outputs.write_text(json.dumps(scripted))
                    body = {
                        "messages": history,
                        "tools": row["tools"],
                        "rid": rid,
                        "max_tokens": 1024,
                    }
                    reply = httpx.post(f"{app.url}/v1/chat/completions", json=body, timeout=60)
                    assert reply.status_code == 200, reply.text
                    [answer] = [a for a in app.answers() if a["rid"] == rid]
                    built[rec_id] = answer["input_ids"]
                    if turn + 1 < len(slots):
                        message = reply.json()["choices"][0]["message"]
                        message = {k: v for k, v in message.items() if v is not None}
                        new_ids = [c["id"] for c in message.get("tool_calls") or []]
                        old_ids = [c.get("id") for c in messages[end].get("tool_calls") or []]
                        renamed = dict(zip(old_ids, new_ids, strict=False))
                        following = [
                            {**m, "tool_call_id": renamed[m["tool_call_id"]]}
                            if m.get("tool_call_id") in renamed
                            else m
                            for m in messages[end + 1 : slots[turn + 1]]
                        ]
                        history = [*history, message, *following]
    finally:
        app.stop()
    return built


def test_all_turns_and_samples_are_token_exact_with_unique_rids(
    tmp_path: Path, prefect_backend: None
) -> None:
    """``regenerate: all_turns`` + ``samples: 2`` against the real app: every turn's prompt ids
    are those SGLang's own chat path builds for the conversation driven through
    ``/v1/chat/completions`` (each earlier turn as the message SGLang returned for the model's
    output), every record's output ids are the fake engine's, and no two requests share a rid
    (SGLang refuses one it holds)."""
    rows = [
        # The conversation of the recorded fixtures (conformance/record.py): the fake model
        # calls no tool in turns 1 and 2 for it, so both samples reach turn 2.
        {**REGEN_LINE, "id": "conv-paris"},
        _conversation("conv-oslo", "Oslo", '{"temp_c": 3}'),
        _conversation("conv-rome", "Rome", '{"temp_c": 24, "sky": "clear"}'),
    ]
    prompts = tmp_path / "conversations.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = tmp_path / "answers.jsonl"
    app = RealAppProcess(tmp_path, log=log).wait_ready()
    try:
        config = _config(tmp_path, app.url)
        cfg = yaml.safe_load(config.read_text())
        cfg["sampling"] = {"seed": 7}
        cfg["tiers"][0]["max_tokens"] = 256
        cfg["partitions"] = [
            {
                "name": "p_turns",
                "input": str(prompts),
                "tier": "SHORT",
                "regenerate": "all_turns",
                "samples": 2,
                "temperatures": [0.0, 1.0],
            }
        ]
        config.write_text(yaml.safe_dump(cfg))
        run = CliRun(config, tmp_path / "turns.log")
        assert run.wait() == 0, run.output()
        sent = _generation_answers(app)
    finally:
        app.stop()
    rids = [a["rid"] for a in sent]
    assert len(rids) == len(set(rids)), f"rids sent twice: {Counter(rids).most_common(3)}"
    answers = {a["rid"]: a for a in sent}
    recs = records(tmp_path / "out", "p_turns")
    # Every turn's prompt is what SGLang's own chat path builds for that conversation, driven
    # through /v1/chat/completions with each earlier turn as the message SGLang returned.
    served = _prompts_sglang_chat_builds(tmp_path, rows, recs)
    assert sorted(served) == sorted(recs)
    for rec in recs.values():
        got = answers[rec["rid"]]
        assert list(rec["output_ids"]) == got["output_ids"], rec["id"]
        assert list(rec["prompt_ids"]) == got["input_ids"], rec["id"]  # stored as sent
        assert list(rec["prompt_ids"]) == served[rec["id"]], rec["id"]
        assert rec["rid"].split(":")[-2].endswith(rec["id"][len(rec["conversation_id"]) :])
        assert rec["sampling"]["temperature"] == [0.0, 1.0][rec["sample"]], rec["id"]
    assert len(sent) == len(recs), "a request sent for no record, or a record not sent"
    # Where the fake model's calls (drawn from the prompt) differ from the data's turn, the
    # conversation stops there with the reason recorded and its later turns are never sent.
    stopped = {i: r["stop_reason"] for i, r in recs.items() if r["stop_reason"]}
    assert stopped, "no conversation diverged: the stop path went unchecked"
    for rec_id, reason in stopped.items():
        assert reason.startswith("tool_call_diverged"), (rec_id, reason)
        turn = int(rec_id.rsplit("#t", 1)[1])
        assert f"{rec_id.rsplit('#t', 1)[0]}#t{turn + 1}" not in recs
    paris = sorted(i for i in recs if i.startswith("conv-paris"))
    assert paris == [f"conv-paris#s{n}#t{k}" for n in (0, 1) for k in (0, 1, 2)]
    seeds = [rec["sampling"]["sampling_seed"] for rec in recs.values()]
    assert None not in seeds and len(set(seeds)) == len(seeds), "one sampling_seed per record"
    # Later turns were sent on the model's own history: turn 1's prompt holds turn 0's
    # tool-call section as the model wrote it, then the tool result.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    out0 = str(tok.decode(recs["conv-paris#s1#t0"]["output_ids"]))
    section = out0[out0.index("<|tool_calls_section_begin|>") : out0.index("<|im_end|>")]
    prompt1 = str(tok.decode(recs["conv-paris#s1#t1"]["prompt_ids"]))
    assert section + "<|im_end|>" in prompt1
    assert prompt1.index(section) < prompt1.index('{"temp_c": 18, "sky": "clear"}')

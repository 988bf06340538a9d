"""Every assistant turn regenerated, and several samples per prompt, against a real emulator.

The emulator's fake model calls exactly the tools a ``[[call NAME {json}]]`` text in the message
right before the generation prompt asks for (and, with ``--emu-tool-call-rate 0``, none
otherwise), so a test decides whether the model's call agrees with the data's or not.

The expected prompt of every turn is rendered here independently: the stored output ids of the
turns before it are decoded to text and split on the special tokens' strings (not on ids, as
the pipeline does), turned into OpenAI-style assistant messages, and the conversation is
rendered by transformers' ``apply_chat_template``.
"""

from __future__ import annotations

import json
import os
import re
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.report.data_picture import partition_picture, picture_markdown
from eagle3_datagen.validate.dataset import validate_dataset
from eagle3_datagen.write.export import export_dataset
from eagle3_datagen.write.manifest import summarize_on_disk
from tests.support import TOKENIZER_DIR
from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config, run_batches, write_config
from tests.support.prompts import WEATHER_TOOL

NO_RANDOM_TOOLS = ("--emu-tool-call-rate", "0")


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def weather_conversation(cid: str, asked_city: str, data_city: str = "Paris") -> dict[str, Any]:
    """Three assistant turns: a tool call (Paris in the data; the user's script makes the
    model call for ``asked_city``), the answer after the tool result, a reply to a follow-up."""
    args = json.dumps({"city": data_city})
    script = json.dumps({"city": asked_city})
    return {
        "id": cid,
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": f"Weather in {data_city}? [[call get_weather {script}]]"},
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
            {"role": "tool", "tool_call_id": "call_7", "content": '{"temp_c": 18}'},
            {"role": "assistant", "content": "It is 18 C in Paris."},
            {"role": "user", "content": "And should I take a coat tomorrow?"},
            {"role": "assistant", "content": "Yes, a light one."},
        ],
    }


def _config(tmp_path: Path, rows: list[dict[str, Any]], **partition: Any) -> PipelineConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return PipelineConfig.model_validate(
        {
            # The data through the template as it is, as rendered below; what SGLang's chat path
            # makes of such histories (render: sglang_chat) is checked against SGLang's own
            # preprocessing in tests/unit/test_sglang_chat_render.py.
            "model": {"path": str(TOKENIZER_DIR), "render": "template"},
            "sampling": {"seed": 7},
            "tiers": [{"name": "T", "concurrency": 8, "max_tokens": 1024}],
            "partitions": [{"name": "p", "input": str(prompts), "tier": "T", **partition}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 4,
        }
    )


def _rows(paths: list[Path]) -> list[dict[str, Any]]:
    return pq.read_table(paths).to_pylist() if paths else []


_CALL = re.compile(
    r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S
)


def message_from_output(hf_tokenizer: Any, output_ids: list[int]) -> dict[str, Any]:
    """An assistant message from a turn's output ids, split as text on the token strings."""
    text = hf_tokenizer.decode(output_ids, skip_special_tokens=False)
    text = text.removesuffix("<|im_end|>")
    reasoning, _, rest = text.partition("</think>")
    content, _, section = rest.partition("<|tool_calls_section_begin|>")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
    }
    calls = [
        {
            "id": head.strip(),
            "type": "function",
            "function": {
                "name": head.strip().removeprefix("functions.").split(":")[0],
                "arguments": args.strip(),
            },
        }
        for head, args in _CALL.findall(section)
    ]
    if calls:
        message["tool_calls"] = calls
    return message


def independent_prompt(hf_tokenizer: Any, history: list[dict[str, Any]], tools: Any) -> list[int]:
    ids = hf_tokenizer.apply_chat_template(
        history, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


@pytest.mark.tokens
async def test_three_turns_with_a_tool_call_are_rendered_on_the_models_own_history(
    tmp_path: Path, emulator_factory: Any, hf_tokenizer: Any
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(*NO_RANDOM_TOOLS, ledger=ledger).wait_ready()
    row = weather_conversation("wx", asked_city="Paris")
    out = await run_batches(_config(tmp_path, [row], regenerate="all_turns"), emu.url)

    records = {r["id"]: r for r in _rows(out.shard_paths())}
    assert sorted(records) == ["wx#t0", "wx#t1", "wx#t2"]
    assert not list(out.rejects_dir.glob("*.parquet"))
    turns = [records[f"wx#t{k}"] for k in range(3)]
    assert [(r["conversation_id"], r["turn"], r["sample"]) for r in turns] == [
        ("wx", 0, 0),
        ("wx", 1, 0),
        ("wx", 2, 0),
    ]
    assert all(r["stop_reason"] is None for r in turns)
    # What coverage counts (docs/coverage.md): turn 1 follows the tool result, turn 2 a second
    # user message.
    assert [(r["has_tool_results"], r["user_turns"]) for r in turns] == [
        (False, 1),
        (True, 1),
        (True, 2),
    ]

    # The model called the data's tool, with the data's arguments, in turn 0.
    first = message_from_output(hf_tokenizer, turns[0]["output_ids"])
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["get_weather"]
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}

    # Each turn's prompt is the template over the model's own earlier turns.
    data = row["messages"]
    history = [data[0]]
    assert turns[0]["prompt_ids"] == independent_prompt(hf_tokenizer, history, row["tools"])
    tool_result = {**data[2], "tool_call_id": first["tool_calls"][0]["id"]}
    history = [data[0], first, tool_result]
    assert turns[1]["prompt_ids"] == independent_prompt(hf_tokenizer, history, row["tools"])
    second = message_from_output(hf_tokenizer, turns[1]["output_ids"])
    assert "tool_calls" not in second
    history = [*history, second, data[4]]
    assert turns[2]["prompt_ids"] == independent_prompt(hf_tokenizer, history, row["tools"])
    # The reasoning of the tool-loop turn is shown to turn 1 (it follows the last user message)
    # and dropped by the template for turn 2 (before the new user message): the model's own
    # reasoning text is in one prompt and not in the other.
    reasoning_ids = hf_tokenizer.encode(first["reasoning_content"], add_special_tokens=False)
    joined = lambda ids: ",".join(map(str, ids))  # noqa: E731
    assert joined(reasoning_ids) in joined(turns[1]["prompt_ids"])
    assert joined(reasoning_ids) not in joined(turns[2]["prompt_ids"])

    # Stored outputs are exactly what the server returned, turn by turn.
    served = {e["rid"]: e for e in read_ledger(ledger)}
    for rec in turns:
        assert served[rec["rid"]]["output_ids"] == rec["output_ids"]
    summary = summarize_on_disk(out.root, "p")
    assert summary["records_by_turn"] == {"0": 1, "1": 1, "2": 1}
    assert summary["conversations"] == 1 and summary["conversations_stopped"] == 0


@pytest.mark.tokens
async def test_a_diverging_tool_call_stops_the_conversation_with_its_reason(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory(*NO_RANDOM_TOOLS).wait_ready()
    rows = [
        weather_conversation("same", asked_city="Paris"),
        weather_conversation("other", asked_city="Rome"),
    ]
    out = await run_batches(_config(tmp_path, rows, regenerate="all_turns"), emu.url)

    records = {r["id"]: r for r in _rows(out.shard_paths())}
    assert sorted(records) == ["other#t0", "same#t0", "same#t1", "same#t2"]
    stop = records["other#t0"]["stop_reason"]
    assert stop.startswith("tool_call_diverged: ")
    assert 'get_weather({"city":"Paris"})' in stop and 'get_weather({"city":"Rome"})' in stop
    marker = out.batch_summaries()[0]
    assert (marker.conversations, marker.stopped) == (2, 1)
    assert marker.stops_by_reason == {"tool_call_diverged": 1}
    summary = summarize_on_disk(out.root, "p")
    assert summary["conversations_stopped"] == 1
    assert summary["stops_by_reason"] == {"tool_call_diverged": 1}


@pytest.mark.tokens
async def test_n_samples_give_n_records_per_prompt_with_their_sampling(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory().wait_ready()
    rows = [
        {"id": f"q{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}
        for i in range(3)
    ]
    config = _config(tmp_path, rows, samples=4, temperatures=[0.0, 0.6, 1.0])
    out = await run_batches(config, emu.url)

    records = _rows(out.shard_paths())
    assert sorted(r["id"] for r in records) == [f"q{i}#s{n}" for i in range(3) for n in range(4)]
    for i in range(3):
        mine = sorted(
            (r for r in records if r["conversation_id"] == f"q{i}"), key=lambda r: r["sample"]
        )
        assert [r["sample"] for r in mine] == [0, 1, 2, 3]
        assert [r["sampling"]["temperature"] for r in mine] == [0.0, 0.6, 1.0, 0.0]
        assert len({r["sampling"]["sampling_seed"] for r in mine}) == 4
        assert all(r["sampling"]["max_new_tokens"] == 1024 for r in mine)
        # Samples 1 and 2 draw with their own seeds; 0 and 3 are greedy, hence equal.
        outputs = [tuple(r["output_ids"]) for r in mine]
        assert len(set(outputs[:3])) == 3
        assert outputs[0] == outputs[3]
        assert len({tuple(r["prompt_ids"]) for r in mine}) == 1


@pytest.mark.tokens
async def test_samples_of_all_turns_and_the_offline_checks(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory(*NO_RANDOM_TOOLS).wait_ready()
    rows = [weather_conversation("a", asked_city="Paris"), {"id": "bad", "messages": []}]
    config = _config(tmp_path, rows, regenerate="all_turns", samples=2)
    out = await run_batches(config, emu.url)
    ids = sorted(r["id"] for r in _rows(out.shard_paths()))
    assert ids == [f"a#s{n}#t{k}" for n in range(2) for k in range(3)]
    rejects = _rows(sorted(out.rejects_dir.glob("*.parquet")))
    assert [(r["id"], r["reason_code"]) for r in rejects] == [("bad", "bad_input")]
    marker = out.batch_summaries()[0]
    assert (marker.lines, marker.accepted, marker.rejected, marker.conversations) == (2, 6, 1, 2)
    assert marker.records_by_turn == {"0": 2, "1": 2, "2": 2}


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time of a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web-search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def agent_conversation(cid: str) -> dict[str, Any]:
    """Three tool-call turns, then the answer. The scripts make the model call what the data
    calls, in the shapes SGLang's kimi_k2 parsers accept: an ordinary call; a section that ends
    the reasoning without ``</think>``; a bare counter (``7``) for a dashed name."""
    w, t, q = '{"city": "Paris"}', '{"zone": "CET"}', '{"query": "museums"}'

    def call(i: str, name: str, args: Any) -> dict[str, Any]:
        return {"id": i, "type": "function", "function": {"name": name, "arguments": args}}

    return {
        "id": cid,
        "tools": [WEATHER_TOOL, TIME_TOOL, SEARCH_TOOL],
        "messages": [
            {"role": "user", "content": f"Plan my afternoon in Paris. [[call get_weather {w}]]"},
            {"role": "assistant", "content": "", "tool_calls": [call("w1", "get_weather", w)]},
            {
                "role": "tool",
                "tool_call_id": "w1",
                "content": f"18 C [[no-think-end]][[call get_time {t}]]",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("t1", "get_time", {"zone": "CET"})],
            },
            {"role": "tool", "tool_call_id": "t1", "content": f"14:05 [[call 7 {q}]]"},
            {"role": "assistant", "content": "", "tool_calls": [call("s1", "web-search", q)]},
            {"role": "tool", "tool_call_id": "s1", "content": "Louvre, Orsay"},
            {"role": "assistant", "content": "Go to the Orsay."},
        ],
    }


_SECTION = "<|tool_calls_section_begin|>"


def served_from_output(
    hf_tokenizer: Any, output_ids: list[int], tools: list[dict[str, Any]], earlier_calls: int
) -> dict[str, Any]:
    """The message SGLang's kimi_k2 parsers return, worked out here on the decoded text: the
    reasoning ends at ``</think>`` or, without one, at the tool-call section; a bare counter
    is named by the declared tool whose parameters hold the argument keys; ids count the
    calls of the history."""
    text = hf_tokenizer.decode(output_ids, skip_special_tokens=False).removesuffix("<|im_end|>")
    if "</think>" in text:
        reasoning, _, rest = text.partition("</think>")
    else:
        cut = text.index(_SECTION)
        reasoning, rest = text[:cut], text[cut:]
    content, _, section = rest.partition(_SECTION)
    calls: list[dict[str, Any]] = []
    for head, args in _CALL.findall(section):
        head = head.strip()
        if head.isdigit():
            keys = set(json.loads(args))
            [name] = [
                t["function"]["name"]
                for t in tools
                if keys <= set(t["function"]["parameters"]["properties"])
            ]
        else:
            name = head.removeprefix("functions.").rsplit(":", 1)[0]
        served_id = f"functions.{name}:{earlier_calls + len(calls)}"
        calls.append(
            {
                "id": served_id,
                "index": len(calls),
                "type": "function",
                "function": {"name": name, "arguments": args.strip()},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


@pytest.mark.tokens
async def test_all_turns_continue_through_three_tool_call_turns_in_sglangs_shapes(
    tmp_path: Path, emulator_factory: Any, hf_tokenizer: Any
) -> None:
    emu = emulator_factory(*NO_RANDOM_TOOLS).wait_ready()
    row = agent_conversation("agent")
    out = await run_batches(_config(tmp_path, [row], regenerate="all_turns"), emu.url)

    records = {r["id"]: r for r in _rows(out.shard_paths())}
    assert not list(out.rejects_dir.glob("*.parquet"))
    assert sorted(records) == [f"agent#t{k}" for k in range(4)]
    turns = [records[f"agent#t{k}"] for k in range(4)]
    assert all(r["stop_reason"] is None for r in turns)
    assert turns[1]["think_end_index"] == -1  # the section ended the reasoning

    # Each turn's prompt is the render of the data with the model's turns as SGLang returns
    # them, and the data's tool results addressed to the ids SGLang returned.
    tok = ChatTokenizer(str(TOKENIZER_DIR), render="template")  # as _config renders
    data, tools = row["messages"], row["tools"]
    history: list[dict[str, Any]] = [data[0]]
    names = []
    for k, rec in enumerate(turns):
        [expected] = tok.render([Prompt("agent", 1, history, tools)])
        assert rec["prompt_ids"] == expected, f"turn {k}"
        if k == 3:
            break
        earlier = sum(len(m.get("tool_calls", [])) for m in history if m["role"] == "assistant")
        served = served_from_output(hf_tokenizer, rec["output_ids"], tools, earlier)
        [served_call] = served["tool_calls"]
        names.append((served_call["function"]["name"], served_call["id"]))
        result = {**data[2 * k + 2], "tool_call_id": served_call["id"]}
        history = [*history, served, result]
    assert names == [
        ("get_weather", "functions.get_weather:0"),
        ("get_time", "functions.get_time:1"),
        ("web-search", "functions.web-search:2"),
    ]


def _sent_since(ledger: Path, base: int, n: int) -> bool:
    return len(read_ledger(ledger)) - base >= n


@pytest.mark.usefixtures("prefect_backend")
def test_a_kill_in_the_middle_of_a_multi_turn_partition_resumes_exactly(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """A run of multi-turn conversations SIGKILLed mid-run, rerun, and compared with an
    uninterrupted run. One scenario read top to bottom (kill, rerun, compare), hence its length."""
    ledger = tmp_path / "ledger.jsonl"
    slow = [
        "--emu-running-slots",
        "4",
        "--emu-decode-ms-per-token",
        "2",
        "--emu-mean-output-tokens",
        "60",
        *NO_RANDOM_TOOLS,
    ]
    emu = emulator_factory(*slow, ledger=ledger).wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        weather_conversation(f"c{i:02d}", asked_city="Rome" if i % 5 == 0 else "Paris")
        for i in range(24)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def config_file(out: Path) -> Path:
        data = base_config(tmp_path, prompts)
        data["server"] = {"mode": "attach", "url": emu.url}
        data["sampling"] = {"seed": 3}
        data["tiers"][0]["concurrency"] = 4
        data["batch_size"] = 8
        data["partitions"][0].update(regenerate="all_turns", samples=2)
        return write_config(data, out)

    ref = CliRun(config_file(tmp_path / "ref"), tmp_path / "ref.log")
    assert ref.wait(240) == 0, ref.output()
    reference = {r["id"]: r for r in _rows(sorted((tmp_path / "ref" / "chaos").glob("part-*")))}
    base = len(read_ledger(ledger))
    total = base  # requests of one whole run

    killed = config_file(tmp_path / "killed")
    for kill in range(2):
        run = CliRun(killed, tmp_path / f"killed-{kill}.log")
        run.wait_while_running(partial(_sent_since, ledger, len(read_ledger(ledger)), total // 3))
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
    final = CliRun(killed, tmp_path / "final.log")
    assert final.wait(240) == 0, final.output()

    got = {r["id"]: r for r in _rows(sorted((tmp_path / "killed" / "chaos").glob("part-*")))}
    assert sorted(got) == sorted(reference)
    assert len(reference) == 2 * (19 * 3 + 5)  # Rome conversations stop after their turn 0
    for rid, rec in reference.items():
        for column in ("prompt_ids", "output_ids", "turn", "sample", "stop_reason", "sampling"):
            assert got[rid][column] == rec[column], (rid, column)
    report = validate_dataset(tmp_path / "killed")
    assert report.ok, report.lines()
    manifest = json.loads((tmp_path / "killed" / "manifest.json").read_text())["partitions"]
    assert manifest["chaos"]["conversations"] == 48
    assert manifest["chaos"]["conversations_stopped"] == 10
    assert manifest["chaos"]["stops_by_reason"] == {"tool_call_diverged": 10}
    picture = picture_markdown(partition_picture(tmp_path / "killed", "chaos"))
    assert (
        "**48** conversations, **10** stopped before their last turn (tool_call_diverged 10)"
        in picture
    )
    assert "records by turn: turn 0: 48, turn 1: 38, turn 2: 38" in picture

    # Export: one training row per generated turn, loss on exactly that turn's output.
    exported = export_dataset(
        tmp_path / "killed", "speculators", tmp_path / "spec.jsonl", tokenizer=str(TOKENIZER_DIR)
    )
    assert exported.total == len(reference)
    rows = [json.loads(line) for line in (tmp_path / "spec.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["id"] == "chaos/c01#s1#t2")
    rec = reference["c01#s1#t2"]
    assert row["primary_id"] == "c01"
    assert row["input_ids"] == rec["prompt_ids"] + rec["output_ids"]
    assert row["loss_mask"] == [0] * len(rec["prompt_ids"]) + [1] * len(rec["output_ids"])
    assert (row["metadata"]["turn"], row["metadata"]["sample"]) == (2, 1)
    assert row["metadata"]["sampling_params"]["sampling_seed"] == rec["sampling"]["sampling_seed"]
    # Only what was in flight at each kill was sent twice (4 at most per kill).
    sent = [
        e["rid"].split(":")[2]
        for e in read_ledger(ledger)[base:]
        if not e["rid"].startswith("preflight")
    ]
    assert len(sent) - len(set(sent)) <= 2 * 4, len(sent) - len(set(sent))

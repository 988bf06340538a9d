"""``/generate`` shapes and semantics against a real emulator process."""

from __future__ import annotations

import re
from typing import Any

import orjson

from tests.support.emulator import EmulatorFactory, EmulatorProcess
from tests.support.prompts import WEATHER_TOOL, render

META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
    "reasoning_tokens",
    "response_sent_to_client_ts",
}


def test_single_response_shape(emu: EmulatorProcess, prompt: list[int]) -> None:
    out = emu.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 64}})
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert set(meta) >= META_KEYS
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["weight_version"] == "default"
    assert meta["num_retractions"] == 0 and meta["reasoning_tokens"] == 0
    assert re.fullmatch(r"[0-9a-f]{32}", meta["id"])
    assert isinstance(out["text"], str)


def test_rid_rules(emu: EmulatorProcess, prompt: list[int]) -> None:
    sp = {"max_new_tokens": 4}
    assert (
        emu.generate({"input_ids": prompt, "rid": "r-1", "sampling_params": sp})["meta_info"]["id"]
        == "r-1"
    )
    ids = [
        emu.generate({"input_ids": prompt, "sampling_params": sp})["meta_info"]["id"]
        for _ in range(2)
    ]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]
    # a finished rid may be sent again (the pipeline retries with the same rid)
    again = emu.generate({"input_ids": prompt, "rid": "r-1", "sampling_params": sp})
    assert again["meta_info"]["id"] == "r-1"


def test_stop_token_is_last_and_matched(
    emu: EmulatorProcess, prompt: list[int], special: dict[str, int]
) -> None:
    for seed in range(5):
        out = emu.generate(
            {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 4000, "sampling_seed": seed},
            }
        )
        ids = out["output_ids"]
        assert ids[-1] == special["im_end"]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": special["im_end"]}
        assert special["im_end"] not in ids[:-1]
        assert ids.count(special["think_end"]) == 1


def test_stop_token_ids_and_trimming(
    emu: EmulatorProcess, prompt: list[int], special: dict[str, int]
) -> None:
    sp: dict[str, Any] = {
        "max_new_tokens": 4000,
        "stop_token_ids": [special["think_end"]],
        "skip_special_tokens": False,
    }
    out = emu.generate({"input_ids": prompt, "sampling_params": sp})
    assert out["output_ids"][-1] == special["think_end"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": special["think_end"]}
    assert "</think>" not in out["text"]
    kept = emu.generate({"input_ids": prompt, "sampling_params": {**sp, "no_stop_trim": True}})
    assert kept["output_ids"] == out["output_ids"]
    assert kept["text"].endswith("</think>")
    full = emu.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 4000}})
    assert full["output_ids"][: len(out["output_ids"])] == out["output_ids"]
    # skip_special_tokens (default) keeps special tokens out of text, never out of output_ids
    assert "<|" not in full["text"] and "</think>" not in full["text"]


def test_length_finish_is_exact(emu: EmulatorProcess, prompt: list[int]) -> None:
    for n in (1, 5, 300):
        sp = {"max_new_tokens": n, "ignore_eos": True, "sampling_seed": 3}
        out = emu.generate({"input_ids": prompt, "sampling_params": sp})
        assert len(out["output_ids"]) == n == out["meta_info"]["completion_tokens"]
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": n}
    short = emu.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}})
    long = emu.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 2000}})
    assert long["output_ids"][: len(short["output_ids"])] == short["output_ids"]


def test_determinism_across_restarts(
    emu: EmulatorProcess, emu_factory: EmulatorFactory, prompt: list[int]
) -> None:
    b, c = emu_factory.start_many(["--random-seed", "0"], ["--random-seed", "5"])
    a = emu
    sp = {"max_new_tokens": 500}
    for seed in (None, 1, 2):
        body: dict[str, Any] = {"input_ids": prompt, "sampling_params": dict(sp)}
        if seed is not None:
            body["sampling_params"]["sampling_seed"] = seed
        first = a.generate({**body, "rid": "one"})["output_ids"]
        assert b.generate({**body, "rid": "two"})["output_ids"] == first
    default = a.generate({"input_ids": prompt, "sampling_params": sp})["output_ids"]
    seeded = a.generate({"input_ids": prompt, "sampling_params": {**sp, "sampling_seed": 9}})
    assert seeded["output_ids"] != default
    assert c.generate({"input_ids": prompt, "sampling_params": sp})["output_ids"] != default
    # greedy decoding ignores the seed, as a real model's argmax would
    greedy = {**sp, "temperature": 0}
    g1 = a.generate({"input_ids": prompt, "sampling_params": {**greedy, "sampling_seed": 1}})
    g2 = c.generate({"input_ids": prompt, "sampling_params": {**greedy, "sampling_seed": 2}})
    assert g1["output_ids"] == g2["output_ids"]


def test_thinking_shapes(emu: EmulatorProcess, hf_tokenizer: Any, special: dict[str, int]) -> None:
    think, end = special["think"], special["think_end"]
    on = render(hf_tokenizer, "Think about it.")
    off = render(hf_tokenizer, "Think about it.", thinking=False)
    r1 = on[:-1]  # a template that leaves <think> to the model
    assert on[-1] == think and off[-2:] == [think, end] and r1[-1] != think
    for seed in range(5):
        sp = {"max_new_tokens": 8000, "sampling_seed": seed}
        ids = emu.generate({"input_ids": on, "sampling_params": sp})["output_ids"]
        assert think not in ids and ids.count(end) == 1 and ids.index(end) > 0
        ids = emu.generate({"input_ids": off, "sampling_params": sp})["output_ids"]
        assert think not in ids and end not in ids
        ids = emu.generate({"input_ids": r1, "sampling_params": sp})["output_ids"]
        assert ids[0] == think and ids.count(think) == 1 and ids.count(end) == 1


def test_tool_call_section_when_tools_declared(
    emu: EmulatorProcess, hf_tokenizer: Any, special: dict[str, int]
) -> None:
    with_tools = render(hf_tokenizer, "Weather in Paris?", tools=[WEATHER_TOOL])
    without = render(hf_tokenizer, "Weather in Paris?")
    sections = 0
    for seed in range(16):
        sp = {"max_new_tokens": 8000, "sampling_seed": seed}
        out = emu.generate({"input_ids": with_tools, "sampling_params": sp})
        ids = out["output_ids"]
        if special["sec_begin"] not in ids:
            continue
        sections += 1
        begin, end = ids.index(special["sec_begin"]), ids.index(special["sec_end"])
        assert begin < end and ids[end + 1 :] == [special["im_end"]]
        assert ids.index(special["think_end"]) < begin
        section = ids[begin + 1 : end]
        calls = section.count(special["call_begin"])
        assert 1 <= calls <= 3 and section.count(special["call_end"]) == calls
        text = hf_tokenizer.decode(section, skip_special_tokens=False)
        for idx, (name, args) in enumerate(
            re.findall(
                r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
                text,
            )
        ):
            assert name == f"functions.get_weather:{idx}"
            assert set(orjson.loads(args)) <= {"city", "unit"}
        plain = emu.generate({"input_ids": without, "sampling_params": sp})["output_ids"]
        assert special["sec_begin"] not in plain
    assert 3 <= sections <= 13  # about half of the seeds call a tool


def test_cached_tokens_on_repeat(emu: EmulatorProcess, hf_tokenizer: Any) -> None:
    p = render(hf_tokenizer, "a prompt seen twice")
    first = emu.generate({"input_ids": p, "sampling_params": {"max_new_tokens": 2}})
    second = emu.generate({"input_ids": p, "sampling_params": {"max_new_tokens": 2}})
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == len(p) - 1

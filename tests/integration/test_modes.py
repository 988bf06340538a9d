"""A partition that mixes thinking and instant mode, run against a real emulator process over
real HTTP: the Parquet read back holds both modes, each instant record's prompt ends with the
instant generation prompt (an empty reasoning block) and its answer has none, each thinking
record closes its reasoning once, and every record passes the offline checks of its mode. A
line whose kwargs the template refuses, or one naming a mode that is not declared, stops the
partition's plan, naming file and line, before any request (without the plan, as batches run
alone, such a line is a reject naming its line)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import ConfigError, InputFileError
from eagle3_datagen.generate.plan import plan_partition
from eagle3_datagen.inputs.modes import assign_mode
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.validate.dataset import check_record, validate_dataset
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import base_config, records, run_batches
from tests.support.prompts import write_prompts

MODES = {"thinking": {}, "instant": {"thinking": False}}
SHARES = {"thinking": 0.5, "instant": 0.5}


def modes_config(tmp_path: Path, lines: int = 24, undeclared: bool = False) -> PipelineConfig:
    path = tmp_path / "in.jsonl"
    with path.open("w") as fh:
        for i in range(lines):
            msg = {"role": "user", "content": f"question number {i}, thinking or not"}
            fh.write(json.dumps({"id": f"r{i}", "messages": [msg]}) + "\n")
        msg = {"role": "user", "content": "a line that names its mode"}
        fh.write(json.dumps({"id": "named", "mode": "instant", "messages": [msg]}) + "\n")
        if undeclared:
            fh.write(json.dumps({"id": "fast", "mode": "fast", "messages": [msg]}) + "\n")
        bad = {"add_generation_prompt": False}
        fh.write(json.dumps({"id": "bad", "chat_template_kwargs": bad, "messages": [msg]}) + "\n")
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR), "modes": MODES},
            "tiers": [{"name": "T", "concurrency": 8, "max_tokens": 400}],
            "partitions": [{"name": "p", "input": str(path), "tier": "T", "modes": SHARES}],
            "sampling": {"seed": 7},
            "output_dir": str(tmp_path / "out"),
            "batch_size": 5,
        }
    )


async def test_a_partition_mixes_thinking_and_instant_mode(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "60").wait_ready()
    config = modes_config(tmp_path)
    await run_batches(config, emu.url)
    out = Path(config.output_dir)
    rows = records(out, "p")
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    ids = TokenIds.resolve(tok, config.special_tokens)
    think, end = tok.token_id("<think>"), tok.token_id("</think>")
    assert set(rows) == {f"r{i}" for i in range(24)} | {"named"}
    modes = Counter(row["mode"] for row in rows.values())
    assert set(modes) == {"thinking", "instant"}, modes
    content = {"chat_template_kwargs": {}, "modes": MODES}
    for rid, row in rows.items():
        expected = "instant" if rid == "named" else assign_mode(rid, SHARES)
        assert row["mode"] == expected, rid
        if expected == "instant":
            assert row["prompt_ids"][-2:] == [think, end], rid
            assert think not in row["output_ids"] and end not in row["output_ids"], rid
            assert row["think_end_index"] == -1
        else:
            assert row["prompt_ids"][-1] == think, rid
            assert row["output_ids"].count(end) == 1, rid
        verdict = check_record(row, "p", ids, config.validation, content)
        assert verdict.accepted, (rid, verdict.reasons)
    rejects = pq.read_table(sorted((out / "p" / "rejects").glob("part-*.parquet"))).to_pylist()
    by_id = {r["id"]: r for r in rejects}
    assert set(by_id) == {"bad"}
    assert by_id["bad"]["source_line"] == 26 and by_id["bad"]["reason_code"] == "template_error"
    assert "add_generation_prompt" in by_id["bad"]["reason"]


def test_an_undeclared_mode_stops_the_plan_naming_file_and_line(tmp_path: Path) -> None:
    """The partition's plan (before any of its requests) reads every line's mode."""
    config = modes_config(tmp_path, undeclared=True)
    where = f"{config.partition('p').input}:26: mode 'fast' is not declared in model.modes"
    with pytest.raises(InputFileError, match=re.escape(where)):
        plan_partition(config, "p")
    assert not list((Path(config.output_dir) / "p").glob("**/*.parquet"))  # nothing generated


def test_a_lines_refused_kwargs_reject_that_line_and_a_refused_mode_stops_the_plan(
    tmp_path: Path,
) -> None:
    """SGLang's chat path passes add_generation_prompt by name, so a line repeating it in its
    kwargs fails as SGLang's request would: found on a probe render when the partition is
    planned, for that line alone (its reject, bad input: tests/integration/test_rejects_cli.py);
    a mode the template refuses fails every line of it, so it stops the plan."""
    config = modes_config(tmp_path)
    plan = plan_partition(config, "p")
    [why] = plan.refused_kwargs.values()
    assert why.startswith('chat_template_kwargs {"add_generation_prompt":false}: '), why
    # A mode whose own kwargs the template refuses: the config is named.
    data = config.model_dump(mode="json")
    data["model"]["modes"]["instant"] = {"tools": []}
    bad = PipelineConfig.model_validate(data)
    with pytest.raises(ConfigError, match=re.escape('model.modes.instant {"tools":[]}: ')):
        plan_partition(bad, "p")


@pytest.mark.usefixtures("prefect_backend")
def test_a_mixed_run_validates_against_its_input_and_its_card_names_the_modes(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """The whole flow: ``validate --input`` renders every line again in its mode (from the
    fingerprint) and finds the records' prompts; the offline checks apply each mode's rules."""
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "60").wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 30)
    data = base_config(tmp_path, prompts)
    data["server"] = {"mode": "attach", "url": emu.url}
    data["model"]["modes"] = MODES
    data["partitions"][0]["modes"] = SHARES
    config = PipelineConfig.model_validate(data)
    ok, result = run_pipeline(config)
    assert ok, result
    out = Path(config.output_dir)
    rows = records(out, "chaos")
    assert len(rows) == 30 and {r["mode"] for r in rows.values()} == {"thinking", "instant"}
    report = validate_dataset(out, inputs=True)
    assert report.ok, report.lines()
    card = (out / "README.md").read_text()
    assert (
        "| serving modes (docs/modes.md) |" in card and "chaos: thinking 0.5, instant 0.5" in card
    )

"""Resume keyed by content: a rerun after the prompts file changed sends exactly the prompts that
are not done, and the dataset then holds each current id once, with the record of its current
prompt (checked against transformers' own chat template, not the pipeline's render)."""

from __future__ import annotations

import json
import os
import random
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.validate.dataset import validate_dataset
from eagle3_datagen.write.export import export_dataset
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.main import main
from tests.support import TOKENIZER_DIR
from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config, records
from tests.support.prompts import expected_prompt_ids, prompt_line

pytestmark = pytest.mark.usefixtures("prefect_backend")


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def _edited(i: int) -> str:
    """Line ``i`` with the same id and another question."""
    row = json.loads(prompt_line(i))
    row["messages"][-1]["content"] += " (edited: answer in one sentence)"
    return json.dumps(row)


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def _generation_rids(ledger: Path, since: int) -> list[str]:
    return [e["rid"] for e in read_ledger(ledger)[since:] if not e["rid"].startswith("preflight")]


def _check_dataset(out: Path, prompts: Path, tok: Any) -> dict[str, dict[str, Any]]:
    """Every line of the current input once (record or reject), each record its current
    prompt rendered independently; validate and export agree; nothing superseded is left."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    got = records(out, "chaos")  # fails on an id written twice
    rejects_dir = out / "chaos" / "rejects"
    rejects = (
        pq.read_table(sorted(rejects_dir.glob("part-*.parquet"))).to_pylist()
        if list(rejects_dir.glob("part-*.parquet"))
        else []
    )
    assert not rejects, rejects[:3]
    assert sorted(got) == sorted(r["id"] for r in rows)
    for line, row in enumerate(rows, start=1):
        rec = got[row["id"]]
        assert rec["prompt_ids"] == expected_prompt_ids(tok, row), f"line {line}: stale prompt"
        assert rec["source_line"] == line
    report = validate_dataset(out, inputs=True)
    assert report.ok, report.lines()
    assert main(["validate", str(out), "--input"]) == 0
    exported = export_dataset(out, "specforge", out.parent / f"{out.name}.jsonl")
    assert exported.total == len(rows)
    assert not (out / "chaos" / "_superseded").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["partitions"]["chaos"]
    assert entry["input"]["lines"] == len(rows)
    assert entry["input"]["size"] == prompts.stat().st_size
    assert entry["accepted"] == len(rows)
    return got


def test_every_kind_of_input_change_sends_only_what_is_not_done(
    tmp_path: Path, emulator_factory: Any, hf_tokenizer: Any
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(ledger=ledger).wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    data = base_config(tmp_path, prompts)
    data["model"]["render"] = "template"  # checked against the template over the data as-is
    data["server"] = {"mode": "attach", "url": emu.url}
    data["batch_size"] = 8
    config = PipelineConfig.model_validate(data)
    out = Path(config.output_dir)

    def rerun(lines: list[str], expect_sent: set[str], step: str) -> dict[str, dict[str, Any]]:
        _write(prompts, lines)
        if (out / "manifest.json").exists():  # the dataset no longer matches its input
            stale = validate_dataset(out, inputs=True)
            assert not stale.ok
            assert any(f"{prompts} changed since" in p for p in stale.problems), stale.problems
        since = len(read_ledger(ledger))
        ok, result = run_pipeline(config)
        assert ok, f"{step}: {result}"
        rows = [json.loads(line) for line in lines]
        by_line = {str(i): r["id"] for i, r in enumerate(rows, start=1)}
        sent = {by_line[rid.split(":")[-2]] for rid in _generation_rids(ledger, since)}
        assert sent == expect_sent, f"{step}: sent {sorted(sent)}, expected {sorted(expect_sent)}"
        return _check_dataset(out, prompts, hf_tokenizer)

    lines = [prompt_line(i) for i in range(40)]
    first = rerun(lines, {f"p{i:07d}" for i in range(40)}, "first run")

    # Added at the start, in the middle and at the end: only the new ones are sent, and the
    # records of the others are the very same outputs, now on their new lines.
    lines = [
        prompt_line(100),
        *lines[:17],
        prompt_line(101),
        prompt_line(102),
        *lines[17:],
        prompt_line(103),
    ]
    got = rerun(lines, {"p0000100", "p0000101", "p0000102", "p0000103"}, "lines added")
    for pid, rec in first.items():
        assert got[pid]["output_ids"] == rec["output_ids"]

    # Edited (same id, another question): sent again, the old record is gone.
    for i in (4, 28):
        lines[lines.index(prompt_line(i))] = _edited(i)
    got = rerun(lines, {"p0000004", "p0000028"}, "lines edited")

    # Removed: nothing sent, the records of the removed ids are gone.
    del lines[10:14]
    rerun(lines, set(), "lines removed")

    # Reordered: nothing sent.
    random.Random(3).shuffle(lines)
    rerun(lines, set(), "lines reordered")

    # A different file under the same name: new ids are sent, an id that comes back with its
    # old prompt is not, one that comes back with another prompt is.
    lines = [prompt_line(i) for i in range(200, 220)] + [prompt_line(20), _edited(7)]
    rerun(lines, {f"p{i:07d}" for i in range(200, 220)} | {"p0000007"}, "another file")


def _sent_since(ledger: Path, base: int, n: int) -> bool:
    return len(_generation_rids(ledger, base)) >= n


def test_a_kill_after_the_input_changed_resumes_exactly(
    tmp_path: Path, emulator_factory: Any, hf_tokenizer: Any
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    slow = ["--emu-running-slots", "8", "--emu-decode-ms-per-token", "2"]
    emu = emulator_factory(*slow, ledger=ledger).wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    data = base_config(tmp_path, prompts)
    data["model"]["render"] = "template"  # checked against the template over the data as-is
    data["server"] = {"mode": "attach", "url": emu.url}
    data["tiers"][0]["concurrency"] = 8
    data["batch_size"] = 10
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = Path(data["output_dir"])

    _write(prompts, [prompt_line(i) for i in range(60)])
    first = CliRun(cfg, tmp_path / "first.log")
    assert first.wait(240) == 0, first.output()

    # Prepend 40 new prompts (every batch shifts) and edit one, then kill the run mid-way.
    lines = [prompt_line(i) for i in range(1000, 1040)] + [prompt_line(i) for i in range(60)]
    lines[70] = _edited(30)
    _write(prompts, lines)
    base = len(read_ledger(ledger))
    killed = CliRun(cfg, tmp_path / "killed.log")
    killed.wait_while_running(partial(_sent_since, ledger, base, 15))
    os.kill(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait()

    final = CliRun(cfg, tmp_path / "final.log")
    assert final.wait(240) == 0, final.output()
    _check_dataset(out, prompts, hf_tokenizer)
    rows = [json.loads(line) for line in lines]
    sent = _generation_rids(ledger, base)
    # Only the 41 new or edited prompts were ever sent; at most what was in flight twice.
    sent_ids = {rows[int(rid.split(":")[-2]) - 1]["id"] for rid in sent}
    assert sent_ids == {r["id"] for r in rows[:40]} | {"p0000030"}
    assert len(sent) - len(sent_ids) <= 8

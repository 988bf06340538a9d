"""Repeated prompts through a real partition run against the emulator (no Prefect): ``drop``
rejects them naming the line they repeat, ``keep`` generates them; both report every one in
``near_duplicates.jsonl`` and count them in the manifest entry and the card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import TOKENIZER_DIR
from eagle3_datagen.generate.batch import PartitionRunner
from eagle3_datagen.generate.context import PartitionJob
from eagle3_datagen.generate.plan import NEAR_DUPLICATES, plan_partition
from eagle3_datagen.report.dataset_card import CARD, refresh_dataset_card
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.write.manifest import summarize_on_disk

pytestmark = pytest.mark.tokens

QUESTIONS = [
    "How do I reverse a linked list in place without extra memory, step by step?",
    "Explain why the sky looks blue at noon and red at sunset, with the physics.",
    "Write a haiku about speculative decoding and the patience of a draft model.",
    "What is the difference between a process and a thread on Linux systems?",
]


def write_input(path: Path) -> Path:
    rows = [
        {"id": f"q{i}", "messages": [{"role": "user", "content": q}]}
        for i, q in enumerate(QUESTIONS)
    ]
    rows.append({"id": "again", "messages": [{"role": "user", "content": QUESTIONS[1].upper()}]})
    long = " ".join(f"{QUESTIONS[3]} part {i}." for i in range(12))
    rows.append({"id": "long", "messages": [{"role": "user", "content": long}]})
    rows.append(
        {
            "id": "long2",
            "messages": [{"role": "user", "content": long.replace("part 7", "piece 7")}],
        }
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path  # line 5 repeats line 2 exactly; line 7 nearly repeats line 6


def make(tmp_path: Path, policy: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 4, "max_tokens": 64}],
            "partitions": [
                {
                    "name": "p",
                    "input": str(write_input(tmp_path / "in.jsonl")),
                    "tier": "T",
                    "near_duplicates": {"policy": policy, "threshold": 0.8},
                }
            ],
            "output_dir": str(tmp_path / f"out-{policy}"),
            "batch_size": 4,
        }
    )


async def run(config: PipelineConfig, url: str) -> dict[str, Any]:
    plan = plan_partition(config, "p")
    async with SGLangClient(url) as client:
        runner = PartitionRunner.from_plan(plan, PartitionJob(config, "p", url), client)
        for spec in plan.batches:
            await runner.run_batch(spec)
    out = runner.output
    rejects = [
        r for p in sorted(out.rejects_dir.glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    return {
        "accepted": sorted(pq.read_table(out.shard_paths()).column("source_line").to_pylist()),
        "rejects": {r["source_line"]: r for r in rejects},
        "report": [orjson.loads(x) for x in (out.dir / NEAR_DUPLICATES).read_bytes().splitlines()],
        "summary": summarize_on_disk(config.output_dir, "p"),
    }


async def test_drop_rejects_repeats_and_keep_generates_them(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory().wait_ready()
    path = str(tmp_path / "in.jsonl")
    dropped = await run(make(tmp_path, "drop"), emu.url)
    report = [(r["file"], r["line"], r["first_line"], r["kind"]) for r in dropped["report"]]
    assert report == [(path, 5, 2, "exact"), (path, 7, 6, "near")]
    assert 0.8 <= dropped["report"][1]["similarity"] < 1.0
    assert dropped["accepted"] == [1, 2, 3, 4, 6]
    exact, near = dropped["rejects"][5], dropped["rejects"][7]
    assert (exact["reason_code"], exact["source_file"], exact["stage"]) == (
        "duplicate_prompt",
        path,
        "input",
    )
    assert "the same prompt as line 2" in exact["reason"]
    assert near["reason_code"] == "near_duplicate" and "of line 6" in near["reason"]
    summary = dropped["summary"]
    assert summary["rejects_by_reason"] == {"duplicate_prompt": 1, "near_duplicate": 1}
    assert (summary["input"]["exact_duplicates"], summary["input"]["near_duplicates"]) == (1, 1)

    kept = await run(make(tmp_path, "keep"), emu.url)
    assert kept["report"] == dropped["report"] and kept["rejects"] == {}
    assert kept["accepted"] == [1, 2, 3, 4, 5, 6, 7]
    config = make(tmp_path, "keep")
    entry = {"status": "completed", **kept["summary"]}
    refresh_dataset_card(config.output_dir, {"partitions": {"p": entry}})
    card = (Path(config.output_dir) / CARD).read_text()
    counts = next(x for x in card.splitlines() if x.startswith("| p | completed |"))
    assert counts.endswith("| 1 / 1, kept |")

"""Request ids and sampling seeds as the runner sends them, against a real emulator process.

Rids carry the run id, so two runs (or a batch retried while the server still aborts the first
try) never send one the server still holds. With ``sampling.seed`` set, every prompt gets its own
seed from its id: two prompts with the same text sample differently, and a rerun samples each
prompt the same way (the emulator honours ``sampling_seed`` as SGLang does with
``--enable-deterministic-inference``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3_datagen.config import PipelineConfig
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import run_batches


def _config(tmp_path: Path, seed: int | None) -> PipelineConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "in.jsonl"
    same = [{"role": "user", "content": "Explain the rule of three, briefly."}]
    prompts.write_text(
        "".join(json.dumps({"id": f"twin-{i}", "messages": same}) + "\n" for i in range(4))
    )
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "sampling": {"seed": seed},
            "tiers": [{"name": "T", "concurrency": 4, "max_tokens": 256}],
            "partitions": [{"name": "p", "input": str(prompts), "tier": "T"}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 2,
        }
    )


async def _run(config: PipelineConfig, url: str, run_id: str) -> dict[str, dict[str, Any]]:
    out = await run_batches(config, url, run_id=run_id)
    rows = pq.read_table(out.shard_paths()).to_pylist()
    return {r["id"]: r for r in rows}


async def test_rids_carry_the_run_and_seeds_follow_the_prompt(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory().wait_ready()
    config = _config(tmp_path / "a", seed=1234)
    first = await _run(config, emu.url, "run-a")
    again = await _run(_config(tmp_path / "b", seed=1234), emu.url, "run-b")
    unseeded = await _run(_config(tmp_path / "c", seed=None), emu.url, "run-c")

    assert sorted(first) == [f"twin-{i}" for i in range(4)]
    for rows, run in ((first, "run-a"), (again, "run-b")):
        for row in rows.values():
            assert re.fullmatch(rf"{run}-[0-9a-f]+:p:{row['source_line']}:0", row["rid"])
    # Same text, different ids: each prompt its own seed, so its own sample.
    assert len({tuple(r["output_ids"]) for r in first.values()}) == 4
    # The same prompt in another run: the same seed, so the same sample.
    assert all(first[i]["output_ids"] == again[i]["output_ids"] for i in first)
    # Without a seed this server samples identical prompts identically: the seeds made the
    # difference above.
    assert len({tuple(r["output_ids"]) for r in unseeded.values()}) == 1

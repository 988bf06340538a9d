"""The batch runner on its own (no Prefect): prompts too long for the context, server 400s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import TOKENIZER_DIR
from tests.support.pipeline import run_batches


def make(tmp_path: Path, texts: list[str]) -> PipelineConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "messages": [
        {"role": "user", "content": t}]}) + "\n" for i, t in enumerate(texts)))  # fmt: skip
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 4, "max_tokens": 64}],
            "partitions": [{"name": "p", "input": str(path), "tier": "T"}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 10,
        }
    )


async def run(config: PipelineConfig, url: str, context_length: int | None) -> dict[str, Any]:
    out = await run_batches(config, url, context_length=context_length)
    rejects = pq.read_table(sorted(out.rejects_dir.glob("*.parquet"))).to_pylist()
    accepted = pq.read_table(out.shard_paths()).column("id").to_pylist()
    return {"accepted": accepted, "rejects": {r["id"]: r for r in rejects}}


async def test_too_long_prompts_are_rejected_locally_or_by_the_server(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--context-length", "200").wait_ready()
    config = make(tmp_path, ["short question", "long " * 300, "another short one"])
    # With the context length known, the long prompt never leaves the client.
    got = await run(config, emu.url, context_length=200)
    assert sorted(got["accepted"]) == ["r0", "r2"]
    local = got["rejects"]["r1"]
    assert local["stage"] == "input" and local["reason_code"] == "prompt_too_long"
    assert "context length (200 tokens)" in local["reason"]

    # Without it, the server refuses it with a 400, which is a reject, not a retry or a crash.
    config2 = make(tmp_path / "b", ["short question", "long " * 300])
    got = await run(config2, emu.url, context_length=None)
    remote = got["rejects"]["r1"]
    assert remote["stage"] == "server" and remote["reason_code"] == "server_rejected"
    assert "HTTP 400" in remote["reason"] and "context length" in remote["reason"]

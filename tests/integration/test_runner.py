"""The batch runner on its own (no Prefect): prompts too long for the context, server 400s, the
order a batch sends its requests in."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from PIL import Image

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import TOKENIZER_DIR
from eagle3_datagen.inputs.prompts import plan_batches
from eagle3_datagen.sglang.client import GenerateRequest, GenerateResult, SGLangClient
from eagle3_datagen.write.shards import PartitionOutput
from tests.support.pipeline import partition_runner, run_batches

pytestmark = pytest.mark.tokens


def make(tmp_path: Path, texts: list[Any], concurrency: int = 4) -> PipelineConfig:
    """One line per text: a user message whose content is the text (a string or parts)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": t}]}) + "\n"
            for i, t in enumerate(texts)
        )
    )
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": concurrency, "max_tokens": 64}],
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


class _SendOrder(SGLangClient):
    """The real client, noting the prompt length of each request as it is sent."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.sent: list[int] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.sent.append(len(request.input_ids))
        return await super().generate(request)


async def _run_in_send_order(config: PipelineConfig, url: str) -> tuple[PartitionOutput, list[int]]:
    """Partition ``p`` run batch by batch against ``url``; its output and the prompt lengths
    in the order the requests reached the server."""
    client = _SendOrder(url)
    return await run_batches(config, url, client=client), client.sent


async def test_a_batch_sends_its_longest_prompts_first(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """Longest first within a batch: with one slot, the requests reach the server in order of
    prompt length, longest first, not in line order; every line still gets its record."""
    emu = emulator_factory().wait_ready()
    words = [3, 40, 10, 80, 10, 1, 25]
    config = make(tmp_path, [" ".join(["word"] * n) for n in words], concurrency=1)
    out, sent = await _run_in_send_order(config, emu.url)
    lengths = {r["id"]: r["prompt_tokens"] for r in pq.read_table(out.shard_paths()).to_pylist()}
    in_line_order = [lengths[f"r{i}"] for i in range(len(words))]
    assert sent == sorted(in_line_order, reverse=True)
    assert sent != in_line_order


async def test_image_prompts_take_their_place_by_the_length_the_server_holds(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """An image prompt is as long as its ids with each placeholder expanded (what the server
    holds in KV): one that sends fewer ids than a text prompt but holds more goes first."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1000, 700), (9, 90, 200)).save(tmp_path / "big.png", format="PNG")
    image_line = [{"type": "text", "text": "Describe"}, _img("big.png")]
    words = " ".join(["word"] * 15)
    config = make(tmp_path, ["hi", words, image_line], concurrency=1)
    emu = emulator_factory().wait_ready()
    out, order = await _run_in_send_order(config, emu.url)
    records = {r["id"]: r for r in pq.read_table(out.shard_paths()).to_pylist()}
    sent = {i: len(r["prompt_ids"]) for i, r in records.items()}
    held = {i: r["prompt_tokens"] for i, r in records.items()}  # the server's count
    # The case this is about: the image line sends the fewest ids of the two long lines but
    # the server holds the most for it.
    assert sent["r2"] < sent["r1"] == held["r1"] < held["r2"]
    assert held["r2"] == len(records["r2"]["model_prompt_ids"])
    assert order == [sent["r2"], sent["r1"], sent["r0"]]  # longest held first
    assert order != sorted(sent.values(), reverse=True)  # not by the ids as sent


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


async def test_a_stopped_batch_keeps_its_settled_lines(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """A stop mid-batch: the lines already answered stay done (progress never goes backwards),
    and the rerun finds them in the batch's journal and sends only the others."""
    emu = emulator_factory("--emu-decode-ms-per-token", "4", "--emu-mean-output-tokens", "40")
    emu.wait_ready()
    config = make(tmp_path, [f"question number {i}" for i in range(10)], concurrency=1)
    [spec] = plan_batches("p", config.partition("p").input, config.batch_size)
    async with SGLangClient(emu.url) as client:
        first = partition_runner(config, client)
        batch = asyncio.create_task(first.run_batch(spec))
        while first.progress.done < 3:
            assert not batch.done(), "the batch finished before it could be stopped"
            await asyncio.sleep(0.01)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        settled = first.progress.done
        assert 3 <= settled < 10
        assert not list(PartitionOutput(config.output_dir, "p").shard_paths())

    resent = _SendOrder(emu.url)
    async with resent:
        second = partition_runner(config, resent)
        await second.run_batch(spec)
    assert len(resent.sent) == 10 - settled
    ids = pq.read_table(PartitionOutput(config.output_dir, "p").shard_paths()).column("id")
    assert sorted(ids.to_pylist()) == sorted(f"r{i}" for i in range(10))

"""Whole-pipeline runs in tests: a base config over the emulator, the config file, the CLI as a
child process (output to a file), one partition's batches run without Prefect, the accepted
records read back from Parquet."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.generate.batch import PartitionRunner
from eagle3_datagen.generate.context import PartitionJob, RunContext
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.inputs.prompts import plan_batches
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.write.shards import PartitionOutput
from tests.support import TOKENIZER_DIR, free_port


def base_config(tmp_path: Path, prompts: Path, **server: Any) -> dict[str, Any]:
    """One partition ``chaos`` of ``prompts``, a launched emulator, quick retries."""
    return {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {
            "mode": "launch",
            "engine": "emulator",
            "port": free_port(),
            "startup_timeout_s": 60,
            "request_timeout_s": 60,
            **server,
        },
        "tiers": [{"name": "SHORT", "concurrency": 16, "max_tokens": 2048}],
        "partitions": [{"name": "chaos", "input": str(prompts), "tier": "SHORT"}],
        "output_dir": str(tmp_path / "out"),
        "batch_size": 32,
        "retries": {"max_attempts": 8, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    }


def write_config(data: dict[str, Any], out: Path) -> Path:
    """``data`` writing to ``out``, saved as ``out.yaml`` beside it; returns the file."""
    data["output_dir"] = str(out)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def partition_runner(
    config: PipelineConfig,
    client: SGLangClient,
    *,
    run_id: str | None = None,
    context_length: int | None = None,
    metadata: dict[str, str] | None = None,
) -> PartitionRunner:
    """The runner of partition ``p`` with the test tokenizer, writing to the config's output,
    without a plan (nothing of the output is moved or reused); ``run_id``: the run key its
    rids carry, ``context_length``: the server's, ``metadata``: the Parquet metadata."""
    tok = ChatTokenizer(str(TOKENIZER_DIR), render=config.model.render)
    run = RunContext(run_key=run_id, budget=ServerBudget()) if run_id else None
    job = PartitionJob(config, "p", "", context_length, None, metadata, run)
    ids = TokenIds.resolve(tok, config.special_tokens)
    return PartitionRunner(job, PartitionContext.build(job, tok, ids), client)


async def run_batches(
    config: PipelineConfig, url: str, client: SGLangClient | None = None, **runner: Any
) -> PartitionOutput:
    """Every batch of partition ``p`` through one PartitionRunner, in order, without Prefect;
    ``client`` (opened and closed here) replaces a plain one to ``url``; ``runner``:
    partition_runner's keywords (``run_id``, ``context_length``, ``metadata``)."""
    async with client or SGLangClient(url) as client:
        runs = partition_runner(config, client, **runner)
        for spec in plan_batches("p", config.partition("p").input, config.batch_size):
            await runs.run_batch(spec)
    return runs.output


def records(output_dir: Path, partition: str) -> dict[str, dict[str, Any]]:
    """Accepted records by id; fails if an id was written twice."""
    rows = pq.read_table(sorted((output_dir / partition).glob("part-*.parquet"))).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "an id was written twice"
    return {r["id"]: r for r in rows}


class CliRun:
    """``eagle3-datagen run CONFIG`` as a child process against the session's Prefect backend;
    its stdout and stderr go to ``log`` (never an unread pipe)."""

    def __init__(self, config: Path, log: Path, *args: str) -> None:
        from prefect.settings import PREFECT_API_URL

        env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", "run", str(config), *args]
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait(self, timeout_s: float = 240) -> int:
        return self.proc.wait(timeout_s)

    def wait_while_running(self, condition: Callable[[], bool], timeout_s: float = 120) -> None:
        """Poll ``condition`` until true; fails if the run exits first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.proc.poll() is None, f"the run exited early:\n{self.output()}"
            assert time.monotonic() < deadline, f"no progress in {timeout_s}s:\n{self.output()}"
            time.sleep(0.02)

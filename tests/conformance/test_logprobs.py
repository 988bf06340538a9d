"""A ``logprobs: {top_k: K}`` partition run through the pipeline (attach mode) against SGLang
0.5.23's real app: SGLang's own TokenizerManager shapes the fake scheduler's logprob values into
``meta_info`` (conformance/fake_logprobs.py), our client reads them, and the Parquet columns
must hold exactly the values the scheduler made, per output token, with the entries of no
mass (sent clamped to float32's lowest value) dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conformance.process import RealAppProcess
from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from eagle3_datagen.sglang.logprobs import NO_MASS, entropy_summary  # noqa: E402
from tests.support import TOKENIZER_DIR  # noqa: E402
from tests.support.pipeline import CliRun, records  # noqa: E402
from tests.support.prompts import write_prompts  # noqa: E402

LINES = 6


def _config(tmp_path: Path, url: str) -> Path:
    cfg: dict[str, Any] = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {"mode": "attach", "url": url, "request_timeout_s": 60},
        "sampling": {"seed": 7, "temperature": 0.7},
        "tiers": [{"name": "SHORT", "concurrency": 4, "max_tokens": 160}],
        "partitions": [
            {
                "name": "top3",
                "input": str(write_prompts(tmp_path / "a.jsonl", LINES)),
                "tier": "SHORT",
                "logprobs": {"top_k": 3},
                "samples": 2,
                "temperatures": [0.0, 0.7],  # greedy and sampled
            },
            {
                "name": "top0",
                "input": str(write_prompts(tmp_path / "b.jsonl", LINES, first=100)),
                "tier": "SHORT",
                "logprobs": {"top_k": 0},
            },
        ],
        "output_dir": str(tmp_path / "out"),
        "batch_size": 4,
        "retries": {"max_attempts": 4, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_logprob_columns_are_the_scheduler_s_values(tmp_path: Path, prefect_backend: None) -> None:
    app = RealAppProcess(tmp_path).wait_ready()
    try:
        run = CliRun(_config(tmp_path, app.url), tmp_path / "run.log")
        assert run.wait() == 0, run.output()
        logged = {a["rid"]: a for a in app.answers() if "logprobs" in a}
    finally:
        app.stop()
    top3 = records(tmp_path / "out", "top3")
    top0 = records(tmp_path / "out", "top0")
    assert len(top3) == 2 * LINES and len(top0) == LINES  # none rejected
    clamped = 0
    for rec in [*top3.values(), *top0.values()]:
        lp = logged[rec["rid"]]["logprobs"]
        assert lp["top_logprobs_num"] == (3 if rec["partition"] == "top3" else 0)
        assert list(rec["output_ids"]) == lp["token_idx"], rec["id"]
        assert rec["output_logprobs"] == lp["token_val"], rec["id"]  # float32 both, exact
        if rec["partition"] == "top0":
            assert rec["top_logprob_ids"] is None and rec["top_logprobs"] is None
            assert rec["entropy_mean"] is None
            continue
        kept = [
            [(v, i) for v, i in zip(vals, ids, strict=True) if v > NO_MASS]
            for vals, ids in zip(lp["top_val"], lp["top_idx"], strict=True)
        ]
        clamped += sum(len(row) for row in lp["top_val"]) - sum(len(row) for row in kept)
        assert rec["top_logprob_ids"] == [[i for _, i in row] for row in kept], rec["id"]
        assert rec["top_logprobs"] == [[v for v, _ in row] for row in kept], rec["id"]
        summary = entropy_summary(rec["top_logprobs"])
        assert summary is not None and rec["entropy_mean"] == summary.mean
        if rec["sampling"]["temperature"] == 0.0:  # greedy: each output id is its row's top
            assert [row[0] for row in rec["top_logprob_ids"]] == list(rec["output_ids"])
    assert clamped > 0, "no row had an entry of no mass: the drop went unexercised"

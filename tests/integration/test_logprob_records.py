"""A partition that asks for the target's distribution (``logprobs: {top_k: 5}``), run against a
real emulator process over real HTTP: the Parquet read back holds, per record, one logprob per
output token, five alternatives per token agreeing with it, and entropy estimates; a partition
that does not ask has all of them null, and the same tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.sglang.logprobs import NO_MASS, entropy_summary
from eagle3_datagen.validate.logprobs import check_logprobs
from eagle3_datagen.validate.tokens import Verdict
from eagle3_datagen.write.records import LOGPROB_COLUMNS
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import records, run_batches


def logprob_config(
    tmp_path: Path, logprobs: dict[str, Any] | None, lines: int = 12, samples: int = 2
) -> PipelineConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    with path.open("w") as fh:
        for i in range(lines):
            msg = {"role": "user", "content": f"question number {i} about distributions"}
            fh.write(json.dumps({"id": f"r{i}", "messages": [msg]}) + "\n")
    partition: dict[str, Any] = {"name": "p", "input": str(path), "tier": "T", "samples": samples}
    if logprobs is not None:
        partition["logprobs"] = logprobs
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 8, "max_tokens": 120}],
            "partitions": [partition],
            "sampling": {"seed": 7},
            "output_dir": str(tmp_path / "out"),
            "batch_size": 5,
        }
    )


async def test_records_keep_the_distribution_a_partition_asks_for(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "60").wait_ready()
    config = logprob_config(tmp_path / "on", {"top_k": 5})
    await run_batches(config, emu.url)
    rows = records(Path(config.output_dir), "p")
    assert len(rows) == 24
    schema = pq.read_schema(next((Path(config.output_dir) / "p").glob("part-*.parquet")))
    assert str(schema.field("output_logprobs").type) == "list<element: float>"
    assert str(schema.field("top_logprob_ids").type) == "list<element: list<element: int32>>"
    outside = peaked = 0
    for row in rows.values():
        n = len(row["output_ids"])
        assert len(row["output_logprobs"]) == n and len(row["top_logprobs"]) == n
        # Five each, less the entries of no mass SGLang sends clamped (sglang/logprobs.py).
        assert all(1 <= len(ids) <= 5 for ids in row["top_logprob_ids"])
        peaked += sum(len(ids) < 5 for ids in row["top_logprob_ids"])
        assert all(v > NO_MASS for lps in row["top_logprobs"] for v in lps)
        for token, lp, ids, lps in zip(
            row["output_ids"], row["output_logprobs"], row["top_logprob_ids"],
            row["top_logprobs"], strict=True,
        ):  # fmt: skip
            assert math.isfinite(lp) and lp <= 0.0
            assert lps == sorted(lps, reverse=True)
            if token in ids:
                assert lps[ids.index(token)] == lp
            else:
                outside += 1
                assert lp <= lps[-1]
        summary = entropy_summary(row["top_logprobs"])
        assert summary is not None
        assert row["entropy_mean"] == summary.mean and row["entropy_p90"] == summary.p90
        assert 0.0 < row["entropy_mean"] <= row["entropy_p90"] + 1e-12
        verdict = Verdict()  # the offline check passes what the live one let through
        check_logprobs(
            row["output_ids"], row["output_logprobs"], verdict, top_ids=row["top_logprob_ids"],
            top_logprobs=row["top_logprobs"], top_k=5,
        )  # fmt: skip
        assert verdict.accepted, verdict.reason_text
    assert outside > 0  # the emulator's sampled token is sometimes past the top 5
    assert peaked > 0  # and some rows had entries of no mass, dropped

    # The same prompts without logprobs: the same tokens (sampling is unchanged), no columns.
    plain = logprob_config(tmp_path / "off", None)
    await run_batches(plain, emu.url)
    plain_rows = records(Path(plain.output_dir), "p")
    assert {k: r["output_ids"] for k, r in plain_rows.items()} == {
        k: r["output_ids"] for k, r in rows.items()
    }
    assert all(r[c] is None for r in plain_rows.values() for c in LOGPROB_COLUMNS)


async def test_top_k_zero_keeps_only_the_sampled_token_s_logprob(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "40").wait_ready()
    config = logprob_config(tmp_path, {"top_k": 0}, lines=4)
    await run_batches(config, emu.url)
    for row in records(Path(config.output_dir), "p").values():
        assert len(row["output_logprobs"]) == len(row["output_ids"])
        assert row["top_logprob_ids"] is None and row["top_logprobs"] is None
        assert row["entropy_mean"] is None and row["entropy_p90"] is None

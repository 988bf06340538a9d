"""The demo pipeline on Kimi-K2.5's tokenizer class path (configs/demo-tiktoken.yaml).

Prefect's real local backend, the emulator as a real process serving the tiktoken remote-code
tokenizer, Parquet read back with pyarrow: every prompt equals an independent render, every
output equals what the emulator's ledger says it returned, ids above 65535 kept exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support import REPO, free_port
from tests.support.prompts import expected_prompt_ids

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.tokens]

CONFIG = REPO / "configs" / "demo-tiktoken.yaml"
THINK_END, IM_END = 163607, 163586


def tiktoken_demo_config(out: Path) -> PipelineConfig:
    data = load_config(CONFIG).model_dump(mode="json")
    data["output_dir"] = str(out)
    data["server"]["port"] = free_port()
    data["server"]["extra_args"] = ["--emu-ledger", str(out / "emulator-ledger.jsonl")]
    return PipelineConfig.model_validate(data)


def test_demo_on_the_tiktoken_tokenizer_holds_exact_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    config = tiktoken_demo_config(tmp_path / "out")
    assert config.model.path.endswith("kimi-k2.5-tiktoken") and config.model.trust_remote_code
    ok, manifest = run_pipeline(config)
    assert ok, manifest
    assert isinstance(manifest, dict)

    tok = AutoTokenizer.from_pretrained(config.model.path, trust_remote_code=True)
    assert type(tok).__name__ == "TikTokenTokenizer" and not tok.is_fast
    ledger_lines = (Path(config.output_dir) / "emulator-ledger.jsonl").read_bytes().splitlines()
    ledger: dict[str, dict[str, Any]] = {
        e["rid"]: e for e in map(orjson.loads, filter(None, ledger_lines))
    }
    for part in config.partitions:
        pdir = Path(config.output_dir) / part.name
        table = pq.read_table(sorted(pdir.glob("part-*.parquet")))
        assert table.schema.field("prompt_ids").type == pa.list_(pa.int32())
        assert table.schema.field("output_ids").type == pa.list_(pa.int32())
        rows = table.to_pylist()
        assert rows, f"no records for {part.name}"
        lines = Path(part.input).read_text().splitlines()
        for row in rows:
            src = json.loads(lines[row["source_line"] - 1])
            want = expected_prompt_ids(tok, src, config.model.render)
            assert row["prompt_ids"] == want, row["id"]
            assert row["output_ids"] == ledger[row["rid"]]["output_ids"], row["id"]
            assert row["output_ids"].count(THINK_END) == 1
            assert row["output_ids"][row["think_end_index"]] == THINK_END
            if row["finish_reason"] == "stop":
                assert row["output_ids"][-1] == IM_END
        summary = manifest["partitions"][part.name]
        assert summary["accepted"] == len(rows)

    written = json.loads((Path(config.output_dir) / "manifest.json").read_text())
    assert written["status"] == "completed"
    assert written["partitions"]["demo_short"]["rejected"] == 4  # the demo's planted rejects

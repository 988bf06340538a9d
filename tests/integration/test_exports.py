"""The demo's real output: provenance, loading with `datasets`, both exports, offline validate."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.demo import demo_config
from eagle3_datagen.provenance import pipeline_version
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.export import export_dataset
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.main import main

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.tokens]


def check_provenance(fp: dict[str, Any], config: Any, tok: ChatTokenizer) -> None:
    content, run = fp["content"], fp["run"]
    expected_tok = tok.fingerprint()
    assert content["model_path"] == config.model.path
    for key in ("vocab_size", "vocab_sha256", "special_tokens_sha256"):
        assert content["tokenizer"][key] == expected_tok[key], key
    assert content["chat_template_sha256"] == expected_tok["chat_template_sha256"]
    assert content["chat_template_kwargs"] == config.model.chat_template_kwargs
    assert content["sampling"] == config.sampling.model_dump()
    assert run["server_args"]["model_path"] == config.model.path  # /server_info, verbatim
    assert run["server_args"]["port"] == config.server.port
    assert run["server_args"]["reasoning_parser"] is None
    assert run["sglang_version"] and isinstance(run["sglang_version"], str)
    assert run["pipeline_version"] == pipeline_version()
    made = dt.datetime.fromisoformat(run["created_at"])
    assert dt.timedelta(0) <= dt.datetime.now(dt.UTC) - made < dt.timedelta(hours=1)


def test_demo_output_loads_exports_and_validates(
    tmp_path: Path, chat_tokenizer: ChatTokenizer
) -> None:
    config = demo_config(tmp_path / "out")
    ok, manifest = run_pipeline(config)
    assert ok, manifest
    assert isinstance(manifest, dict)
    root = Path(config.output_dir)

    # Provenance: in the manifest and in every shard's key-value metadata.
    fp = json.loads((root / "manifest.json").read_text())["fingerprint"]
    check_provenance(fp, config, chat_tokenizer)
    shards = sorted(root.glob("*/part-*.parquet"))
    assert shards
    for shard in shards:
        meta = pq.read_schema(shard).metadata
        shard_fp = orjson.loads(meta[b"eagle3_datagen.fingerprint"])
        assert shard_fp["content"] == fp["content"]
        assert meta[b"eagle3_datagen.content_sha256"].decode() == fp["content_sha256"]
        check_provenance(shard_fp, config, chat_tokenizer)

    # The native Parquet loads with `datasets` as it is: int32 id lists, metadata and all.
    import datasets

    loaded: dict[str, dict[str, Any]] = {}
    for part in config.partitions:
        ds = datasets.load_dataset(
            "parquet",
            split="train",
            cache_dir=str(tmp_path / "hf"),
            data_files=str(root / part.name / "part-*.parquet"),
        )
        for column in ("prompt_ids", "output_ids"):
            arrow_type = ds.data.schema.field(column).type
            assert pa.types.is_list(arrow_type) and arrow_type.value_type == pa.int32()
        assert len(ds) == manifest["partitions"][part.name]["accepted"]
        loaded.update({f"{part.name}/{row['id']}": row for row in ds})

    # Both exports: input_ids = prompt_ids + output_ids; loss on the output tokens, and for
    # SpecForge also on the last prompt token (its shift then trains the first proposal).
    spec = export_dataset(root, "speculators", tmp_path / "spec.jsonl")
    forge = export_dataset(root, "specforge", tmp_path / "sf.jsonl")
    # The image partition's records are left out of both, counted (docs/exports.md).
    left_out = manifest["partitions"]["demo_images"]["accepted"]
    assert left_out == 6 and spec.metadata["images"]["left_out"] == left_out
    assert spec.total == forge.total == len(loaded) - left_out
    spec_rows = [orjson.loads(x) for x in (tmp_path / "spec.jsonl").read_bytes().splitlines()]
    forge_rows = [orjson.loads(x) for x in (tmp_path / "sf.jsonl").read_bytes().splitlines()]
    for s, f in zip(spec_rows, forge_rows, strict=True):
        row = loaded[s["id"]]
        n_prompt, n_out = len(row["prompt_ids"]), len(row["output_ids"])
        assert s["input_ids"] == f["input_ids"] == row["prompt_ids"] + row["output_ids"]
        assert s["loss_mask"] == [0] * n_prompt + [1] * n_out
        assert f["loss_mask"] == [0] * (n_prompt - 1) + [1] * (n_out + 1)
        assert s["metadata"]["finish_reason"] == row["finish_reason"]
        assert s["metadata"]["truncated"] == row["truncated"]

    # Offline validation passes on what the pipeline wrote.
    assert main(["validate", str(root)]) == 0

"""What a run checks before it launches a server: names, inputs, tokenizer, special tokens."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig, parse_config
from eagle3_datagen.errors import ConfigError, InputFileError, TokenizerError
from eagle3_datagen.inputs.prompts import plan_batches
from eagle3_datagen.precheck import check_before_server, count_input_lines
from tests.support import TOKENIZER_DIR


def config(tmp_path: Path, inputs: dict[str, str], **special: str) -> PipelineConfig:
    return parse_config(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "special_tokens": special,
            "partitions": [
                {"name": n, "input": str(tmp_path / f), "tier": "SHORT"} for n, f in inputs.items()
            ],
            "output_dir": str(tmp_path / "out"),
        }
    )


def test_sizes_count_lines_as_the_planner_does(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"messages": []}\n\n{"x": 1}\n{"last": "no newline"}')
    pq.write_table(
        pa.table({"messages": [[{"role": "user", "content": "hi"}]] * 5}), tmp_path / "b.parquet"
    )
    cfg = config(tmp_path, {"a": "a.jsonl", "b": "b.parquet"})
    check = check_before_server(cfg, None)
    assert check.names == ["a", "b"] and check.sizes == {"a": 4, "b": 5}
    planned = sum(s.count for s in plan_batches("a", tmp_path / "a.jsonl", 2))
    assert planned == count_input_lines(tmp_path / "a.jsonl") == 4
    assert check.ids.think_end == check.tokenizer.token_id("</think>")


def test_a_count_is_read_once_until_the_file_changes(tmp_path: Path) -> None:
    """The command line and the flow both count: once per file as it is, again once changed."""
    path = tmp_path / "a.jsonl"
    path.write_text("{}\n{}\n")
    assert count_input_lines(path) == 2
    with path.open("a") as fh:
        fh.write("{}\n")
    assert count_input_lines(path) == 3
    path.write_text("{}\n")  # another file under the same name, shorter
    assert count_input_lines(path) == 1


def test_every_unusable_input_is_named_before_the_server(tmp_path: Path) -> None:
    (tmp_path / "ok.jsonl").write_text("{}\n")
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    cfg = config(
        tmp_path, {"ok": "ok.jsonl", "gone": "gone.jsonl", "dir": "dir.jsonl", "bad": "bad.parquet"}
    )
    sizes: dict[str, int] = {}
    with pytest.raises(InputFileError) as err:
        check_before_server(cfg, None, sizes=sizes)
    text = str(err.value)
    assert f"{tmp_path}/gone.jsonl: input file not found for partition 'gone'" in text
    assert f"{tmp_path}/dir.jsonl: not a file (input of partition 'dir')" in text
    assert f"{tmp_path}/bad.parquet: not a readable Parquet file (partition 'bad')" in text
    assert sizes == {"ok": 1}  # what was found is known to the caller's report
    # Only the selected partitions' inputs are checked.
    assert check_before_server(cfg, ["ok"]).sizes == {"ok": 1}
    with pytest.raises(ConfigError, match="unknown partition 'nope'"):
        check_before_server(cfg, ["nope"])


def test_a_special_token_that_is_not_one_token_fails_before_the_server(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    cfg = config(tmp_path, {"a": "a.jsonl"}, think_end="</thinking-not-a-token>")
    with pytest.raises(TokenizerError, match="thinking-not-a-token"):
        check_before_server(cfg, None)


@pytest.mark.parametrize("tokenizer", ["mini", "tiktoken"])
def test_the_demo_passes_the_checks_on_either_bundled_tokenizer(
    tmp_path: Path, tokenizer: str
) -> None:
    """`eagle3-datagen demo --tokenizer tiktoken` runs on Kimi-K2.5's remote-code class path."""
    from eagle3_datagen.demo import demo_config

    check = check_before_server(demo_config(tmp_path, port=1, tokenizer=tokenizer), None)
    assert check.sizes == {"demo_short": 64, "demo_long": 24, "demo_images": 8}
    assert type(check.tokenizer.tok).__name__ == (
        "TikTokenTokenizer" if tokenizer == "tiktoken" else "TokenizersBackend"
    )
    # Kimi's real ids on the tiktoken fixture; right after a small vocabulary on the mini one.
    assert (check.ids.think_end >= 163584) == (tokenizer == "tiktoken")


def _made_by(cfg: PipelineConfig, partition: str, **server: object) -> None:
    """An output directory as a run of ``cfg`` leaves it: a manifest and a committed batch."""
    from eagle3_datagen.generate.plan import load_tokenizer
    from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
    from eagle3_datagen.write.manifest import update_manifest
    from eagle3_datagen.write.shards import BatchSummary, PartitionOutput

    fp = build_fingerprint(cfg, load_tokenizer(cfg), dict(server), "0.5.23")
    PartitionOutput(cfg.output_dir, partition).write_batch(
        BatchSummary(partition, 0, 0, 1), [], [], parquet_metadata(fp)
    )
    update_manifest(cfg.output_dir, fp, {})


def test_an_output_path_that_cannot_be_written_fails_before_the_server(tmp_path: Path) -> None:
    from eagle3_datagen.errors import OutputWriteError

    (tmp_path / "a.jsonl").write_text("{}\n")
    cfg = config(tmp_path, {"a": "a.jsonl"})
    (tmp_path / "out").write_text("a file")
    with pytest.raises(OutputWriteError, match="out: the output directory is a file"):
        check_before_server(cfg, None, overwrite=False)
    with pytest.raises(OutputWriteError, match="out: the output directory is a file"):
        check_before_server(cfg, None, overwrite=True)  # nothing to delete makes it writable
    cfg.output_dir = str(tmp_path / "out" / "deeper" / "run")
    with pytest.raises(OutputWriteError, match=r"cannot create the output directory: .*/out is a"):
        check_before_server(cfg, None, overwrite=False)
    (tmp_path / "out").unlink()
    check_before_server(cfg, None, overwrite=False)  # a directory that does not exist yet is fine


def test_a_setting_the_config_changed_is_refused_before_the_server(tmp_path: Path) -> None:
    from eagle3_datagen.errors import OutputConflictError

    (tmp_path / "a.jsonl").write_text("{}\n")
    cfg = config(tmp_path, {"a": "a.jsonl"})
    _made_by(cfg, "a", context_length=4096)
    # Only the server differs (it is not known before the server answers): not refused here.
    check_before_server(cfg, None, overwrite=False)
    changed = config(tmp_path, {"a": "a.jsonl"})
    changed.sampling.temperature = 0.3
    with pytest.raises(OutputConflictError, match=r"changed: sampling.temperature: 1.0 -> 0.3"):
        check_before_server(changed, None, overwrite=False)
    check_before_server(changed, None, overwrite=True)  # deleted once the server is known


def test_shards_of_other_settings_are_refused_without_a_manifest(tmp_path: Path) -> None:
    from eagle3_datagen.errors import OutputConflictError
    from eagle3_datagen.write.manifest import MANIFEST

    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.jsonl").write_text("{}\n")
    cfg = config(tmp_path, {"a": "a.jsonl", "b": "b.jsonl"})
    cfg.batch_size = 7
    _made_by(cfg, "a")
    (tmp_path / "out" / MANIFEST).unlink()  # a fan-out job that died before its manifest
    cfg.batch_size = 8
    with pytest.raises(OutputConflictError, match="a: shards written under other settings"):
        check_before_server(cfg, ["a"], overwrite=False)
    check_before_server(cfg, ["b"], overwrite=False)  # b has no data: nothing to conflict with

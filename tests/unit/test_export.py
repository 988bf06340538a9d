"""Exports to SpecForge and speculators JSONL from a dataset written the pipeline's way."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.export import ExportOptions, export_dataset
from eagle3_datagen_cli.main import main
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset


@pytest.fixture(scope="module")
def tk(chat_tokenizer: ChatTokenizer) -> Tok:
    return Tok(chat_tokenizer)


@pytest.fixture
def dataset(tmp_path: Path, tk: Tok, chat_tokenizer: ChatTokenizer) -> Path:
    root = tmp_path / "data"
    fp = make_fingerprint(make_config(), chat_tokenizer)
    write_dataset(
        root,
        fp,
        {
            "p1": [
                Batch(
                    [tk.record("a", "p1", line=1), tk.record("b", "p1", tk.tool_output(), line=2)]
                ),
                Batch([tk.record("c", "p1", tk.truncated_output(), finish="length", line=4)]),
            ],
            "p2": [Batch([tk.record("a", "p2", tk.output(think=9), line=7)])],
        },
    )
    return root


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_specforge_rows_mark_the_last_prompt_token_and_the_output(
    dataset: Path, tk: Tok, tmp_path: Path
) -> None:
    """SpecForge's shift trains the marked feature position to predict two tokens on: the
    draft's first proposal (from <think>'s features) is trained only with <think> marked
    (checked against SpecForge's own code in test_trainer_conventions.py)."""
    out = tmp_path / "sf.jsonl"
    result = export_dataset(dataset, "specforge", out)
    rows = read_jsonl(out)
    assert result.total == len(rows) == 4 and dict(result.written) == {"p1": 3, "p2": 1}
    expected_outputs = [tk.output(), tk.tool_output(), tk.truncated_output(), tk.output(think=9)]
    prompt = tk.prompt()
    assert prompt[-1] == tk.id["<think>"]
    for row, output in zip(rows, expected_outputs, strict=True):
        assert set(row) == {"input_ids", "loss_mask"}
        assert row["input_ids"] == prompt + output
        assert row["loss_mask"] == [0] * (len(prompt) - 1) + [1] + [1] * len(output)


def test_truncated_records_are_kept_unless_skipped(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "sf.jsonl"
    result = export_dataset(dataset, "specforge", out, skip_truncated=True)
    assert result.total == len(read_jsonl(out)) == 3 and result.skipped_truncated == 1
    assert result.metadata["options"]["truncated"] == "drop"
    assert result.metadata["counts"]["truncated_dropped"] == 1


def test_truncated_records_are_listed_in_the_exports_own_metadata(
    dataset: Path, tmp_path: Path
) -> None:
    """Neither trainer carries the flag (SpecForge's rows have no field for it, speculators'
    prepare-data drops metadata): the export's metadata file says which records they are."""
    out = tmp_path / "sf.jsonl"
    export_dataset(dataset, "specforge", out)
    meta = orjson.loads((tmp_path / "sf.export.json").read_bytes())
    assert meta["options"]["truncated"] == "keep"
    assert meta["counts"]["truncated"] == 1 and meta["truncated_ids"] == ["p1/c"]
    assert (
        "truncated records (finish_reason length): 1 (keep"
        in (tmp_path / "sf.report.txt").read_text()
    )
    with pytest.raises(
        DatasetError,
        match=r"refusing to export: 1 truncated records \(finish_reason length\) \(p1/c\)",
    ):
        export_dataset(
            dataset,
            "speculators",
            tmp_path / "spec.jsonl",
            options=ExportOptions(truncated="refuse"),
        )
    assert not (tmp_path / "spec.jsonl").exists()


def test_speculators_rows_have_its_fields_and_our_provenance(
    dataset: Path, tk: Tok, tmp_path: Path
) -> None:
    out = tmp_path / "spec.jsonl"
    export_dataset(dataset, "speculators", out)
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert set(rows) == {"p1/a", "p1/b", "p1/c", "p2/a"}  # unique across partitions
    tool, cut, long = rows["p1/b"], rows["p1/c"], rows["p2/a"]
    assert set(tool) == {"id", "primary_id", "input_ids", "loss_mask", "metadata"}
    assert tool["primary_id"] == "b"
    assert tool["input_ids"] == tk.prompt() + tk.tool_output()
    assert sum(tool["loss_mask"]) == len(tk.tool_output())
    meta = tool["metadata"]
    assert meta["is_tool_call"] is True and rows["p1/a"]["metadata"]["is_tool_call"] is False
    assert meta["partition"] == "p1" and meta["idx"] == 1 and meta["source_line"] == 2
    assert meta["finish_reason"] == "stop" and meta["truncated"] is False
    assert meta["usage"] == {"prompt_tokens": 6, "completion_tokens": 11, "total_tokens": 17}
    assert meta["endpoint"] == "http://127.0.0.1:30000/generate"
    assert meta["sampling_params"]["max_new_tokens"] == 10240
    assert long["metadata"]["sampling_params"]["max_new_tokens"] == 16384
    assert cut["metadata"]["finish_reason"] == "length" and cut["metadata"]["truncated"] is True
    assert len(meta["content_sha256"]) == 64


def test_export_is_atomic_and_refuses_data_of_another_run(
    dataset: Path, tk: Tok, tmp_path: Path, chat_tokenizer: ChatTokenizer
) -> None:
    out = tmp_path / "sf.jsonl"
    out.write_text("previous export\n")
    other = tmp_path / "other"
    config = make_config().model_copy(update={"batch_size": 7})
    write_dataset(
        other, make_fingerprint(config, chat_tokenizer), {"p2": [Batch([tk.record("z", "p2")])]}
    )
    shutil.copy(other / "p2" / "part-00000.parquet", dataset / "p2" / "part-00000.parquet")
    with pytest.raises(DatasetError, match=r"p2/part-00000.parquet: made under fingerprint"):
        export_dataset(dataset, "specforge", out)
    assert out.read_text() == "previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_uncommitted_shards_are_left_out(dataset: Path, tmp_path: Path) -> None:
    shutil.copy(dataset / "p1" / "part-00000.parquet", dataset / "p1" / "part-00009.parquet")
    result = export_dataset(dataset, "specforge", tmp_path / "sf.jsonl")
    assert dict(result.written) == {"p1": 3, "p2": 1}


def test_cli_export(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nested" / "spec.jsonl"
    argv = ["export", str(dataset), "--format", "speculators", "--output", str(out)]
    assert main([*argv, "--skip-truncated"]) == 0
    printed = capsys.readouterr().out
    assert "exported 3 records (p1=2, p2=1), 1 truncated skipped" in printed
    assert "speculators prepare-data --data spec.jsonl --seq-length 8192" in printed
    assert f"-> {out}" in printed  # the report's paths are relative to this directory
    assert printed.startswith((out.parent / "spec.report.txt").read_text())
    assert len(read_jsonl(out)) == 3
    with pytest.raises(SystemExit):
        main(["export", str(dataset), "--format", "csv", "--output", str(out)])


def test_records_over_the_trainers_max_length_are_reported_dropped_or_refused(
    dataset: Path, tk: Tok, tmp_path: Path
) -> None:
    """Both trainers clip long records to their maximum without telling anyone."""
    lengths = sorted(len(r["input_ids"]) for r in read_jsonl(_export(dataset, tmp_path)))
    assert lengths == [12, 13, 17, 19]  # prompt 6 + outputs of 6, 7, 11, 13 tokens
    out = tmp_path / "sf.jsonl"
    kept = export_dataset(dataset, "specforge", out, options=ExportOptions(max_length=16))
    assert kept.total == 4
    summary = kept.metadata["lengths"]
    assert (summary["max_length"], summary["over_max_length"], summary["max"]) == (16, 2, 19)
    assert summary["tokens_past_max_length"] == 1 + 3
    report = (tmp_path / "sf.report.txt").read_text()
    assert (
        "max length 16 (data.max_length; SpecForge's default is 2048): 2 records longer" in report
    )
    assert (
        "2 records WILL BE CLIPPED by the trainer (4 tokens past the maximum); "
        "--max-length 64 trains every token" in report
    )
    assert "data.max_length: 16" in report
    dropped = export_dataset(
        dataset, "specforge", out, options=ExportOptions(max_length=16, over_length="drop")
    )
    assert dropped.total == len(read_jsonl(out)) == 2 and dropped.skipped_over_length == 2
    with pytest.raises(
        DatasetError,
        match=r"2 records longer than the max length 16 .*longest "
        r"is 19 tokens",
    ):
        export_dataset(
            dataset, "specforge", out, options=ExportOptions(max_length=16, over_length="refuse")
        )
    assert len(read_jsonl(out)) == 2  # the previous export is untouched


def _export(dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "plain" / "sf.jsonl"
    export_dataset(dataset, "specforge", out)
    return out


def test_the_report_names_the_pre_tokenized_paths_and_the_default_maxima(
    dataset: Path, tmp_path: Path
) -> None:
    """The Parquet dataset is read by neither trainer, and SpecForge's conversation path
    re-renders with its own template: the report says which flag takes the exact ids."""
    sf = export_dataset(dataset, "specforge", tmp_path / "sf.jsonl")
    spec = export_dataset(dataset, "speculators", tmp_path / "spec.jsonl")
    sf_text, spec_text = "\n".join(sf.report()), "\n".join(spec.report())
    assert "data.prompts_path: sf.jsonl " in sf_text  # relative to the export's directory
    assert "never data.train_data_path" in sf_text and "data.max_length: 2048" in sf_text
    assert "speculators prepare-data --data spec.jsonl --seq-length 8192" in spec_text
    assert "no --render-endpoint" in spec_text and "--total-seq-len 8192" in spec_text
    assert "drops primary_id" in spec_text  # without --validation, its own split leaks


def test_validation_holds_out_whole_conversations(
    tmp_path: Path, tk: Tok, chat_tokenizer: ChatTokenizer
) -> None:
    """Every turn and sample of one conversation lands on one side (speculators splits by row
    after a shuffle and drops primary_id, so the export decides)."""
    root = tmp_path / "data"
    records = [
        tk.record(
            f"c{c}#s{s}#t{t}",
            "p1",
            line=c + 1,
            conversation_id=f"c{c}",
            turn=t,
            sample=s,
            prompt_ids=[*tk.prompt(), 50 + c],  # one prompt per conversation: none repeats
        )
        for c in range(12)
        for s in range(2)
        for t in range(2)
    ]
    write_dataset(
        root,
        make_fingerprint(make_config(), chat_tokenizer),
        {"p1": [Batch(records[:24]), Batch(records[24:])]},
    )
    out = tmp_path / "spec.jsonl"
    opts = ExportOptions(validation=0.3, split_seed=1)
    result = export_dataset(root, "speculators", out, options=opts)
    train, val = read_jsonl(out), read_jsonl(tmp_path / "spec.validation.jsonl")
    assert result.validation_path == tmp_path / "spec.validation.jsonl"
    train_convs = {r["primary_id"] for r in train}
    val_convs = {r["primary_id"] for r in val}
    assert train_convs and val_convs and not train_convs & val_convs
    assert len(train) + len(val) == 48 and len(val) == 4 * len(val_convs)
    assert {r["metadata"]["split"] for r in val} == {"validation"}
    split = result.metadata["split"]
    assert (split["conversations"], split["validation_conversations"]) == (12, len(val_convs))
    # The same seed gives the same sides; each side's rows are whole conversations.
    again = export_dataset(root, "specforge", tmp_path / "sf.jsonl", options=opts)
    assert again.metadata["counts"]["written"] == {"train": len(train), "validation": len(val)}
    # The first export fixed the dataset's split: another fraction is refused, naming the
    # way to re-split and its cost; --resplit replaces it (here: nothing held out).
    with pytest.raises(DatasetError, match=r"--validation 0\.001 differ.*--resplit.*no longer"):
        export_dataset(
            root, "specforge", tmp_path / "x.jsonl", options=ExportOptions(validation=0.001)
        )
    assert not (tmp_path / "x.jsonl").exists()
    tiny = ExportOptions(validation=0.001, resplit=True)
    none = export_dataset(root, "specforge", tmp_path / "x.jsonl", options=tiny)
    assert none.metadata["counts"]["written"] == {"train": 48, "validation": 0}
    assert "held out: 0 of 12 conversations" in "\n".join(none.report())

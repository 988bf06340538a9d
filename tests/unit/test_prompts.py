import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.errors import InputFileError
from eagle3_datagen.inputs.prompts import (
    InputReject,
    Prompt,
    parse_prompt,
    plan_batches,
    read_batch,
)


def lines_of(path: Path, batch_size: int) -> list[tuple[int, bytes]]:
    out = []
    for spec in plan_batches("p", path, batch_size):
        items = read_batch(spec)
        assert len(items) == spec.count
        for n, raw in items:
            assert isinstance(raw, bytes)  # a JSONL batch: raw lines, not Parquet rows
            out.append((n, raw))
    return out


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_batches_cover_every_line_once(
    tmp_path: Path, batch_size: int, trailing_newline: bool
) -> None:
    rows = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(10)]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + ("\n" if trailing_newline else ""))
    got = lines_of(path, batch_size)
    assert [n for n, _ in got] == list(range(1, 11))
    assert [raw.decode() for _, raw in got] == rows


def test_parquet_input_batches_by_rows(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(9)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4)
    got = []
    for spec in plan_batches("p", path, 5):
        got.extend(read_batch(spec))
    assert [n for n, _ in got] == list(range(1, 10))
    parsed = [parse_prompt(raw, n) for n, raw in got]
    assert [p.id for p in parsed if isinstance(p, Prompt)] == [f"r{i}" for i in range(9)]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="input file not found for partition 'p'"):
        list(plan_batches("p", tmp_path / "nope.jsonl", 4))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"messages": [', "invalid JSON"),
        (b"\xff\xfe garbage", "not valid UTF-8"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"prompt": "x"}', "missing 'messages'"),
        (b'{"messages": []}', "'messages' is empty"),
        (b'{"messages": "hi"}', "'messages' must be a list"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "unknown role 'wizard'"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "content must be a string"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}', "'tools' must be"),
        (b'{"id": [1], "messages": [{"role": "user", "content": "x"}]}', "'id' must be a string"),
        (b'{"messages": [{"role": "assistant", "content": "x"}]}', "no messages left"),
        (b"   ", "empty line"),
    ],
)
def test_bad_lines_become_rejects_with_reason(raw: bytes, reason: str) -> None:
    got = parse_prompt(raw, 7)
    assert isinstance(got, InputReject)
    assert got.line == 7
    assert reason in got.reason


def test_trailing_assistant_is_dropped_and_ids_are_stable() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]
    a = parse_prompt(json.dumps({"messages": msgs}).encode(), 1)
    b = parse_prompt(json.dumps({"messages": msgs[:1]}).encode(), 2)
    assert isinstance(a, Prompt) and isinstance(b, Prompt)
    assert a.messages == [{"role": "user", "content": "hi"}]
    assert a.id == b.id and a.id.startswith("sha256:")
    c = parse_prompt(json.dumps({"id": 42, "messages": msgs}).encode(), 3)
    assert isinstance(c, Prompt) and c.id == "42"


def test_duplicate_ids_first_occurrence_wins(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "same"}]
    rows = [
        {"id": "a", "messages": msgs},
        {"messages": msgs},  # content id
        {"id": "b", "messages": msgs},
        {"id": "a", "messages": [{"role": "user", "content": "other"}]},
        {"messages": msgs},  # same content id as line 2
        {"id": "a", "messages": msgs},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    from eagle3_datagen.inputs.prompts import find_duplicate_ids

    assert find_duplicate_ids("p", path, batch_size=2) == {4: 1, 5: 2, 6: 1}

from pathlib import Path

from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.journal import BatchJournal


def result(i: int) -> GenerateResult:
    return GenerateResult(f"r{i}", [i, i + 1, 7], "stop", 7, None, 10, 3, 0, 0.5)


def test_round_trip_and_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "j" / "00000.jsonl"
    journal = BatchJournal(path)
    journal.append(3, result(3))
    journal.append(9, result(9))
    journal.close()
    with path.open("ab") as fh:
        fh.write(b'{"rid": "r11", "output_ids": [1, 2')  # killed mid-write
    assert BatchJournal(path).load() == {3: result(3), 9: result(9)}

    again = BatchJournal(path)  # a rerun appends after the torn line, not onto it
    again.append(11, result(11))
    again.close()
    assert BatchJournal(path).load() == {3: result(3), 9: result(9), 11: result(11)}
    again.remove()
    assert not path.exists() and BatchJournal(path).load() == {}

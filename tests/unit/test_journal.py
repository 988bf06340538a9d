import asyncio
import os
import signal
from pathlib import Path

from eagle3_datagen.generate.offload import JournalWriter
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


def test_an_answer_s_logprobs_survive_the_journal(tmp_path: Path) -> None:
    """A resumed batch validates and records a journaled answer as if it had just arrived."""
    path = tmp_path / "00000.jsonl"
    answer = result(1)
    answer.output_logprobs, answer.logprob_ids = [-0.5, -0.25, -1e-06], [1, 2, 7]
    answer.top_logprob_ids, answer.top_logprobs = [[1, 5], [9, 2], [7]], [
        [-0.5, -1.5], [-0.125, -0.25], [-1e-06]
    ]  # fmt: skip
    journal = BatchJournal(path)
    journal.append(1, answer)
    journal.close()
    assert BatchJournal(path).load() == {1: answer}


def _write_through_the_journal_thread(path: Path, keys: range) -> dict[int, GenerateResult]:
    """Appends from the event loop through JournalWriter, drained; what the file then holds."""

    async def main() -> None:
        writer = JournalWriter(BatchJournal(path))
        for i in keys:
            writer.add(i, result(i))
        await writer.drain()
        await writer.close()

    asyncio.run(main())
    return BatchJournal(path).load()


def test_the_journal_thread_writes_every_append_before_drain_returns(tmp_path: Path) -> None:
    path = tmp_path / "00000.jsonl"
    assert _write_through_the_journal_thread(path, range(500)) == {i: result(i) for i in range(500)}


def test_a_forked_child_journals_on_a_thread_of_its_own(tmp_path: Path) -> None:
    """The parent's journal thread does not survive a fork: without its own, the child's drain
    would wait forever (the timeout below turns that into a failure)."""
    _write_through_the_journal_thread(tmp_path / "parent.jsonl", range(3))  # thread started
    child = tmp_path / "child.jsonl"
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its journal was written
        signal.alarm(20)
        ok = False
        try:
            ok = _write_through_the_journal_thread(child, range(5)) == {
                i: result(i) for i in range(5)
            }
        finally:
            os._exit(0 if ok else 1)  # a forked child must never return into pytest
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

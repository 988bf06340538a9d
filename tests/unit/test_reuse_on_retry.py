"""A retried run reuses a partition an earlier attempt completed only while the output
directory still holds all its lines (the library's rule; the flow only asks it)."""

from __future__ import annotations

import shutil
from pathlib import Path

from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.write.resume import still_on_disk
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset


def test_a_partition_is_reused_while_all_its_lines_are_on_disk(
    tmp_path: Path, chat_tokenizer: object
) -> None:
    config = make_config(("zeta",))
    fingerprint = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    t = Tok(chat_tokenizer)  # type: ignore[arg-type]
    batch = Batch([t.record("z1", "zeta", line=1), t.record("z2", "zeta", line=2)])
    write_dataset(tmp_path, fingerprint, {"zeta": [batch]})
    on_disk = still_on_disk(str(tmp_path), "zeta", size=2)
    assert on_disk is not None and on_disk["input_lines"] == 2
    assert still_on_disk(str(tmp_path), "zeta", size=None) is not None  # size unknown
    assert still_on_disk(str(tmp_path), "zeta", size=3) is None  # a line is missing
    shutil.rmtree(tmp_path / "zeta")  # an --overwrite deleted it since
    assert still_on_disk(str(tmp_path), "zeta", size=2) is None


def test_a_reused_partition_reads_done_in_the_runs_meter() -> None:
    meter = RunMeter()
    meter.expect({"short": 64, "long": 24})
    meter.reused("short", 64)
    assert meter.totals() == (64, 88)
    progress = meter.progress("short")
    assert progress is not None and progress.done == 64 and progress.output_tokens == 0

"""A full disk mid-run: no half-written shard is visible, the run fails naming the file and the
cause, and a rerun once space is freed completes the dataset exactly.

The output directory is a real 4 MiB tmpfs (needs root and ``mount -t tmpfs``; skipped
otherwise), so the ENOSPC comes from the kernel, not from a mock. The disk fills once the first
shard has committed, leaving less than that shard took: the state the test means (some batches
committed, the next one cannot be) is built, whatever the machine's speed, not hoped for.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.validate.dataset import validate_dataset
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import base_config, records
from tests.support.prompts import expected_prompt_ids, prompt_ids, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Take all but about ``leave`` bytes of the disk with one file (the run writes meanwhile:
    a write the disk no longer takes ends the filling)."""
    filler = disk / "filler"
    chunk = b"\0" * 16384
    with filler.open("wb") as fh:
        try:
            while (st := os.statvfs(disk)).f_bavail * st.f_frsize > leave + len(chunk):
                fh.write(chunk)
                fh.flush()
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return filler


def _fill_after_the_first_commit(part: Path, disk: Path, found: list[Any]) -> None:
    """Wait (with a deadline) for the partition's first committed batch, then fill the disk,
    leaving half of what a shard took: the next shard cannot be written."""
    deadline = time.monotonic() + 240
    while not list((part / "_batches").glob("*.json")):
        if time.monotonic() > deadline:
            found.append(TimeoutError("no batch committed in 240 s"))
            return
        time.sleep(0.02)
    shard = max((p.stat().st_size for p in part.glob("part-*.parquet")), default=65536)
    found.append(_fill(disk, leave=shard // 2))


def test_a_full_disk_fails_cleanly_and_a_rerun_completes_the_dataset(
    tmp_path: Path, small_disk: Path, emulator_factory: Any
) -> None:
    from transformers import AutoTokenizer

    prompts = write_prompts(tmp_path / "prompts.jsonl", 400, words=20)
    # Slow enough (5 ms a token) that batches still run once the first has committed.
    emu = emulator_factory("--emu-decode-ms-per-token", "5").wait_ready()
    data = base_config(tmp_path, prompts)
    data["server"] = {"mode": "attach", "url": emu.url}
    data["batch_size"] = 16
    data["output_dir"] = str(small_disk / "out")
    # The prompts are checked below against the template over the data as it is; what SGLang's
    # chat path makes of them (render: sglang_chat) is checked against SGLang's own render in
    # tests/unit/test_sglang_chat_render.py.
    data["model"]["render"] = "template"
    config = PipelineConfig.model_validate(data)
    out = Path(config.output_dir)
    found: list[Any] = []
    filling = threading.Thread(
        target=_fill_after_the_first_commit, args=(out / "chaos", small_disk, found), daemon=True
    )
    filling.start()
    ok, reason = run_pipeline(config)
    filling.join(60)
    [filler] = found
    assert isinstance(filler, Path), filler
    assert not ok
    assert "No space left on device" in str(reason), reason
    # Names the partition's file that failed first, not the manifest that failed after it.
    assert f"{out}/chaos/" in str(reason), reason
    assert "manifest.json" not in str(reason), reason
    # Nothing half written is visible: no temporary files, no shard without its marker.
    part = out / "chaos"
    assert not list(part.rglob(".*.tmp-*"))
    shards = {p.stem.removeprefix("part-") for p in part.glob("part-*.parquet")}
    markers = {p.stem for p in (part / "_batches").glob("*.json")}
    assert shards <= markers, "a shard without its commit marker is visible"
    for p in part.glob("part-*.parquet"):
        pq.read_table(p)  # every visible shard is whole
    assert 0 < len(markers) < 25

    filler.unlink()
    ok, result = run_pipeline(config)
    assert ok, result
    got = records(out, "chaos")
    assert sorted(got) == prompt_ids(400)
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    for line in prompts.read_text().splitlines():
        row = json.loads(line)
        assert got[row["id"]]["prompt_ids"] == expected_prompt_ids(tok, row)
    report = validate_dataset(out)
    assert report.ok, report.lines()

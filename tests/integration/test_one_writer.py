"""One writer per partition of an output directory, checks before the server, and the history
of runs, through real runs of the flow (the CLI in a child process, and in this process)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.report.history import read_history
from eagle3_datagen.write.lock import LOCKS_DIR
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.main import main
from tests.support import free_port
from tests.support.pipeline import CliRun, base_config
from tests.support.prompts import write_prompts

pytestmark = [
    pytest.mark.usefixtures("prefect_backend"),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]


def test_second_run_refuses_then_history_and_conflicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 64)
    slow = ["--emu-running-slots", "4", "--emu-decode-ms-per-token", "8"]
    data = base_config(tmp_path, prompts, extra_args=slow)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = Path(data["output_dir"])
    first = CliRun(cfg, tmp_path / "first.log")
    first.wait_while_running(lambda: (out / LOCKS_DIR / "chaos.lock").exists(), timeout_s=180)

    # An ad-hoc run while the first holds the partition: refused at once, the holder named.
    config = PipelineConfig.model_validate(data)
    started = time.monotonic()
    ok, reason = run_pipeline(config)
    assert not ok
    assert time.monotonic() - started < 60 and first.proc.poll() is None  # not after it
    assert f"{out} is in use by another run: partition chaos by flow run '" in str(reason)
    assert f"pid {first.proc.pid} on host {socket.gethostname()}" in str(reason)
    assert first.wait(300) == 0, first.output()
    assert not (out / LOCKS_DIR / "chaos.lock").exists()  # released at the end

    # The first run's line; a rerun (nothing left to generate) adds its own.
    ok, _ = run_pipeline(config)
    assert ok
    first_run, rerun = read_history(out)
    assert first_run["partitions"]["chaos"]["records"] == 64
    assert (
        first_run["partitions"]["chaos"]["output_p90"]
        >= first_run["partitions"]["chaos"]["output_p50"]
        > 0
    )
    assert rerun["partitions"]["chaos"]["records"] == 0
    assert main(["history", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("started (UTC)")
    assert " chaos " in lines[1] and " completed " in lines[1]

    # A setting the config alone decides: refused before the server (the URL has nothing).
    changed = PipelineConfig.model_validate(
        {
            **data,
            "sampling": {"temperature": 0.25},
            "server": {
                **data["server"],
                "mode": "attach",
                "url": f"http://127.0.0.1:{free_port()}",
            },
        }
    )
    ok, reason = run_pipeline(changed)
    assert not ok
    assert "changed: sampling.temperature: 1.0 -> 0.25" in str(reason), reason
    # An output path that is a file: the same, named, no traceback in the reason.
    (tmp_path / "file").write_text("x")
    ok, reason = run_pipeline(config.model_copy(update={"output_dir": str(tmp_path / "file")}))
    assert not ok and "the output directory is a file" in str(reason), reason

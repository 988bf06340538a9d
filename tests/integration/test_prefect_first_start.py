"""Two runs started at once on a new Prefect home (a new user's first day, two shells) both
succeed: each temporary server's first start, which creates and migrates ``prefect.db``,
waits for the other's. Each says on its first line what it waits for, and prints no
"View at" link to its temporary server, which serves no UI and is gone after the command.

Real child processes of the CLI without ``PREFECT_API_URL``, one ``PREFECT_HOME``, each run
launching its own emulator.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eagle3_datagen.demo import demo_config

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, name: str) -> Path:
    config = demo_config(tmp_path / name).model_dump(mode="json")
    short = next(p for p in config["partitions"] if p["name"] == "demo_short")
    lines = Path(short["input"]).read_text().splitlines(keepends=True)[:8]
    (tmp_path / f"{name}.jsonl").write_text("".join(lines))
    short["input"] = str(tmp_path / f"{name}.jsonl")
    config["partitions"] = [short]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.timeout(900)
def test_two_runs_started_at_once_on_a_new_prefect_home_both_succeed(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    runs = []
    for name in ("one", "two"):
        cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", "run", str(_config(tmp_path, name))]
        log = (tmp_path / f"{name}.log").open("w")
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        assert proc.stderr is not None
        first = proc.stderr.readline()
        runs.append((name, proc, first, time.monotonic() - started, log))
    outputs = {}
    for name, proc, first, took, log in runs:
        assert proc.stderr is not None
        rest = proc.stderr.read()
        assert proc.wait(600) == 0, f"{name} failed:\n{first}{rest[-4000:]}"
        log.close()
        stdout = (tmp_path / f"{name}.log").read_text()
        outputs[name] = first + rest + stdout
        # The first line says what the run waits for, before Prefect is imported (seconds).
        assert first.startswith(
            "eagle3-datagen: checking the config and inputs, then starting Prefect's temporary "
            "server (15-60 s"
        ), first
        assert took < 10, f"first line after {took:.1f} s"
        assert "demo_short: 8 accepted, 0 rejected" in stdout, stdout
    for name, text in outputs.items():
        assert "View at http" not in text, (name, text[-3000:])
        assert "duplicate column" not in text and "Traceback" not in text, (name, text[-3000:])

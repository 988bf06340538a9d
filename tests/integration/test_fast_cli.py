"""The command line says what it can before Prefect: a bad config, a missing prompts file or an
output it cannot write is told without starting Prefect's temporary server, in the words and
with the exit status the flow's own check gives; ``failures`` names the database or API it
read; a rerun says how much of the earlier runs it reused and what is left.

Real child processes of the CLI. Without ``PREFECT_API_URL`` each has its own ``PREFECT_HOME``:
Prefect's temporary server creates (and migrates) ``prefect.db`` there as it starts, so a
home without one after the command proves that no server was started. The rerun is the demo's
config with its emulator, on the session's Prefect backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_datagen.config import load_config
from eagle3_datagen.demo import demo_config
from eagle3_datagen.errors import DatagenError
from eagle3_datagen.precheck import check_before_server
from tests.support import free_port
from tests.support.pipeline import CliRun


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI without PREFECT_API_URL, with its own PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _flow_says(config_path: Path) -> str:
    """What the flow's own check before its server raises for this config."""
    with pytest.raises(DatagenError) as err:
        check_before_server(load_config(config_path), None, overwrite=False)
    return str(err.value)


WAITING = (
    "eagle3-datagen: checking the config and inputs, then starting Prefect's temporary server "
    "(15-60 s; with PREFECT_API_URL set to a running server it is at once)"
)


def _no_prefect_server(home: Path) -> None:
    assert not (home / "prefect.db").exists(), "Prefect's temporary server was started"


def test_input_output_and_tokenizer_errors_come_before_prefect(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    missing = demo_config(tmp_path / "out").model_dump(mode="json")
    missing["partitions"][0]["input"] = str(tmp_path / "missing.jsonl")
    (tmp_path / "a-file").write_text("not a directory\n")
    unwritable = demo_config(tmp_path / "a-file").model_dump(mode="json")
    split = demo_config(tmp_path / "out").model_dump(mode="json")
    split["special_tokens"]["think_end"] = "<not one token>"
    cases = {
        "missing input": _write(tmp_path / "missing.yaml", missing),
        "output is a file": _write(tmp_path / "unwritable.yaml", unwritable),
        "a special token the tokenizer splits": _write(tmp_path / "split.yaml", split),
    }
    for case, path in cases.items():
        out = _cli(home, "run", str(path))
        assert out.returncode == 1, (case, out.stderr)
        # What it waits for, then the flow's own words, as `run` printed them when the flow
        # made this check.
        assert out.stderr.splitlines() == [
            WAITING,
            f"eagle3-datagen: run failed: {_flow_says(path)}",
        ], case
        _no_prefect_server(home)
    assert "input file not found for partition 'demo_short'" in _flow_says(cases["missing input"])
    assert "the output directory is a file" in _flow_says(cases["output is a file"])
    assert "<not one token>" in _flow_says(cases["a special token the tokenizer splits"])


def test_a_bad_config_comes_before_prefect(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    bad = tmp_path / "bad.yaml"
    bad.write_text("partitions: [\n")
    out = _cli(home, "run", str(bad))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"eagle3-datagen: {bad}:"), out.stderr
    assert "invalid YAML" in out.stderr, out.stderr
    config = _write(tmp_path / "run.yaml", demo_config(tmp_path / "out").model_dump(mode="json"))
    unknown = _cli(home, "run", str(config), "--partition", "nope")
    assert unknown.returncode == 2, unknown.stderr
    assert "nope" in unknown.stderr, unknown.stderr
    _no_prefect_server(home)


def test_an_attached_server_nothing_listens_at_comes_before_prefect(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    config = _write(tmp_path / "run.yaml", demo_config(tmp_path / "out").model_dump(mode="json"))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = _cli(home, "run", str(config), "--server-url", dead)
    assert out.returncode == 1, out.stderr
    first, last = out.stderr.splitlines()
    assert first == WAITING
    # The attach gate's own words, after its 10 s of refusals, without Prefect's start.
    assert last.startswith(
        f"eagle3-datagen: run failed: nothing listens at {dead} (connection refused for 1"
    ), last
    assert "check the URL" in last, last
    _no_prefect_server(home)


def test_a_mode_the_chat_template_refuses_comes_before_prefect(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    config["model"]["modes"] = {"odd": {"add_generation_prompt": False}}
    config["partitions"][0]["modes"] = {"odd": 1.0}
    out = _cli(home, "run", str(_write(tmp_path / "run.yaml", config)))
    assert out.returncode == 2, out.stderr
    first, last = out.stderr.splitlines()
    assert first == WAITING
    assert last.startswith(
        'eagle3-datagen: model.modes.odd {"add_generation_prompt":false}: SGLang\'s chat path '
        "refuses the request: chat_template_kwargs sets 'add_generation_prompt'"
    ), last
    _no_prefect_server(home)


def test_several_config_errors_are_one_readable_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model: {path: /models/m}\n"
        "tiers:\n"
        "  - {name: SHORT, concurrency: -1, max_tokens: 0}\n"
        "partitions:\n"
        "  - {name: ../a, input: prompts.jsonl, tier: SHORT}\n"
        "batch_size: -3\n"
    )
    out = _cli(tmp_path / "prefect-home", "run", str(bad))
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"eagle3-datagen: {bad}:3: tiers.0.concurrency: Input should be greater than or equal "
        "to 1, or 'auto'",
        f"eagle3-datagen: {bad}:3: tiers.0.max_tokens: Input should be greater than or equal to 1",
        f"eagle3-datagen: {bad}:5: partitions.0.name: partition name '../a' is not a safe "
        "directory name (letters, digits, '_', '-', '.'; no slashes, no '..')",
        f"eagle3-datagen: {bad}:6: batch_size: Input should be greater than or equal to 1",
    ], out.stderr


async def _latest_partition_tasks() -> list[str]:
    """The task run names of the latest partition subflow on the session's Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        [sub] = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["datagen-partition"])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[sub.id]))
        )
    return sorted(t.name for t in tasks)


def _first_lines(path: Path, src: str, count: int) -> None:
    lines = Path(src).read_text().splitlines(keepends=True)
    assert len(lines) >= count, "the demo input is too short for this test"
    path.write_text("".join(lines[:count]))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_backend")
@pytest.mark.timeout(900)
def test_a_rerun_says_what_it_reused_and_failures_names_its_api(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    short = next(p for p in config["partitions"] if p["name"] == "demo_short")
    prompts, source = tmp_path / "short.jsonl", short["input"]
    _first_lines(prompts, source, 32)  # two batches of 16
    short["input"] = str(prompts)
    path = _write(tmp_path / "run.yaml", config)

    first = CliRun(path, tmp_path / "first.log", "--partition", "demo_short")
    assert first.wait(400) == 0, first.output()
    assert "reusing" not in first.log.read_text(), first.output()

    # The input grows by two batches: the first two are done, two are left.
    _first_lines(prompts, source, 64)
    second = CliRun(path, tmp_path / "second.log", "--partition", "demo_short")
    assert second.wait(400) == 0, second.output()
    log = second.log.read_text().splitlines()
    said = [line for line in log if "reusing" in line]
    assert len(said) == 1, log[-40:]
    assert said[0].endswith("demo_short: reusing 32 of 64 lines done by earlier runs; 32 left")
    summary = [line for line in log if line.startswith("  demo_short: ")]
    assert len(summary) == 1, log[-20:]
    assert "; reused 32 of 64 input lines done by earlier runs ->" in summary[0], summary
    # The batches the first run committed get no task run in the second (one would only read
    # their commit markers): its partition's tasks are the two batches left.
    assert asyncio.run(_latest_partition_tasks()) == [
        "generate[demo_short/0002]",
        "generate[demo_short/0003]",
    ]

    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value())
    out = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", "failures"],
        capture_output=True,
        text=True,
        env={**os.environ, "PREFECT_API_URL": api},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"read from the Prefect API at {api}", out.stdout

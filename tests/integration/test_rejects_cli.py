"""Rejected lines are told, not only counted: the end of ``eagle3-datagen run`` lists the first
few (``file:line: code: reason``) and how many more, and ``eagle3-datagen rejects DIR`` lists
them all from ``rejects/*.parquet``. Malformed ``chat_template_kwargs`` on a line is one
behaviour, whatever the malformation (not an object, or kwargs SGLang's chat path refuses: a
request's own ``chat_template``, a key it passes by name): that line is rejected as
``bad_input``, and the rest of the partition is generated.

A real ``run`` (child process of the CLI) on the session's Prefect backend, the demo's config
with its emulator.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_datagen.demo import demo_config
from tests.support.pipeline import CliRun

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_backend")]

MSG = [{"role": "user", "content": "a question"}]
BAD = [
    "not json at all",
    json.dumps({"id": "s", "messages": MSG, "chat_template_kwargs": "thinking"}),
    json.dumps({"id": "t", "messages": MSG, "chat_template_kwargs": {"chat_template": "x"}}),
    json.dumps(
        {"id": "u", "messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}}
    ),
    "{",
    json.dumps({"id": "v"}),
    json.dumps({"id": "w", "messages": MSG, "chat_template_kwargs": {"chat_template": "y"}}),
]


@pytest.mark.timeout(600)
def test_a_run_lists_its_rejected_lines_and_rejects_lists_them_all(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    short = next(p for p in config["partitions"] if p["name"] == "demo_short")
    good = Path(short["input"]).read_text().splitlines()[:6]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(good + BAD) + "\n")
    short["input"] = str(prompts)
    config["partitions"] = [short]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))

    run = CliRun(path, tmp_path / "run.log")
    assert run.wait(500) == 0, run.output()
    out = run.log.read_text().splitlines()
    assert any(
        line.startswith("  demo_short: 6 accepted, 7 rejected (bad_input=7)") for line in out
    )
    at = out.index("rejected lines (7):")
    bad_lines = range(len(good) + 1, len(good) + len(BAD) + 1)
    listed = out[at + 1 : at + 7]
    # The first five, each naming its file and line, in line order, then the rest's count.
    assert [line.split(": ")[0] for line in listed[:5]] == [
        f"  {prompts}:{n}" for n in list(bad_lines)[:5]
    ], listed
    assert listed[5] == f"  ... and 2 more: eagle3-datagen rejects {tmp_path / 'out'}", listed

    cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", "rejects", str(tmp_path / "out")]
    every = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines[-1] == f"7 rejected in {tmp_path / 'out'}"
    by_line = {int(line.split(":")[1]): line for line in lines[:-1]}
    assert sorted(by_line) == list(bad_lines)
    for n, line in by_line.items():
        assert line.startswith(f"{prompts}:{n}: bad_input: "), line
    first = len(good) + 1
    assert "invalid JSON" in by_line[first], by_line[first]
    assert "missing 'messages'" in by_line[first + 5], by_line[first + 5]
    assert "'chat_template_kwargs' must be an object" in by_line[first + 1]
    # SGLang's own refusals, on that line alone (docs/sglang-conformance.md, finding 23).
    assert "Request-supplied chat_template is not allowed" in by_line[first + 2]
    assert "'add_generation_prompt'" in by_line[first + 3]
    assert "passes to the chat template itself" in by_line[first + 3]
    assert "Request-supplied chat_template is not allowed" in by_line[first + 6]

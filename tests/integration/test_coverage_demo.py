"""Coverage of the demo's real output: a run with a serving profile writes the table into the card
and a Prefect artifact, and ``eagle3-datagen coverage`` prints the same shares the Parquet holds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.config import ServingProfile
from eagle3_datagen.demo import demo_config
from eagle3_datagen.report.coverage import COVERAGE_KEY
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support import REPO

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.tokens]

PROFILE = {"tools": 0.5, "images": 0.07, "tolerance": 0.05, "modes": {"default": 1.0}}


async def _coverage_artifact(output_dir: Path) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        runs = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=20)
        ids = {
            r.id
            for r in runs
            if (r.parameters.get("config") or {}).get("output_dir") == str(output_dir)
        }
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[COVERAGE_KEY]))
        )
    (mine,) = [a for a in artifacts if a.flow_run_id in ids]
    return str(mine.data)


def coverage_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``eagle3-datagen coverage`` in a child process (pytest's capture of this process's
    output would be kept by Prefect's log handlers past the test)."""
    cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", "coverage", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_demo_coverage_in_card_artifact_and_cli(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "out").model_copy(
        update={"serving_profile": ServingProfile.model_validate(PROFILE)}
    )
    ok, manifest = run_pipeline(config)
    assert ok, manifest
    root = Path(config.output_dir)

    # What the Parquet says, counted here with pyarrow.
    table = pq.read_table(
        sorted(root.glob("*/part-*.parquet")), columns=["has_tools", "images", "has_tool_results"]
    )
    n = table.num_rows
    with_tools = pc.sum(table["has_tools"]).as_py()
    with_images = pc.sum(pc.greater(pc.list_value_length(table["images"]), 0)).as_py()
    with_results = pc.sum(table["has_tool_results"]).as_py()
    assert n == 90 and 0 < with_tools < n and with_images == 6 and 0 < with_results < with_tools

    card = (root / "README.md").read_text()
    tools_row = (
        f"| with tools | with | 50.0% | {100 * with_tools / n:.1f}% | {with_tools} | **OFF** |"
    )
    assert "## Coverage" in card and tools_row in card
    images_row = f"| with images | with | 7.0% | {100 * with_images / n:.1f}% | {with_images} |  |"
    assert images_row in card
    assert "Flagged: tools." in card
    assert tools_row in asyncio.run(_coverage_artifact(root))

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**config.model_dump(mode="json"), "output_dir": str(root)}))
    strict = coverage_cli(str(root), "--config", str(cfg), "--strict", "--json")
    assert strict.returncode == 1, strict.stderr
    report = orjson.loads(strict.stdout)
    assert report["records"] == n and report["flagged"] == ["tools"]
    by = {(r["dimension"], r["key"]): r for r in report["rows"]}
    assert by["tool_results", "with"]["records"] == with_results
    assert by["tool_results", "with"]["profile"] is None  # not declared: shown, not judged
    # Without --config: the profile the run recorded in its manifest, the same verdict.
    recorded = coverage_cli(str(root), "--strict", "--json")
    assert recorded.returncode == 1, recorded.stderr
    again = orjson.loads(recorded.stdout)
    assert again["flagged"] == ["tools"] and again["rows"] == report["rows"]
    assert again["profile_from"] == f"{root}/manifest.json (the run's config)"
    # A rerun of the config without a profile (every batch reused) drops it: the own mix.
    ok, _ = run_pipeline(demo_config(root))
    assert ok and "serving_profile" not in orjson.loads((root / "manifest.json").read_bytes())
    own = coverage_cli(str(root))
    assert own.returncode == 0, own.stderr
    assert "own mix over 90 records" in own.stdout and "latin" in own.stdout

"""The demo run on Prefect's real local backend with a launched emulator that speculates: the
records keep the acceptance, and the card, the history and the data artifacts show it; the
fingerprint's content is that of a plain run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig, SpeculativeSpec
from eagle3_datagen.demo import demo_config
from eagle3_datagen.report.history import read_history
from eagle3_datagen_cli.flow_run import run_pipeline

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.tokens]


async def _data_artifacts(output_dir: Path) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        recent = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=50)
        (parent,) = [
            r
            for r in recent
            if (r.parameters.get("config") or {}).get("output_dir") == str(output_dir)
            and r.parent_task_run_id is None
        ]
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[parent.id]))
        )
    return [a for a in artifacts if (a.key or "").startswith("data-")]


def _speculating(tmp_path: Path) -> PipelineConfig:
    config = demo_config(tmp_path / "out")
    draft = tmp_path / "draft"
    draft.mkdir()
    server = config.server.model_copy(
        update={
            "speculative": SpeculativeSpec(draft_model_path=str(draft), num_steps=4),
            "extra_args": [*config.server.extra_args, "--emu-accept-length", "3.5"],
        }
    )
    return config.model_copy(update={"server": server})


def test_a_speculating_demo_run_reports_its_acceptance(tmp_path: Path) -> None:
    config = _speculating(tmp_path)
    ok, manifest = run_pipeline(config)
    assert ok, manifest
    out = Path(config.output_dir)
    rows = pq.read_table(sorted((out / "demo_short").glob("part-*.parquet"))).to_pylist()
    spec = [r for r in rows if r["spec_verify_ct"] is not None]
    assert len(spec) >= len(rows) - 1  # a one-token answer has no verify step
    assert all(r["spec_num_proposed_drafts"] == 4 * r["spec_verify_ct"] for r in spec)

    card = (out / "README.md").read_text()
    assert "## Acceptance" in card and "speculative decoding (lossless)" in card
    (night,) = read_history(out)
    short = night["partitions"]["demo_short"]
    assert short["spec_accept_length"] == pytest.approx(3.5, abs=0.4)
    assert set(short["acceptance"]["slices"]) >= {"turn", "tools", "images", "output_length"}
    images = night["partitions"]["demo_images"]["acceptance"]["slices"]["images"]
    assert list(images) == ["with images"]
    artifacts = asyncio.run(_data_artifacts(out))
    assert artifacts and all("Acceptance" in str(a.data) for a in artifacts)
    assert all("accept length" in (a.description or "") for a in artifacts)

    fingerprint = json.loads((out / "manifest.json").read_text())["fingerprint"]
    assert fingerprint["content"]["server"]["speculative_algorithm"] is None
    assert fingerprint["run"]["server_args"]["speculative_algorithm"] == "EAGLE3"
    assert fingerprint["run"]["server_args"]["speculative_num_draft_tokens"] == 5

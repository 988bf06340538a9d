"""The eval flow on Prefect's real local backend against a speculating emulator: Completed
with the result when the gate passes, Failed with the gate's reason when it does not (so the
failed-run alert fires), and its result artifact."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.states import State

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen_flows.evaluate import datagen_eval
from tests.integration.test_eval import ACCEPT, make_dataset, spec_flags
from tests.support.emulator import EmulatorProcess

pytestmark = pytest.mark.usefixtures("prefect_backend")


async def _eval(**params: Any) -> State[Any]:
    """A run of the flow, its final state."""
    return await datagen_eval(**params, return_state=True)


async def _artifact(flow_run_id: UUID) -> str:
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join(str(a.data) for a in found if a.key == "eval")


def test_the_eval_flow_fails_on_the_gate(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> None:
    dataset = make_dataset(tmp_path / "data", chat_tokenizer, 40)
    (tmp_path / "draft").mkdir()
    emu = EmulatorProcess(*spec_flags(tmp_path / "draft"), log_dir=tmp_path).wait_ready()
    try:
        first = asyncio.run(_eval(dataset=str(dataset), server_url=emu.url))
        assert first.is_completed(), first.message
        data = first.result()
        assert data["gate"]["reason"] == "no baseline to compare with"
        assert data["accept_length"] == pytest.approx(ACCEPT, abs=0.3)
        run_id = first.state_details.flow_run_id
        assert run_id is not None
        artifact = asyncio.run(_artifact(run_id))
        assert "accept length" in artifact and "by partition" in artifact
        better = tmp_path / "better.json"
        better.write_text(json.dumps({"accept_length": ACCEPT + 1.0}))
        state = asyncio.run(_eval(dataset=str(dataset), server_url=emu.url, baseline=str(better)))
        assert state.is_failed()
        assert "eval gate failed: accept length" in str(state.message), state.message
    finally:
        emu.stop()

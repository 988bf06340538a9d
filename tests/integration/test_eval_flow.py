"""The eval flow on Prefect's real local backend against a speculating emulator: Completed
with the result when the gate passes, Failed with the gate's reason in one ERROR line when it
does not (so the failed-run alert fires), its result artifact with the verdict first, and a run
name that says which dataset and when."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.states import State

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen_flows.evaluate import datagen_eval
from tests.integration.test_eval import ACCEPT, make_dataset, spec_flags
from tests.support.emulator import EmulatorProcess

pytestmark = pytest.mark.usefixtures("prefect_backend")


async def _eval(**params: Any) -> State[Any]:
    """A run of the flow, its final state."""
    return await datagen_eval(**params, return_state=True)


async def _artifact(flow_run_id: UUID) -> tuple[str, str]:
    """The eval artifact's markdown and description."""
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    mine = [a for a in found if a.key == "eval"]
    return "\n".join(str(a.data) for a in mine), "\n".join(str(a.description) for a in mine)


async def _run(flow_run_id: UUID, last: str) -> tuple[str, list[str]]:
    """The flow run's name and its ERROR log lines (as the UI's log tab shows them), once the
    line starting with ``last`` reached the API (logs are sent in batches)."""
    deadline = time.monotonic() + 60
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        while True:
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
            if any(log.message.startswith(last) for log in logs) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    return run.name, [log.message for log in logs if log.level >= logging.ERROR]


def test_the_eval_flow_fails_on_the_gate(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> None:
    dataset = make_dataset(tmp_path / "data", chat_tokenizer, 40)
    (tmp_path / "draft").mkdir()
    emu = EmulatorProcess(*spec_flags(tmp_path / "draft"), log_dir=tmp_path).wait_ready()
    try:
        small = {"validation": 0.2, "min_records": 10}  # a 40-conversation dataset
        first = asyncio.run(_eval(dataset=str(dataset), server_url=emu.url, **small))
        assert first.is_completed(), first.message
        data = first.result()
        assert data["gate"]["reason"] == "no baseline to compare with"
        assert data["accept_length"] == pytest.approx(ACCEPT, abs=0.3)
        run_id = first.state_details.flow_run_id
        assert run_id is not None
        artifact, description = asyncio.run(_artifact(run_id))
        # The verdict first, and as the description (what the artifacts list shows).
        assert artifact.startswith("**gate passed: no baseline to compare with**"), artifact
        assert description == (
            "gate passed: no baseline to compare with; EMULATED: the bundled SGLang emulator "
            "answered, not SGLang (test figures)"
        )
        # The result as a list that wraps at 1400 px, not a code block's long lines.
        assert "\n- accept length " in artifact and "\n    - by partition: " in artifact
        assert "The dataset's evals (`eagle3-datagen history" in artifact  # as history shows
        assert "accept len [95% CI]" in artifact
        name, errors = asyncio.run(_run(run_id, "Finished in state Completed"))
        assert re.fullmatch(r"eval \S+/data \d{4}-\d\d-\d\d \d\d:\d\dZ", name), name
        assert not errors
        better = tmp_path / "better.json"
        better.write_text(json.dumps({"accept_length": ACCEPT + 1.0}))
        state = asyncio.run(
            _eval(dataset=str(dataset), server_url=emu.url, baseline=str(better), **small)
        )
        assert state.is_failed()
        assert "eval gate failed: accept length" in str(state.message), state.message
        assert state.state_details.flow_run_id is not None
        _, errors = asyncio.run(_run(state.state_details.flow_run_id, "Finished in state Failed"))
        # One ERROR line with the reason, no traceback (docs/operations.md).
        assert len(errors) == 1 and "eval gate failed" in errors[0], errors
        assert "Traceback" not in errors[0]
    finally:
        emu.stop()

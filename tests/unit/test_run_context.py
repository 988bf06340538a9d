"""A partition subflow's recorded parameters rebuild it: RunContext's JSON form validates back
into a context, through Prefect's own parameter serialization and validation."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_datagen.demo import demo_config
from eagle3_datagen.generate.context import RunContext
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen_flows.partition import generate_partition


def test_run_context_json_validates_back_with_its_limits():
    ctx = RunContext(run_key="0123abcd-run", budget=ServerBudget(48, 200_000))
    recorded = json.loads(ctx.model_dump_json())
    assert recorded == {
        "run_key": "0123abcd-run",
        "supervised": False,
        "max_requests_in_flight": 48,
        "max_tokens_in_flight": 200_000,
    }
    again = RunContext.model_validate(recorded)
    assert again.run_key == "0123abcd-run"
    assert (again.budget.max_requests, again.budget.max_tokens) == (48, 200_000)
    assert again.budget is not ctx.budget and again.supervisor is None
    assert json.loads(again.model_dump_json()) == recorded


def test_a_standalone_context_round_trips_with_the_configs_limits(tmp_path: Path):
    config = demo_config(tmp_path / "out")
    again = RunContext.model_validate_json(RunContext.standalone(config).model_dump_json())
    server = config.server
    assert again.run_key == "standalone"
    assert again.budget.max_requests == server.limits.max_requests_in_flight
    assert again.budget.max_tokens == server.limits.max_tokens_in_flight


def test_partition_subflow_reruns_from_its_recorded_parameters(tmp_path: Path):
    """What Prefect records for a subflow run (its serialized parameters, as JSON) validates
    into the flow's arguments again: the same config, partition and run context."""
    config = demo_config(tmp_path / "out")
    params = {
        "config": config,
        "partition": config.partitions[0].name,
        "server_url": "http://127.0.0.1:30000",
        "context_length": 4096,
        "max_req_input_len": 4000,
        "parquet_metadata": {"eagle3_datagen.fingerprint": "{}"},
        "run": RunContext(run_key="run-1", budget=ServerBudget(16, None)),
    }
    recorded = json.loads(json.dumps(generate_partition.serialize_parameters(params)))
    rebuilt = generate_partition.validate_parameters(recorded)
    assert rebuilt["config"] == config
    assert rebuilt["partition"] == params["partition"]
    assert rebuilt["parquet_metadata"] == params["parquet_metadata"]
    run = rebuilt["run"]
    assert isinstance(run, RunContext)
    assert (run.run_key, run.budget.max_requests, run.budget.max_tokens) == ("run-1", 16, None)

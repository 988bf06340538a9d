"""deployments/serve.py builds the single-machine deployment (no server needed to check it)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from eagle3_datagen.config import PipelineConfig, load_config
from tests.support import REPO


def load_serve() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serve", REPO / "deployments" / "serve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_deployment_has_the_validated_config_and_an_inactive_schedule() -> None:
    serve = load_serve()
    dep = serve.build_deployment(REPO / "configs" / "kimi-k2.5.yaml", name="kimi-k2.5")
    assert dep.entrypoint.endswith("flows/pipeline.py:datagen")
    assert dep.enforce_parameter_schema is True
    [schedule] = dep.schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.active is False
    config = PipelineConfig.model_validate(dep.parameters["config"])
    assert config == load_config(REPO / "configs" / "kimi-k2.5.yaml")
    unscheduled = serve.build_deployment(REPO / "configs" / "demo.yaml", name="demo", cron=None)
    assert unscheduled.schedules == []


def test_served_deployment_attaches_to_the_given_server() -> None:
    """``--server-url``: the nightly recipe's deployment attaches to a server the user runs."""
    serve = load_serve()
    url = "http://127.0.0.1:30000"
    dep = serve.build_deployment(
        REPO / "configs" / "kimi-k2.5.yaml", name="nightly", schedule_active=True, server_url=url
    )
    assert dep.parameters["server_url"] == url
    assert PipelineConfig.model_validate(dep.parameters["config"]) == load_config(
        REPO / "configs" / "kimi-k2.5.yaml"
    )
    [schedule] = dep.schedules
    assert schedule.active is True
    launched = serve.build_deployment(REPO / "configs" / "kimi-k2.5.yaml", name="kimi-k2.5")
    assert "server_url" not in launched.parameters  # without it, the run launches its own

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

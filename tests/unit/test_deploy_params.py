"""Deployment parameters come from a config file, validated, as JSON the run form accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen.errors import ConfigError
from eagle3_datagen_flows.deploy_params import config_parameters, main

REPO = Path(__file__).resolve().parents[2]
KIMI = str(REPO / "configs" / "kimi-k2.5.yaml")


def test_parameters_are_the_validated_config_as_json() -> None:
    params = config_parameters(KIMI, partitions=["B1_glaive"])
    assert json.loads(json.dumps(params)) == params
    assert PipelineConfig.model_validate(params["config"]) == load_config(KIMI)
    assert params["partitions"] == ["B1_glaive"]
    with pytest.raises(ConfigError, match="unknown partition 'nope'"):
        config_parameters(KIMI, partitions=["nope"])


def test_the_command_prints_them_or_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([KIMI, "--partition", "B1_glaive", "--server-url", "http://n1:8000"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["server_url"] == "http://n1:8000" and printed["partitions"] == ["B1_glaive"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {path: m}\npartitions: [{name: p, input: x.jsonl, tier: MEDIUM}]\n")
    assert main([str(bad)]) == 2
    assert "names tier 'MEDIUM'" in capsys.readouterr().err

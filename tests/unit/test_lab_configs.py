"""The CPU lab's run configs (trainers/lab/, not run in CI) still load, and the modes table's
three runs get the mixes docs/modes-lab.md describes from the product's own assignment."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eagle3_datagen.config.loading import load_config
from eagle3_datagen.inputs.modes import assign_mode
from tests.support import REPO

LAB = REPO / "trainers" / "lab"
IDS = [f"lab-{i:04d}" for i in range(240)]  # corpus.py's line ids


def test_the_lab_config_loads() -> None:
    config = load_config(LAB / "lab.yaml")
    assert [p.name for p in config.partitions] == ["lab"]
    assert config.model.modes == {}


@pytest.mark.parametrize(
    ("mix", "expected"),
    [("thinking", {"thinking"}), ("instant", {"instant"}), ("mixture", {"thinking", "instant"})],
)
def test_the_modes_tables_configs(tmp_path: Path, mix: str, expected: set[str]) -> None:
    out = tmp_path / f"{mix}.yaml"
    subprocess.run(
        [sys.executable, str(LAB / "modes.py"), "config", str(LAB / "lab.yaml"), mix, str(out)],
        check=True,
    )
    config = load_config(out)
    assert config.model.modes == {"thinking": {}, "instant": {"thinking": False}}
    [partition] = config.partitions
    assert partition.modes is not None
    got = Counter(assign_mode(i, partition.modes) for i in IDS)
    assert set(got) == expected
    if mix == "mixture":  # half and half, within what 240 fair coins give
        assert 90 <= got["thinking"] <= 150, got

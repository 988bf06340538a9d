"""The sampling config accepts exactly what SGLang 0.5.23's ``SamplingParams.verify`` accepts,
derives one seed per prompt, and the ``--reasoning-parser`` guard catches SGLang's abbreviations.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from eagle3_datagen.config import (
    ModelSpec,
    Sampling,
    ServerSpec,
    names_reasoning_parser,
    parse_config,
)
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.sglang.launch_command import build_launch_command


def _config(**sampling: Any) -> dict[str, Any]:
    return {
        "model": {"path": "m"},
        "partitions": [{"name": "p", "input": "p.jsonl", "tier": "SHORT"}],
        "sampling": sampling,
    }


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("repetition_penalty", 0.0, "greater than 0"),  # SGLang: (0, 2]
        ("repetition_penalty", 2.01, "less than or equal to 2"),
        ("temperature", -0.1, "greater than or equal to 0"),
        ("temperature", float("inf"), "finite number"),
        ("temperature", float("nan"), "finite number"),
        ("top_p", 0.0, "greater than 0"),
        ("min_p", 1.5, "less than or equal to 1"),
        ("top_k", 0, "top_k must be -1"),
        ("seed", 2**63, "less than or equal to"),
    ],
)
def test_values_sglang_refuses_are_refused_with_the_field_named(
    field: str, value: Any, why: str
) -> None:
    with pytest.raises(ConfigError, match=f"sampling.{field}: .*{why}"):
        parse_config(_config(**{field: value}), "run.yaml")


@pytest.mark.parametrize(
    "values",
    [
        {"repetition_penalty": 2.0, "temperature": 0.0, "top_p": 1.0, "min_p": 1.0},
        {"repetition_penalty": 0.01, "top_k": -1, "min_p": 0.0, "seed": -(2**63)},
        {"top_k": 1, "seed": 2**63 - 1},
    ],
)
def test_values_sglang_accepts_are_accepted(values: dict[str, Any]) -> None:
    assert parse_config(_config(**values)).sampling.model_dump().items() >= values.items()


def test_each_prompt_gets_its_own_seed() -> None:
    sampling = Sampling(seed=1234)
    seeds = {sampling.request_seed(f"prompt-{i}") for i in range(1000)}
    assert len(seeds) == 1000
    assert all(s is not None and 0 <= s < 2**63 for s in seeds)
    assert Sampling(seed=1235).request_seed("prompt-0") != sampling.request_seed("prompt-0")
    params = sampling.to_sglang(64, [7], prompt_id="prompt-0")
    assert params["sampling_seed"] == sampling.request_seed("prompt-0")
    assert "sampling_seed" not in sampling.to_sglang(64, [7])
    assert "sampling_seed" not in Sampling().to_sglang(64, [7], prompt_id="prompt-0")


def test_a_prompt_seed_is_the_same_in_another_process() -> None:
    # Python's own hash() of a str changes per process; a resumed run must draw the same.
    code = (
        "from eagle3_datagen.config import Sampling;"
        "print(Sampling(seed=1234).request_seed('prompt-0'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == Sampling(seed=1234).request_seed("prompt-0")


@pytest.mark.parametrize(
    "arg",
    [
        "--reasoning-parser",
        "--reasoning-parser=kimi_k2",
        "--reasoning-pars",  # argparse's allow_abbrev: SGLang takes this as --reasoning-parser
        "--reasoning-pars=kimi_k2",
        "--reasoning",
        "--rea",
    ],
)
def test_every_spelling_of_reasoning_parser_is_refused(arg: str) -> None:
    assert names_reasoning_parser(arg)
    with pytest.raises(ValueError, match="SGLang reads it as --reasoning-parser"):
        ServerSpec(extra_args=[arg, "kimi_k2"])


@pytest.mark.parametrize(
    "arg", ["--re", "--revision", "--reasoning-parserx", "kimi_k2", "--tool-call-parser", "--"]
)
def test_other_flags_are_not_taken_for_reasoning_parser(arg: str) -> None:
    assert not names_reasoning_parser(arg)
    assert ServerSpec(extra_args=[arg]).extra_args == [arg]


@pytest.mark.parametrize("arg", ["--reasoning-parser=kimi_k2", "--reasoning-pars"])
def test_the_launch_command_refuses_it_even_past_the_config_check(arg: str) -> None:
    spec = ServerSpec.model_construct(**{**ServerSpec().model_dump(), "extra_args": [arg]})
    with pytest.raises(ConfigError, match="SGLang reads it as --reasoning-parser"):
        build_launch_command(spec, ModelSpec(path="m"))

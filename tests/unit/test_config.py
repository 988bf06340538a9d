from pathlib import Path

import pytest

from eagle3_datagen.config import PipelineConfig, load_config, parse_config
from eagle3_datagen.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


MINIMAL = """
model: {path: /models/m}
partitions:
  - {name: p1, input: prompts.jsonl, tier: SHORT}
"""


def test_shipped_configs_load() -> None:
    demo = load_config(REPO / "configs" / "demo.yaml")
    assert demo.server.engine == "emulator"
    assert {t.name: (t.concurrency, t.max_tokens) for t in demo.tiers} == {
        "SHORT": (150, 10240),
        "LONG": (32, 16384),
    }
    assert Path(demo.partitions[0].input).is_file()
    kimi = load_config(REPO / "configs" / "kimi-k2.5.yaml")
    assert kimi.model.path == "/shared/kimi-k2.5-int4"
    assert kimi.server.launch.tp_size == 8
    assert kimi.partitions[0].name == "B1_glaive"


def test_defaults_are_the_seed_tiers_and_relative_paths_resolve(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.tier("SHORT").concurrency == 150 and cfg.tier("LONG").max_tokens == 16384
    assert cfg.partitions[0].input == str(tmp_path / "prompts.jsonl")
    assert cfg.model.path == "/models/m"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (MINIMAL.replace("tier: SHORT", "tier: HUGE"), "names tier 'HUGE'"),
        (MINIMAL.replace("name: p1", "name: ../etc"), "partitions.0.name"),
        (MINIMAL.replace("name: p1", "name: a/b"), "not a safe directory name"),
        (
            MINIMAL + "server: {extra_args: ['--reasoning-parser', 'kimi_k2']}\n",
            "--reasoning-parser",
        ),
        (MINIMAL + "bogus_key: 1\n", "bogus_key"),
        (MINIMAL + "server: {mode: attach}\n", "needs server.url"),
        ("model: {path: m}\npartitions: []\n", "partitions"),
    ],
)
def test_errors_name_file_field_and_reason(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"cfg\.yaml:\d+: invalid YAML"):
        load_config(path)


def test_flow_parameter_schema_has_forms_for_tiers_and_partitions() -> None:
    schema = PipelineConfig.model_json_schema()
    assert schema["properties"]["tiers"]["type"] == "array"
    assert schema["properties"]["partitions"]["items"]["$ref"].endswith("/Partition")
    server = schema["$defs"]["ServerSpec"]["properties"]
    assert server["mode"]["enum"] == ["launch", "attach"]
    assert "description" in schema["$defs"]["LaunchFlags"]["properties"]["tp_size"]
    # A key's docstring is its description in the form.
    timeout = schema["$defs"]["ServerLimits"]["properties"]["request_timeout_s"]
    assert timeout["description"] == "Per-request timeout; a 16k-token generation takes minutes."


def test_partitions_are_selected_by_name_and_an_unknown_one_is_refused() -> None:
    config = parse_config(
        {
            "model": {"path": "m"},
            "partitions": [
                {"name": n, "input": f"{n}.jsonl", "tier": "SHORT"} for n in ("a", "b", "c")
            ],
        }
    )
    assert [p.name for p in config.select(None)] == ["a", "b", "c"]
    assert [p.name for p in config.select(["c", "a"])] == ["c", "a"]
    with pytest.raises(ConfigError, match="unknown partition 'x'"):
        config.select(["a", "x"])


def test_server_launch_limits_and_recovery_keys_still_load_from_their_old_place() -> None:
    """A config written before server.launch, .limits and .recovery loads the same; a key set in
    both places is refused, naming the one to keep."""
    base = {
        "model": {"path": "m"},
        "partitions": [{"name": "a", "input": "a.jsonl", "tier": "SHORT"}],
    }
    flat = {"request_timeout_s": 7, "max_relaunches": 0, "tp_size": 4}
    old = parse_config({**base, "server": flat})
    grouped = {
        "launch": {"tp_size": 4},
        "limits": {"request_timeout_s": 7},
        "recovery": {"max_relaunches": 0},
    }
    assert old.server == parse_config({**base, "server": grouped}).server
    assert old.server.limits.request_timeout_s == 7 and old.server.recovery.max_relaunches == 0
    assert old.server.launch.tp_size == 4
    both = {"request_timeout_s": 7, "limits": {"request_timeout_s": 8}}
    with pytest.raises(ConfigError, match=r"keep server\.limits\.request_timeout_s"):
        parse_config({**base, "server": both})

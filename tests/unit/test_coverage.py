"""Coverage against a serving profile: the profile's errors, the shares, the flags, the CLI, on
datasets written to disk the way the pipeline writes them and read back from Parquet."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import ServingProfile, load_config
from eagle3_datagen.errors import ConfigError, DatasetError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.report.coverage import Coverage, Row, dataset_coverage, script_of
from eagle3_datagen.report.dataset_card import CARD, refresh_dataset_card
from eagle3_datagen_cli.main import main
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset

CONFIG = """\
model: {path: /models/m}
partitions:
  - {name: p1, input: prompts.jsonl, tier: SHORT}
serving_profile:
"""


def write_profile(tmp_path: Path, profile: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG + profile)
    return path


@pytest.mark.parametrize(
    ("profile", "line", "needle"),
    [
        ("  tools: 0.3\n  tool_calls: 0.2\n", 6, "serving_profile.tool_calls: Extra inputs"),
        ("  turns: {'1': 0.5, '1-3': 0.5}\n", 5, "turns buckets '1' and '1-3' overlap"),
        ("  input_tokens: {'<1k': 1.0}\n", 5, "bucket '<1k' is not '<N', 'N-M'"),
        ("  modes: {chat: 0.5, code: 0.3}\n", 5, "mode shares sum to 0.8, not 1"),
        ("  languages: {latin: 0.5, klingon: 0.5}\n", 5, "unknown script(s) ['klingon']"),
        ("  tools: 1.5\n", 5, "serving_profile.tools: Input should be less than or equal to 1"),
        ("  tolerance: 0.1\n", 4, "declares at least one of modes"),
    ],
)
def test_profile_errors_name_file_line_and_reason(
    tmp_path: Path, profile: str, line: int, needle: str
) -> None:
    path = write_profile(tmp_path, profile)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:{line}: serving_profile" in str(info.value)
    assert needle in str(info.value)


def test_script_of_names_the_prompt_not_its_template() -> None:
    template = "<|im_system|>system<|im_middle|>You are helpful<|im_end|><|im_user|>user"
    assert script_of(template + "How are you today?") == "latin"
    assert script_of(template + "今天天气怎么样？") == "han"
    assert script_of(template + "今日の天気はどうですか") == "kana"
    assert script_of(template + "Как дела сегодня?") == "cyrillic"
    assert script_of(template + "오늘 날씨 어때요") == "hangul"
    assert script_of("12345 + 678 = ?") == "other"
    assert script_of("12345 + 678 = ? ½ → ∞") == "other"  # not ASCII, still no letter
    assert script_of("x = 1") == "latin"
    assert script_of("Ça coûte 5 €, n'est-ce pas ?") == "latin"
    # A Greek word in a long English prompt: under 10 % of the letters, still Latin.
    assert script_of("word " * 40 + "λόγος") == "latin"
    assert script_of("word " * 4 + "λόγος λόγος") == "greek"


@pytest.fixture
def dataset(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> Path:
    """Ten records over two partitions: tools on 4, tool results on 2, 1-3 user turns, one
    Chinese prompt, one long output, one record from before the new columns."""
    t = Tok(chat_tokenizer)
    zh = chat_tokenizer.tok.encode("今天天气怎么样？请告诉我。", add_special_tokens=False)
    en = chat_tokenizer.tok.encode("What is the weather like today?", add_special_tokens=False)
    recs = [
        t.record(
            f"r{i}",
            "p1",
            line=i + 1,
            prompt_ids=en,
            prompt_tokens=len(en),
            has_tools=i < 4,
            has_tool_results=i < 2,
            user_turns=1 + i % 3,
        )
        for i in range(9)
    ]
    recs[0].prompt_ids, recs[0].prompt_tokens = zh, len(zh)
    recs[1].completion_tokens = 600  # 512-2047
    old = t.record("old", "p2", prompt_ids=en, prompt_tokens=len(en))  # no new columns
    root = tmp_path / "ds"
    fp = make_fingerprint(make_config(), chat_tokenizer)
    write_dataset(root, fp, {"p1": [Batch(recs[:5]), Batch(recs[5:])], "p2": [Batch([old])]})
    return root


def rows(cov: Coverage, dim: str) -> dict[str, Row]:
    return {r.key: r for r in cov.rows if r.dimension == dim}


def test_own_mix_counts_every_dimension(dataset: Path) -> None:
    cov = dataset_coverage(dataset)
    assert cov.mix.records == 10 and cov.mix.language_sample == 10
    assert cov.profile is None and cov.flagged == []
    assert rows(cov, "modes")["default"].records == 10
    tools = rows(cov, "tools")
    assert (tools["with"].records, tools["with"].dataset) == (4, 0.4)
    assert tools["unknown"].records == 1  # the record from before has_tools
    assert rows(cov, "tool_results")["with"].records == 2
    assert rows(cov, "images")["with"].records == 0
    turns = rows(cov, "turns")
    assert {k: r.records for k, r in turns.items()} == {"1": 3, "2": 3, "3-4": 3, "unknown": 1}
    assert {k: r.records for k, r in rows(cov, "output_tokens").items()} == {
        "<128": 9,
        "512-2047": 1,
    }
    assert {k: r.records for k, r in rows(cov, "languages").items()} == {"latin": 9, "han": 1}


def test_profile_flags_off_and_missing_dimensions(dataset: Path) -> None:
    profile = ServingProfile(
        tolerance=0.05,
        modes={"default": 0.7, "agent": 0.3},
        tools=0.45,  # data 0.40: within 5 points
        tool_results=0.5,  # data 0.20: off
        images=0.1,  # data none: missing
        turns={"1": 0.3, "2-3": 0.7},  # data 0.3 and 0.6: 2-3 off by 10 points
        output_tokens={"<512": 0.9, ">=512": 0.1},  # exact
        languages={"latin": 0.9, "han": 0.1},  # exact
    )
    cov = dataset_coverage(dataset, profile)
    assert cov.flagged == ["modes", "tool_results", "images", "turns"]
    assert rows(cov, "modes")["agent"].flag == "missing"
    assert rows(cov, "modes")["default"].flag == "off"
    assert rows(cov, "tools")["with"].flag == ""
    assert rows(cov, "tool_results")["with"].flag == "off"
    assert rows(cov, "images")["with"].flag == "missing"
    turns = rows(cov, "turns")
    assert (turns["1"].flag, turns["2-3"].flag, turns["2-3"].records) == ("", "off", 6)
    out = rows(cov, "output_tokens")
    assert (out["<512"].records, out[">=512"].records, out[">=512"].flag) == (9, 1, "")
    assert all(r.flag == "" for r in rows(cov, "languages").values())


def test_profile_against_data_without_the_columns_is_missing(
    tmp_path: Path, chat_tokenizer: ChatTokenizer
) -> None:
    t = Tok(chat_tokenizer)
    root = tmp_path / "old"
    fp = make_fingerprint(make_config(("p1",)), chat_tokenizer)
    write_dataset(root, fp, {"p1": [Batch([t.record("a", "p1"), t.record("b", "p1")])]})
    shard = next((root / "p1").glob("part-*.parquet"))
    table = pq.read_table(shard)  # as written before the columns, fingerprint kept
    pq.write_table(table.drop_columns(["has_tool_results", "user_turns"]), shard)
    cov = dataset_coverage(root, ServingProfile(tool_results=0.2, turns={"1": 1.0}))
    assert cov.flagged == ["tool_results", "turns"]
    assert rows(cov, "tool_results")["unknown"].flag == "missing"
    assert rows(cov, "turns")["1"].flag == "missing" and rows(cov, "turns")["1"].dataset is None


def test_cli_coverage_prints_flags_and_strict_exits_1(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_profile(tmp_path, "  tools: 0.9\n  tolerance: 0.1\n")
    assert main(["coverage", str(dataset), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("with tools") and " with " in x)
    assert line.split() == ["with", "tools", "with", "90.0%", "40.0%", "4", "OFF"]
    assert "Flagged: tools." in out
    assert main(["coverage", str(dataset), "--config", str(cfg), "--strict"]) == 1
    capsys.readouterr()
    assert main(["coverage", str(dataset), "--strict", "--partition", "p2"]) == 0
    assert "own mix over 1 records" in capsys.readouterr().out
    assert main(["coverage", str(dataset), "--partition", "nope"]) == 2
    assert "no partition nope" in capsys.readouterr().err


def test_card_has_the_coverage_section(dataset: Path) -> None:
    manifest = orjson.loads((dataset / "manifest.json").read_bytes())
    refresh_dataset_card(dataset, manifest, ServingProfile(images=0.2))
    card = (dataset / CARD).read_text()
    assert "## Coverage" in card
    assert "| with images | with | 20.0% | 0.0% | 0 | **MISSING** |" in card
    assert "Flagged: images." in card


def test_unknown_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no manifest"):
        dataset_coverage(tmp_path)

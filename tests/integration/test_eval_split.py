"""One held-out split per dataset (``split.json``): every default export leaves it out of
training, eval measures on it and proves, from an export's provenance file, that the draft
never trained on what it measures; a dataset grown by a second run keeps its earlier held-out
conversations held out; the accept length comes with its interval and the result shows where
users look (``history``, the dataset card)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.write.export_provenance import conversation_digest
from eagle3_datagen.write.manifest import read_manifest
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.main import main
from tests.integration.test_eval import make_dataset, spec_flags
from tests.support.emulator import EmulatorProcess, read_ledger
from tests.support.pipeline import base_config
from tests.support.prompts import prompt_line

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _held_out(dataset: Path) -> set[tuple[str, str]]:
    return {(p, c) for p, c in orjson.loads((dataset / "split.json").read_bytes())["held_out"]}


def test_eval_never_measures_what_an_export_trained_on(
    tmp_path: Path, chat_tokenizer: ChatTokenizer, cli: Cli
) -> None:
    """The README's recipe with the defaults: export (two, with different flags), then eval of
    a draft trained on either: no eval request is a conversation of a training file."""
    dataset = make_dataset(tmp_path / "data", chat_tokenizer, 1000)
    manifest = read_manifest(dataset)
    assert manifest is not None
    refresh_dataset_card(dataset, manifest)
    # Two exports with different flags, both the default way: the first fixes the split.
    spec, sf = tmp_path / "a" / "spec.jsonl", tmp_path / "b" / "sf.jsonl"
    code, out, _ = cli("export", str(dataset), "--format", "speculators", "--output", str(spec))
    assert code == 0 and "held out: " in out and "never in the training one" in out, out
    split = orjson.loads((dataset / "split.json").read_bytes())
    assert (split["validation"], split["seed"]) == (0.05, 0)
    code, _, _ = cli(
        "export", str(dataset), "--format", "specforge", "--output", str(sf),
        "--truncated", "drop", "--max-length", "4096",
    )  # fmt: skip
    assert code == 0
    held = _held_out(dataset)
    trained = {row["primary_id"] for row in _jsonl(spec)}
    assert trained and not {c for _, c in held} & trained
    assert {row["primary_id"] for row in _jsonl(spec.with_name("spec.validation.jsonl"))} == {
        c for _, c in held
    }
    # Another fraction is refused, naming how to re-split and what that costs.
    code, _, err = cli(
        "export", str(dataset), "--format", "specforge", "--output", str(tmp_path / "x.jsonl"),
        "--validation", "0.2",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1
    assert "--resplit" in err and "can no longer be evaluated" in err, err
    # Holding nothing out takes a flag, and the report says what it means.
    everything = tmp_path / "all" / "sf.jsonl"
    code, out, _ = cli(
        "export", str(dataset), "--format", "specforge", "--output", str(everything),
        "--no-holdout",
    )  # fmt: skip
    assert code == 0 and "held out: nothing (--no-holdout)" in out

    ledger = tmp_path / "ledger.jsonl"
    (tmp_path / "draft").mkdir()
    emu = EmulatorProcess(*spec_flags(tmp_path / "draft"), ledger=ledger, log_dir=tmp_path)
    emu.wait_ready()
    try:
        result = tmp_path / "eval.json"
        code, printed, _ = cli(
            "eval", str(dataset), "--server-url", emu.url, "--json", str(result),
            "--train-export", str(spec),
        )  # fmt: skip
        assert code == 0, printed
        sent = {
            tuple(e["rid"].split(":")[1:3])
            for e in read_ledger(ledger)
            if e["rid"].startswith("eval-")
        }
        sent_convs = {(p, rid.split("#")[0]) for p, rid in sent}
        assert sent_convs == held  # every held-out conversation, nothing else
        assert not {c for _, c in sent_convs} & trained
        sf_digests = set(
            orjson.loads(sf.with_name("sf.provenance.json").read_bytes())["train_conversations"][
                "digests"
            ]
        )
        assert not {conversation_digest(*k) for k in sent_convs} & sf_digests
        data = orjson.loads(result.read_bytes())
        assert data["overlap"]["checked"] is True
        assert data["overlap"]["conversations_in_training"] == 0
        assert data["heldout"]["conversations"] == len(held)
        assert data["heldout"]["records"] == len(sent) >= 50
        assert data["heldout"]["moved_to_train"] == split_moved(dataset)
        low, high = data["accept_length_ci95"]
        assert low < data["accept_length"] < high
        assert f"accept length {data['accept_length']} [{low}, {high}]" in printed
        assert "95 % interval over" in printed

        # The draft trained on everything (--no-holdout): refused before a request is sent,
        # in one line, nothing written.
        before = (dataset / "history.jsonl").read_bytes()
        n_sent = len(read_ledger(ledger))
        code, _, err = cli(
            "eval", str(dataset), "--server-url", emu.url, "--json", str(tmp_path / "no.json"),
            "--train-export", str(everything.parent),
        )  # fmt: skip
        assert code == 2 and err.count("\n") == 1, err
        assert f"{len(held)} of {len(held)} eval conversations" in err
        assert "in the training file of" in err
        assert (dataset / "history.jsonl").read_bytes() == before
        assert not (tmp_path / "no.json").exists() and len(read_ledger(ledger)) == n_sent
    finally:
        emu.stop()

    # Where users look: history shows the eval beside the runs, and alone with --evals; the
    # dataset card shows the latest.
    code, out, _ = cli("history", str(dataset), "--evals")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [
        "eval", "started", "(UTC)", "draft", "held-out", "records", "accept", "len", "[95%",
        "CI]", "gate",
    ]  # fmt: skip
    assert f"{data['accept_length']:.3f} [{low:.3f}, {high:.3f}]" in row
    assert row.rstrip().endswith("passed") and str(tmp_path / "draft") in row
    card = (dataset / "README.md").read_text()
    assert "## Latest eval" in card and f"{data['accept_length']:.3f} [{low:.3f}" in card


def split_moved(dataset: Path) -> int:
    return len(orjson.loads((dataset / "split.json").read_bytes())["moved_to_train"])


def test_eval_against_a_dead_server_is_one_line(
    tmp_path: Path, chat_tokenizer: ChatTokenizer, cli: Cli
) -> None:
    dataset = make_dataset(tmp_path / "data", chat_tokenizer, 1000)
    emu = EmulatorProcess("--random-seed", "0", log_dir=tmp_path).wait_ready()
    url = emu.url
    emu.stop()  # nothing listens there now
    code, _, err = cli("eval", str(dataset), "--server-url", url, "--json", str(tmp_path / "e"))
    assert code == 2
    assert err == f"eagle3-datagen: cannot reach {url}: connection refused\n"
    assert not (dataset / "split.json").exists() and not (tmp_path / "e").exists()
    assert not (dataset / "history.jsonl").exists()


@pytest.mark.usefixtures("prefect_backend")
def test_a_grown_dataset_keeps_its_held_out_conversations(
    tmp_path: Path, emulator_factory: Any, cli: Cli
) -> None:
    """A nightly's second run adds lines: every earlier held-out conversation stays held out,
    and a new line repeating a held-out prompt is held out with it."""
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "20").wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    data = base_config(tmp_path, prompts)
    data["server"] = {"mode": "attach", "url": emu.url}
    config = PipelineConfig.model_validate(data)
    out = Path(config.output_dir)
    lines = [prompt_line(i, words=12) for i in range(80)]
    prompts.write_text("".join(f"{line}\n" for line in lines))
    ok, result = run_pipeline(config)
    assert ok, result
    first = tmp_path / "first.jsonl"
    code, _, err = cli(
        "export", str(out), "--format", "speculators", "--output", str(first),
        "--validation", "0.25",
    )  # fmt: skip
    assert code == 0, err
    before = _held_out(out)
    assert len(before) >= 5

    # The second run: new lines, and one repeating each held-out prompt under a new id.
    by_id = {json.loads(line)["id"]: json.loads(line) for line in lines}
    repeats = [json.dumps({**by_id[c], "id": f"again-{c}"}) for _, c in sorted(before)]
    grown = lines + [prompt_line(i, words=12) for i in range(100, 180)] + repeats
    prompts.write_text("".join(f"{line}\n" for line in grown))
    ok, result = run_pipeline(config)
    assert ok, result
    second = tmp_path / "second.jsonl"
    code, printed, err = cli("export", str(out), "--format", "speculators", "--output", str(second))
    assert code == 0, err
    after = _held_out(out)
    assert before <= after  # every earlier held-out conversation is still held out
    assert {("chaos", f"again-{c}") for _, c in before} <= after
    validation = {r["primary_id"] for r in _jsonl(second.with_name("second.validation.jsonl"))}
    trained = {r["primary_id"] for r in _jsonl(second)}
    assert {c for _, c in after} == validation and not validation & trained
    assert any(c.startswith("p00001") for _, c in after - before)  # new lines, by the hash
    # Those the hash alone would have put in train joined their held-out prompt (and say so).
    joined = re.search(r"; (\d+) new ones held out \(their first prompt is a held-out", printed)
    assert joined and 0 < int(joined[1]) <= len(before), printed

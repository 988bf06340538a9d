"""``eagle3-datagen eval`` against real emulator processes that speculate: the JSON, the gate,
the history line, and each bad input refused in one line with nothing written lost."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.report.history import read_history
from eagle3_datagen.write.heldout import in_validation
from eagle3_datagen_cli.main import main
from tests.support import TOKENIZER_DIR
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset
from tests.support.emulator import EmulatorProcess

ACCEPT = 2.5  # the emulator's acceptance profile: mean tokens per verify step
STEPS = 3
SAMPLING = {
    "temperature": 1.0,
    "top_p": 0.95,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_new_tokens": 400,
    "sampling_seed": None,
}


def spec_flags(draft: Path, *extra: str) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(STEPS), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(STEPS + 1), "--emu-accept-length", str(ACCEPT),
        "--emu-mean-output-tokens", "120", "--random-seed", "0", *extra,
    ]  # fmt: skip


def make_dataset(root: Path, tok: ChatTokenizer, conversations: int) -> Path:
    """Conversations of two turns over two partitions, some with a tool call; conversation
    ``c0``'s first prompt is repeated by every fifth one (under another id)."""
    tk = Tok(tok)
    parts: dict[str, list[Any]] = {"p1": [], "p2": []}
    for c in range(conversations):
        first = tk.prompt() if c % 5 == 0 else [*tk.prompt(), 60 + c]
        for t in range(2):
            out = tk.tool_output() if c % 3 == 0 else tk.output()
            rec = tk.record(f"c{c}#t{t}", f"p{1 + c % 2}", out, line=c + 1)
            rec.conversation_id, rec.turn, rec.sampling = f"c{c}", t, dict(SAMPLING)
            rec.has_tools = c % 3 == 0
            rec.prompt_ids = first if t == 0 else [*first, *out, 99, 98]
            parts[rec.partition].append(rec)
    write_dataset(
        root, make_fingerprint(make_config(), tok), {p: [Batch(r)] for p, r in parts.items()}
    )
    return root


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft directory whose config fits the bundled target's."""
    path = tmp_path_factory.mktemp("draft")
    target = json.loads((TOKENIZER_DIR / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({"vocab_size": target["vocab_size"]}))
    return path


@pytest.fixture(scope="module")
def speculating(draft: Path, tmp_path_factory: pytest.TempPathFactory):
    emu = EmulatorProcess(*spec_flags(draft), log_dir=tmp_path_factory.mktemp("logs"))
    yield emu.wait_ready()
    emu.stop()


@pytest.fixture
def dataset(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> Path:
    return make_dataset(tmp_path / "data", chat_tokenizer, 40)


Run = Callable[..., tuple[int, str, str]]
# The small dataset's split: 20 % of its 40 conversations, and a minimum it meets (the
# defaults, 5 % and 50 records, are for real datasets: test_eval_split.py).
SMALL = ("--validation", "0.2", "--min-records", "10")


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def call(*argv: str) -> tuple[int, str, str]:
        code = main(["eval", *argv, *SMALL])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def test_eval_measures_the_held_out_split(
    dataset: Path, speculating: EmulatorProcess, draft: Path, run: Run, tmp_path: Path
) -> None:
    out = tmp_path / "eval.json"
    code, printed, _ = run(
        str(dataset), "--server-url", speculating.url, "--json", str(out), "--draft", str(draft)
    )
    assert code == 0, printed
    data = orjson.loads(out.read_bytes())
    assert {"records", "accept_length", "slices", "split", "gate"} <= set(data)
    held = {f"c{c}" for c in range(40) if in_validation(f"p{1 + c % 2}", f"c{c}", 0.2, 0) and c % 5}
    assert held and data["records"] == 2 * len(held)  # both turns of each held-out conversation
    moved = {c for c in range(0, 40, 5) if in_validation(f"p{1 + c % 2}", f"c{c}", 0.2, 0)}
    assert moved and len(moved) < 8  # repeats on both sides: every held-out one moved
    assert data["split"]["duplicates_moved_to_train"] == len(moved)
    assert data["heldout"] == {
        "conversations": len(held),
        "records": 2 * len(held),
        "moved_to_train": len(moved),
        "images_left_out": 0,
    }
    low, high = data["accept_length_ci95"]
    assert low < data["accept_length"] < high
    assert f"accept length {data['accept_length']} [{low}, {high}]" in printed
    # Nothing says what the draft trained on: said, in the output and the JSON.
    assert data["overlap"]["checked"] is False and "overlap not checked" in printed
    # The first eval fixed the dataset's split.
    recorded = orjson.loads((dataset / "split.json").read_bytes())
    assert (recorded["validation"], recorded["seed"]) == (0.2, 0)
    assert {tuple(k) for k in recorded["held_out"]} == {(f"p{1 + int(c[1:]) % 2}", c) for c in held}
    assert data["accept_length"] == pytest.approx(ACCEPT, abs=0.3)
    assert len(data["position_acceptance"]) == STEPS
    assert data["position_acceptance"] == sorted(data["position_acceptance"], reverse=True)
    slices = data["slices"]
    assert set(slices) == {"partition", "turn", "tools", "mode", "images", "output_length"}
    assert set(slices["mode"]) == {"default"}  # no modes declared
    assert set(slices["turn"]) == {"0", "1"} and set(slices["images"]) == {"text only"}
    assert set(slices["tools"]) == {"with tools", "no tools"}
    for values in slices.values():
        assert sum(v["requests"] for v in values.values()) == data["records"]
        assert sum(v["verify_ct"] for v in values.values()) == data["verify_ct"]
    assert data["unchecked"] == []  # the draft's config was compared with the target's
    entry = read_history(dataset)[-1]
    assert entry["kind"] == "eval" and entry["accept_length"] == data["accept_length"]
    # The emulator answered, and the record says so beside the version it stands in for.
    assert data["server"]["kind"] == entry["server"]["kind"] == "sglang-emulator"


def test_the_gate_fails_against_a_better_baseline_and_passes_a_worse(
    dataset: Path, speculating: EmulatorProcess, run: Run, tmp_path: Path
) -> None:
    better, worse = tmp_path / "better.json", tmp_path / "worse.json"
    better.write_text(json.dumps({"accept_length": ACCEPT + 1.0}))
    worse.write_text(json.dumps({"accept_length": ACCEPT - 1.0}))
    url = ["--server-url", speculating.url]
    code, _, err = run(str(dataset), *url, "--baseline", str(better), "--max-drop", "0.1")
    assert code == 1
    assert err.count("\n") == 1 and "eval gate failed: accept length" in err and "dropped" in err
    assert run(str(dataset), *url, "--baseline", str(worse))[0] == 0
    # From the history, the baseline is the last eval that passed its gate (a failed one, here
    # with a far higher accept length, is not): the same data, within the margin.
    with (dataset / "history.jsonl").open("a") as fh:
        fh.write(json.dumps({"kind": "eval", "accept_length": 9.0, "gate": {"ok": False}}) + "\n")
    code, printed, _ = run(str(dataset), *url, "--baseline", "history", "--max-drop", "0.5")
    assert code == 0 and "in history.jsonl" in printed, printed
    gates = [e["gate"]["ok"] for e in read_history(dataset)]
    assert gates == [False, True, False, True]


@pytest.fixture
def plain(tmp_path: Path):
    emu = EmulatorProcess("--random-seed", "0", log_dir=tmp_path)
    yield emu.wait_ready()
    emu.stop()


@pytest.fixture
def lossy(tmp_path: Path, draft: Path):
    flags = spec_flags(draft, "--speculative-accept-threshold-single", "0.5")
    emu = EmulatorProcess(*flags, log_dir=tmp_path)
    yield emu.wait_ready()
    emu.stop()


def _refused(run: Run, dataset: Path, url: str, *extra: str) -> str:
    """Exit 2 with one line; the earlier JSON and the history are untouched."""
    before = (dataset / "history.jsonl").read_bytes()
    code, _, err = run(str(dataset), "--server-url", url, "--json", str(dataset / "e.json"), *extra)
    assert code == 2 and err.count("\n") == 1, err
    assert (dataset / "history.jsonl").read_bytes() == before
    assert (dataset / "e.json").read_text() == "earlier"
    return err


def test_bad_input_is_refused_in_one_line(
    dataset: Path,
    speculating: EmulatorProcess,
    plain: EmulatorProcess,
    lossy: EmulatorProcess,
    draft: Path,
    run: Run,
    tmp_path: Path,
    chat_tokenizer: ChatTokenizer,
) -> None:
    (dataset / "history.jsonl").write_text('{"kind": "eval", "accept_length": 2.0}\n')
    (dataset / "e.json").write_text("earlier")
    assert "does not speculate" in _refused(run, dataset, plain.url)
    err = _refused(run, dataset, lossy.url)
    assert "speculates lossily: speculative_accept_threshold_single=0.5" in err
    assert "--draft" in _refused(run, dataset, speculating.url, "--draft", str(tmp_path / "no"))
    wrong = tmp_path / "wrong-draft"
    shutil.copytree(draft, wrong)
    (wrong / "config.json").write_text(json.dumps({"vocab_size": 12345}))
    err = _refused(run, dataset, speculating.url, "--draft", str(wrong))
    assert "does not fit the target" in err and "vocab_size 12345" in err
    # A dataset too small for its split to hold anything out.
    small = make_dataset(tmp_path / "small", chat_tokenizer, 1)
    shutil.copy(dataset / "history.jsonl", small / "history.jsonl")
    (small / "e.json").write_text("earlier")
    seed = next(s for s in range(100) if not in_validation("p1", "c0", 0.2, s))
    err = _refused(run, small, speculating.url, "--seed", str(seed))
    assert "0 held-out records, fewer than the minimum 10 (--min-records)" in err
    assert not (small / "split.json").exists()

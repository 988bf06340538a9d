"""The whole pipeline, attach mode, against SGLang 0.5.23's real app: records token-exact
against the fake engine's own log, and a rerun after a server restart resumes, sending nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conformance.process import RealAppProcess
from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from tests.support import TOKENIZER_DIR  # noqa: E402
from tests.support.pipeline import CliRun, records  # noqa: E402
from tests.support.prompts import write_prompts  # noqa: E402

PARTITIONS = ("p_alpha", "p_beta", "p_gamma")


def _config(tmp_path: Path, url: str) -> Path:
    inputs = [
        write_prompts(tmp_path / f"{n}.jsonl", 12, first=100 * i) for i, n in enumerate(PARTITIONS)
    ]
    cfg: dict[str, Any] = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {"mode": "attach", "url": url, "request_timeout_s": 60},
        "tiers": [{"name": "SHORT", "concurrency": 8, "max_tokens": 1024}],
        "partitions": [
            {"name": name, "input": str(path), "tier": "SHORT"}
            for name, path in zip(PARTITIONS, inputs, strict=True)
        ],
        "output_dir": str(tmp_path / "out"),
        "batch_size": 5,
        "retries": {"max_attempts": 4, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _generation_answers(app: RealAppProcess) -> list[dict[str, Any]]:
    """The log minus the pre-flight smoke requests and SGLang's own (text) warm-up."""
    return [a for a in app.answers() if not a["rid"].startswith("preflight") and not a["from_text"]]


def test_attach_run_is_token_exact_and_resumes_after_restart(
    tmp_path: Path, prefect_backend: None
) -> None:
    log = tmp_path / "answers.jsonl"
    app = RealAppProcess(tmp_path, log=log).wait_ready()
    config = _config(tmp_path, app.url)
    try:
        first = CliRun(config, tmp_path / "run1.log")
        assert first.wait() == 0, first.output()
        answers = {a["rid"]: a for a in _generation_answers(app)}
        total = 0
        for name in PARTITIONS:
            for rec in records(tmp_path / "out", name).values():
                total += 1
                got = answers[rec["rid"]]
                assert list(rec["output_ids"]) == got["output_ids"], rec["id"]
                assert list(rec["prompt_ids"]) == got["input_ids"], rec["id"]
        assert total > 0
        sent_before = len(_generation_answers(app))
    finally:
        app.stop()

    # A restarted server: the same flags, so a new random_seed drawn by SGLang.
    app2 = RealAppProcess(tmp_path, port=app.port, log=log).wait_ready()
    try:
        second = CliRun(config, tmp_path / "run2.log")
        code = second.wait()
        assert code == 0, f"the rerun after a server restart was refused:\n{second.output()}"
        assert len(_generation_answers(app2)) == sent_before, "the rerun sent prompts again"
    finally:
        app2.stop()


def test_two_runs_never_reuse_a_rid(tmp_path: Path, prefect_backend: None) -> None:
    """SGLang refuses a rid it still holds (tokenizer_manager.py:3833-3837), so rids must be
    unique per run: two runs of the same prompts (two output dirs) share none."""
    app = RealAppProcess(tmp_path).wait_ready()
    try:
        config = _config(tmp_path, app.url)
        assert CliRun(config, tmp_path / "a.log").wait() == 0
        first = {a["rid"] for a in _generation_answers(app)}
        cfg = yaml.safe_load(config.read_text())
        cfg["output_dir"] = str(tmp_path / "out-2")
        config.write_text(yaml.safe_dump(cfg))
        assert CliRun(config, tmp_path / "b.log").wait() == 0
        second = {a["rid"] for a in _generation_answers(app)} - first
        reused = first & {a["rid"] for a in _generation_answers(app)[len(first) :]}
    finally:
        app.stop()
    assert second, "the second run sent nothing"
    assert not reused, f"rids reused across runs: {sorted(reused)[:5]}"

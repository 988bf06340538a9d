"""Pre-flight of a speculating server (a real emulator process): each lossy knob refused in one
line naming it, a lossless one let through; the draft directory checked before a launch."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from eagle3_datagen.config import ModelSpec, RetryPolicy, Sampling, ServerSpec, SpeculativeSpec
from eagle3_datagen.errors import PreflightError
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.preflight import preflight
from eagle3_datagen.sglang.spec_preflight import check_before_launch
from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorProcess

pytestmark = pytest.mark.timeout(120)

Start = Callable[..., EmulatorProcess]
ATTACH = ServerSpec(mode="attach", url="http://unused")
MODEL = ModelSpec(path=str(TOKENIZER_DIR))
QUICK = RetryPolicy(max_attempts=3, backoff_initial_s=0.2, backoff_max_s=1.0)
TARGET_VOCAB = json.loads((TOKENIZER_DIR / "config.json").read_text())["vocab_size"]


def _spec_flags(draft: Path, *more: str) -> tuple[str, ...]:
    return (
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", *more,
    )  # fmt: skip


async def _preflight(
    emu: EmulatorProcess,
    server: ServerSpec = ATTACH,
    sampling: Sampling | None = None,
    temperatures: tuple[float, ...] = (),
) -> None:
    async with SGLangClient(emu.url) as client:
        await preflight(
            client,
            server=server,
            model=MODEL,
            sampling=sampling,
            retries=QUICK,
            temperatures=temperatures,
        )


@pytest.mark.parametrize(
    ("flags", "sampling", "cause"),
    [
        (("--speculative-accept-threshold-single", "0.5"), {}, "threshold_single=0.5"),
        (("--speculative-accept-threshold-acc", "0.8"), {}, "threshold_acc=0.8"),
        (("--device", "cpu"), {"temperature": 0.6}, "device=cpu"),
        ((), {"min_p": 0.05}, "min_p > 0"),
        ((), {"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
    ],
)
async def test_lossy_speculation_is_refused_naming_the_cause(
    emulator_factory: Start, tmp_path: Path, flags: tuple[str, ...], sampling: dict, cause: str
) -> None:
    emu = emulator_factory(*_spec_flags(tmp_path, *flags)).wait_ready()
    with pytest.raises(PreflightError, match="speculates lossily") as err:
        await _preflight(emu, sampling=Sampling(**sampling))
    assert cause in str(err.value)
    assert "\n" not in str(err.value)


async def test_simulated_acceptance_in_the_launch_env_is_refused(
    emulator_factory: Start, tmp_path: Path
) -> None:
    emu = emulator_factory(*_spec_flags(tmp_path)).wait_ready()
    launched = ServerSpec(env={"SGLANG_SIMULATE_ACC_LEN": "3.5"})
    with pytest.raises(PreflightError, match=r"SGLANG_SIMULATE_ACC_LEN=3.5: accept lengths"):
        await _preflight(emu, server=launched)


async def test_lossless_speculation_passes(emulator_factory: Start, tmp_path: Path) -> None:
    emu = emulator_factory(*_spec_flags(tmp_path, "--device", "cpu")).wait_ready()
    await _preflight(emu, sampling=Sampling(temperature=0.0))  # greedy: cpu is fine
    with pytest.raises(PreflightError, match="device=cpu"):  # a partition samples at 0.7
        await _preflight(emu, sampling=Sampling(temperature=0.0), temperatures=(0.0, 0.7))
    await _preflight(emulator_factory(*_spec_flags(tmp_path)).wait_ready())


async def test_an_attached_draft_for_another_target_is_refused(
    emulator_factory: Start, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": TARGET_VOCAB + 1}))
    emu = emulator_factory(*_spec_flags(tmp_path)).wait_ready()
    with pytest.raises(PreflightError, match=f"vocab_size {TARGET_VOCAB + 1}, the target's"):
        await _preflight(emu)


def _launch(draft: Path) -> ServerSpec:
    return ServerSpec(engine="emulator", speculative=SpeculativeSpec(draft_model_path=str(draft)))


def test_the_draft_is_checked_before_launch(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match=r"draft_model_path .*absent: no such directory"):
        check_before_launch(_launch(tmp_path / "absent"), MODEL)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PreflightError, match="not a directory"):
        check_before_launch(_launch(tmp_path / "file"), MODEL)
    draft = tmp_path / "draft"
    draft.mkdir()
    check_before_launch(_launch(draft), MODEL)  # no config.json: nothing to compare
    (draft / "config.json").write_text(
        json.dumps({"vocab_size": TARGET_VOCAB, "hidden_size": 7168, "draft_vocab_size": 32})
    )
    check_before_launch(_launch(draft), MODEL)  # a reduced draft vocabulary fits
    (draft / "config.json").unlink()
    sglang = ServerSpec(speculative=SpeculativeSpec(draft_model_path=str(draft)))
    with pytest.raises(PreflightError, match=r"no config\.json"):
        check_before_launch(sglang, MODEL)
    (draft / "config.json").write_text(json.dumps({"vocab_size": 163840}))
    with pytest.raises(PreflightError, match=r"does not fit the target.*vocab_size 163840"):
        check_before_launch(_launch(draft), MODEL)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_draft_is_refused(tmp_path: Path) -> None:
    draft = tmp_path / "locked"
    draft.mkdir(mode=0)
    try:
        with pytest.raises(PreflightError, match="not readable"):
            check_before_launch(_launch(draft), MODEL)
    finally:
        draft.chmod(0o755)


def test_hidden_size_mismatch_is_refused(tmp_path: Path) -> None:
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 7168}}))
    (draft / "config.json").write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(PreflightError, match="hidden_size 4096, the target's 7168"):
        check_before_launch(_launch(draft), ModelSpec(path=str(target)))


def test_the_launch_command_speculates_with_sglangs_flags(tmp_path: Path) -> None:
    from eagle3_datagen.sglang.launch_command import build_launch_command

    cmd = build_launch_command(_launch(tmp_path), MODEL, python="py")
    at = cmd.index("--speculative-algorithm")
    assert cmd[at : at + 10] == [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(tmp_path),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip
    assert cmd[:3] == ["py", "-m", "sglang_emulator"]
    assert "--speculative-algorithm" not in build_launch_command(ServerSpec(), MODEL)
    with pytest.raises(ValueError, match="num_steps \\+ 1 = 4; leave it unset"):
        SpeculativeSpec(draft_model_path="d", num_draft_tokens=8)
    assert SpeculativeSpec(draft_model_path="d", eagle_topk=4, num_draft_tokens=8).draft_tokens == 8


async def test_a_launched_emulator_speculates_from_the_config(tmp_path: Path) -> None:
    """The launch path: server.speculative becomes SGLang's flags, the server reports them."""
    import logging

    from eagle3_datagen.config import parse_config
    from eagle3_datagen.sglang.session import open_server
    from tests.support.pipeline import base_config
    from tests.support.prompts import write_prompts

    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    draft = tmp_path / "draft"
    draft.mkdir()
    data = base_config(tmp_path, prompts, speculative={"draft_model_path": str(draft)})
    config = parse_config(data)
    async with open_server(config, run_key="r", logger=logging.getLogger("t")) as session:
        args = session.facts.server_args
        assert session.display_cmd is not None and "--speculative-num-draft-tokens 4" in (
            session.display_cmd
        )
    assert (args["speculative_algorithm"], args["speculative_num_steps"]) == ("EAGLE3", 3)
    assert args["speculative_draft_model_path"] == str(draft)
    missing = parse_config(
        base_config(tmp_path, prompts, speculative={"draft_model_path": str(tmp_path / "gone")})
    )
    with pytest.raises(PreflightError, match="no such directory"):
        async with open_server(missing, run_key="r2", logger=logging.getLogger("t")):
            pass
    assert not list((tmp_path / "out" / "logs").glob("server-*.log"))[1:]  # no second launch

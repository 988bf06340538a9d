"""The emulator as a process with ``--emu-model-backend transformers``: real HTTP, a real tiny
Llama target and an untrained EAGLE-3 draft built with speculators' own class. At temperature 0
the speculating server returns the plain server's ids, with SGLang's spec fields; a draft
directory that does not exist stops the server with a one-line reason. Needs torch,
transformers and speculators (the trainer venv; see test_model_backend.py for the command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("speculators")

from tests.lab.tiny import tiny_llama_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "src/eagle3_datagen/assets/kimi-k2.5-mini"
PROMPT = [672, 82, 88, 265, 68, 76, 679, 406, 523, 220, 42, 72, 76, 664, 666, 413, 587, 679, 684]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from speculators.models.eagle3 import Eagle3DraftModel

    torch.manual_seed(0)
    target = tmp_path_factory.mktemp("target")
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER, trust_remote_code=True)
    config = tiny_llama_config(
        len(tok),
        1024,
        tie_word_embeddings=False,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    draft = tmp_path_factory.mktemp("draft")
    config._attn_implementation = "sdpa"
    Eagle3DraftModel.from_training_args(
        config,
        verifier_name_or_path=str(target),
        draft_vocab_size=len(tok),
        norm_before_residual=True,
        ttt_steps=3,
        target_layer_ids=[1, 2, 3],
        draft_attn_impl="sdpa",
    ).save_pretrained(draft)
    return target, draft


def _start(target: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "sglang_emulator",
        "--model-path",
        str(target),
        "--port",
        str(port),
        "--emu-model-backend",
        "transformers",
        "--random-seed",
        "0",
        *flags,
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    # importing torch and speculators took over a minute on a loaded 2-core machine
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc, url
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.25)
    proc.kill()
    raise AssertionError("the emulator did not start")


def _generate(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return dict(json.loads(r.read()))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


SPEC = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)


def test_speculating_server_returns_the_plain_ids_with_spec_fields(
    models: tuple[Path, Path],
) -> None:
    target, draft = models
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 40},
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 3,
    }
    plain, url = _start(target)
    try:
        expected = _generate(url, body)
    finally:
        _stop(plain)
    assert "spec_verify_ct" not in expected["meta_info"]
    spec, url = _start(target, *SPEC, "--speculative-draft-model-path", str(draft))
    try:
        got = _generate(url, body)
        with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
            info = json.loads(r.read())
    finally:
        _stop(spec)
    assert got["output_ids"] == expected["output_ids"]
    meta = got["meta_info"]
    n = meta["completion_tokens"]
    assert n == len(got["output_ids"]) > 1
    hist = meta["spec_correct_drafts_histogram"]
    assert sum(hist) == meta["spec_verify_ct"]
    assert sum(i * c for i, c in enumerate(hist)) == meta["spec_num_correct_drafts"]
    assert meta["spec_num_proposed_drafts"] == 3 * meta["spec_verify_ct"]
    assert meta["spec_accept_length"] == n / meta["spec_verify_ct"]
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    # the target's own logprobs, the same with speculation as without (SGLang's shapes)
    want, lps = expected["meta_info"], meta["output_token_logprobs"]
    assert [t for _, t, _ in lps] == got["output_ids"] and meta["input_token_logprobs"] == []
    for (lp, t, _), top, ref in zip(
        lps, meta["output_top_logprobs"], want["output_token_logprobs"], strict=True
    ):
        assert len(top) == 3 and top[0][:2] == [lp, t] and lp <= 0.0  # greedy: the argmax
        assert lp == pytest.approx(ref[0], abs=1e-4)


def test_missing_draft_directory_is_a_one_line_error(models: tuple[Path, Path]) -> None:
    target, _ = models
    proc, _ = _start(target, *SPEC, "--speculative-draft-model-path", "/nonexistent/draft")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "--speculative-draft-model-path /nonexistent/draft: not a readable directory" in out
    assert "Traceback" not in out


def test_requests_in_flight_are_served_together_with_their_own_ids(
    models: tuple[Path, Path],
) -> None:
    """Several prompts sent at once (one padded batch in the backend) get the ids and the
    finish each gets alone; /generate keeps answering while a batch runs."""
    from concurrent.futures import ThreadPoolExecutor

    target, _ = models
    prompts = [PROMPT, PROMPT[:7], PROMPT[5:] + PROMPT[:3], [PROMPT[0]]]
    bodies = [
        {"input_ids": p, "sampling_params": {"temperature": 0, "max_new_tokens": 12 + 5 * i}}
        for i, p in enumerate(prompts)
    ]
    proc, url = _start(target, "--max-running-requests", "4")
    try:
        alone = [_generate(url, b) for b in bodies]
        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(lambda b: _generate(url, b), bodies))
    finally:
        _stop(proc)
    for a, t in zip(alone, together, strict=True):
        assert t["output_ids"] == a["output_ids"]
        assert t["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        assert t["meta_info"]["completion_tokens"] == len(t["output_ids"]) > 0

"""The real lab's replayed accept length (trainers/lab/replay.py) against the emulator's live
speculating loop: on a real tiny Llama and EAGLE-3 drafts of speculators' own class, the
replay's (tokens, verify steps) per prompt equal the live loop's, for a draft that proposes from
the features and tokens it is given (on a random target none is accepted) and for one that always
proposes the same token (some are). That a trained draft's chain lines up with the live one is
checked by every real lab run on its live sample (real_measure.py: replay_disagreements). Needs
the trainer venv (tests/lab/test_model_backend.py has the command).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("speculators")

from sglang_emulator.sampling import Sampling  # noqa: E402
from sglang_emulator_transformers import (  # noqa: E402
    Eagle3Chain,
    ModelGenerator,
    TransformersTarget,
)
from tests.lab.test_model_backend_http import PROMPT, models  # noqa: E402, F401
from tests.lab.test_speculation_reference import fixed_draft  # noqa: E402, F401

GREEDY = Sampling(temperature=0.0, top_k=1)
LIMIT = 48


def _replay() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "trainers" / "lab" / "replay.py"
    spec = importlib.util.spec_from_file_location("lab_replay", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def decisive_draft(
    models: tuple[Path, Path],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The untrained draft with its head scaled up: its proposals still come from the features
    and tokens it reads, with no near ties that float rounding could flip."""
    from speculators.models.eagle3 import Eagle3DraftModel

    _, draft = models
    model = Eagle3DraftModel.from_pretrained(str(draft), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    out = tmp_path_factory.mktemp("decisive-draft")
    model.save_pretrained(out)
    return out


def prompts() -> list[list[int]]:
    return [PROMPT, PROMPT[:7], PROMPT[3:] + PROMPT[:5], [PROMPT[-1]] * 4 + PROMPT[2:9]]


@pytest.mark.parametrize("which", ["decisive", "fixed"])
def test_replayed_counts_equal_the_live_loops(
    which: str,
    models: tuple[Path, Path],  # noqa: F811
    decisive_draft: Path,
    fixed_draft: Path,  # noqa: F811
) -> None:
    replay = _replay()
    target_dir, _ = models
    draft_dir = decisive_draft if which == "decisive" else fixed_draft
    target = TransformersTarget(target_dir)
    eos = transformers.AutoConfig.from_pretrained(target_dir).eos_token_id
    stops = frozenset({eos})
    plain = ModelGenerator(target, None, 0)
    live = ModelGenerator(target, Eagle3Chain(draft_dir, target), 3)
    draft = replay.load_draft(draft_dir)
    accepted = 0
    for prompt in prompts():
        output, _ = plain.generate(prompt, GREEDY, 0, LIMIT, stops)
        ids, counters = live.generate(prompt, GREEDY, 0, LIMIT, stops)
        assert ids == output
        assert counters is not None
        ref = replay.reference(target.model, target.aux_layers, prompt, output)
        assert ref.greedy_breaks == 0
        got = replay.walk(ref, replay.chains(draft, ref, 3))
        assert got == (len(ids), counters.verify_ct), prompt
        accepted += counters.num_correct_drafts
    if which == "fixed":  # its token is the target's likeliest second one: some are accepted
        assert accepted > 0, "no draft token accepted: the walk's accepting branch went untested"

"""The real lab's hidden-state cache (trainers/hidden_states.py, LAB_HS_CACHE): a subset's
preparation gets, from the cache, exactly the tensors a fresh forward of the target gives its
rows, and only rows the cache lacks run the target. Needs torch, transformers, datasets and
speculators (the trainer venv; see test_model_backend.py for the command).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("speculators")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tests.lab.tiny import tiny_llama_config  # noqa: E402

ROWS = [[5, 9, 11, 3, 7], [2, 4, 6, 8], [13, 1, 12, 40, 41, 42], [5, 9, 11, 3, 7, 8]]


def _hidden_states() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "trainers" / "hidden_states.py"
    spec = importlib.util.spec_from_file_location("lab_hidden_states", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path: Path = tmp_path_factory.mktemp("target")
    transformers.LlamaForCausalLM(tiny_llama_config(64, 128)).save_pretrained(path)
    return path


def _prepared(where: Path, rows: list[list[int]]) -> Path:
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(where))
    return where


def _tensors(prepared: Path, i: int) -> dict:
    return safetensors_torch.load_file(str(prepared / "hidden_states" / f"hs_{i}.safetensors"))


def test_a_subset_reads_the_full_sets_rows_from_the_cache(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    hs = _hidden_states()
    fresh = _prepared(tmp_path / "fresh", ROWS[2:3] + ROWS[0:1])
    hs.speculators(str(target), str(fresh))  # no LAB_HS_CACHE: every row runs the target
    assert "(0 from the cache)" in capsys.readouterr().out

    monkeypatch.setenv("LAB_HS_CACHE", str(tmp_path / "cache"))
    hs.speculators(str(target), str(_prepared(tmp_path / "full", ROWS)))
    assert "(0 from the cache)" in capsys.readouterr().out
    subset = _prepared(tmp_path / "subset", ROWS[2:3] + ROWS[0:1])
    hs.speculators(str(target), str(subset))
    assert "(2 from the cache)" in capsys.readouterr().out
    for i in range(2):
        got, want = _tensors(subset, i), _tensors(fresh, i)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key

    # A row the cache lacks (a prefix of a cached row is another sequence) runs the target.
    hs.speculators(str(target), str(_prepared(tmp_path / "new", [ROWS[3][:4], ROWS[1]])))
    assert "(1 from the cache)" in capsys.readouterr().out

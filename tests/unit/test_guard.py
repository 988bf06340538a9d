"""The output guard: data of two fingerprints never mixes, and --overwrite deletes only its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_datagen.errors import OutputConflictError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.guard import guard_output
from eagle3_datagen.write.shards import PartitionOutput
from tests.support import TOKENIZER_DIR
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(str(TOKENIZER_DIR))


def _fingerprint(tok: ChatTokenizer, temperature: float) -> dict:
    """The fingerprint of a two-partition run (p1, p2) sampled at ``temperature``."""
    config = make_config(("p1", "p2"))
    config.sampling.temperature = temperature
    return make_fingerprint(config, tok)


def _dataset(root: Path, tok: ChatTokenizer, temperature: float = 1.0) -> dict:
    fp = _fingerprint(tok, temperature)
    t = Tok(tok)
    write_dataset(
        root,
        fp,
        {name: [Batch(records=[t.record(f"{name}-1", name)])] for name in ("p1", "p2")},
    )
    return fp


@pytest.fixture
def changed_fp(tmp_path: Path, tok: ChatTokenizer) -> dict:
    """p1 and p2 written at temperature 1.0; the fingerprint of the same run at 0.5."""
    _dataset(tmp_path, tok, temperature=1.0)
    return _fingerprint(tok, 0.5)


def test_same_settings_pass(tmp_path: Path, tok: ChatTokenizer) -> None:
    fp = _dataset(tmp_path, tok)
    assert guard_output(tmp_path, fp, ["p1", "p2"]) is None


def test_other_settings_refused_naming_the_change(tmp_path: Path, changed_fp: dict) -> None:
    with pytest.raises(OutputConflictError, match=r"sampling\.temperature"):
        guard_output(tmp_path, changed_fp, ["p1"])
    # Refusing deletes nothing.
    assert PartitionOutput(tmp_path, "p1").shard_paths()
    assert PartitionOutput(tmp_path, "p2").shard_paths()


def test_overwrite_deletes_only_the_partitions_this_run_runs(
    tmp_path: Path, changed_fp: dict
) -> None:
    """A fan-out job for p1 must never delete p2, which another job may be writing."""
    said = guard_output(tmp_path, changed_fp, ["p1"], overwrite=True)
    assert said is not None and "p1" in said and "p2" not in said
    assert not PartitionOutput(tmp_path, "p1").shard_paths()
    assert PartitionOutput(tmp_path, "p2").shard_paths()


def test_stale_shards_refused_even_when_the_manifest_agrees(
    tmp_path: Path, tok: ChatTokenizer, changed_fp: dict
) -> None:
    """Job A already wrote the new manifest; job B's partition still holds old shards."""
    t = Tok(tok)
    write_dataset(tmp_path, changed_fp, {"p1": [Batch(records=[t.record("p1-1", "p1")])]})
    with pytest.raises(OutputConflictError, match="p2: shards written under other settings"):
        guard_output(tmp_path, changed_fp, ["p2"])
    said = guard_output(tmp_path, changed_fp, ["p2"], overwrite=True)
    assert said is not None and "p2" in said
    assert not PartitionOutput(tmp_path, "p2").shard_paths()
    assert PartitionOutput(tmp_path, "p1").shard_paths()

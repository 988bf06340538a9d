"""The held-out split: grouped by conversation, the same for the export and eval, and clean of
repeated prompts (checked on the rows the export wrote, read back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.dataset_dir import DatasetDir
from eagle3_datagen.write.export import ExportOptions, export_dataset
from eagle3_datagen.write.export_plan import committed_shards, held_out, scan
from eagle3_datagen.write.heldout import Conversation, in_validation, prompt_keys, split
from eagle3_datagen.write.split_file import choose_split
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset

FRACTION, SEED = 0.4, 3


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def test_prompt_keys_follow_the_ids_and_the_images_of_a_sliced_column() -> None:
    col = pa.array([[1, 2], [1, 2], [1, 2, 3], [], [1, 2]], pa.list_(pa.int32()))
    images = [[], [], [], [], ["abc"]]
    keys = prompt_keys(col, images)
    assert keys[0] == keys[1] and len(set(keys)) == 4  # an image makes another prompt
    sliced = col.slice(2, 3)  # offsets into a shared buffer
    assert prompt_keys(sliced, images[2:]) == keys[2:]


def test_a_held_out_conversation_repeating_a_training_prompt_moves_to_train() -> None:
    convs = [Conversation("p", f"c{i}", bytes([i % 5])) for i in range(40)]
    held = split(convs, FRACTION, SEED)
    hashed = {(c.partition, c.conversation) for c in convs if in_validation(*_k(c), FRACTION, SEED)}
    assert set(held.moved) <= hashed and held.moved  # only held-out ones move
    trained = {c.prompt for c in convs if held.side(*_k(c)) == "train"}
    held_prompts = {c.prompt for c in convs if held.side(*_k(c)) == "validation"}
    assert not trained & held_prompts
    assert held.validation_conversations == len(hashed) - held.duplicates_moved
    # Without repeats nothing moves: the split is the hash alone, as before.
    unique = split([Conversation("p", f"c{i}", bytes([i])) for i in range(40)], FRACTION, SEED)
    assert not unique.moved and unique.validation_conversations == len(hashed)


def _k(c: Conversation) -> tuple[str, str]:
    return (c.partition, c.conversation)


@pytest.fixture
def repeated(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> Path:
    """30 conversations of two turns over two partitions; every third repeats conversation 0's
    first prompt, across partitions too (the demo repeats prompts under other ids)."""
    tk = Tok(chat_tokenizer)
    parts: dict[str, list[Any]] = {"p1": [], "p2": []}
    for c in range(30):
        first = tk.prompt() if c % 3 == 0 else [*tk.prompt(), 60 + c]
        for t in range(2):
            prompt = first if t == 0 else [*first, 99, 98]
            rec = tk.record(
                f"c{c}#t{t}", f"p{1 + c % 2}", line=c + 1, conversation_id=f"c{c}", turn=t
            )
            rec.prompt_ids = prompt
            parts[rec.partition].append(rec)
    root = tmp_path / "data"
    fp = make_fingerprint(make_config(), chat_tokenizer)
    write_dataset(root, fp, {p: [Batch(recs)] for p, recs in parts.items()})
    return root


def test_the_exports_validation_rows_repeat_no_training_prompt(repeated: Path, tmp_path: Path):
    out = tmp_path / "spec.jsonl"
    result = export_dataset(
        repeated, "speculators", out, options=ExportOptions(validation=FRACTION, split_seed=SEED)
    )
    train, val = read_jsonl(out), read_jsonl(tmp_path / "spec.validation.jsonl")
    assert train and val

    def first(rows: list[dict[str, Any]]) -> set[tuple[int, ...]]:
        """The first turns' prompts (the ids before the loss mask starts)."""
        ids = (r["input_ids"][: r["loss_mask"].index(1)] for r in rows if r["id"].endswith("#t0"))
        return {tuple(x) for x in ids}

    assert not first(train) & first(val)
    convs = {side: {r["primary_id"] for r in rows} for side, rows in (("t", train), ("v", val))}
    assert not convs["t"] & convs["v"]
    # The hash alone would have held out some of the repeats: they were moved and counted.
    hashed = {f"c{c}" for c in range(0, 30, 3) if in_validation(f"p{1 + c % 2}", f"c{c}", 0.4, 3)}
    assert hashed and not hashed & convs["v"]
    split_meta = result.metadata["split"]
    assert split_meta["duplicates_moved_to_train"] == len(hashed)
    assert split_meta["validation_conversations"] == len(convs["v"])
    assert f"repeated prompts: {len(hashed)} held-out conversations moved" in "\n".join(
        result.report()
    )


def test_eval_and_the_export_hold_out_the_same_conversations(repeated: Path, tmp_path: Path):
    """The split is computed over every record: an export's options never change it."""
    ds = DatasetDir(repeated)
    choice = choose_split(repeated, FRACTION, SEED)
    held = held_out(list(scan(committed_shards(ds), prompts=True)), choice)
    out = tmp_path / "sf.jsonl"
    opts = ExportOptions(validation=FRACTION, split_seed=SEED, truncated="drop")
    export_dataset(repeated, "speculators", out, options=opts)
    exported = {r["primary_id"] for r in read_jsonl(tmp_path / "sf.validation.jsonl")}
    assert exported == {c for (_, c), side in held.sides.items() if side == "validation"}


def test_a_grown_split_keeps_its_held_out_conversations() -> None:
    """What split.json recorded stays: earlier held-out conversations are held out again (even
    where the hash of another fraction would say train), moved ones stay in train, and a new
    conversation repeating a held-out prompt is held out with it."""
    convs = [Conversation("p", f"c{i}", bytes([i])) for i in range(40)]
    first = split(convs, FRACTION, SEED)
    held_before = set(first.held_out_keys())
    repeat_of = next(c for c in convs if ("p", c.conversation) in held_before)
    later = [
        *convs,
        *(Conversation("p", f"n{i}", bytes([100 + i])) for i in range(40)),
        Conversation("p", "again", repeat_of.prompt),
    ]
    grown = split(later, 0.01, SEED, held_before, first.moved)  # another fraction: ignored
    assert held_before <= set(grown.held_out_keys())
    assert grown.kept == len(held_before)
    assert grown.side("p", "again") == "validation" and grown.joined == [("p", "again")]
    new = {("p", f"n{i}") for i in range(40) if in_validation("p", f"n{i}", 0.01, SEED)}
    assert set(grown.held_out_keys()) == held_before | new | {("p", "again")}

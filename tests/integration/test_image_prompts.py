"""Image prompts end to end against a real emulator process: parse, render, ``image_data``,
the server's expansion, the stored record read back from Parquet.

The oracle for an image's token count is SGLang 0.5.23's own ``navit_resize_config``, recorded
in ``tests/fixtures/kimi-images/sglang-0.5.23.json`` for the processor config the bundled
stand-in model ships (the same ``media_proc_cfg``); the server's side is the emulator's own copy
of that arithmetic, reported in its ledger's ``prompt_tokens``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.report.data_picture import partition_picture, picture_markdown
from eagle3_datagen.report.dataset_card import card_text
from eagle3_datagen.validate.dataset import check_record
from eagle3_datagen.write.export import export_dataset
from eagle3_datagen.write.records import Record
from tests.support import REPO, TOKENIZER_DIR
from tests.support.dataset import Batch, make_fingerprint, write_dataset
from tests.support.emulator import read_ledger
from tests.support.pipeline import run_batches

pytestmark = pytest.mark.tokens

FIXTURES = REPO / "tests" / "fixtures" / "kimi-images"
SGLANG_COUNTS = {
    (c["width"], c["height"]): c["num_tokens"]
    for c in json.loads((FIXTURES / "sglang-0.5.23.json").read_text())["counts"]
}
# Sizes SGLang's answer was recorded for: a small one, one scaled down to the patch limits, one
# over the per-image patch budget.
SIZES = [(57, 29), (223, 1000), (796, 694)]


def _image(path: Path, size: tuple[int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10 * size[0] % 255, 40, 200)).save(out, format=fmt)
    path.write_bytes(out.getvalue())
    return out.getvalue()


def _pad_id() -> int:
    return int(
        json.loads((TOKENIZER_DIR / "config.json").read_text())["media_placeholder_token_id"]
    )


def _expected(prompt_ids: list[int], counts: list[int]) -> list[int]:
    """The prompt with the i-th placeholder repeated counts[i] times, written out here."""
    pad, it, out = _pad_id(), iter(counts), []
    for token in prompt_ids:
        out.extend([token] * next(it) if token == pad else [token])
    return out


def _config(tmp_path: Path, prompts: Path, **partition: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "sampling": {"seed": 3},
            "tiers": [{"name": "T", "concurrency": 4, "max_tokens": 1024}],
            "partitions": [{"name": "p", "input": str(prompts), "tier": "T", **partition}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 8,
        }
    )


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


async def test_image_lines_become_records_with_the_ids_the_model_saw(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """Image lines of every kind run through the pipeline; each record's ids, image columns,
    export and data picture are checked. One scenario read top to bottom, hence its length."""
    (tmp_path / "img").mkdir()
    a = _image(tmp_path / "img" / "a.png", SIZES[0])
    b = _image(tmp_path / "img" / "b b.jpg", SIZES[1], "JPEG")
    c = _image(tmp_path / "c.webp", SIZES[2], "WEBP")
    uri = "data:image/webp;base64," + base64.b64encode(c).decode()
    rows = [
        {"id": "one", "messages": [_user(_text("What is this?"), _img("img/a.png"))]},
        {
            "id": "three",
            "messages": [
                _user(
                    _img((tmp_path / "img" / "b b.jpg").as_uri()),
                    _text("and"),
                    _img(uri),
                    _img("img/a.png"),
                )
            ],
        },
        {"id": "text", "messages": [{"role": "user", "content": "No image here."}]},
    ]
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(ledger=ledger).wait_ready()
    config = _config(tmp_path, prompts)
    out = await run_batches(config, emu.url)

    assert not list(out.rejects_dir.glob("*.parquet"))
    table = pq.read_table(out.shard_paths())
    records = {r["id"]: r for r in table.to_pylist()}
    served = {e["rid"]: e for e in read_ledger(ledger)}
    pad = _pad_id()

    one, three, text = records["one"], records["three"], records["text"]
    assert one["prompt_ids"].count(pad) == 1 and three["prompt_ids"].count(pad) == 3
    counts_one = [SGLANG_COUNTS[SIZES[0]]]
    counts_three = [SGLANG_COUNTS[SIZES[1]], SGLANG_COUNTS[SIZES[2]], SGLANG_COUNTS[SIZES[0]]]
    assert one["model_prompt_ids"] == _expected(one["prompt_ids"], counts_one)
    assert three["model_prompt_ids"] == _expected(three["prompt_ids"], counts_three)
    for rec in (one, three):
        assert rec["prompt_tokens"] == len(rec["model_prompt_ids"])
        assert served[rec["rid"]]["prompt_tokens"] == rec["prompt_tokens"]  # the server's count
        assert served[rec["rid"]]["output_ids"] == rec["output_ids"]  # untouched
    assert [
        (i["ref"], i["width"], i["height"], i["format"], i["tokens"], i["sha256"])
        for i in three["images"]
    ] == [
        (
            (tmp_path / "img" / "b b.jpg").as_uri(),
            *SIZES[1],
            "JPEG",
            counts_three[0],
            hashlib.sha256(b).hexdigest(),
        ),
        (
            "data:image/webp;base64",
            *SIZES[2],
            "WEBP",
            counts_three[1],
            hashlib.sha256(c).hexdigest(),
        ),
        ("img/a.png", *SIZES[0], "PNG", counts_three[2], hashlib.sha256(a).hexdigest()),
    ]
    assert text["images"] is None and text["model_prompt_ids"] is None
    assert text["prompt_tokens"] == len(text["prompt_ids"])
    assert table.schema.field("images").type.value_type.field("tokens").type == pa.int32()

    # Reading the dataset back (``validate``) holds image records to the ids the model saw.
    ids = TokenIds.resolve(ChatTokenizer(str(TOKENIZER_DIR)), config.special_tokens)
    for rec in records.values():
        assert check_record(rec, "p", ids, config.validation).accepted, rec["id"]
    short = {**three, "model_prompt_ids": three["model_prompt_ids"][1:]}
    assert {c for c, _ in check_record(short, "p", ids, config.validation).reasons} == {
        "image_tokens",
        "prompt_token_mismatch",
    }

    # The same records as a finished dataset: exports leave the image records out and say so;
    # the data picture and the card count them.
    root = tmp_path / "dataset"
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    stored = [Record(**r) for r in table.to_pylist()]
    manifest = write_dataset(root, make_fingerprint(config, tok), {"p": [Batch(stored)]})
    for fmt in ("specforge", "speculators"):
        result = export_dataset(root, fmt, tmp_path / f"{fmt}.jsonl")
        assert result.total == 1, fmt  # only the text record
        assert result.metadata["images"]["left_out"] == 2
        assert sorted(result.metadata["image_ids"]) == ["p/one", "p/three"]
        assert any("2 image records are left out" in line for line in result.report())
    picture = partition_picture(root, "p")
    assert (picture.image_records, picture.images) == (2, 4)
    assert picture.image_tokens == sum(counts_one) + sum(counts_three)
    line = f"**2** records with images (4 images, {picture.image_tokens} image tokens"
    assert line in picture_markdown(picture)
    assert line in card_text(root, manifest, [picture])


async def test_bad_images_are_rejected_per_line_before_the_server(
    tmp_path: Path, emulator_factory: Any
) -> None:
    _image(tmp_path / "ok.png", SIZES[0])
    (tmp_path / "garbage.png").write_text("not a picture")
    _image(tmp_path / "pic.bmp", (8, 8), "BMP")
    bad = [
        "missing.png",
        "garbage.png",
        "pic.bmp",
        "data:image/png;base64,@@",
        "https://x.io/a.png",
    ]
    rows = [{"id": "good", "messages": [_user(_img("ok.png"))]}]
    rows += [
        {"id": f"bad{i}", "messages": [_user(_text("see"), _img(u))]} for i, u in enumerate(bad)
    ]
    rows.append({"id": "nourl", "messages": [_user({"type": "image_url", "image_url": {}})]})
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(ledger=ledger).wait_ready()
    out = await run_batches(_config(tmp_path, prompts), emu.url)

    rejects = pq.read_table(list(out.rejects_dir.glob("*.parquet"))).to_pylist()
    by_line = {r["source_line"]: r for r in rejects}
    assert sorted(by_line) == list(range(2, 2 + len(bad) + 1))
    reasons = [by_line[line]["reason"] for line in sorted(by_line)]
    expected = [
        "image not found",
        "unreadable image",
        "unsupported image format BMP",
        "not valid base64",
        "remote image URLs are not fetched",
        "image part without a URL",
    ]
    for line, (reason, want) in enumerate(zip(reasons, expected, strict=True), start=2):
        assert reason.startswith(f"{prompts}:{line}: messages[0].content["), reason
        assert want in reason
    assert {r["reason_code"] for r in rejects} == {"bad_input"}
    assert len(read_ledger(ledger)) == 1  # only the good line reached the server


def test_emulator_refuses_placeholders_and_images_that_do_not_pair(emulator_factory: Any) -> None:
    """SGLang's check and message (kimi_k25.py:574-578), over HTTP."""
    emu = emulator_factory().wait_ready()
    png = io.BytesIO()
    Image.new("RGB", SIZES[0]).save(png, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    pad = _pad_id()
    body = {
        "input_ids": [5, pad, 6, pad],
        "image_data": [uri],
        "sampling_params": {"max_new_tokens": 4},
    }
    r = httpx.post(f"{emu.url}/generate", json=body, timeout=10)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "Kimi image placeholders must map one-to-one to "
            "image data: expected 1, found 2 token(s)"
        }
    }
    ok = emu.generate({**body, "input_ids": [5, pad, 6]})
    assert ok["meta_info"]["prompt_tokens"] == 2 + SGLANG_COUNTS[SIZES[0]]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
async def test_all_turns_and_samples_on_an_image_conversation(
    tmp_path: Path, emulator_factory: Any, fmt: str
) -> None:
    _image(tmp_path / "cat.png", SIZES[0])
    # Content as lists of parts throughout, so that a Parquet column holds it (one type).
    row = {
        "id": "conv",
        "messages": [
            _user(_text("Describe"), _img("cat.png")),
            {"role": "assistant", "content": [_text("A square.")]},
            _user(_text("What colour?")),
            {"role": "assistant", "content": [_text("Blue.")]},
        ],
    }
    # The image arrives in the second turn: the first is a text request with text columns.
    late = {
        "id": "late",
        "messages": [
            _user(_text("Hello")),
            {"role": "assistant", "content": [_text("Hi.")]},
            _user(_text("Describe"), _img("cat.png")),
            {"role": "assistant", "content": [_text("A square.")]},
        ],
    }
    prompts = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        prompts.write_text(json.dumps(row) + "\n" + json.dumps(late) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist([row, late]), prompts)
    ledger = tmp_path / "ledger.jsonl"
    # Outputs well under max_tokens, so no turn is cut and every conversation goes on.
    emu = emulator_factory("--emu-max-output-tokens", "600", ledger=ledger).wait_ready()
    config = _config(tmp_path, prompts, regenerate="all_turns", samples=2)
    out = await run_batches(config, emu.url)

    records = {r["id"]: r for r in pq.read_table(out.shard_paths()).to_pylist()}
    turns = [f"{c}#s{s}#t{t}" for c in ("conv", "late") for s in (0, 1) for t in (0, 1)]
    assert sorted(records) == turns
    served = {e["rid"]: e for e in read_ledger(ledger)}
    for s in (0, 1):
        text_turn = records.pop(f"late#s{s}#t0")
        assert text_turn["images"] is None and text_turn["model_prompt_ids"] is None
        assert _pad_id() not in text_turn["prompt_ids"]
        assert served[text_turn["rid"]]["prompt_tokens"] == len(text_turn["prompt_ids"])
    count = SGLANG_COUNTS[SIZES[0]]
    for rec in records.values():
        assert rec["prompt_ids"].count(_pad_id()) == 1
        assert rec["model_prompt_ids"] == _expected(rec["prompt_ids"], [count])
        assert served[rec["rid"]]["prompt_tokens"] == len(rec["model_prompt_ids"])
        assert [i["tokens"] for i in rec["images"]] == [count]

"""Exports of a finished dataset to the JSONL that draft-model trainers read, following each
trainer's own conventions (checked by running its own loading and shift code: ``trainers/``).

Both formats hold ``input_ids = prompt_ids + output_ids`` from the stored ids (never
re-tokenized). Shards are streamed one at a time; the files appear only when complete (written
to temporary names, then renamed). Beside them: ``<stem>.export.json`` (the export's own
metadata: options, counts, truncated and over-length ids, split), ``<stem>.report.txt`` and
``<stem>.provenance.json`` (what ``eval --train-export`` reads: the dataset, the split, the
rows and the trained conversations); every path in those is relative to the export's own
directory. By default the dataset's held-out split (``write/split_file.py``, ``split.json``)
goes to the validation file and never to the training one; ``hold_out=False`` trains on all.
Which records go where is ``write/export_plan.py``; the rows themselves
``write/export_rows.py``.

- ``specforge``: SpecForge's pre-tokenized prompts file (``data.prompts_path``), one
  ``{"input_ids": [...], "loss_mask": [...]}`` per line (``specforge/data/prompt_builder.py``:
  a file whose first record has both keys is pre-tokenized, never re-rendered). ``loss_mask``
  is 1 on the output tokens *and on the last prompt token*: SpecForge's EAGLE-3 shift
  (``TargetHead.preprocess`` pads the target left by one, the mask stays on the feature
  position) trains the position the mask marks to predict the token two on, so without the last
  prompt token the draft's first proposal after prefill (features of ``<think>`` for Kimi-K2.5
  plus output token 0, predicting output token 1) is never trained. SpecForge's own
  ``kimi-k2-thinking`` template marks that token the same way.
- ``speculators``: the rows of vllm-project/speculators' response regeneration
  (``build_boundary_sample``): ``id``, ``primary_id`` (the conversation key), ``input_ids``,
  ``loss_mask`` (0 on the prompt, 1 on the output: its ``shift_batch`` pairs the mask with the
  predicted token, so the first proposal is already trained) and ``metadata`` with ``idx``,
  ``finish_reason``, ``is_tool_call``, ``usage``, ``endpoint``, ``sampling_params``; we add
  ``partition``, ``truncated``, ``source_line``, ``turn``, ``sample``, ``split`` and the
  dataset's ``content_sha256``. speculators' ``prepare-data`` drops everything but
  ``input_ids`` and ``loss_mask``, which is why the split and the truncated records are decided
  here and recorded in the metadata file.

Both trainers train, per row, the same predictions: each output token as the draft's input
(the first one with the last prompt token's features) predicting the token after it, through
the distribution after the end-of-turn token.

Image records (``images`` not null; docs/images.md) are left out of both formats, counted and
listed in the metadata file: both exports are token ids only (SpecForge's pre-tokenized prompts
file, speculators' ``input_ids``), and neither trainer's path for such rows runs the target
model's vision encoder, so at the image positions the target's hidden states would be those of
the bare placeholder id, not of the image the output was generated for.

Options: truncated records (``finish_reason: length``) are kept, dropped or refused; records
longer than the trainer's maximum (SpecForge ``data.max_length`` 2048, speculators
``--seq-length``/``--total-seq-len`` 8192 by default), which the trainer would clip, are kept
and reported, dropped or refused; ``validation`` holds out whole conversations (every turn and
sample of one input line, keyed by partition and ``conversation_id``) by a seeded hash, so a
conversation never lands on both sides, and moves a held-out conversation whose first prompt a
training one repeats to train (``write/heldout.py``, the split ``eval`` measures on too).

Several turns and samples (``regenerate: all_turns``, ``samples``): every generated turn is its
own row, its prompt the conversation so far as the model saw it, the loss on that turn's output
only, so the loss covers every generated turn once. That is how both trainers take multi-turn
regenerated data: speculators' regeneration writes one row per generation (``<conv>_gen<N>``,
the conversation in ``primary_id``; PR #693), and SpecForge's
``scripts/expand_reasoning_conversations.py`` splits a conversation into one row per assistant
turn (``{id}#turn{k}``) trained with ``train_only_last_turn``. A single row holding several
turns with loss on each would train later turns on a history whose earlier reasoning the
template dropped, which is not what the model saw when it generated them.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import orjson

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard, iter_rows
from eagle3_datagen.write.export_plan import (
    IMAGES_LEFT_OUT,
    POLICIES,
    ExportOptions,
    Plan,
    Policy,
    committed_shards,
    in_validation,
    make_plan,
    present_columns,
    scan,
)
from eagle3_datagen.write.export_provenance import provenance
from eagle3_datagen.write.export_report import (
    TRAINERS,
    length_summary,
    report_lines,
    settings,
    trained_positions,
)
from eagle3_datagen.write.export_rows import (
    COLUMNS,
    boundary_sample,
    specforge_row,
    specforge_sample,
    speculators_row_builder,
)
from eagle3_datagen.write.heldout import SPLIT_KEY
from eagle3_datagen.write.split_file import choose_split, save_split, split_summary

__all__ = [
    "FORMATS",
    "POLICIES",
    "ExportOptions",
    "ExportResult",
    "Policy",
    "boundary_sample",
    "export_dataset",
    "in_validation",
    "sibling",
    "specforge_sample",
]

Format = Literal["specforge", "speculators"]
FORMATS: tuple[str, ...] = get_args(Format)
_LISTED = 1000  # ids listed per kind in the metadata file; counts are always complete


@dataclass(slots=True)
class ExportResult:
    path: Path
    format: str
    validation_path: Path | None = None
    metadata_path: Path | None = None
    report_path: Path | None = None
    written: Counter[str] = field(default_factory=Counter)  # per partition, both files
    skipped_truncated: int = 0
    skipped_over_length: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.written.values())

    def report(self) -> list[str]:
        return report_lines(self.metadata)


def sibling(out: Path, kind: str) -> Path:
    """The file written beside ``out``: validation rows, metadata, report or provenance."""
    names = {
        "validation": f"{out.stem}.validation{out.suffix}",
        "metadata": f"{out.stem}.export.json",
        "provenance": f"{out.stem}.provenance.json",
        "report": f"{out.stem}.report.txt",
    }
    return out.with_name(names[kind])


def _metadata(
    ds: DatasetDir,
    fmt: str,
    opts: ExportOptions,
    max_length: int,
    plan: Plan,
    files: dict[str, Path | None],
    written: Counter[str],
) -> dict[str, Any]:
    """The metadata file's content; its paths are relative to the export's directory (the
    files' names, and the dataset as reached from there)."""
    trainer = TRAINERS[fmt]
    ids = lambda es: [f"{e.partition}/{e.id}" for e in es[:_LISTED]]  # noqa: E731
    here = files["train"].parent.resolve()  # type: ignore[union-attr]
    names = {k: (Path(v.name) if v else None) for k, v in files.items()}
    return {
        "format": fmt,
        "trainer": {
            "name": trainer.name,
            "checked_version": trainer.checked_version,
            "default_max_length": trainer.default_max_length,
        },
        "paths": "relative to the export's directory (where this file is)",
        "dataset": {
            "path": os.path.relpath(ds.root.resolve(), here),
            "content_sha256": ds.content_sha256,
        },
        "files": {k: (str(v) if v else None) for k, v in names.items()},
        "options": {
            "truncated": opts.truncated,
            "over_length": opts.over_length,
            "max_length": max_length,
            "validation": plan.choice.validation if plan.choice else None,
            "split_seed": plan.choice.seed if plan.choice else None,
            "hold_out": opts.hold_out,
            "resplit": opts.resplit,
        },
        "trained_positions": trained_positions(fmt),
        "lengths": length_summary([e.length for e in plan.measured], max_length),
        "counts": {
            "records": plan.records,
            "exported": written["train"] + written["validation"],
            "written": {k: written[k] for k in files if files[k] is not None},
            "truncated": len(plan.truncated),
            "truncated_dropped": plan.dropped_truncated,
            "over_length_dropped": plan.dropped_over_length,
            "images_left_out": len(plan.images),
        },
        "images": {"left_out": len(plan.images), "reason": IMAGES_LEFT_OUT},
        "image_ids": ids(plan.images),
        "truncated_ids": ids(plan.truncated),
        "over_length_ids": ids(plan.over),
        "split": {
            **(
                split_summary(plan.choice, plan.held)
                if plan.choice and plan.held
                else {"key": SPLIT_KEY, "validation": None, "seed": None}
            ),
            "held_out": plan.held is not None,
            "conversations": plan.conversations,
            "validation_conversations": plan.validation_conversations,
        },
        "settings": settings(fmt, names, max_length, written["train"], written["validation"]),
    }


def _write_rows(
    ds: DatasetDir,
    fmt: str,
    shards: list[Shard],
    sides: dict[tuple[str, str], str],
    handles: dict[str, Any],
    result: ExportResult,
    tokenizer: str | None,
) -> Counter[str]:
    row_fn = specforge_row if fmt == "specforge" else speculators_row_builder(ds, tokenizer)
    per_file: Counter[str] = Counter()
    for shard in shards:
        for row in iter_rows(shard.path, present_columns(shard.path, COLUMNS[fmt])):
            side = sides.get((shard.partition, row["id"]))
            if side is None:
                continue
            row["_split"] = side
            handles[side].write(orjson.dumps(row_fn(row), option=orjson.OPT_APPEND_NEWLINE))
            result.written[shard.partition] += 1
            per_file[side] += 1
    return per_file


def export_dataset(
    root: str | Path,
    fmt: str,
    output_path: str | Path,
    *,
    options: ExportOptions | None = None,
    skip_truncated: bool = False,
    tokenizer: str | None = None,
) -> ExportResult:
    """Write the dataset at ``root`` as ``fmt`` JSONL to ``output_path`` (and the validation
    rows, the metadata and the report beside it). ``skip_truncated`` is ``truncated="drop"``;
    ``tokenizer`` overrides the recorded tokenizer path (speculators' ``is_tool_call``)."""
    if fmt not in FORMATS:
        raise DatasetError(f"unknown export format {fmt!r}; choose one of {list(FORMATS)}")
    opts = options or ExportOptions(truncated="drop" if skip_truncated else "keep")
    max_length = opts.max_length or TRAINERS[fmt].default_max_length
    ds = DatasetDir(root)
    choice = (
        choose_split(ds.root, opts.validation, opts.split_seed, resplit=opts.resplit)
        if opts.hold_out
        else None
    )
    shards = committed_shards(ds)
    plan = make_plan(list(scan(shards, prompts=opts.hold_out)), opts, max_length, choice)
    out = Path(output_path)
    files: dict[str, Path | None] = {
        "train": out,
        "validation": sibling(out, "validation") if opts.hold_out else None,
    }
    result = ExportResult(
        out, fmt, files["validation"], sibling(out, "metadata"), sibling(out, "report")
    )
    result.skipped_truncated = plan.dropped_truncated
    result.skipped_over_length = plan.dropped_over_length
    targets = {k: v for k, v in files.items() if v is not None}
    tmps = {k: v.with_name(f".{v.name}.tmp-{os.getpid()}") for k, v in targets.items()}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        per_file = _write_files(ds, fmt, shards, plan, tmps, result, tokenizer)
        result.metadata = _metadata(ds, fmt, opts, max_length, plan, files, per_file)
        meta_tmp = sibling(tmps["train"], "metadata")
        meta_tmp.write_bytes(orjson.dumps(result.metadata, option=orjson.OPT_INDENT_2))
        report_tmp = sibling(tmps["train"], "report")
        report_tmp.write_text("\n".join(result.report()) + "\n")
        prov_tmp = sibling(tmps["train"], "provenance")
        prov_tmp.write_bytes(
            orjson.dumps(provenance(ds, plan, per_file, out), option=orjson.OPT_INDENT_2)
        )
        if choice is not None and plan.held is not None:
            save_split(ds.root, choice, plan.held)
        for k, p in tmps.items():
            os.replace(p, targets[k])
        os.replace(meta_tmp, result.metadata_path)  # type: ignore[arg-type]
        os.replace(report_tmp, result.report_path)  # type: ignore[arg-type]
        os.replace(prov_tmp, sibling(out, "provenance"))
    except OSError as err:
        _cleanup(tmps)
        raise DatasetError(f"{out}: cannot write: {err.strerror or err}") from None
    except BaseException:
        _cleanup(tmps)
        raise
    return result


def _write_files(
    ds: DatasetDir,
    fmt: str,
    shards: list[Shard],
    plan: Plan,
    tmps: dict[str, Path],
    result: ExportResult,
    tokenizer: str | None,
) -> Counter[str]:
    """The rows into the temporary files, synced before they are renamed into place."""
    handles = {k: open(p, "wb") for k, p in tmps.items()}  # noqa: SIM115
    try:
        per_file = _write_rows(ds, fmt, shards, plan.sides, handles, result, tokenizer)
        for fh in handles.values():
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        for fh in handles.values():
            fh.close()
    return per_file


def _cleanup(tmps: dict[str, Path]) -> None:
    for p in tmps.values():
        p.unlink(missing_ok=True)
    train = tmps.get("train")
    if train is not None:
        sibling(train, "metadata").unlink(missing_ok=True)
        sibling(train, "report").unlink(missing_ok=True)
        sibling(train, "provenance").unlink(missing_ok=True)

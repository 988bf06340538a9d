"""Exports of a finished dataset to the JSONL that draft-model trainers read, following each
trainer's own conventions (checked by running its own loading and shift code: ``trainers/``).

Both formats hold ``input_ids = prompt_ids + output_ids`` from the stored ids (never
re-tokenized). Shards are streamed one at a time; the files appear only when complete (written
to temporary names, then renamed). Beside them: ``<stem>.export.json`` (the export's own
metadata: options, counts, truncated and over-length ids, split) and ``<stem>.report.txt``.

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
conversation never lands on both sides and stays on its side as the dataset grows.

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

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard, iter_rows
from eagle3_datagen.write.export_report import TRAINERS, length_summary, report_lines, settings

Format = Literal["specforge", "speculators"]
FORMATS: tuple[str, ...] = get_args(Format)
Policy = Literal["keep", "drop", "refuse"]
POLICIES: tuple[str, ...] = get_args(Policy)
Row = dict[str, Any]

_COLUMNS: dict[str, tuple[str, ...]] = {
    "specforge": ("id", "partition", "prompt_ids", "output_ids", "truncated"),
    "speculators": (
        "id",
        "partition",
        "prompt_ids",
        "output_ids",
        "finish_reason",
        "truncated",
        "prompt_tokens",
        "completion_tokens",
        "source_line",
        "conversation_id",
        "turn",
        "sample",
        "sampling",
    ),
}
_LISTED = 1000  # ids listed per kind in the metadata file; counts are always complete


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """What to do with truncated and over-long records, and the validation split."""

    truncated: Policy = "keep"
    over_length: Policy = "keep"
    max_length: int | None = None  # None: the trainer's default
    validation: float = 0.0  # fraction of conversations held out
    split_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("truncated", "over_length"):
            if getattr(self, name) not in POLICIES:
                raise DatasetError(f"{name} must be one of {list(POLICIES)}")
        if not 0.0 <= self.validation < 1.0:
            raise DatasetError(f"validation must be in [0, 1), got {self.validation}")
        if self.max_length is not None and self.max_length < 2:
            raise DatasetError(f"max_length must be at least 2, got {self.max_length}")


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


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the export decides on, for one record (read without the token lists' values)."""

    partition: str
    id: str
    conversation: str
    length: int
    truncated: bool
    images: int = 0  # an image record: left out (see the module docstring)


IMAGES_LEFT_OUT = (
    "image records are left out: these exports are token ids only, and the trainer would compute "
    "the target's hidden states on the image placeholder id instead of the image (docs/images.md)"
)


def boundary_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """speculators' convention: loss on exactly the tokens the model generated."""
    return prompt_ids + output_ids, [0] * len(prompt_ids) + [1] * len(output_ids)


def specforge_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """SpecForge's convention: the output tokens and the last prompt token (the feature position
    of the draft's first proposal; see the module docstring)."""
    n = len(prompt_ids)
    return prompt_ids + output_ids, [0] * (n - 1) + [1] * (len(output_ids) + 1)


def in_validation(partition: str, conversation: str, fraction: float, seed: int) -> bool:
    """Whether a conversation is held out: a seeded hash, so it never changes side."""
    if fraction <= 0.0:
        return False
    digest = hashlib.sha256(f"{seed}\0{partition}\0{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _specforge(row: Row) -> Row:
    input_ids, loss_mask = specforge_sample(row["prompt_ids"], row["output_ids"])
    return {"input_ids": input_ids, "loss_mask": loss_mask}


def _speculators(ds: DatasetDir, tokenizer: str | None) -> Callable[[Row], Row]:
    """The row builder, with what every row shares computed once."""
    section_begin: int | None = None
    if ds.special_tokens.tool_calls is not None:  # is_tool_call needs the tokenizer's id
        tools = ds.token_ids(tokenizer).tools
        section_begin = tools.section_begin if tools is not None else None
    args = ds.run.get("server_args") or {}
    endpoint = (
        f"http://{args['host']}:{args['port']}/generate"
        if args.get("host") and args.get("port")
        else None
    )
    sampling = ds.content.get("sampling") or {}
    tiers = ds.content.get("tiers") or {}
    per_partition = {
        name: {**sampling, "max_new_tokens": (tier or {}).get("max_tokens")}
        for name, tier in tiers.items()
    }

    def row_fn(row: Row) -> Row:
        input_ids, loss_mask = boundary_sample(row["prompt_ids"], row["output_ids"])
        part = row["partition"]
        conversation = row.get("conversation_id") or row["id"]
        per_record = {k: v for k, v in (row.get("sampling") or {}).items() if v is not None}
        return {
            "id": f"{part}/{row['id']}",  # ids are unique per partition, not across them
            "primary_id": conversation,  # every turn and sample of one input line
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "metadata": {
                "idx": row["source_line"] - 1,  # 0-based row of the partition's prompts file
                "source_line": row["source_line"],
                "partition": part,
                "finish_reason": row["finish_reason"],
                "truncated": row["truncated"],
                "is_tool_call": section_begin is not None and section_begin in row["output_ids"],
                "usage": {
                    "prompt_tokens": row["prompt_tokens"],
                    "completion_tokens": row["completion_tokens"],
                    "total_tokens": row["prompt_tokens"] + row["completion_tokens"],
                },
                "endpoint": endpoint,
                "turn": row.get("turn", 0),
                "sample": row.get("sample", 0),
                "split": row["_split"],
                "sampling_params": {**per_partition.get(part, sampling), **per_record},
                "content_sha256": ds.content_sha256,
            },
        }

    return row_fn


def _present(path: Path, columns: tuple[str, ...]) -> list[str]:
    """The wanted columns the shard has (shards of older versions lack the turn columns)."""
    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return list(columns)  # iter_rows names the file and the problem
    return [c for c in columns if c in names]


def _committed_shards(ds: DatasetDir) -> list[Shard]:
    """Every committed shard; refuses data of another fingerprint (uncommitted shards are not
    part of the dataset and are left out, as a rerun would replace them)."""
    shards: list[Shard] = []
    for name in ds.partitions():
        committed, _ = ds.shards(name)
        for shard in committed:
            problem = ds.check_fingerprint(shard.path)
            if problem:
                raise DatasetError(f"{problem}; refusing to export (see eagle3-datagen validate)")
        shards.extend(committed)
    return shards


def _scan(shards: list[Shard]) -> Iterator[_Entry]:
    """Every record's id, conversation, length and truncated flag (lengths computed in Arrow,
    the token lists never become Python objects here)."""
    for shard in shards:
        columns = _present(
            shard.path, ("id", "conversation_id", "truncated", "prompt_ids", "output_ids", "images")
        )
        try:
            for batch in pq.ParquetFile(shard.path).iter_batches(columns=columns):
                lengths = pc.add(
                    pc.list_value_length(batch.column("prompt_ids")),
                    pc.list_value_length(batch.column("output_ids")),
                )
                ids = batch.column("id").to_pylist()
                names = batch.schema.names
                convs = (
                    batch.column("conversation_id").to_pylist()
                    if "conversation_id" in names
                    else ids
                )
                images = (
                    pc.list_value_length(batch.column("images")).to_pylist()
                    if "images" in names
                    else [None] * len(ids)
                )
                for i, n, c, t, k in zip(
                    ids,
                    lengths.to_pylist(),
                    convs,
                    batch.column("truncated").to_pylist(),
                    images,
                    strict=True,
                ):
                    yield _Entry(shard.partition, i, c or i, n, bool(t), k or 0)
        except (pa.ArrowException, OSError, KeyError) as err:
            raise DatasetError(f"{shard.path}: cannot read: {err}") from None


def _refuse(what: str, entries: list[_Entry], hint: str) -> DatasetError:
    shown = ", ".join(f"{e.partition}/{e.id}" for e in entries[:5])
    more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
    return DatasetError(f"refusing to export: {len(entries)} {what} ({shown}{more}); {hint}")


def _plan(entries: list[_Entry], opts: ExportOptions, max_length: int) -> dict[str, Any]:
    """Which records go where ("train" / "validation"), or a refusal naming them. Image
    records go nowhere (see the module docstring)."""
    with_images = [e for e in entries if e.images]
    entries = [e for e in entries if not e.images]
    truncated = [e for e in entries if e.truncated]
    over = [e for e in entries if e.length > max_length]
    if opts.truncated == "refuse" and truncated:
        raise _refuse(
            "truncated records (finish_reason length)",
            truncated,
            "pass --truncated keep or --truncated drop",
        )
    if opts.over_length == "refuse" and over:
        longest = max(e.length for e in over)
        raise _refuse(
            f"records longer than the max length {max_length}",
            over,
            f"raise --max-length (the longest is {longest} tokens; the trainer must "
            "get the same value) or pass --over-length keep or drop",
        )
    dropped = set()
    if opts.truncated == "drop":
        dropped |= {(e.partition, e.id) for e in truncated}
    if opts.over_length == "drop":
        dropped |= {(e.partition, e.id) for e in over}
    sides: dict[tuple[str, str], str] = {}
    groups: dict[tuple[str, str], str] = {}
    for e in entries:
        if (e.partition, e.id) in dropped:
            continue
        group = (e.partition, e.conversation)
        if group not in groups:
            held = in_validation(e.partition, e.conversation, opts.validation, opts.split_seed)
            groups[group] = "validation" if held else "train"
        sides[(e.partition, e.id)] = groups[group]
    n_val = sum(1 for side in groups.values() if side == "validation")
    if opts.validation > 0 and not 0 < n_val < len(groups):
        raise DatasetError(
            f"a validation fraction of {opts.validation} put {n_val} of {len(groups)} "
            "conversations in validation; change --validation or --split-seed"
        )
    return {
        "sides": sides,
        "truncated": truncated,
        "over": over,
        "conversations": len(groups),
        "validation_conversations": n_val,
        "dropped_truncated": sum(1 for e in truncated if (e.partition, e.id) in dropped),
        "dropped_over_length": sum(1 for e in over if (e.partition, e.id) in dropped),
        "images": with_images,
    }


def sibling(out: Path, kind: str) -> Path:
    """The file written beside ``out``: validation rows, metadata or report."""
    names = {
        "validation": f"{out.stem}.validation{out.suffix}",
        "metadata": f"{out.stem}.export.json",
        "report": f"{out.stem}.report.txt",
    }
    return out.with_name(names[kind])


def _trained_positions(fmt: str) -> str:
    if TRAINERS[fmt].mask_last_prompt_token:
        return (
            "loss_mask 1 on the last prompt token and every output token (SpecForge's "
            "shift trains the marked feature position to predict two tokens on): every "
            "output token is trained as the draft's input, the first with the last prompt "
            "token's features (the first proposal after prefill)"
        )
    return (
        "loss_mask 1 on every output token (speculators' shift_batch pairs the mask with "
        "the predicted token): every output token is trained as the draft's input, the "
        "first with the last prompt token's features (the first proposal after prefill)"
    )


def _metadata(
    ds: DatasetDir,
    fmt: str,
    opts: ExportOptions,
    max_length: int,
    entries: list[_Entry],
    plan: dict[str, Any],
    files: dict[str, Path | None],
    written: Counter[str],
) -> dict[str, Any]:
    trainer = TRAINERS[fmt]
    ids = lambda es: [f"{e.partition}/{e.id}" for e in es[:_LISTED]]  # noqa: E731
    return {
        "format": fmt,
        "trainer": {
            "name": trainer.name,
            "checked_version": trainer.checked_version,
            "default_max_length": trainer.default_max_length,
        },
        "dataset": {"path": str(ds.root.resolve()), "content_sha256": ds.content_sha256},
        "files": {k: (v.name if v else None) for k, v in files.items()},
        "options": {
            "truncated": opts.truncated,
            "over_length": opts.over_length,
            "max_length": max_length,
            "validation": opts.validation,
            "split_seed": opts.split_seed,
        },
        "trained_positions": _trained_positions(fmt),
        "lengths": length_summary([e.length for e in entries], max_length),
        "counts": {
            "records": len(entries),
            "written": dict(written),
            "truncated": len(plan["truncated"]),
            "truncated_dropped": plan["dropped_truncated"],
            "over_length_dropped": plan["dropped_over_length"],
            "images_left_out": len(plan["images"]),
        },
        "images": {"left_out": len(plan["images"]), "reason": IMAGES_LEFT_OUT},
        "image_ids": ids(plan["images"]),
        "truncated_ids": ids(plan["truncated"]),
        "over_length_ids": ids(plan["over"]),
        "split": {
            "key": "partition + conversation_id",
            "validation": opts.validation,
            "seed": opts.split_seed,
            "conversations": plan["conversations"],
            "validation_conversations": plan["validation_conversations"],
        },
        "settings": settings(fmt, files, max_length, written["train"], written["validation"]),
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
    row_fn = _specforge if fmt == "specforge" else _speculators(ds, tokenizer)
    per_file: Counter[str] = Counter()
    for shard in shards:
        for row in iter_rows(shard.path, _present(shard.path, _COLUMNS[fmt])):
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
    shards = _committed_shards(ds)
    entries = list(_scan(shards))
    plan = _plan(entries, opts, max_length)
    out = Path(output_path)
    files: dict[str, Path | None] = {
        "train": out,
        "validation": sibling(out, "validation") if opts.validation > 0 else None,
    }
    result = ExportResult(
        out, fmt, files["validation"], sibling(out, "metadata"), sibling(out, "report")
    )
    result.skipped_truncated = plan["dropped_truncated"]
    result.skipped_over_length = plan["dropped_over_length"]
    targets = {k: v for k, v in files.items() if v is not None}
    tmps = {k: v.with_name(f".{v.name}.tmp-{os.getpid()}") for k, v in targets.items()}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handles = {k: open(p, "wb") for k, p in tmps.items()}  # noqa: SIM115
        try:
            per_file = _write_rows(ds, fmt, shards, plan["sides"], handles, result, tokenizer)
            for fh in handles.values():
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            for fh in handles.values():
                fh.close()
        result.metadata = _metadata(ds, fmt, opts, max_length, entries, plan, files, per_file)
        meta_tmp = sibling(tmps["train"], "metadata")
        meta_tmp.write_bytes(orjson.dumps(result.metadata, option=orjson.OPT_INDENT_2))
        report_tmp = sibling(tmps["train"], "report")
        report_tmp.write_text("\n".join(result.report()) + "\n")
        for k, p in tmps.items():
            os.replace(p, targets[k])
        os.replace(meta_tmp, result.metadata_path)  # type: ignore[arg-type]
        os.replace(report_tmp, result.report_path)  # type: ignore[arg-type]
    except OSError as err:
        _cleanup(tmps)
        raise DatasetError(f"{out}: cannot write: {err.strerror or err}") from None
    except BaseException:
        _cleanup(tmps)
        raise
    return result


def _cleanup(tmps: dict[str, Path]) -> None:
    for p in tmps.values():
        p.unlink(missing_ok=True)
    train = tmps.get("train")
    if train is not None:
        sibling(train, "metadata").unlink(missing_ok=True)
        sibling(train, "report").unlink(missing_ok=True)

"""Exports of a finished dataset to the JSONL that draft-model trainers read.

Both formats hold the same training sample: ``input_ids = prompt_ids + output_ids`` and
``loss_mask`` 0 over the prompt, 1 over the output, built from the stored ids (never
re-tokenized). Shards are streamed one at a time and the file appears only when complete
(written to a temporary name, then renamed).

- ``specforge``: SpecForge's pre-tokenized prompts file (``data.prompts_path``), one
  ``{"input_ids": [...], "loss_mask": [...]}`` per line. Read by
  ``specforge/data/prompt_builder.py`` (sgl-project/SpecForge @00899963): a file whose first
  record has both keys is pre-tokenized; each record needs both, of equal length, non-empty,
  ``loss_mask`` of 0/1.
- ``speculators``: the rows of vllm-project/speculators'
  ``scripts/response_regeneration/script.py`` (``_sample_from_response``): ``id``,
  ``primary_id`` (the conversation key), ``input_ids``, ``loss_mask`` (``build_boundary_sample``)
  and ``metadata`` with ``idx``, ``finish_reason``, ``is_tool_call``, ``usage``, ``endpoint``,
  ``sampling_params``; we add ``partition``, ``truncated``, ``source_line``, ``turn``,
  ``sample`` and the dataset's ``content_sha256``. Its review-only ``text`` (a decode of
  ``input_ids``) is left out.

Several turns and samples (``regenerate: all_turns``, ``samples``): every generated turn is its
own row, its prompt the conversation so far as the model saw it, the loss on that turn's output
only, so the loss covers every generated turn once. That is how both trainers take multi-turn
regenerated data: speculators' regeneration writes one row per generation (``<conv>_gen<N>``,
the conversation in ``primary_id``; PR #693), and SpecForge's
``scripts/expand_reasoning_conversations.py`` splits a conversation into one row per assistant
turn (``{id}#turn{k}``) trained with ``train_only_last_turn``. The speculators rows carry the
record's own sampling in ``sampling_params`` (temperature, seed) and the conversation (the
input line's id) in ``primary_id``. A single row holding several turns with loss on each would train
later turns on a history whose earlier reasoning the template dropped, which is not what the
model saw when it generated them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
import pyarrow.parquet as pq

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard, iter_rows

Format = Literal["specforge", "speculators"]
FORMATS: tuple[str, ...] = get_args(Format)
Row = dict[str, Any]

_COLUMNS: dict[str, tuple[str, ...]] = {
    "specforge": ("prompt_ids", "output_ids", "truncated"),
    "speculators": ("id", "partition", "prompt_ids", "output_ids", "finish_reason", "truncated",
                    "prompt_tokens", "completion_tokens", "source_line", "conversation_id",
                    "turn", "sample", "sampling"),
}  # fmt: skip


@dataclass(slots=True)
class ExportResult:
    path: Path
    format: str
    written: Counter[str] = field(default_factory=Counter)  # per partition
    skipped_truncated: int = 0

    @property
    def total(self) -> int:
        return sum(self.written.values())


def boundary_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """Training input and loss mask: loss on exactly the tokens the model generated."""
    return prompt_ids + output_ids, [0] * len(prompt_ids) + [1] * len(output_ids)


def _specforge(row: Row) -> Row:
    input_ids, loss_mask = boundary_sample(row["prompt_ids"], row["output_ids"])
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


def export_dataset(
    root: str | Path,
    fmt: str,
    output_path: str | Path,
    *,
    skip_truncated: bool = False,
    tokenizer: str | None = None,
) -> ExportResult:
    """Write the dataset at ``root`` as ``fmt`` JSONL to ``output_path``. Truncated records are
    kept (flagged in speculators' metadata) unless ``skip_truncated``; ``tokenizer`` overrides
    the recorded tokenizer path (speculators' ``is_tool_call`` needs the tool-call token id)."""
    if fmt not in FORMATS:
        raise DatasetError(f"unknown export format {fmt!r}; choose one of {list(FORMATS)}")
    ds = DatasetDir(root)
    shards = _committed_shards(ds)
    row_fn = _specforge if fmt == "specforge" else _speculators(ds, tokenizer)
    out = Path(output_path)
    result = ExportResult(out, fmt)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            for shard in shards:
                for row in iter_rows(shard.path, _present(shard.path, _COLUMNS[fmt])):
                    if skip_truncated and row["truncated"]:
                        result.skipped_truncated += 1
                        continue
                    fh.write(orjson.dumps(row_fn(row), option=orjson.OPT_APPEND_NEWLINE))
                    result.written[shard.partition] += 1
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise DatasetError(f"{out}: cannot write: {err.strerror or err}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result

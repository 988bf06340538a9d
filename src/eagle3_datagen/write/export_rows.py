"""The rows each trainer reads, built from one stored record (the conventions are described in
``write/export.py`` and checked with each trainer's own code in ``trainers/``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3_datagen.write.dataset_dir import DatasetDir

Row = dict[str, Any]

COLUMNS: dict[str, tuple[str, ...]] = {
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


def boundary_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """speculators' convention: loss on exactly the tokens the model generated."""
    return prompt_ids + output_ids, [0] * len(prompt_ids) + [1] * len(output_ids)


def specforge_sample(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """SpecForge's convention: the output tokens and the last prompt token (the feature position
    of the draft's first proposal; see ``write/export.py``)."""
    n = len(prompt_ids)
    return prompt_ids + output_ids, [0] * (n - 1) + [1] * (len(output_ids) + 1)


def specforge_row(row: Row) -> Row:
    input_ids, loss_mask = specforge_sample(row["prompt_ids"], row["output_ids"])
    return {"input_ids": input_ids, "loss_mask": loss_mask}


def _endpoint(ds: DatasetDir) -> str | None:
    args = ds.run.get("server_args") or {}
    if args.get("host") and args.get("port"):
        return f"http://{args['host']}:{args['port']}/generate"
    return None


def speculators_row_builder(ds: DatasetDir, tokenizer: str | None) -> Callable[[Row], Row]:
    """The row builder, with what every row shares computed once."""
    section_begin: int | None = None
    if ds.special_tokens.tool_calls is not None:  # is_tool_call needs the tokenizer's id
        tools = ds.token_ids(tokenizer).tools
        section_begin = tools.section_begin if tools is not None else None
    endpoint = _endpoint(ds)
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

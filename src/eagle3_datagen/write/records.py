"""The dataset's row types and their Arrow schemas (the stable output contract).

Training input is ``prompt_ids + output_ids`` with loss on ``output_ids``; ids are int32 lists
exactly as rendered (prompt) and as returned by the server (output), never re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

SAMPLING_TYPE = pa.struct(
    [
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("top_k", pa.int32()),
        pa.field("min_p", pa.float64()),
        pa.field("repetition_penalty", pa.float64()),
        pa.field("max_new_tokens", pa.int32()),
        pa.field("sampling_seed", pa.int64()),  # null: none sent
    ]
)

IMAGE_TYPE = pa.struct(
    [
        pa.field("ref", pa.string()),  # the path or URL as the input gave it; data: its type
        pa.field("sha256", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("format", pa.string()),
        pa.field("tokens", pa.int32()),  # its placeholder's expanded length
    ]
)

RECORD_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("partition", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("output_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),  # stop | length
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("completion_tokens", pa.int32(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("think_end_index", pa.int32(), nullable=False),  # -1: no </think>
        pa.field("cached_tokens", pa.int32(), nullable=False),
        pa.field("e2e_latency", pa.float64()),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("rid", pa.string(), nullable=False),
        # Several records per input line (generate/conversation.py): the line's id, which
        # generated turn (0-based) and which sample this is, the sampling the request had, and
        # why the conversation stopped after this turn (null: it went on or was complete).
        pa.field("conversation_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("sampling", SAMPLING_TYPE),
        pa.field("stop_reason", pa.string()),
        # Image prompts (docs/images.md; null for text): the prompt ids with each image
        # placeholder expanded to the image's tokens, as the model saw them and the server
        # counted them in prompt_tokens; and the images in placeholder order.
        pa.field("model_prompt_ids", pa.list_(pa.int32())),
        pa.field("images", pa.list_(IMAGE_TYPE)),
        # Whether the prompt declared tools (null in data written before this column): acceptance
        # is reported with and without tools.
        pa.field("has_tools", pa.bool_()),
        # The conversation so far (null in data written before these columns), for coverage
        # against a serving profile (docs/coverage.md): a tool result in it, its user turns.
        pa.field("has_tool_results", pa.bool_()),
        pa.field("user_turns", pa.int32()),
        # The line's serving mode (docs/modes.md): "default" when none is declared; null in
        # data written before this column.
        pa.field("mode", pa.string()),
        # Speculative decoding (docs/sglang-speculative.md): the request's meta_info fields as
        # a speculating SGLang sent them; null when it sent none (the server does not
        # speculate, or the request ended before any verify step), never 0.
        pa.field("spec_verify_ct", pa.int32()),
        pa.field("spec_num_correct_drafts", pa.int32()),
        pa.field("spec_num_proposed_drafts", pa.int32()),
        pa.field("spec_accept_length", pa.float64()),
        pa.field("spec_accept_rate", pa.float64()),
        pa.field("spec_correct_drafts_histogram", pa.list_(pa.int32())),
        # The target's distribution (docs/logprobs.md), when the partition asks for it
        # (`logprobs: {top_k: K}`); null otherwise. Per output token: the sampled token's
        # logprob; with K > 0 the top-K ids and logprobs (highest first), and per record the
        # mean and 90th percentile of a per-token entropy estimate from the top-K (nats).
        pa.field("output_logprobs", pa.list_(pa.float32())),
        pa.field("top_logprob_ids", pa.list_(pa.list_(pa.int32()))),
        pa.field("top_logprobs", pa.list_(pa.list_(pa.float32()))),
        pa.field("entropy_mean", pa.float64()),
        pa.field("entropy_p90", pa.float64()),
    ]
)
# The record columns above that hold the target's distribution.
LOGPROB_COLUMNS = (
    "output_logprobs",
    "top_logprob_ids",
    "top_logprobs",
    "entropy_mean",
    "entropy_p90",
)
# The record columns above that hold speculative decoding fields, named as in meta_info.
SPEC_COLUMNS = (
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_correct_drafts_histogram",
)
_NO_SPEC: dict[str, Any] = dict.fromkeys(SPEC_COLUMNS)

REJECT_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.string(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("id", pa.string()),
        pa.field("stage", pa.string(), nullable=False),  # input | template | server | validation
        pa.field("reason_code", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string()),  # the input line, for input rejects
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("output_ids", pa.list_(pa.int32())),
        pa.field("finish_reason", pa.string()),
        pa.field("turn", pa.int32()),  # the generated turn and sample, for a turn's reject
        pa.field("sample", pa.int32()),
    ]
)


@dataclass(slots=True)
class Record:
    id: str
    partition: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool
    think_end_index: int
    cached_tokens: int
    e2e_latency: float | None
    source_line: int
    rid: str
    conversation_id: str = ""
    turn: int = 0
    sample: int = 0
    sampling: dict[str, Any] | None = None
    stop_reason: str | None = None
    model_prompt_ids: list[int] | None = None
    images: list[dict[str, Any]] | None = None
    has_tools: bool | None = None
    has_tool_results: bool | None = None
    user_turns: int | None = None
    mode: str | None = None
    spec_verify_ct: int | None = None
    spec_num_correct_drafts: int | None = None
    spec_num_proposed_drafts: int | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    spec_correct_drafts_histogram: list[int] | None = None
    output_logprobs: list[float] | None = None
    top_logprob_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    entropy_mean: float | None = None
    entropy_p90: float | None = None

    def __post_init__(self) -> None:
        if not self.conversation_id:
            self.conversation_id = self.id


@dataclass(slots=True)
class Reject:
    partition: str
    source_file: str
    source_line: int
    id: str | None
    stage: str
    reason_code: str
    reason: str
    raw: str | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    finish_reason: str | None = None
    turn: int | None = None
    sample: int | None = None


def spec_columns(spec: dict[str, Any] | None) -> dict[str, Any]:
    """A record's spec columns from a response's spec fields (all null without any)."""
    if spec is None:
        return _NO_SPEC
    return {name: spec.get(name) for name in SPEC_COLUMNS}


def _columns(rows: list[Record] | list[Reject], schema: pa.Schema) -> pa.Table:
    cols = {name: [getattr(r, name) for r in rows] for name in schema.names}
    return pa.Table.from_pydict(cols, schema=schema)


def records_table(rows: list[Record]) -> pa.Table:
    return _columns(rows, RECORD_SCHEMA)


def rejects_table(rows: list[Reject]) -> pa.Table:
    return _columns(rows, REJECT_SCHEMA)

"""Small datasets written the way the pipeline writes them, without Prefect or a server.

Records are hand-made token sequences over the bundled tokenizer; they bypass the live
validator, so tests can plant invalid ones and see the offline tools find them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_datagen.config import PipelineConfig, parse_config
from eagle3_datagen.generate.summary import add_record_counts
from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.manifest import summarize, write_manifest
from eagle3_datagen.write.records import Record, Reject
from eagle3_datagen.write.shards import BatchSummary, PartitionOutput
from tests.support import TOKENIZER_DIR

SERVER_ARGS: dict[str, Any] = {
    "model_path": str(TOKENIZER_DIR),
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 8,
    "reasoning_parser": None,
}


def make_config(
    partitions: tuple[str, ...] = ("p1", "p2"), truncation: str = "keep"
) -> PipelineConfig:
    return parse_config(
        {
            "model": {"path": str(TOKENIZER_DIR), "chat_template_kwargs": {"thinking": True}},
            "partitions": [
                {"name": n, "input": f"{n}.jsonl", "tier": "SHORT" if i == 0 else "LONG"}
                for i, n in enumerate(partitions)
            ],
            "validation": {"truncation": truncation},
        }
    )


def make_fingerprint(config: PipelineConfig, tok: ChatTokenizer) -> dict[str, Any]:
    return build_fingerprint(config, tok, SERVER_ARGS, "0.5.23")


class Tok:
    """Special-token ids of the bundled tokenizer and hand-made sequences built from them."""

    def __init__(self, tok: ChatTokenizer) -> None:
        names = [
            "<think>",
            "</think>",
            "<|im_end|>",
            "<|im_user|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ]
        self.id = {n: tok.token_id(n) for n in names}

    def prompt(self, n: int = 5) -> list[int]:
        return [*range(10, 10 + n), self.id["<think>"]]

    def output(self, think: int = 3, answer: int = 2) -> list[int]:
        """Reasoning, ``</think>``, answer, ``<|im_end|>``: a well-formed Kimi turn."""
        return [
            *range(100, 100 + think),
            self.id["</think>"],
            *range(200, 200 + answer),
            self.id["<|im_end|>"],
        ]

    def tool_output(self) -> list[int]:
        i = self.id
        return [
            100,
            i["</think>"],
            200,
            i["<|tool_calls_section_begin|>"],
            i["<|tool_call_begin|>"],
            300,
            i["<|tool_call_argument_begin|>"],
            301,
            i["<|tool_call_end|>"],
            i["<|tool_calls_section_end|>"],
            i["<|im_end|>"],
        ]

    def truncated_output(self, n: int = 6) -> list[int]:
        return list(range(100, 100 + n))  # still reasoning when max_new_tokens hit

    def record(
        self,
        rid: str,
        partition: str,
        output: list[int] | None = None,
        *,
        finish: str = "stop",
        line: int = 1,
        **overrides: Any,
    ) -> Record:
        """A record whose stored columns agree with its ids unless ``overrides`` say so."""
        prompt = self.prompt()
        out = self.output() if output is None else output
        end = self.id["</think>"]
        rec = Record(
            id=rid,
            partition=partition,
            prompt_ids=prompt,
            output_ids=out,
            finish_reason=finish,
            prompt_tokens=len(prompt),
            completion_tokens=len(out),
            truncated=finish == "length",
            think_end_index=out.index(end) if end in out else -1,
            cached_tokens=0,
            e2e_latency=0.5,
            source_line=line,
            rid=f"{partition}:{line}:0",
        )
        for key, value in overrides.items():
            setattr(rec, key, value)
        return rec


def reject(partition: str, line: int, code: str = "bad_input") -> Reject:
    return Reject(
        partition=partition,
        source_file=f"{partition}.jsonl",
        source_line=line,
        id=None,
        stage="input",
        reason_code=code,
        reason=f"line {line}: bad",
    )


@dataclass
class Batch:
    records: list[Record] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)


def write_partition(
    root: Path, partition: str, batches: list[Batch], fingerprint: dict[str, Any]
) -> dict[str, Any]:
    """Write the batches as the runner does (shard, rejects, marker); return the summary."""
    out = PartitionOutput(root, partition)
    first = 1
    for index, b in enumerate(batches):
        s = BatchSummary(partition, index, first, len(b.records) + len(b.rejects))
        s.accepted, s.rejected = len(b.records), len(b.rejects)
        s.rejects_by_reason = dict(Counter(r.reason_code for r in b.rejects))
        add_record_counts(s, b.records)
        s.requests_sent = len(b.records)
        out.write_batch(s, b.records, b.rejects, parquet_metadata(fingerprint))
        first += s.lines
    return summarize(partition, out.batch_summaries())


def write_dataset(
    root: Path, fingerprint: dict[str, Any], partitions: dict[str, list[Batch]]
) -> dict[str, Any]:
    manifest = {
        "fingerprint": fingerprint,
        "status": "completed",
        "partitions": {n: write_partition(root, n, b, fingerprint) for n, b in partitions.items()},
    }
    write_manifest(root, manifest)
    return manifest

"""Offline validation of a finished dataset (``eagle3-datagen validate``).

A dataset is copied, merged and moved between machines before anyone trains on it; this re-runs
the live validator on every record with the settings recorded in the manifest, and checks what
holds the dataset together: every shard carries the manifest's fingerprint, ids are unique per
partition, and accepted + rejected match the manifest's counts. The summary (truncation rate,
length percentiles) is computed by the same code that wrote the manifest's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_datagen.config import ValidationPolicy
from eagle3_datagen.errors import DatasetError
from eagle3_datagen.inputs.modes import recorded_thinking
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.sglang.logprobs import entropy_summary
from eagle3_datagen.validate.logprobs import check_logprobs
from eagle3_datagen.validate.tokens import Verdict, validate_output
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard, iter_rows
from eagle3_datagen.write.manifest import summarize
from eagle3_datagen.write.records import LOGPROB_COLUMNS, SPEC_COLUMNS
from eagle3_datagen.write.shards import BatchSummary

RECORD_COLUMNS = (
    "id",
    "partition",
    "prompt_ids",
    "output_ids",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "truncated",
    "think_end_index",
    "source_line",
)
# Absent from shards of older versions (turns and samples, image prompts).
TURN_COLUMNS = (
    "conversation_id",
    "turn",
    "sample",
    "model_prompt_ids",
    "images",
    "mode",
    *SPEC_COLUMNS,
    *LOGPROB_COLUMNS,
)
MAX_EXAMPLES = 20  # invalid records listed per partition; all are counted


def _columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        names = set()
    return [*RECORD_COLUMNS, *(c for c in TURN_COLUMNS if c in names)]


def check_record(
    row: dict[str, Any],
    partition: str,
    ids: TokenIds,
    policy: ValidationPolicy,
    content: dict[str, Any] | None = None,
) -> Verdict:
    """The live rules, plus the stored columns that must agree with them. An image prompt's
    rules apply to the ids the model saw (``model_prompt_ids``), which ``prompt_tokens`` counts."""
    seen = row.get("model_prompt_ids")
    v = validate_output(
        row["prompt_ids"] if seen is None else seen,
        row["output_ids"],
        finish_type=row["finish_reason"],
        finish_matched=None,  # not stored; the last-token rules still apply
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        ids=ids,
        policy=policy,
        thinking=recorded_thinking(
            row.get("mode"),
            (content or {}).get("chat_template_kwargs") or {},
            (content or {}).get("modes") or {},
        ),
    )
    if row["partition"] != partition:
        v.fail("wrong_partition", f"record of partition {row['partition']!r} in {partition!r}")
    if bool(row["truncated"]) != v.truncated:
        v.fail(
            "truncated_flag",
            f"truncated={row['truncated']} with finish_reason {row['finish_reason']!r}",
        )
    if row["think_end_index"] != v.think_end_index:
        v.fail(
            "think_end_index",
            f"stored {row['think_end_index']}, the output has it at {v.think_end_index}",
        )
    if (problem := spec_problem(row)) is not None:
        v.fail("spec_fields", problem)
    if row.get("output_logprobs") is not None:
        _check_logprob_columns(row, v)
    images = row.get("images") or []
    if seen is not None:
        want = len(row["prompt_ids"]) - len(images) + sum(i["tokens"] for i in images)
        if len(seen) != want:
            v.fail(
                "image_tokens",
                f"model_prompt_ids has {len(seen)} ids; the prompt ids with "
                f"{len(images)} image(s) expanded make {want}",
            )
    return v


def _check_logprob_columns(row: dict[str, Any], v: Verdict) -> None:
    """The live logprob checks on the stored columns, and the entropy columns recomputed."""
    top = row.get("top_logprobs")
    k = max((len(ids) for ids in row.get("top_logprob_ids") or ()), default=0)
    check_logprobs(
        row["output_ids"],
        row["output_logprobs"],
        v,
        top_ids=row.get("top_logprob_ids"),
        top_logprobs=top,
        top_k=k if top is not None else 0,
    )
    summary = entropy_summary(top) if top is not None and v.accepted else None
    stored = (row.get("entropy_mean"), row.get("entropy_p90"))
    if summary is not None and not all(
        s is not None and abs(s - want) <= 1e-4
        for s, want in zip(stored, (summary.mean, summary.p90), strict=True)
    ):
        v.fail(
            "entropy_columns",
            f"entropy_mean, entropy_p90 stored {stored}, the top-K gives "
            f"({summary.mean:.6f}, {summary.p90:.6f})",
        )


def spec_problem(row: dict[str, Any]) -> str | None:
    """How a record's speculative fields disagree with each other or with its output length
    (SGLang's invariants, docs/sglang-speculative.md); None when they agree or are absent."""
    verify = row.get("spec_verify_ct")
    if verify is None:
        return None
    correct = row.get("spec_num_correct_drafts")
    hist = row.get("spec_correct_drafts_histogram") or []
    n = len(row["output_ids"])
    if verify <= 0 or verify >= n:
        return f"spec_verify_ct {verify} with {n} output tokens (one from prefill, one per step)"
    if sum(hist) != verify or sum(i * c for i, c in enumerate(hist)) != correct:
        return (
            f"spec_correct_drafts_histogram {hist} disagrees with spec_verify_ct {verify} and "
            f"spec_num_correct_drafts {correct}"
        )
    length = row.get("spec_accept_length")
    if length is not None and abs(length - row["completion_tokens"] / verify) > 1e-6:
        return f"spec_accept_length {length} is not completion_tokens / spec_verify_ct"
    return None


@dataclass(slots=True)
class PartitionAudit:
    """One partition re-read: its summary, its invalid records, its dataset problems."""

    partition: str
    summary: dict[str, Any] = field(default_factory=dict)
    invalid: int = 0
    invalid_by_reason: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary,
            "invalid": self.invalid,
            "invalid_by_reason": dict(sorted(self.invalid_by_reason.items())),
            "invalid_examples": self.examples,
            "problems": self.problems,
        }


@dataclass(slots=True)
class AuditReport:
    root: Path
    content_sha256: str
    partitions: list[PartitionAudit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(int(p.summary.get("accepted", 0)) for p in self.partitions)

    @property
    def invalid(self) -> int:
        return sum(p.invalid for p in self.partitions)

    @property
    def all_problems(self) -> list[str]:
        return self.problems + [x for p in self.partitions for x in p.problems]

    @property
    def ok(self) -> bool:
        return self.invalid == 0 and not self.all_problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": str(self.root),
            "content_sha256": self.content_sha256,
            "ok": self.ok,
            "records": self.records,
            "invalid": self.invalid,
            "problems": self.all_problems,
            "partitions": {p.partition: p.to_dict() for p in self.partitions},
        }

    def lines(self) -> list[str]:
        """The human summary ``eagle3-datagen validate`` prints."""
        out = [f"dataset: {self.root} (fingerprint {self.content_sha256[:12]})"]
        for p in self.partitions:
            s = p.summary
            rejects = ", ".join(f"{k}={v}" for k, v in s.get("rejects_by_reason", {}).items())
            out.append(
                f"  {p.partition}: {s.get('accepted', 0)} records, {p.invalid} invalid, "
                f"{s.get('rejected', 0)} rejected" + (f" ({rejects})" if rejects else "")
            )
            out.append(
                f"    truncated {s.get('truncated', 0)} ({100 * s.get('truncation_rate', 0):.1f}%)"
                f"; output length {_pcts(s.get('output_length', {}))}"
                f"; thinking length {_pcts(s.get('thinking_length', {}))}"
            )
            if p.invalid:
                by = ", ".join(f"{k}={v}" for k, v in sorted(p.invalid_by_reason.items()))
                out.append(f"    invalid by reason: {by}")
                out.extend(f"    - {e}" for e in p.examples)
        if self.all_problems:
            out.append("problems:")
            out.extend(f"  - {x}" for x in self.all_problems)
        verdict = "OK" if self.ok else "FAILED"
        out.append(
            f"{verdict}: {self.records} records, {self.invalid} invalid, "
            f"{len(self.all_problems)} problems"
        )
        return out


def _pcts(p: dict[str, float]) -> str:
    if not p:
        return "-"
    return (
        f"p50 {p['p50']:.0f} p90 {p['p90']:.0f} p99 {p['p99']:.0f} "
        f"mean {p['mean']:.1f} max {p['max']:.0f}"
    )


def validate_dataset(
    root: str | Path, tokenizer: str | None = None, *, inputs: bool = False
) -> AuditReport:
    """Re-validate every record of the dataset at ``root``; ``tokenizer`` overrides the
    recorded tokenizer path (it must have the same vocabulary and special tokens). With
    ``inputs``, also check the dataset against its input files as they are now
    (:mod:`.inputs`)."""
    ds = DatasetDir(root)
    ids = ds.token_ids(tokenizer)
    policy = ds.policy
    report = AuditReport(ds.root, ds.content_sha256)
    status = ds.manifest.get("status")
    if status != "completed":
        report.problems.append(f"{ds.manifest_path}: run status is {status!r}, not 'completed'")
    for name in ds.partitions():
        report.partitions.append(_audit_partition(ds, name, ids, policy))
    if inputs:
        from eagle3_datagen.validate.inputs import check_inputs

        tok = ds.load_tokenizer(tokenizer)
        tok.chat_template_kwargs = dict(ds.content.get("chat_template_kwargs") or {})
        for problems in check_inputs(ds, tok).values():
            report.problems.extend(problems)
    return report


def _audit_partition(
    ds: DatasetDir, name: str, ids: TokenIds, policy: ValidationPolicy
) -> PartitionAudit:
    """One partition's shards re-read; a selection (``eagle3-datagen select``) drops whole
    lines by design, so only its records' lines are checked against their batch."""
    audit = PartitionAudit(name)
    shards, audit.problems = ds.shards(name)
    seen: set[str] = set()
    batches: list[BatchSummary] = []
    for shard in shards:
        for path in (shard.path, shard.rejects_path):
            problem = ds.check_fingerprint(path) if path is not None else None
            if problem:
                audit.problems.append(problem)
        try:
            selected = "selection" in ds.manifest
            batches.append(_audit_shard(shard, ids, policy, seen, audit, selected, ds.content))
        except DatasetError as err:
            audit.problems.append(str(err))
    audit.summary = summarize(name, batches)
    _check_counts(ds, name, audit)
    return audit


def _audit_shard(
    shard: Shard,
    ids: TokenIds,
    policy: ValidationPolicy,
    seen: set[str],
    audit: PartitionAudit,
    selected: bool = False,
    content: dict[str, Any] | None = None,
) -> BatchSummary:
    """Validate one shard's records; its stats as a BatchSummary (for ``summarize``)."""
    m = shard.marker
    b = BatchSummary(
        shard.partition,
        shard.index,
        m.first_line,
        m.lines,
        requests_sent=m.requests_sent,
        wall_s=m.wall_s,
    )
    lines: set[int] = set()
    turns: Counter[str] = Counter()
    for row_no, row in enumerate(iter_rows(shard.path, _columns(shard.path))):
        lines.add(row["source_line"])
        turns[str(row.get("turn", 0))] += 1
        v = check_record(row, shard.partition, ids, policy, content)
        if row["id"] in seen:
            v.fail("duplicate_id", f"id {row['id']!r} appears earlier in the partition")
        seen.add(row["id"])
        if not v.accepted:
            audit.invalid += 1
            audit.invalid_by_reason.update({code for code, _ in v.reasons})
            if len(audit.examples) < MAX_EXAMPLES:
                audit.examples.append(
                    f"{shard.path}: row {row_no} (id {row['id']!r}, input line "
                    f"{row['source_line']}): {v.reason_text}"
                )
        b.accepted += 1
        b.truncated += bool(row["truncated"])
        b.prompt_tokens += len(row["prompt_ids"])
        b.output_tokens += len(row["output_ids"])
        b.output_lengths.append(len(row["output_ids"]))
        if v.think_end_index >= 0:
            b.thinking_lengths.append(v.think_end_index)
    b.records_by_turn = dict(turns)
    if shard.rejects_path is not None:
        codes: Counter[str] = Counter()
        for r in iter_rows(shard.rejects_path, ["reason_code", "source_line"]):
            codes[r["reason_code"]] += 1
            lines.add(r["source_line"])
        b.rejected = sum(codes.values())
        b.rejects_by_reason = dict(codes)
    if (b.accepted, b.rejected) != (m.accepted, m.rejected):
        audit.problems.append(
            f"{shard.path}: holds {b.accepted} records and {b.rejected} rejects, its commit "
            f"marker says {m.accepted} and {m.rejected}"
        )
    batch = set(range(m.first_line, m.first_line + m.lines))
    missing = set() if selected else batch - lines
    if missing or (lines - batch) or (not selected and len(lines) != m.lines):
        # A line gives one record or reject, or with several turns or samples several: never
        # none, and never one of a line outside the batch.
        audit.problems.append(
            f"{shard.path}: {len(missing)} of its {m.lines} input lines have no record and no "
            f"reject (first: line {min(missing) if missing else '?'}), or rows name lines "
            "outside the batch"
        )
    return b


def _check_counts(ds: DatasetDir, name: str, audit: PartitionAudit) -> None:
    """Accepted and rejected on disk must be the manifest's (nothing lost, nothing added)."""
    entry = ds.manifest_entry(name)
    where = f"{ds.manifest_path}: partition {name!r}"
    if entry is None:
        audit.problems.append(f"{where}: data on disk but no entry in the manifest")
        return
    if "accepted" not in entry:
        audit.problems.append(
            f"{where}: did not complete (status {entry.get('status')!r}: {entry.get('error')})"
        )
        return
    for key in ("accepted", "rejected"):
        if entry.get(key) != audit.summary[key]:
            audit.problems.append(
                f"{where}: manifest says {key}={entry.get(key)}, the files hold "
                f"{audit.summary[key]}"
            )

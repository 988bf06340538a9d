"""One eval, end to end: held-out records, server checks, requests, acceptance, gate.

Nothing is written until every request answered: a refused server, too few held-out records,
an overlap with the draft's training file or a failed request leaves the dataset, its split,
its history and an earlier JSON as they were. Then the JSON is written atomically, the split
recorded (the first eval of a dataset fixes it, a grown one adds its new conversations), the
history line appended and the dataset card refreshed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import RetryableRequestError, ServerError
from eagle3_datagen.evaluate.gate import gate, load_baseline, record_in_history
from eagle3_datagen.evaluate.measure import measure
from eagle3_datagen.evaluate.overlap import check_overlap
from eagle3_datagen.evaluate.records import MIN_RECORDS, HeldOutRecord, held_out_records
from eagle3_datagen.evaluate.server import check_draft, check_lossless, speculating, unreachable
from eagle3_datagen.evaluate.slices import Measured, acceptance
from eagle3_datagen.provenance import server_kind
from eagle3_datagen.report.dataset_card import update_latest_eval
from eagle3_datagen.report.intervals import Group, ratio_interval
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.write.dataset_dir import DatasetDir
from eagle3_datagen.write.shards import atomic_write_bytes
from eagle3_datagen.write.split_file import SplitChoice, choose_split, save_split, split_summary


@dataclass(frozen=True, slots=True)
class EvalOptions:
    dataset: str
    server_url: str
    validation: float | None = None  # None: the dataset's split (split.json), or the default
    seed: int | None = None
    resplit: bool = False
    min_records: int = MIN_RECORDS
    train_export: str | None = None  # the draft's export (JSONL, provenance file or its dir)
    json_path: str | None = None
    baseline: str | None = None  # an eval JSON, or "history"
    max_drop: float = 0.1
    concurrency: int = 32
    draft: str | None = None  # the draft directory, where this machine can read it
    tokenizer: str | None = None
    api_key: str | None = None
    record_history: bool = True


@dataclass(slots=True)
class EvalResult:
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.data["gate"]["ok"])

    @property
    def verdict(self) -> str:
        """``gate passed|FAILED|inconclusive: <reason>``: the line an operator reads first."""
        g = self.data["gate"]
        word = {"failed": "FAILED"}.get(g.get("verdict", ""), g.get("verdict", "passed"))
        return f"gate {word}: {g['reason']}"

    @property
    def reason(self) -> str:
        return str(self.data["gate"]["reason"])

    def lines(self) -> list[str]:
        """The result for a terminal: overall with its interval, then each slice, the overlap
        check and the gate."""
        d = self.data
        held, split = d["heldout"], d["split"]
        ci = d["accept_length_ci95"]
        out = [
            f"eval of {held['records']} held-out records ({held['conversations']} "
            f"conversations; {held['moved_to_train']} moved to train for a repeated prompt; "
            f"{held['images_left_out']} image records left out) on {d['server']['url']}, "
            f"split {split['id']} (validation {split['validation']}, seed {split['seed']})",
            f"accept length {d['accept_length']} [{ci[0]}, {ci[1]}] (tokens per verify step; "
            f"95 % interval over {held['conversations']} held-out conversations), acceptance "
            f"per draft position {d['position_acceptance']}",
        ]
        for name, values in d["slices"].items():
            cells = ", ".join(
                f"{k}: {v['accept_length']} ({v['requests']})" for k, v in values.items()
            )
            out.append(f"  by {name}: {cells}")
        out.append(f"overlap: {d['overlap']['reason']}")
        out += [f"note: {note}" for note in d["unchecked"]]
        out.append(self.verdict)
        return out


def _server(url: str, settings: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The server as the eval's JSON and history record it; ``kind`` says whether SGLang or
    the bundled emulator (which reports the SGLang version it stands in for) answered."""
    return {
        "url": url,
        "kind": server_kind(info),
        "version": settings.version,
        "algorithm": settings.algorithm,
        "draft_model_path": settings.draft_model_path,
        "num_steps": settings.num_steps,
        "eagle_topk": settings.eagle_topk,
        "num_draft_tokens": settings.num_draft_tokens,
    }


def conversation_groups(records: list[HeldOutRecord], answers: list[Measured]) -> list[Group]:
    """Per held-out conversation: (tokens committed, verify steps), the bootstrap's units
    (``accept_length`` is their ratio of sums)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for rec, m in zip(records, answers, strict=True):
        g = groups.setdefault((rec.partition, rec.conversation), [0.0, 0.0])
        g[0] += m.stats.num_correct_drafts + m.stats.verify_ct
        g[1] += m.stats.verify_ct
    return [(num, den) for num, den in groups.values()]


async def _measure(
    opts: EvalOptions, choice: SplitChoice, on_done: Callable[[int], None] | None
) -> tuple[dict[str, Any], Any]:
    ds = DatasetDir(opts.dataset)
    held = held_out_records(ds, ds.token_ids(opts.tokenizer), choice, opts.min_records)
    overlap = check_overlap(
        ((r.partition, r.conversation) for r in held.records), opts.train_export, opts.draft
    )
    async with SGLangClient(opts.server_url, api_key=opts.api_key) as client:
        try:
            info = await client.server_info()
        except RetryableRequestError as err:
            raise await unreachable(opts.server_url, err) from None
        settings = speculating(info, opts.server_url)
        check_lossless(info, opts.server_url, (r.sampling for r in held.records))
        unchecked = check_draft(info, opts.draft)
        started = datetime.now(UTC)
        measured = await measure(
            client, held.records, settings, concurrency=opts.concurrency, on_done=on_done
        )
    overall, slices = acceptance(measured, settings.num_steps)
    groups = conversation_groups(held.records, measured)
    ci = ratio_interval(groups) if any(den for _, den in groups) else None
    data = {
        "kind": "eval",
        "started": started.isoformat(timespec="seconds"),
        "ended": datetime.now(UTC).isoformat(timespec="seconds"),
        "dataset": {"path": str(ds.root), "content_sha256": ds.content_sha256},
        "server": _server(opts.server_url, settings, info),
        "split": split_summary(choice, held.split),
        "heldout": held.counts(),
        "images_left_out": held.images_left_out,
        "records": len(measured),
        "overlap": overlap,
        **overall,
        "accept_length_ci95": ci.as_list() if ci else None,
        "slices": slices,
        "unchecked": unchecked,
    }
    return data, held.split


async def evaluate(opts: EvalOptions, on_done: Callable[[int], None] | None = None) -> EvalResult:
    """Measure, compare with the baseline, then write the JSON, the split, the history line
    and the dataset card."""
    baseline = load_baseline(opts.baseline, opts.dataset) if opts.baseline else None
    choice = choose_split(
        opts.dataset, opts.validation, opts.seed, resplit=opts.resplit, seed_flag="--seed"
    )
    data, split = await _measure(opts, choice, on_done)
    if data["accept_length"] is None or data["accept_length_ci95"] is None:
        raise ServerError(
            f"{opts.server_url}: no held-out request had a verify step (each ended after its "
            "prefill token): nothing to measure"
        )
    low, high = data["accept_length_ci95"]
    data["gate"] = gate(data["accept_length"], (low, high), baseline, opts.max_drop)
    if opts.json_path:
        path = Path(opts.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    save_split(opts.dataset, choice, split)
    if opts.record_history:
        record_in_history(opts.dataset, data)
        update_latest_eval(opts.dataset)
    return EvalResult(data)


def run_eval(opts: EvalOptions, on_done: Callable[[int], None] | None = None) -> EvalResult:
    """:func:`evaluate` on a new event loop (the command line)."""
    return asyncio.run(evaluate(opts, on_done))

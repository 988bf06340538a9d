"""One eval, end to end: held-out records, server checks, requests, acceptance, gate.

Nothing is written until every request answered: a refused server, an empty split or a failed
request leaves the dataset, its history and an earlier JSON as they were. The JSON is written
atomically; the history line is appended last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import ServerError
from eagle3_datagen.evaluate.gate import gate, load_baseline, record_in_history
from eagle3_datagen.evaluate.measure import measure
from eagle3_datagen.evaluate.records import held_out_records
from eagle3_datagen.evaluate.server import check_draft, check_lossless, speculating
from eagle3_datagen.evaluate.slices import acceptance
from eagle3_datagen.provenance import server_kind
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.write.dataset_dir import DatasetDir
from eagle3_datagen.write.shards import atomic_write_bytes


@dataclass(frozen=True, slots=True)
class EvalOptions:
    dataset: str
    server_url: str
    validation: float = 0.2
    seed: int = 0
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
    def reason(self) -> str:
        return str(self.data["gate"]["reason"])

    def lines(self) -> list[str]:
        """The result for a terminal: overall, then each slice."""
        d = self.data
        split = d["split"]
        out = [
            f"eval of {d['records']} held-out records ({split['validation_conversations']} "
            f"conversations; {split['duplicates_moved_to_train']} moved to train for a repeated "
            f"prompt; {d['images_left_out']} image records left out) on {d['server']['url']}",
            f"accept length {d['accept_length']} (tokens per verify step), acceptance per draft "
            f"position {d['position_acceptance']}",
        ]
        for name, values in d["slices"].items():
            cells = ", ".join(
                f"{k}: {v['accept_length']} ({v['requests']})" for k, v in values.items()
            )
            out.append(f"  by {name}: {cells}")
        out += [f"note: {note}" for note in d["unchecked"]]
        out.append(f"gate: {'passed' if self.ok else 'FAILED'}: {self.reason}")
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


async def _measure(opts: EvalOptions, on_done: Callable[[int], None] | None) -> dict[str, Any]:
    ds = DatasetDir(opts.dataset)
    held = held_out_records(ds, ds.token_ids(opts.tokenizer), opts.validation, opts.seed)
    async with SGLangClient(opts.server_url, api_key=opts.api_key) as client:
        info = await client.server_info()
        settings = speculating(info, opts.server_url)
        check_lossless(info, opts.server_url, (r.sampling for r in held.records))
        unchecked = check_draft(info, opts.draft)
        started = datetime.now(UTC)
        measured = await measure(
            client, held.records, settings, concurrency=opts.concurrency, on_done=on_done
        )
    overall, slices = acceptance(measured, settings.num_steps)
    return {
        "kind": "eval",
        "started": started.isoformat(timespec="seconds"),
        "ended": datetime.now(UTC).isoformat(timespec="seconds"),
        "dataset": {"path": str(ds.root), "content_sha256": ds.content_sha256},
        "server": _server(opts.server_url, settings, info),
        "split": held.split.summary(),
        "images_left_out": held.images_left_out,
        "records": len(measured),
        **overall,
        "slices": slices,
        "unchecked": unchecked,
    }


async def evaluate(opts: EvalOptions, on_done: Callable[[int], None] | None = None) -> EvalResult:
    """Measure, compare with the baseline, then write the JSON and the history line."""
    baseline = load_baseline(opts.baseline, opts.dataset) if opts.baseline else None
    data = await _measure(opts, on_done)
    if data["accept_length"] is None:
        raise ServerError(
            f"{opts.server_url}: no held-out request had a verify step (each ended after its "
            "prefill token): nothing to measure"
        )
    data["gate"] = gate(data["accept_length"], baseline, opts.max_drop)
    if opts.json_path:
        path = Path(opts.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    if opts.record_history:
        record_in_history(opts.dataset, data)
    return EvalResult(data)


def run_eval(opts: EvalOptions, on_done: Callable[[int], None] | None = None) -> EvalResult:
    """:func:`evaluate` on a new event loop (the command line)."""
    return asyncio.run(evaluate(opts, on_done))

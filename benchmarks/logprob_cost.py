"""(h) The price of ``logprobs: {top_k: K}`` (docs/logprobs.md), per record: Parquet bytes on
disk and the client's CPU to parse, validate and write an answer, with logprobs off and with
K = 0, 1 and 20, as ratios to off.

The same prompts and seeds in every mode, so the same tokens (the emulator, like SGLang, draws
them the same way with or without logprobs); only the logprob fields differ. The answers are
fetched from a real emulator process first; the measured part is what the pipeline's client does
with each body: ``orjson`` decode, ``GenerateResult.from_json``, the token and logprob checks,
the record with its entropy columns, and the batch's Parquet shard and commit marker through
``PartitionOutput.write_batch``. CPU is ``time.process_time`` of that loop in this process,
best of ``repeats`` runs alternating the modes (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import TOKENIZER_DIR, Emulator, emit, make_config, run_child, write_prompts

MODES: tuple[int | None, ...] = (None, 0, 1, 20)


def _name(mode: int | None) -> str:
    return "off" if mode is None else f"top_k {mode}"


def _fetch(
    url: str, jobs: list[tuple[str, list[int]]], sampling: dict[str, Any], mode: int | None
) -> list[bytes]:
    import httpx
    import orjson

    from eagle3_datagen.sglang.logprobs import request_fields

    bodies = []
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for i, (rid, ids) in enumerate(jobs):
            payload: dict[str, Any] = {
                "input_ids": ids,
                "sampling_params": {**sampling, "sampling_seed": i},
                "rid": f"{rid}:{_name(mode)}",
            }
            if mode is not None:
                payload.update(request_fields(mode))
            r = client.post("/generate", content=orjson.dumps(payload))
            r.raise_for_status()
            bodies.append(r.content)
    return bodies


def _process(
    bodies: list[bytes],
    jobs: list[tuple[str, list[int]]],
    mode: int | None,
    ctx: dict[str, Any],
    out: Path,
) -> float:
    """Parse, validate and write every answer as the pipeline does; its CPU seconds."""
    import orjson

    from eagle3_datagen.config import Logprobs
    from eagle3_datagen.generate.turn import logprob_columns
    from eagle3_datagen.sglang.client import GenerateResult
    from eagle3_datagen.validate.logprobs import check_logprobs
    from eagle3_datagen.validate.tokens import validate_output
    from eagle3_datagen.write.records import Record
    from eagle3_datagen.write.shards import BatchSummary, PartitionOutput

    asked = Logprobs(top_k=mode) if mode is not None else None
    t0 = time.process_time()
    records = []
    for (rid, ids), body in zip(jobs, bodies, strict=True):
        result = GenerateResult.from_json(orjson.loads(body), mode)
        v = validate_output(
            ids, result.output_ids, finish_type=result.finish_type,
            finish_matched=result.finish_matched, prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens, ids=ctx["ids"], policy=ctx["policy"],
        )  # fmt: skip
        if asked is not None:
            check_logprobs(
                result.output_ids, result.output_logprobs, v, scored_ids=result.logprob_ids,
                top_ids=result.top_logprob_ids, top_logprobs=result.top_logprobs, top_k=mode or 0,
            )  # fmt: skip
        if not v.accepted:
            raise AssertionError(f"{rid}: {v.reason_text}")
        records.append(
            Record(
                id=rid,
                partition="p",
                prompt_ids=ids,
                output_ids=result.output_ids,
                finish_reason=result.finish_type,
                prompt_tokens=len(ids),
                completion_tokens=len(result.output_ids),
                truncated=v.truncated,
                think_end_index=v.think_end_index,
                cached_tokens=result.cached_tokens,
                e2e_latency=result.e2e_latency,
                source_line=0,
                rid=result.rid,
                **logprob_columns(asked, result),
            )
        )
    summary = BatchSummary("p", 0, 1, len(records), accepted=len(records))
    PartitionOutput(out, "p").write_batch(summary, records, [], ctx["metadata"])
    return time.process_time() - t0


def _child(n: int, repeats: int, out_tokens: int) -> dict[str, Any]:
    import orjson

    from benchmarks.common import render_partition, sampling_for
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen.render.token_ids import TokenIds

    tmp = Path(tempfile.mkdtemp(prefix="logprob-cost-"))
    config = make_config([("p", write_prompts(tmp / "p.jsonl", n), "SHORT")], tmp / "out")
    jobs = render_partition(config, "p")
    sampling = sampling_for(config, "SHORT")
    ctx = {
        "ids": TokenIds.resolve(ChatTokenizer(str(TOKENIZER_DIR)), config.special_tokens),
        "policy": config.validation,
        "metadata": {"eagle3_datagen.content_sha256": "benchmark"},
    }
    emu = Emulator("--random-seed", "0", "--emu-mean-output-tokens", str(out_tokens)).wait_ready()
    try:
        bodies = {m: _fetch(emu.url, jobs, sampling, m) for m in MODES}
    finally:
        emu.stop()
    cpu: dict[str, float] = {}
    size: dict[str, int] = {}
    for r in range(repeats + 1):  # the first round warms up (imports, allocator)
        for m in MODES:
            out = tmp / f"run{r}-{_name(m)}"
            s = _process(bodies[m], jobs, m, ctx, out)
            if r:
                cpu[_name(m)] = min(cpu.get(_name(m), s), s)
            size[_name(m)] = (out / "p" / "part-00000.parquet").stat().st_size
    return {
        "records": len(jobs),
        "repeats": repeats,
        "cpu_ms_per_record": {k: 1000 * v / len(jobs) for k, v in cpu.items()},
        "bytes_per_record": {k: v / len(jobs) for k, v in size.items()},
        "output_tokens_per_record": sum(len(orjson.loads(b)["output_ids"]) for b in bodies[None])
        / len(jobs),
        "response_bytes_per_record": {
            _name(m): sum(map(len, bodies[m])) / len(jobs) for m in MODES
        },
    }


def measure(n: int = 400, repeats: int = 3, out_tokens: int = 200) -> dict[str, Any]:
    return run_child("logprob_cost", ["--child", str(n), str(repeats), str(out_tokens)])


def figures(h: dict[str, Any], figure: Any) -> list[Any]:
    """(h) as two figures: bytes and CPU per record, each mode against off. The price is a
    number to know, not a target to meet."""
    out = []
    for key, label, unit in (
        ("bytes_per_record", "Parquet bytes per record", "B"),
        ("cpu_ms_per_record", "client CPU per record (parse, validate, write)", "ms"),
    ):
        v = h[key]
        base = v["off"]
        ratios = " / ".join(f"{v[_name(m)] / base:.2f}x" for m in MODES[1:])
        fmt = "{:,.0f}" if unit == "B" else "{:.3f}"
        value = f"{ratios} (off {fmt.format(base)} {unit})"
        if unit == "B":  # the emulator's tokens compress far better than a model's: per token
            per_token = " / ".join(
                f"+{(v[_name(m)] - base) / h['output_tokens_per_record']:.0f}" for m in MODES[1:]
            )
            value += f"; {per_token} B per output token"
        out.append(
            figure("h", f"{label}, logprobs top_k 0 / 1 / 20 vs off", value, "reported", True)
        )
    return out


def details(h: dict[str, Any]) -> list[str]:
    def row(key: str, fmt: str) -> str:
        return ", ".join(f"{k} {fmt.format(v)}" for k, v in h[key].items())

    return [
        f"(h) {h['records']:,} records of ~{h['output_tokens_per_record']:.0f} output tokens, "
        f"best of {h['repeats']} alternating runs",
        f"    Parquet bytes per record: {row('bytes_per_record', '{:,.0f}')}",
        f"    client CPU ms per record: {row('cpu_ms_per_record', '{:.3f}')}",
        f"    response bytes per record (JSON): {row('response_bytes_per_record', '{:,.0f}')}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", nargs=3, type=int, metavar=("N", "REPEATS", "OUT_TOKENS"))
    args = p.parse_args(argv)
    if args.child:
        emit(_child(*args.child))
        return 0
    result = measure()
    print("\n".join(details(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

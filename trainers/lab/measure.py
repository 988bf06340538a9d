"""Held-out accept length, measured by a speculating server (the lab's stand-in for
``eagle3-datagen eval``, which can replace this step: same inputs, same summary).

Each held-out row of a speculators export (the validation file: the rows a draft trained on
that export never saw) gives its prompt, the ids before the first supervised token; the prompt
goes to ``/generate`` at temperature 0 with ``max_new_tokens``. The server's per-request spec
fields are read and pooled by the project's own reader (``eagle3_datagen.sglang.speculative``).

Each output also carries its resampling unit for the tables' intervals: ``accept`` =
[correct drafts + verify steps, verify steps] (its share of the pooled ratio). With a fourth
argument, the id of the end-of-reasoning token, each output that contains it is measured once
more in two parts at temperature 0: the prompt with ``max_new_tokens`` up to and including that
token (the reasoning tokens), then the prompt plus that reasoning with the remaining budget (the
answer tokens); ``split`` = {reasoning: [num, den], answer: [num, den]} and ``split_same_ids``
whether the two parts gave the whole output's ids again.

usage: python measure.py URL VALIDATION_JSONL MAX_NEW_TOKENS OUT_JSON [THINK_END_ID]
"""

import json
import sys
import urllib.request
from dataclasses import asdict
from pathlib import Path

from eagle3_datagen.sglang.speculative import SpeculativeSettings, parse_spec_meta, summarize


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def prompt_of(row: dict) -> list[int]:
    mask = row["loss_mask"]
    first = mask.index(1) if 1 in mask else len(mask)
    return row["input_ids"][:first]


def _unit(spec) -> list[int]:
    return [spec.num_correct_drafts + spec.verify_ct, spec.verify_ct]


def _part(url: str, ids: list[int], budget: int, settings, rid: str) -> tuple[list[int], list]:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": budget},
        "rid": rid,
    }
    res = _post(f"{url}/generate", body)
    spec = parse_spec_meta(res["meta_info"], settings)
    return res["output_ids"], (_unit(spec) if spec is not None else None)


def split(url: str, prompt: list[int], output: list[int], limit: int, end: int, settings, rid):
    """The output's reasoning tokens (through ``end``) and answer tokens, measured apart."""
    cut = output.index(end) + 1
    first, reasoning = _part(url, prompt, cut, settings, f"{rid}-reasoning")
    parts, same = {"reasoning": reasoning}, first == output[:cut]
    if cut < len(output):
        rest, answer = _part(url, prompt + output[:cut], limit - cut, settings, f"{rid}-answer")
        parts["answer"] = answer
        same = same and rest == output[cut:]
    return parts, same


def main(url: str, validation: str, max_new: str, out: str, think_end: str = "") -> None:
    rows = [json.loads(x) for x in Path(validation).read_text().splitlines() if x.strip()]
    if not rows:
        raise SystemExit(f"{validation}: no held-out rows")
    settings = SpeculativeSettings.from_server_info(_get(f"{url}/server_info"))
    records, stats = [], []
    for row in rows:
        body = {
            "input_ids": prompt_of(row),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": int(max_new)},
            "rid": f"heldout-{row['id']}",
        }
        res = _post(f"{url}/generate", body)
        meta = res["meta_info"]
        spec = parse_spec_meta(meta, settings)
        record = {"id": row["id"], "output_ids": res["output_ids"], "meta_info": meta}
        if spec is not None:
            stats.append(spec)
            record["accept"] = _unit(spec)
            if think_end and int(think_end) in res["output_ids"]:
                record["split"], record["split_same_ids"] = split(
                    url,
                    body["input_ids"],
                    res["output_ids"],
                    int(max_new),
                    int(think_end),
                    settings,
                    body["rid"],
                )
        records.append(record)
    summary = summarize(stats, settings.num_steps) if settings.is_speculating else None
    result = {
        "records": len(records),
        "speculating": settings.is_speculating,
        "draft": settings.draft_model_path,
        "accept_length": summary.accept_length if summary else None,
        "summary": asdict(summary) if summary else None,
        "outputs": records,
    }
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"{out}: {len(records)} held-out prompts, accept length {result['accept_length']}")


if __name__ == "__main__":
    main(*sys.argv[1:6])

"""Held-out accept length, measured by a speculating server (the lab's stand-in for
``eagle3-datagen eval``, which can replace this step: same inputs, same summary).

Each held-out row of a speculators export (the validation file: the rows a draft trained on
that export never saw) gives its prompt, the ids before the first supervised token; the prompt
goes to ``/generate`` at temperature 0 with ``max_new_tokens``. The server's per-request spec
fields are read and pooled by the project's own reader (``eagle3_datagen.sglang.speculative``).

usage: python measure.py URL VALIDATION_JSONL MAX_NEW_TOKENS OUT_JSON
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


def main(url: str, validation: str, max_new: str, out: str) -> None:
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
        if spec is not None:
            stats.append(spec)
        records.append({"id": row["id"], "output_ids": res["output_ids"], "meta_info": meta})
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
    main(*sys.argv[1:5])

"""The lossless check's reference: transformers' own ``generate`` on the target, greedy.

Why: comparing the speculating server with the same backend's plain path proves only that the
two paths agree with each other (they share the cached forward). ``generate`` is independent
code: its own KV cache, its own greedy loop, its own stop on the end-of-turn token. A verifier
that is lossless gives exactly these ids at temperature 0.

Each held-out row's prompt (the ids before its first supervised token, as measure.py sends it)
is generated with ``do_sample=False``, ``max_new_tokens`` and the stop ids SGLang
uses (the model's and generation config's ``eos_token_id`` and the tokenizer's end-of-sequence
token; a stop is kept, as the server keeps it). The output has measure.py's shape
(``outputs``: ``{id, output_ids}``), so summary.py and modes.py compare it the same way.

usage: python reference.py TARGET_DIR VALIDATION_JSONL MAX_NEW_TOKENS OUT_JSON
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def prompt_of(row: dict) -> list[int]:
    mask = row["loss_mask"]
    first = mask.index(1) if 1 in mask else len(mask)
    return row["input_ids"][:first]


def _ids(value) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list | tuple) else {int(value)}


def stop_ids(target: str, model) -> list[int]:
    """The ids that end an output: the configs' eos ids and the tokenizer's eos token."""
    tok = AutoTokenizer.from_pretrained(target, trust_remote_code=True)
    ids = _ids(model.config.eos_token_id) | _ids(tok.eos_token_id)
    if model.generation_config is not None:
        ids |= _ids(model.generation_config.eos_token_id)
    return sorted(ids)


def main(target: str, validation: str, max_new: str, out: str) -> None:
    rows = [json.loads(x) for x in Path(validation).read_text().splitlines() if x.strip()]
    if not rows:
        raise SystemExit(f"{validation}: no held-out rows")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    eos = stop_ids(target, model)
    records = []
    with torch.no_grad():
        for row in rows:
            prompt = prompt_of(row)
            ids = torch.tensor([prompt])
            got = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=int(max_new),
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            records.append({"id": row["id"], "output_ids": got[0, len(prompt) :].tolist()})
    result = {"records": len(records), "reference": "transformers generate", "outputs": records}
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"{out}: {len(records)} held-out prompts, transformers generate (greedy)")


if __name__ == "__main__":
    main(*sys.argv[1:5])

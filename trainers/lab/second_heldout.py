"""The second held-out set as measure.py's input: each prompt of ``prompts2.jsonl`` (corpus.py:
modules no training data names) rendered to ids by the chat template, as held-out rows
(``input_ids`` = the prompt, one supervised pad position so measure.py finds where it ends).

The rendering must be the pipeline's: it is checked on the first held-out set, whose prompt ids
the pipeline made; one row rendered differently stops the lab.

usage: python second_heldout.py TOKENIZER_DIR PROMPTS_JSONL PROMPTS2_JSONL VALIDATION_JSONL OUT
"""

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer


def _lines(path: str) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def render(tok, messages: list[dict]) -> list[int]:
    user = [m for m in messages if m["role"] != "assistant"]
    text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False).input_ids


def main(tokenizer_dir: str, prompts: str, prompts2: str, validation: str, out: str) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    first = {r["id"]: r["messages"] for r in _lines(prompts)}
    for row in _lines(validation):
        mask = row["loss_mask"]
        if render(tok, first[row["primary_id"]]) != row["input_ids"][: mask.index(1)]:
            raise SystemExit(f"{validation}: {row['id']}: rendered differently than the pipeline")
    rows = []
    for rec in _lines(prompts2):
        ids = render(tok, rec["messages"])
        rows.append({"id": rec["id"], "input_ids": [*ids, 0], "loss_mask": [0] * len(ids) + [1]})
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"second held-out set: {len(rows)} prompts -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:6])

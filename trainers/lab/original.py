"""The lab's baseline data: the same records with each prompt's ORIGINAL assistant answer in
place of the target's regenerated one, as a speculators export (same ids, same train/validation
split, same prompt ids; only the supervised tokens differ).

The original answer is the prompt file's last assistant message, tokenized by the chat template
(``</think>`` then the answer then ``<|im_end|>``: the template renders an answer without
reasoning), which is what a trainer would make of the public dataset without regenerating it.

usage: python original.py TOKENIZER_DIR PROMPTS_JSONL REGENERATED_EXPORT_DIR OUT_DIR
"""

import json
import shutil
import sys
from pathlib import Path

from transformers import AutoTokenizer


def rows_for(tok, messages: dict[str, list], path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        mask = row["loss_mask"]
        prompt = row["input_ids"][: mask.index(1)]
        conversation = messages[row["primary_id"]]
        full = tok(tok.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)
        ids = full.input_ids
        if ids[: len(prompt)] != prompt:
            raise SystemExit(
                f"{path}: {row['id']}: the original conversation's ids do not start "
                "with the record's prompt ids"
            )
        out.append(
            {
                "id": row["id"],
                "input_ids": ids,
                "loss_mask": [0] * len(prompt) + [1] * (len(ids) - len(prompt)),
            }
        )
    return out


def main(tokenizer_dir: str, prompts: str, regenerated: str, out_dir: str) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    messages = {}
    for line in Path(prompts).read_text().splitlines():
        rec = json.loads(line)
        messages[rec["id"]] = rec["messages"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = 0
    for name in ("speculators.jsonl", "speculators.validation.jsonl"):
        rows = rows_for(tok, messages, Path(regenerated) / name)
        tokens += sum(sum(r["loss_mask"]) for r in rows)
        with (out / name).open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    shutil.copy(Path(regenerated) / "speculators.export.json", out / "speculators.export.json")
    print(f"original answers: {out} ({tokens} supervised tokens)")


if __name__ == "__main__":
    main(*sys.argv[1:5])

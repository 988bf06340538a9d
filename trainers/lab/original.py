"""The lab's baseline data: the same records with each prompt's ORIGINAL assistant answer in
place of the target's regenerated one, as a speculators export (same ids, same train/validation
split, same prompt ids; only the supervised tokens differ).

The original answer is the prompt file's last assistant message, tokenized by the chat template
(``</think>`` then the answer then ``<|im_end|>``: the template renders an answer without
reasoning), which is what a trainer would make of the public dataset without regenerating it.

With REASONING_JSONL (corpus.py's ``reasoning.jsonl``): the original answer carries another
writer's reasoning, the control where both drafts see reasoning and only whose text it is
differs. The template drops the reasoning of a finished assistant turn, so those ids are the
prompt's (which end in ``<think>``) then the tokens of ``reasoning</think>answer<|im_end|>``, as
a target's own output follows its prompt.

usage: python original.py TOKENIZER_DIR PROMPTS_JSONL REGENERATED_EXPORT_DIR OUT_DIR
                          [REASONING_JSONL]
"""

import json
import shutil
import sys
from pathlib import Path

from transformers import AutoTokenizer


def rows_for(tok, messages: dict[str, list], path: Path, thoughts: dict[str, str]) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        mask = row["loss_mask"]
        prompt = row["input_ids"][: mask.index(1)]
        conversation = messages[row["primary_id"]]
        if thoughts:
            text = f"{thoughts[row['primary_id']]}</think>{conversation[-1]['content']}<|im_end|>"
            ids = prompt + tok(text, add_special_tokens=False).input_ids
        else:
            text = tok.apply_chat_template(conversation, tokenize=False)
            ids = tok(text, add_special_tokens=False).input_ids
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


def main(
    tokenizer_dir: str, prompts: str, regenerated: str, out_dir: str, reasoning: str = ""
) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    thoughts = {}
    if reasoning:
        for line in Path(reasoning).read_text().splitlines():
            rec = json.loads(line)
            thoughts[rec["id"]] = rec["reasoning"]
    messages = {}
    for line in Path(prompts).read_text().splitlines():
        rec = json.loads(line)
        messages[rec["id"]] = rec["messages"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = 0
    for name in ("speculators.jsonl", "speculators.validation.jsonl"):
        rows = rows_for(tok, messages, Path(regenerated) / name, thoughts)
        tokens += sum(sum(r["loss_mask"]) for r in rows)
        with (out / name).open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    shutil.copy(Path(regenerated) / "speculators.export.json", out / "speculators.export.json")
    print(f"original answers: {out} ({tokens} supervised tokens)")


if __name__ == "__main__":
    main(*sys.argv[1:6])

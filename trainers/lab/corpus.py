"""The lab's text, all from this Python's own standard library (offline, no downloads).

Every public function or class of a fixed list of stdlib modules with a docstring becomes one
question about it. The items split by a hash of their name into two disjoint sets:
- the target's training set: a chat answer in the target's own style (a short reasoning that
  names the item, ``</think>``, the docstring's first sentence, end of turn), so the trained
  target has a chat format and answers that depend on the prompt;
- the lab's prompts: the same kind of question with an ORIGINAL assistant answer written by
  someone else (the docstring's whole first paragraph, no reasoning), as a public dataset's
  answers were written by another model or a person, never by the target.

usage: python corpus.py OUT_DIR [MAX_PROMPTS]   (writes target_train.jsonl, prompts.jsonl)
"""

import hashlib
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

MODULES = [
    "abc",
    "argparse",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "colorsys",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "math",
    "mimetypes",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "platform",
    "pprint",
    "queue",
    "random",
    "re",
    "secrets",
    "shlex",
    "shutil",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "unicodedata",
    "urllib.parse",
    "uuid",
    "warnings",
    "zipfile",
    "zlib",
]
QUESTIONS = (
    "What does {name} do?",
    "Explain {name}.",
    "Tell me about {name}.",
    "Describe {name} briefly.",
)
MAX_CHARS = 220


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def items() -> list[tuple[str, str, str, str]]:
    """(qualified name, kind, module, first paragraph of the docstring), sorted by name."""
    seen: dict[str, tuple[str, str, str, str]] = {}
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            para = re.sub(r"\s+", " ", doc.split("\n\n")[0]).strip()
            if len(para) < 20 or ">>>" in para or not para.isascii():
                continue
            kind = "class" if inspect.isclass(obj) else "function"
            seen.setdefault(f"{mod_name}.{attr}", (f"{mod_name}.{attr}", kind, mod_name, para))
    return sorted(seen.values())


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0][:MAX_CHARS]


def question(name: str) -> str:
    return QUESTIONS[_digest("q" + name) % len(QUESTIONS)].format(name=name)


def target_answer(name: str, kind: str, module: str, para: str) -> tuple[str, str]:
    """(reasoning, answer) in the target's style."""
    reasoning = f"The user asks about {name}, a {kind} in the {module} module."
    return reasoning, first_sentence(para)


def main(out_dir: str, max_prompts: int = 240) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, prompts = [], []
    for name, kind, module, para in items():
        if _digest(name) % 10 < 7:
            reasoning, answer = target_answer(name, kind, module, para)
            train.append({"question": question(name), "reasoning": reasoning, "answer": answer})
        elif len(prompts) < max_prompts:
            original = para[: MAX_CHARS * 2]
            prompts.append(
                {
                    "id": f"lab-{len(prompts):04d}",
                    "messages": [
                        {"role": "user", "content": question(name)},
                        {"role": "assistant", "content": original},
                    ],
                }
            )
    with (out / "target_train.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train)
    with (out / "prompts.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in prompts)
    print(f"corpus: {len(train)} target training answers, {len(prompts)} lab prompts -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))

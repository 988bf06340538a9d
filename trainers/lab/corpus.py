"""The lab's text, all from this Python's own standard library (offline, no downloads).

Every public function or class of a fixed list of stdlib modules with a docstring becomes one
question about it. The items split by a hash of their name into two disjoint sets:
- the target's training set: a chat answer in the target's own style (a short reasoning that
  names the item, ``</think>``, the docstring's first sentence, end of turn), so the trained
  target has a chat format and answers that depend on the prompt;
- the lab's prompts: the same kind of question with an ORIGINAL assistant answer written by
  someone else (the docstring's whole first paragraph, no reasoning), as a public dataset's
  answers were written by another model or a person, never by the target.

Beside them: ``reasoning.jsonl``, for each lab prompt a short reasoning by another writer (not
the target's sentence: other words, other order), so an "original answers with reasoning" draft
sees reasoning too; and ``prompts2.jsonl``, a second held-out set: questions about the items of
``SECOND_MODULES``, modules neither the target nor any draft trained on, checked only once the
tables are made (it decides nothing).

The data-rich variant (``rich``, for the selection table where data is redundant, issue #41):
the target's training set stays the same, and the lab's prompts are MAX_PROMPTS public
functions and classes with a docstring from the source files of every package installed in the
running interpreter's environment (read with ``ast``: nothing is imported), in an order fixed
by a hash of their names: thousands of items, none from the standard library modules above.

usage: python corpus.py OUT_DIR [MAX_PROMPTS [rich]]
       (writes target_train.jsonl, prompts.jsonl, reasoning.jsonl, prompts2.jsonl)
"""

import ast
import hashlib
import importlib
import inspect
import json
import re
import site
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
# The second held-out set's modules: in no other list, so no training data names their items.
SECOND_MODULES = [
    "ast",
    "codecs",
    "configparser",
    "contextlib",
    "graphlib",
    "io",
    "numbers",
    "optparse",
    "sched",
    "stat",
    "tarfile",
    "weakref",
    "zoneinfo",
]
# Another writer's reasoning (picked per item by a hash): it names what the target's does, in
# other words and order, so the difference left is whose text it is.
REASONINGS = (
    "Okay, {name} is from {module}; let me recall its documentation and summarize it.",
    "I need to explain the {kind} {name}. Its docs say what it is for.",
    "{module} provides {name}. I will describe this {kind} in one or two sentences.",
    "Let me think about {name} in Python's {module} library and what it does.",
)
QUESTIONS = (
    "What does {name} do?",
    "Explain {name}.",
    "Tell me about {name}.",
    "Describe {name} briefly.",
)
MAX_CHARS = 220


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def items(modules: list[str] = MODULES) -> list[tuple[str, str, str, str]]:
    """(qualified name, kind, module, first paragraph of the docstring), sorted by name."""
    seen: dict[str, tuple[str, str, str, str]] = {}
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            para = _paragraph(inspect.getdoc(obj) or "")
            if para is None:
                continue
            kind = "class" if inspect.isclass(obj) else "function"
            seen.setdefault(f"{mod_name}.{attr}", (f"{mod_name}.{attr}", kind, mod_name, para))
    return sorted(seen.values())


def _paragraph(doc: str) -> str | None:
    para = re.sub(r"\s+", " ", doc.split("\n\n")[0]).strip()
    return None if len(para) < 20 or ">>>" in para or not para.isascii() else para


def rich_items() -> list[tuple[str, str, str, str]]:
    """Items of every installed package's source (``ast``, no imports), hash-ordered."""
    seen: dict[str, tuple[str, str, str, str]] = {}
    for root in map(Path, site.getsitepackages()):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(p.startswith((".", "_")) or p in ("tests", "test") for p in rel.parts[:-1]):
                continue
            if rel.name.startswith("_") or not rel.parts[0].isidentifier():
                continue
            module = ".".join(rel.with_suffix("").parts)
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in tree.body:
                if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                    continue
                para = _paragraph(ast.get_docstring(node) or "")
                if node.name.startswith("_") or para is None:
                    continue
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                name = f"{module}.{node.name}"
                seen.setdefault(name, (name, kind, module, para))
    return sorted(seen.values(), key=lambda item: _digest(item[0]))


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0][:MAX_CHARS]


def question(name: str) -> str:
    return QUESTIONS[_digest("q" + name) % len(QUESTIONS)].format(name=name)


def target_answer(name: str, kind: str, module: str, para: str) -> tuple[str, str]:
    """(reasoning, answer) in the target's style."""
    reasoning = f"The user asks about {name}, a {kind} in the {module} module."
    return reasoning, first_sentence(para)


def other_reasoning(name: str, kind: str, module: str) -> str:
    """Another writer's reasoning about the item (not the target's sentence)."""
    template = REASONINGS[_digest("r" + name) % len(REASONINGS)]
    return template.format(name=name, kind=kind, module=module)


def _prompt(prefix: str, n: int, name: str, para: str) -> dict:
    return {
        "id": f"{prefix}-{n:04d}",
        "messages": [
            {"role": "user", "content": question(name)},
            {"role": "assistant", "content": para[: MAX_CHARS * 2]},
        ],
    }


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main(out_dir: str, max_prompts: int = 240, variant: str = "") -> None:
    if variant not in ("", "rich"):
        raise SystemExit(f"corpus.py: unknown variant {variant!r} (only 'rich')")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, prompts, reasoning = [], [], []
    lab_items = []
    for name, kind, module, para in items():
        if _digest(name) % 10 < 7:
            thought, answer = target_answer(name, kind, module, para)
            train.append({"question": question(name), "reasoning": thought, "answer": answer})
        else:
            lab_items.append((name, kind, module, para))
    for name, kind, module, para in (rich_items() if variant else lab_items)[:max_prompts]:
        prompts.append(_prompt("lab", len(prompts), name, para))
        reasoning.append(
            {"id": prompts[-1]["id"], "reasoning": other_reasoning(name, kind, module)}
        )
    second = sorted(items(SECOND_MODULES), key=lambda item: _digest(item[0]))
    count = min(40, max(16, len(prompts) // 5))
    prompts2 = [_prompt("second", i, it[0], it[3]) for i, it in enumerate(second[:count])]
    _write(out / "target_train.jsonl", train)
    _write(out / "prompts.jsonl", prompts)
    _write(out / "reasoning.jsonl", reasoning)
    _write(out / "prompts2.jsonl", prompts2)
    print(
        f"corpus: {len(train)} target training answers, {len(prompts)} lab prompts, "
        f"{len(prompts2)} second held-out prompts -> {out}"
    )


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]), *sys.argv[3:4])

"""(d) Prompts rendered to token ids per second: ``ChatTokenizer.render`` against a naive loop.

Why: every prompt passes through the chat template and the tokenizer on the client. The naive
way is one ``apply_chat_template(..., tokenize=True)`` per prompt over the request as SGLang's
chat path hands it to the template (``render: sglang_chat``, the default); ``render`` renders each
template to text and encodes the whole batch in one call to the Rust tokenizer. Both must give
the same ids (checked here on every prompt); only the speed may differ.

Runs in a child process per tokenizer, best of ``repeats`` alternating runs, wall clock and CPU:
the bundled Kimi-K2.5-style fast (Rust-backed) tokenizer gives the figure; the tiktoken one
(``kimi-k2.5-tiktoken``: remote code over tiktoken, Kimi-K2.5's real class path, a Python
tokenizer that encodes one text at a time) is reported beside it under ``tiktoken``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.common import REPO, TOKENIZER_DIR, emit, prompt_line, run_child

TOKENIZERS = {
    "mini": TOKENIZER_DIR,
    "tiktoken": REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-tiktoken",
}


def _child(n: int, repeats: int, tokenizer: str = "mini") -> dict[str, Any]:
    from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
    from eagle3_datagen.render import sglang_chat
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    tok = ChatTokenizer(str(TOKENIZERS[tokenizer]))
    prompts = []
    for i in range(n):
        parsed = parse_prompt(prompt_line(i).encode(), i + 1)
        assert isinstance(parsed, Prompt)
        prompts.append(parsed)

    fmt = sglang_chat.content_format(str(tok.tok.chat_template))

    def naive() -> list[list[int]]:
        out = []
        for p in prompts:
            messages, tools = sglang_chat.prepare(p.messages, p.tools, fmt)
            ids = tok.tok.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            out.append(list(ids))
        return out

    def batched() -> list[Any]:
        return tok.render(prompts)

    if batched() != naive():  # also the warm-up
        raise AssertionError("render() and apply_chat_template(tokenize=True) disagree")
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for name, fn in (("naive", naive), ("batched", batched)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            old = best.get(name)
            best[name] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
    tokens = sum(len(ids) for ids in batched())
    return {
        "tokenizer": f"{tokenizer} ({type(tok.tok).__name__}, fast={tok.tok.is_fast})",
        "prompts": n,
        "tokens_per_prompt": tokens / n,
        "naive_rate": n / best["naive"][0],
        "batched_rate": n / best["batched"][0],
        "naive_cpu_rate": n / best["naive"][1],
        "batched_cpu_rate": n / best["batched"][1],
    }


def measure(n: int, repeats: int = 3) -> dict[str, Any]:
    """The fast tokenizer's row, with the tiktoken tokenizer's row under ``tiktoken``."""
    rows = {}
    for name in TOKENIZERS:
        row = run_child("tokenize_rate", [str(n), str(repeats), "--tokenizer", name])
        row["speedup"] = row["batched_rate"] / row["naive_rate"]
        row["cpu_speedup"] = row["batched_cpu_rate"] / row["naive_cpu_rate"]
        rows[name] = row
    return {**rows["mini"], "tiktoken": rows["tiktoken"]}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("repeats", type=int)
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="mini")
    args = p.parse_args(argv)
    emit(_child(args.n, args.repeats, args.tokenizer))


if __name__ == "__main__":
    main(sys.argv[1:])

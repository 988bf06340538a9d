"""(d) Prompts rendered to token ids per second: ``ChatTokenizer.render`` against a naive loop.

Why: every prompt passes through the chat template and the tokenizer on the client. The naive
way is one ``apply_chat_template(..., tokenize=True)`` per prompt; ``render`` renders each
template to text and encodes the whole batch in one call to the Rust tokenizer. Both must give
the same ids (checked here on every prompt); only the speed may differ.

Runs in a child process with the bundled Kimi-K2.5-style tokenizer (a fast, Rust-backed
tokenizer). Best of ``repeats`` alternating runs, wall clock and CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.common import TOKENIZER_DIR, emit, prompt_line, run_child


def _child(n: int, repeats: int) -> dict[str, Any]:
    from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    tok = ChatTokenizer(str(TOKENIZER_DIR))
    prompts = []
    for i in range(n):
        parsed = parse_prompt(prompt_line(i).encode(), i + 1)
        assert isinstance(parsed, Prompt)
        prompts.append(parsed)

    def naive() -> list[list[int]]:
        return [
            list(tok.tok.apply_chat_template(p.messages, tools=p.tools, add_generation_prompt=True,
                                             tokenize=True, return_dict=False))
            for p in prompts
        ]  # fmt: skip

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
        "prompts": n,
        "tokens_per_prompt": tokens / n,
        "naive_rate": n / best["naive"][0],
        "batched_rate": n / best["batched"][0],
        "naive_cpu_rate": n / best["naive"][1],
        "batched_cpu_rate": n / best["batched"][1],
    }


def measure(n: int, repeats: int = 3) -> dict[str, Any]:
    row = run_child("tokenize_rate", [str(n), str(repeats)])
    row["speedup"] = row["batched_rate"] / row["naive_rate"]
    row["cpu_speedup"] = row["batched_cpu_rate"] / row["naive_cpu_rate"]
    return row


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("repeats", type=int)
    args = p.parse_args(argv)
    emit(_child(args.n, args.repeats))


if __name__ == "__main__":
    main(sys.argv[1:])

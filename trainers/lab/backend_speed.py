"""Tokens/s of the lab's transformers backend, as ratios in one process: plain decoding as one
batch, speculating as one batch, and speculating one request at a time (a batch of one each),
on the same held-out prompts, greedy; the three must give the same ids.

Why: a CPU is compute-bound at a batch of 8, so a verify step that computes 4 positions per
row for about 1.1 committed tokens costs more than it saves. This says by how much, on the
machine at hand, before a lab run is planned around a speculating generation run.

usage: OMP_NUM_THREADS=1 PYTHONPATH=src python backend_speed.py TARGET VALIDATION_JSONL DRAFT
       [PROMPTS=8] [MAX_NEW=64]
"""

import json
import sys
import time
from pathlib import Path

import torch
from real_measure import GREEDY, layers_of, prompt_of, serve, stop_ids

from sglang_emulator_transformers import Eagle3Chain, ModelGenerator, TransformersTarget


def main(target_dir: str, validation: str, draft: str, n: str = "8", max_new: str = "64") -> None:
    lines = Path(validation).read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()][: int(n)]
    prompts = [prompt_of(r) for r in rows]
    limit, stops = int(max_new), stop_ids(target_dir)
    torch.manual_seed(0)
    target = TransformersTarget(Path(target_dir), layers_of(Path(draft)))
    plain = ModelGenerator(target, None, 0)
    spec = ModelGenerator(target, Eagle3Chain(Path(draft), target), 3)

    def batch(gen: ModelGenerator) -> list:
        return serve(gen, rows, limit, stops)

    def alone(gen: ModelGenerator) -> list:
        return [gen.generate(p, GREEDY, 0, limit, stops) for p in prompts]

    seconds, results = {}, {}
    for name, run in (
        ("plain, one batch", lambda: batch(plain)),
        ("speculating, one batch", lambda: batch(spec)),
        ("speculating, one at a time", lambda: alone(spec)),
    ):
        t = time.perf_counter()
        results[name] = run()
        seconds[name] = time.perf_counter() - t
    ids = [[out for out, _ in r] for r in results.values()]
    if any(x != ids[0] for x in ids):
        raise SystemExit("the three ways gave different ids")
    tokens = sum(map(len, ids[0]))
    steps = sum(c.verify_ct for _, c in results["speculating, one batch"] if c)
    accept = tokens / max(steps, 1)
    print(f"{len(rows)} prompts, {tokens} output tokens, accept length {accept:.3f}; same ids")
    base = seconds["plain, one batch"]
    for name, s in seconds.items():
        print(f"{name}: {tokens / s:.1f} tokens/s ({s / base:.2f} x the plain batch's time)")


if __name__ == "__main__":
    main(*sys.argv[1:6])

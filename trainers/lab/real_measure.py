"""Held-out accept length of several drafts of the real target, in one process.

Why in-process: the real lab measures some thirty drafts; a server start loads torch, the
target and speculators each time. This runs the emulator's own transformers backend
(``sglang_emulator_transformers``: the target, the EAGLE-3 chain, the lossless verifier and
its counters, exactly what ``/generate`` runs) on each held-out prompt at temperature 0, with
the target loaded once. The plain (no draft) outputs are the lossless reference: every
draft's ids must equal them.

Per prompt it keeps (committed tokens, verify steps), the groups the bootstrap resamples.

usage: python real_measure.py TARGET VALIDATION_JSONL MAX_NEW OUT_JSON NAME=DRAFT_DIR...
"""

import copy
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from sglang_emulator.sampling import Sampling
from sglang_emulator_transformers import Eagle3Chain, ModelGenerator, TransformersTarget

GREEDY = Sampling(temperature=0.0, top_k=1)


def prompt_of(row: dict) -> list[int]:
    mask = row["loss_mask"]
    return row["input_ids"][: mask.index(1) if 1 in mask else len(mask)]


def stop_ids(target_dir: str) -> frozenset[int]:
    tok = AutoTokenizer.from_pretrained(target_dir)
    ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    return frozenset(i for i in ids if isinstance(i, int) and i >= 0)


class PrefillCache:
    """The target with each prompt's prefill computed once: every draft (and the plain
    reference) starts from a copy of the same KV cache, features and logits."""

    def __init__(self, target: TransformersTarget) -> None:
        self.target = target
        self.model = target.model
        self.aux_layers = target.aux_layers
        self.saved: dict[tuple[int, ...], tuple] = {}

    def forward(self, state, new):  # type: ignore[no-untyped-def]
        return self.target.forward(state, new)

    def prefill(self, prompt: list[int]):  # type: ignore[no-untyped-def]
        key = tuple(prompt)
        if key not in self.saved:
            self.saved[key] = self.target.prefill(prompt)
        state, logits = self.saved[key]
        return copy.deepcopy(state), logits


def layers_of(draft: Path) -> tuple[int, ...]:
    config = json.loads((draft / "config.json").read_text())
    return tuple(config["eagle_aux_hidden_state_layer_ids"])


def main(target_dir: str, validation: str, max_new: str, out: str, *drafts: str) -> None:
    rows = [json.loads(x) for x in Path(validation).read_text().splitlines() if x.strip()]
    limit = int(max_new)
    stops = stop_ids(target_dir)
    torch.manual_seed(0)
    named = [d.split("=", 1) for d in drafts]
    layers = layers_of(Path(named[0][1])) if named else (1, 2, 3)
    target = PrefillCache(TransformersTarget(Path(target_dir), layers))
    t0 = time.monotonic()
    plain = ModelGenerator(target, None, 0)
    reference = [plain.generate(prompt_of(r), GREEDY, 0, limit, stops)[0] for r in rows]
    result: dict = {
        "ids": [r["id"] for r in rows],
        "max_new_tokens": limit,
        "plain": {"tokens": sum(map(len, reference)), "seconds": time.monotonic() - t0},
        "drafts": {},
    }
    for name, path in named:
        t0 = time.monotonic()
        generator = ModelGenerator(target, Eagle3Chain(Path(path), target), 3)
        groups, mismatches = [], 0
        for row, want in zip(rows, reference, strict=True):
            ids, counters = generator.generate(prompt_of(row), GREEDY, 0, limit, stops)
            mismatches += ids != want
            steps = counters.verify_ct if counters else 0
            groups.append([len(ids), steps])
        tokens = sum(g[0] for g in groups)
        steps = sum(g[1] for g in groups)
        result["drafts"][name] = {
            "path": path,
            "groups": groups,
            "accept_length": tokens / steps if steps else None,
            "mismatches": mismatches,
            "seconds": round(time.monotonic() - t0, 1),
        }
        print(f"{name}: accept length {tokens / max(steps, 1):.3f}, {mismatches} mismatches")
    Path(out).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    random.seed(0)
    main(*sys.argv[1:])

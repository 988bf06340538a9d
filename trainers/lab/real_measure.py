"""Held-out accept length of several drafts of the real target, in one process.

Every draft on every held-out prompt, by replay (replay.py): at temperature 0 the lossless
verifier commits the target's greedy output whatever the draft proposes, so the verify steps
follow from one forward of the target over prompt + output and one of the draft over the same
positions. The output is the generation run's own (the export's held-out rows), checked to be
the target's argmax at every position.

On a sample (``--live N``: the first N held-out prompts, for the seed-0 drafts of the
untrained, original and regenerated sets), the emulator's own speculating loop also runs
(``sglang_emulator_transformers``: the target, the EAGLE-3 chain, the lossless verifier and its
counters, exactly what ``/generate`` runs) with the plain output (no draft) as the lossless
reference: every live draft's ids must equal it, and the live counts are compared with the
replayed ones (float rounding can move a near tie).

Per prompt it keeps (committed tokens, verify steps), the groups the bootstrap resamples.

usage: python real_measure.py TARGET VALIDATION_JSONL MAX_NEW OUT_JSON [--live N] NAME=DRAFT...
"""

import json
import random
import sys
import time
from pathlib import Path

import torch
from replay import chains, load_draft, reference, walk
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


def serve(generator: ModelGenerator, rows: list[dict], limit: int, stops: frozenset[int]) -> list:
    """The rows' prompts served as the emulator serves them: one batch, greedy."""
    n = len(rows)
    return generator.generate_many(
        [prompt_of(r) for r in rows], [GREEDY] * n, [0] * n, [limit] * n, [stops] * n, [None] * n
    )


def layers_of(draft: Path) -> tuple[int, ...]:
    config = json.loads((draft / "config.json").read_text())
    return tuple(config["eagle_aux_hidden_state_layer_ids"])


LIVE_SETS = ("untrained", "original", "regenerated")


def output_of(row: dict) -> list[int]:
    """The generation run's output: the supervised span after the prompt."""
    mask = row["loss_mask"]
    first, last = mask.index(1), len(mask) - 1 - mask[::-1].index(1)
    return row["input_ids"][first : last + 1]


def main(target_dir: str, validation: str, max_new: str, out: str, *args: str) -> None:
    live_n = int(args[1]) if args[:1] == ("--live",) else 0
    drafts = args[2:] if live_n else args
    rows = [json.loads(x) for x in Path(validation).read_text().splitlines() if x.strip()]
    limit = int(max_new)
    stops = stop_ids(target_dir)
    torch.manual_seed(0)
    named = [d.split("=", 1) for d in drafts]
    layers = layers_of(Path(named[0][1])) if named else (1, 2, 3)
    target = TransformersTarget(Path(target_dir), layers)
    t0 = time.monotonic()
    refs = [reference(target.model, layers, prompt_of(r), output_of(r)) for r in rows]
    sample = rows[:live_n]
    t1 = time.monotonic()
    live_ref = [ids for ids, _ in serve(ModelGenerator(target, None, 0), sample, limit, stops)]
    result: dict = {
        "ids": [r["id"] for r in rows],
        "max_new_tokens": limit,
        "reference_seconds": round(t1 - t0, 1),
        "reference_breaks": sum(r.greedy_breaks for r in refs),
        "live_prompts": len(sample),
        "live_reference_differs": sum(a != r.output for a, r in zip(live_ref, refs, strict=False)),
        "plain": {"tokens": sum(map(len, live_ref)), "seconds": time.monotonic() - t1},
        "drafts": {},
    }
    for name, path in named:
        t0 = time.monotonic()
        model = load_draft(Path(path))
        groups = [list(walk(ref, chains(model, ref, 3))) for ref in refs]
        entry: dict = {
            "path": path,
            "groups": groups,
            "accept_length": sum(g[0] for g in groups) / max(sum(g[1] for g in groups), 1),
            "mismatches": 0,
            "replay_seconds": round(time.monotonic() - t0, 1),
        }
        set_name, _, seed = name.rpartition("-")
        if sample and set_name in LIVE_SETS and seed == "0":
            t0 = time.monotonic()
            generator = ModelGenerator(target, Eagle3Chain(Path(path), target), 3)
            live = []
            for (ids, counters), want in zip(
                serve(generator, sample, limit, stops), live_ref, strict=True
            ):
                entry["mismatches"] += ids != want
                live.append([len(ids), counters.verify_ct if counters else 0])
            entry["live_groups"] = live
            entry["live_steps"] = sum(g[1] for g in live)
            entry["replay_steps_on_live"] = sum(g[1] for g in groups[: len(sample)])
            entry["replay_disagreements"] = sum(a != b for a, b in zip(live, groups, strict=False))
            entry["seconds"] = round(time.monotonic() - t0, 1)
        result["drafts"][name] = entry
        print(
            f"{name}: accept length {entry['accept_length']:.3f}"
            + (
                f"; live on {len(sample)} prompts: {entry['mismatches']} mismatches, "
                f"{entry['replay_disagreements']} prompts where replay differs"
                if "live_groups" in entry
                else ""
            )
        )
    Path(out).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    random.seed(0)
    main(*sys.argv[1:])

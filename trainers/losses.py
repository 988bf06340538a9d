"""Read both trainers' training logs, assert >= 30 steps each and a falling loss, write JSON.

speculators logs ``train/loss=`` per step and ``val/loss_epoch=`` per epoch (rich logging;
run with a wide COLUMNS so values are not wrapped). SpecForge prints ``step N: {...}`` per
step, with ``loss`` (the sum of its TTT position losses) for training and eval metrics every
eval_interval steps. One record per SpecForge step, so its per-step loss swings with the
record; the falling loss is read from its held-out evaluations and from thirds of the run.

usage: python3 losses.py SPECULATORS_LOG SPECFORGE_LOG OUT_JSON
"""

import ast
import json
import re
import sys
from pathlib import Path

MIN_STEPS = 30


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def speculators(text: str) -> dict:
    train = [float(v) for v in re.findall(r"train/loss=([-0-9.e+]+)", text)]
    val = [float(v) for v in re.findall(r"val/loss_epoch=([-0-9.e+]+)", text)]
    return {
        "steps": len(train),
        "train_loss": train,
        "val_loss_per_epoch": val,
        "first5": mean(train[:5]),
        "last5": mean(train[-5:]),
    }


def specforge(text: str) -> dict:
    train, evals = [], []
    for m in re.finditer(r"^step (\d+): (\{.*\})$", text, re.M):
        metrics = ast.literal_eval(m.group(2))
        if "loss" in metrics:
            train.append(float(metrics["loss"]))
        found = {k: v for k, v in metrics.items() if k.startswith("eval") and "loss" in k}
        if found:
            evals.append({"step": int(m.group(1)), **found})
    third = max(1, len(train) // 3)
    return {
        "steps": len(train),
        "train_loss": train,
        "evals": evals,
        "first_third": mean(train[:third]),
        "last_third": mean(train[-third:]),
    }


def main(spec_log: str, sf_log: str, out: str) -> None:
    spec = speculators(Path(spec_log).read_text())
    sf = specforge(Path(sf_log).read_text())
    result = {"speculators": spec, "specforge": sf}
    Path(out).write_text(json.dumps(result, indent=1))
    print(
        f"speculators: {spec['steps']} steps, loss {spec['first5']:.3f} (first 5) -> "
        f"{spec['last5']:.3f} (last 5); validation per epoch {spec['val_loss_per_epoch']}"
    )
    print(
        f"SpecForge: {sf['steps']} steps, loss {sf['first_third']:.3f} (first third) -> "
        f"{sf['last_third']:.3f} (last third); evaluations {sf['evals']}"
    )
    assert spec["steps"] >= MIN_STEPS and sf["steps"] >= MIN_STEPS, "fewer than 30 steps"
    assert spec["last5"] < spec["first5"], "speculators: the loss did not fall"
    assert sf["last_third"] < sf["first_third"], "SpecForge: the loss did not fall"
    if len(spec["val_loss_per_epoch"]) >= 2:
        assert spec["val_loss_per_epoch"][-1] < spec["val_loss_per_epoch"][0]


if __name__ == "__main__":
    main(*sys.argv[1:4])

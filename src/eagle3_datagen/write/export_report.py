"""What a trainer needs to be told about an export: lengths against its maximum, the settings
to pass, what was left out. Printed by ``eagle3-datagen export`` and written beside the files,
because both trainers clip long records to their maximum without a word (SpecForge silently,
speculators with one log line) and neither carries our metadata into training.

The conventions below were checked by running each trainer's own loading and shift code on
our exports (``trainers/run.sh``; recorded outputs in ``tests/fixtures/trainers/``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Trainer:
    """One trainer's conventions for pre-tokenized rows."""

    name: str
    checked_version: str
    default_max_length: int
    max_length_setting: str  # where the user sets it
    # SpecForge trains the feature position the loss mask marks to predict two tokens on, so
    # the draft's first proposal after prefill (features of the last prompt token plus output
    # token 0, predicting output token 1) is trained only when the last prompt token is marked.
    # speculators' shift marks the predicted token itself: prompt 0, output 1 is its own rule.
    mask_last_prompt_token: bool


TRAINERS: dict[str, Trainer] = {
    "specforge": Trainer("SpecForge", "0.2.0", 2048, "data.max_length", True),
    "speculators": Trainer(
        "speculators", "0.9.0", 8192, "prepare-data --seq-length and train --total-seq-len", False
    ),
}

_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def trained_positions(fmt: str) -> str:
    """Which positions the loss mask marks, and what the trainer's shift makes of them."""
    if TRAINERS[fmt].mask_last_prompt_token:
        return (
            "loss_mask 1 on the last prompt token and every output token (SpecForge's "
            "shift trains the marked feature position to predict two tokens on): every "
            "output token is trained as the draft's input, the first with the last prompt "
            "token's features (the first proposal after prefill)"
        )
    return (
        "loss_mask 1 on every output token (speculators' shift_batch pairs the mask with "
        "the predicted token): every output token is trained as the draft's input, the "
        "first with the last prompt token's features (the first proposal after prefill)"
    )


def _quantile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def length_summary(lengths: list[int], max_length: int) -> dict[str, Any]:
    """Distribution of record lengths (prompt + output tokens) against ``max_length``."""
    values = sorted(lengths)
    over = [n for n in values if n > max_length]
    hist: dict[str, int] = {}
    for n in values:
        i = bisect.bisect_left(_BUCKETS, n)
        key = f"<={_BUCKETS[i]}" if i < len(_BUCKETS) else f">{_BUCKETS[-1]}"
        hist[key] = hist.get(key, 0) + 1
    return {
        "records": len(values),
        "tokens": sum(values),
        "min": values[0] if values else 0,
        "p50": _quantile(values, 0.5) if values else 0,
        "p90": _quantile(values, 0.9) if values else 0,
        "p99": _quantile(values, 0.99) if values else 0,
        "max": values[-1] if values else 0,
        "histogram": hist,
        "max_length": max_length,
        "over_max_length": len(over),
        "tokens_past_max_length": sum(n - max_length for n in over),
    }


def fit_length(longest: int) -> int:
    """A max length that trains every token of the longest record (rounded up to 64)."""
    return max(64, -(-longest // 64) * 64)


def settings(
    fmt: str, files: dict[str, Path | None], max_length: int, n_train: int, n_val: int
) -> list[str]:
    """The exact settings to pass the trainer for these files."""
    train, val = files["train"], files.get("validation")
    if fmt == "specforge":
        lines = [
            f"data.prompts_path: {train}      # pre-tokenized rows: used as they are, no chat "
            "template (data.chat_template and data.is_preformatted are not read for them)",
            f"data.max_length: {max_length}",
            "never data.train_data_path for these files: that path re-renders conversations "
            "with SpecForge's own template (its default system prompt), not the model's ids",
            "offline (data.hidden_states_path): compute the features from these rows "
            "(input_ids and loss_mask as written; see docs/exports.md, 'From dataset to drafter')",
        ]
        if val is not None and n_val:
            lines.append(
                f"validation: features of {val} as data.eval_hidden_states_path, with "
                "training.eval_interval > 0 (SpecForge evaluates offline data only)"
            )
        return lines
    lines = [
        f"speculators prepare-data --data {train} --seq-length {max_length}   "
        "(pre-tokenized rows pass through: no --render-endpoint, no chat template)",
        f"speculators train ... --total-seq-len {max_length}",
    ]
    if val is not None and n_val:
        ratio = (n_train + 0.5) / (n_train + n_val)
        lines += [
            f"validation split by conversation: prepare {val} the same way into its own "
            "directory, join the two prepared directories train-first "
            "(trainers/speculators_join.py), then train on the joined directory with "
            f"--train-data-ratio {ratio:.6f} (= rows of the train part; speculators holds out "
            "the rows after int(rows * ratio))",
        ]
    else:
        lines.append(
            "no validation rows: speculators holds out the last rows after prepare-data's shuffle "
            "(--train-data-ratio, default 0.9); it drops primary_id, so the turns and samples of "
            "one conversation can land on both sides"
        )
    return lines


def _left_out(meta: dict[str, Any]) -> list[str]:
    """What of the dataset the export does not hold, and why (empty when it holds it all)."""
    counts = meta["counts"]
    parts = []
    if counts.get("images_left_out"):
        parts.append(f"{counts['images_left_out']} image records (by design, see below)")
    if counts["truncated_dropped"]:
        parts.append(f"{counts['truncated_dropped']} truncated (--truncated drop)")
    if counts["over_length_dropped"]:
        parts.append(
            f"{counts['over_length_dropped']} longer than the max length (--over-length drop)"
        )
    if not parts:
        return []
    return [f"left out of the dataset's {counts['records']} records: " + ", ".join(parts)]


def _length_lines(meta: dict[str, Any]) -> list[str]:
    trainer = TRAINERS[meta["format"]]
    lengths, opts = meta["lengths"], meta["options"]
    which = "the exported rows"
    if meta["counts"]["over_length_dropped"]:
        which += " and those --over-length drop left out"
    out = [
        f"lengths (prompt + output tokens) of {lengths['records']} records ({which}): "
        f"min {lengths['min']}, p50 {lengths['p50']}, p90 {lengths['p90']}, "
        f"p99 {lengths['p99']}, max {lengths['max']}",
        "  " + ", ".join(f"{k}: {v}" for k, v in lengths["histogram"].items()),
        f"max length {opts['max_length']} ({trainer.max_length_setting}; "
        f"{trainer.name}'s default is {trainer.default_max_length}): "
        f"{lengths['over_max_length']} records longer",
    ]
    if lengths["over_max_length"]:
        verb = {"keep": "WILL BE CLIPPED by the trainer", "drop": "left out (--over-length drop)"}
        out.append(
            f"  {lengths['over_max_length']} records {verb[opts['over_length']]} "
            f"({lengths['tokens_past_max_length']} tokens past the maximum); "
            f"--max-length {fit_length(lengths['max'])} trains every token"
        )
    return out


def _split_lines(split: dict[str, Any]) -> list[str]:
    """How many conversations the export left out of training for the dataset's eval, and why
    (or that it held nothing out, on request)."""
    if not split.get("held_out", True):
        return [
            "held out: nothing (--no-holdout): every conversation is in the training file, so "
            "`eagle3-datagen eval` cannot measure a draft trained on it on this dataset "
            "(eval --train-export refuses it)"
        ]
    return [
        f"held out: {split['validation_conversations']} of {split['conversations']} "
        "conversations, in the validation file, never in the training one: the dataset's eval "
        f"split ({split.get('file', 'split.json')}, id {split.get('id')}: validation "
        f"{split['validation']}, seed {split['seed']}, by {split['key']}); `eagle3-datagen "
        "eval` measures drafts on exactly these",
        f"repeated prompts: {split.get('duplicates_moved_to_train', 0)} held-out "
        "conversations moved to train (their first prompt is also a training one)"
        + (
            f"; {split['joined_held_out_prompt']} new ones held out (their first prompt is a "
            "held-out one)"
            if split.get("joined_held_out_prompt")
            else ""
        ),
    ]


def report_lines(meta: dict[str, Any]) -> list[str]:
    """The human-readable report of an export's metadata (``<out>.export.json``)."""
    trainer = TRAINERS[meta["format"]]
    opts, counts = meta["options"], meta["counts"]
    out = [
        f"export for {trainer.name} (conventions checked with {trainer.name} "
        f"{trainer.checked_version}): {counts['written']['train']} train"
        + (f", {counts['written']['validation']} validation" if meta["files"]["validation"] else "")
        + " records",
        *_left_out(meta),
        f"trained positions: {meta['trained_positions']}",
        *_length_lines(meta),
        f"truncated records (finish_reason length): {counts['truncated']} "
        f"({opts['truncated']}; listed in the metadata file, the trainers do not carry the flag)",
    ]
    images = meta.get("images") or {}
    if images.get("left_out"):
        out.append(f"{images['left_out']} {images['reason']}; listed in the metadata file")
    out += _split_lines(meta["split"])
    out.append("settings (paths relative to the export's directory, where this report is):")
    out += [f"  {line}" for line in meta["settings"]]
    return out

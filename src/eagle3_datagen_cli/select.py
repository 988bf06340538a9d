"""``eagle3-datagen select``: a new dataset of the conversations a rule ranks first (offline:
no Prefect, no server; docs/select.md)."""

from __future__ import annotations

import argparse
from typing import Any

from eagle3_datagen_cli.arguments import add_dataset

RULES = ("flatness", "deviation", "acceptance", "random")
# What the CPU lab measured (docs/selection-lab.md, docs/lab-real.md, trainers/lab/RESULTS.md):
# shown by --help, so that nobody spends GPU hours on a rule expecting it to beat random.
MEASURED = (
    "Measured on the CPU lab (docs/selection-lab.md, docs/lab-real.md): no rule has beaten a "
    "random selection of the same size and training compute. On the tiny target at --keep "
    "0.5 no rule's draft was ahead of random by more than two random halves differ from each "
    "other, and every half "
    "cost accept length against the full data. On SmolLM2-135M-Instruct (3 seeds each, "
    "paired 95% intervals) flatness and deviation against random at 0.5 and 0.25: no "
    "difference, all four (flatness at 0.5: +0.012, -0.001 to +0.026), while half the data "
    "cost 0.045 of accept length against all of it. With more data on the tiny target "
    "(3 seeds) flatness and deviation beat random by about 0.05 only because their halves "
    "held more tokens and trained about 28% longer; at the same training steps both were "
    "slightly below random (-0.012 and -0.014). Keep all the data, or use --by random when a "
    "budget forces a cut, unless your own measurement at the same compute shows a rule ahead."
)


def cmd_select(args: argparse.Namespace) -> int:
    from eagle3_datagen.select.output import select_dataset

    outcome = select_dataset(args.dataset, args.output, args.by, args.keep, args.seed)
    params = ", ".join(f"{k}={v}" for k, v in outcome.request.params.items())
    rule = f"{outcome.request.rule}" + (f" ({params})" if params else "")
    held = outcome.held_out or {}
    for name, choice in outcome.partitions.items():
        unscored = f", {choice.unscored} without a score" if choice.unscored else ""
        print(
            f"{name}: kept {len(choice.kept)} of {choice.conversations} training conversations"
            f"{unscored}; {len(held.get(name, ()))} held-out conversations copied as they are "
            "(the source's eval split, never ranked)"
        )
    verb = "already selected" if outcome.already_done else "selected"
    print(f"{verb} by {rule}, keep {args.keep}, seed {args.seed} -> {outcome.root}")
    return 0


def add_commands(sub: Any) -> None:
    select = sub.add_parser(
        "select",
        help="write a new dataset of the conversations a rule ranks first (docs/select.md)",
        description="Write a new dataset of the conversations a rule ranks first (docs/select.md).",
        epilog=MEASURED,
    )
    add_dataset(select)
    select.add_argument(
        "--by",
        required=True,
        choices=RULES,
        metavar="RULE",
        help="flatness (highest target entropy; needs logprobs top_k > 0), deviation (most "
        "draft tokens rejected, or without a draft lowest p(sampled)), acceptance (lowest "
        f"accept length; needs server.speculative), random (the control): one of {RULES}",
    )
    select.add_argument(
        "--keep",
        required=True,
        type=float,
        metavar="FRACTION",
        help="the fraction of each partition's conversations to keep, in (0, 1]",
    )
    select.add_argument(
        "--output", required=True, metavar="DIR", help="the new dataset's directory"
    )
    select.add_argument(
        "--seed", type=int, default=0, help="seed of the random rule and of every tie-break"
    )
    select.set_defaults(func=cmd_select)

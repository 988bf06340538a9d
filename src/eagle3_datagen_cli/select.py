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
    "random selection of the same size and training compute. On SmolLM2-135M-Instruct (3 "
    "seeds each, paired 95% intervals) flatness, deviation and acceptance (ranked by a "
    "speculating run with the draft one had before) against random at 0.5 and 0.25: no "
    "difference, all six (the largest, flatness at 0.5: +0.019, -0.003 to +0.041). On the "
    "tiny target where the data was redundant (a random half trained as long as all of it was "
    "within the noise of it) deviation tied random, and flatness and acceptance were below it "
    "(-0.047 and -0.124, intervals clear of 0); rules that seemed ahead at the same epochs "
    "kept longer conversations and so trained longer. What did save generation was generating "
    "less: on both targets a random half trained for as many steps as all the data matched it. "
    "Keep all the data, or use --by random when a budget forces a cut; to find out whether "
    "your data is redundant, train a draft on a random half for as many steps as on all of it."
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

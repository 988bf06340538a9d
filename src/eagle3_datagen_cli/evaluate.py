"""``eagle3-datagen eval``: a draft's accept length on the dataset's held-out split, measured
by a speculating server (docs/eval.md). Exit 0 when the gate passes (or cannot tell a drop
from noise: said on stderr), 1 when the accept length dropped past ``--max-drop`` from the
baseline beyond noise (the reason in one line), 2 on bad input (one line, nothing written)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from eagle3_datagen_cli.arguments import add_dataset


def cmd_eval(args: argparse.Namespace) -> int:
    from eagle3_datagen.evaluate.gate import INCONCLUSIVE
    from eagle3_datagen.evaluate.run import EvalOptions, run_eval

    options = EvalOptions(
        dataset=args.dataset,
        server_url=args.server_url,
        validation=args.validation,
        seed=args.seed,
        resplit=args.resplit,
        min_records=args.min_records,
        train_export=args.train_export,
        json_path=args.json,
        baseline=args.baseline,
        max_drop=args.max_drop,
        concurrency=args.concurrency,
        draft=args.draft,
        tokenizer=args.tokenizer,
        api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
        record_history=not args.no_history,
    )
    result = run_eval(options)
    print("\n".join(result.lines()))
    if args.json:
        print(f"json: {args.json}")
    if not result.ok:
        print(f"eagle3-datagen: eval gate failed: {result.reason}", file=sys.stderr)
        return 1
    if result.data["gate"].get("verdict") == INCONCLUSIVE:
        print(f"eagle3-datagen: eval {result.verdict}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """The eval subcommand."""
    ev = sub.add_parser(
        "eval", help="a draft's accept length on the held-out split, from a speculating server"
    )
    add_dataset(ev)
    ev.add_argument(
        "--server-url", required=True, metavar="URL", help="an SGLang server that speculates"
    )
    ev.add_argument(
        "--validation",
        type=float,
        metavar="F",
        help="held-out fraction of conversations, only where the dataset has no split yet "
        "(default 0.05; later: the dataset's split.json, a different F is refused)",
    )
    ev.add_argument(
        "--seed",
        type=int,
        help="the split's seed, as --validation (default 0; the export's --split-seed)",
    )
    ev.add_argument(
        "--resplit",
        action="store_true",
        help="replace the dataset's split (drafts trained on the old one can then no longer "
        "be evaluated on it)",
    )
    ev.add_argument(
        "--min-records",
        type=int,
        default=50,
        metavar="N",
        help="refuse fewer held-out records than this before sending any (default 50)",
    )
    ev.add_argument(
        "--train-export",
        metavar="PATH",
        help="the export the draft trained on (its JSONL, its .provenance.json, or a directory "
        "holding that file): refuse if an eval conversation is in its training file",
    )
    ev.add_argument("--json", metavar="PATH", help="write the result as JSON")
    ev.add_argument(
        "--baseline",
        metavar="PATH|history",
        help="an earlier eval JSON, or 'history': the dataset's last recorded eval",
    )
    ev.add_argument(
        "--max-drop",
        type=float,
        default=0.1,
        metavar="TOKENS",
        help="fail (exit 1) when the accept length is more than this below the baseline's",
    )
    ev.add_argument("--concurrency", type=int, default=32, help="requests in flight at most")
    ev.add_argument(
        "--draft", metavar="DIR", help="the server's draft directory, to check it fits the target"
    )
    ev.add_argument("--tokenizer", metavar="PATH", help="override the recorded tokenizer path")
    ev.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the server's API key"
    )
    ev.add_argument(
        "--no-history", action="store_true", help="do not add the eval to the dataset's history"
    )
    ev.set_defaults(func=cmd_eval)

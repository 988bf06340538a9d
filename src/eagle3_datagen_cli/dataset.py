"""``eagle3-datagen validate``, ``export``, ``history``, ``coverage`` and ``rejects``: a finished
dataset, read offline (no Prefect, no server)."""

from __future__ import annotations

import argparse
from typing import Any

from eagle3_datagen.errors import ConfigError
from eagle3_datagen_cli.arguments import add_dataset


def cmd_validate(args: argparse.Namespace) -> int:
    import orjson

    from eagle3_datagen.validate.dataset import validate_dataset

    report = validate_dataset(args.dataset, tokenizer=args.tokenizer, inputs=args.input)
    if args.json:
        print(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace) -> int:
    from eagle3_datagen.write.export import ExportOptions, export_dataset, sibling

    options = ExportOptions(
        truncated="drop" if args.skip_truncated else args.truncated,
        over_length=args.over_length,
        max_length=args.max_length,
        validation=args.validation,
        split_seed=args.split_seed,
        hold_out=not args.no_holdout,
        resplit=args.resplit,
    )
    result = export_dataset(
        args.dataset, args.format, args.output, options=options, tokenizer=args.tokenizer
    )
    print("\n".join(result.report()))
    parts = ", ".join(f"{k}={v}" for k, v in result.written.items())
    skipped = f", {result.skipped_truncated} truncated skipped" if result.skipped_truncated else ""
    print(f"exported {result.total} records ({parts}){skipped} as {args.format} -> {result.path}")
    print(
        f"metadata, report and provenance: {result.metadata_path}, {result.report_path}, "
        f"{sibling(result.path, 'provenance')}"
    )
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """The runs recorded in output directories, side by side, then their evals (no Prefect:
    read from disk); ``--evals``: the evals only."""
    from eagle3_datagen.report.history import (
        EVAL_COLUMNS,
        eval_rows,
        history_rows,
        history_text,
        read_history,
    )

    entries = [e for d in args.dataset for e in read_history(d)]
    if not entries:
        raise ConfigError(f"no runs recorded in {', '.join(args.dataset)} (no history.jsonl)")
    last = (lambda rows: rows[-args.last :]) if args.last else (lambda rows: rows)
    evals = last(eval_rows(entries))
    if args.evals:
        print(history_text(evals, EVAL_COLUMNS) if evals else "no evals recorded")
        return 0
    print(history_text(last(history_rows(entries, args.partition, all_attempts=args.all_attempts))))
    if evals:
        print()
        print(history_text(evals, EVAL_COLUMNS))
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    """The dataset beside a serving profile: ``--config``'s, else the one the run recorded in
    the manifest, else the data's own mix; exit 1 with ``--strict`` when a dimension is
    flagged."""
    import orjson

    from eagle3_datagen.config import ServingProfile, load_config
    from eagle3_datagen.report.coverage import coverage_text, dataset_coverage
    from eagle3_datagen.write.manifest import MANIFEST, PROFILE, read_manifest

    profile, source = None, "none: the data's own mix"
    if args.config:
        profile = load_config(args.config).serving_profile
        if profile is None:
            raise ConfigError(f"{args.config}: declares no serving_profile")
        source = args.config
    elif (recorded := (read_manifest(args.dataset) or {}).get(PROFILE)) is not None:
        try:
            profile = ServingProfile.model_validate(recorded)
        except ValueError as err:
            raise ConfigError(f"{args.dataset}/{MANIFEST}: {PROFILE}: {err}") from err
        source = f"{args.dataset}/{MANIFEST} (the run's config)"
    cov = dataset_coverage(args.dataset, profile, partitions=args.partition)
    if args.json:
        print(
            orjson.dumps(
                {**cov.to_dict(), "profile_from": source}, option=orjson.OPT_INDENT_2
            ).decode()
        )
    else:
        print(f"profile: {source}")
        print(coverage_text(cov))
    return 1 if args.strict and cov.flagged else 0


def cmd_rejects(args: argparse.Namespace) -> int:
    """Every rejected line of the dataset, ``file:line: reason`` each, then the count."""
    from eagle3_datagen.report.rejected_lines import rejected_lines

    lines = rejected_lines(args.dataset, args.partition)
    for one in lines:
        print(one.text())
    print(f"{len(lines)} rejected in {args.dataset}")
    return 0


def _add_rejects(sub: Any) -> None:
    rejects = sub.add_parser(
        "rejects", help="every rejected line of a dataset: file:line: reason (rejects/*.parquet)"
    )
    rejects.add_argument("dataset", metavar="DIR", help="the run's output directory")
    rejects.add_argument("--partition", action="append", metavar="NAME", help="only this one")
    rejects.set_defaults(func=cmd_rejects)


def _add_coverage(sub: Any) -> None:
    coverage = sub.add_parser(
        "coverage",
        help="the dataset's mix beside the config's serving profile, off dimensions flagged",
    )
    add_dataset(coverage)
    coverage.add_argument(
        "--config",
        metavar="CONFIG",
        help="the config whose serving_profile to compare with (default: the run's, recorded "
        "in the manifest)",
    )
    coverage.add_argument("--partition", action="append", metavar="NAME", help="only this one")
    coverage.add_argument(
        "--strict", action="store_true", help="exit 1 when any dimension is flagged"
    )
    coverage.add_argument("--json", action="store_true", help="print the table as JSON")
    coverage.set_defaults(func=cmd_coverage)


def _add_validate(sub: Any) -> None:
    validate = sub.add_parser(
        "validate", help="re-validate every record of a finished dataset (exit 1 if any fails)"
    )
    add_dataset(validate)
    validate.add_argument(
        "--tokenizer", metavar="PATH", help="tokenizer path, if it moved since the run"
    )
    validate.add_argument("--json", action="store_true", help="print the report as JSON")
    validate.add_argument(
        "--input",
        action="store_true",
        help="also check the dataset against its input files (the paths in the manifest): "
        "unchanged, every line once, every record's prompt the current line's",
    )
    validate.set_defaults(func=cmd_validate)


def _add_export(sub: Any) -> None:
    export = sub.add_parser("export", help="write a dataset as a trainer's JSONL")
    add_dataset(export)
    export.add_argument("--format", required=True, choices=["specforge", "speculators"])
    export.add_argument("--output", required=True, metavar="PATH", help="JSONL file to write")
    export.add_argument(
        "--truncated",
        choices=["keep", "drop", "refuse"],
        default="keep",
        help="length-truncated records: keep (listed in the metadata), drop, or refuse to export",
    )
    export.add_argument("--skip-truncated", action="store_true", help="same as --truncated drop")
    export.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help="the trainer's max length (default: its own, SpecForge 2048, speculators 8192)",
    )
    export.add_argument(
        "--over-length",
        choices=["keep", "drop", "refuse"],
        default="keep",
        help="records longer than --max-length, which the trainer clips: keep (reported), "
        "drop, or refuse to export",
    )
    export.add_argument(
        "--validation",
        type=float,
        metavar="FRACTION",
        help="the held-out fraction of conversations, only where the dataset has no split yet "
        "(default 0.05; later: the dataset's split.json, a different one is refused). The "
        "held-out conversations go to <output stem>.validation.jsonl, never to training",
    )
    export.add_argument(
        "--split-seed", type=int, help="the split's seed, as --validation (default 0)"
    )
    export.add_argument(
        "--no-holdout",
        action="store_true",
        help="hold nothing out: every conversation trains (eval cannot measure such a draft "
        "on this dataset)",
    )
    export.add_argument(
        "--resplit",
        action="store_true",
        help="replace the dataset's split (drafts trained on the old one can then no longer "
        "be evaluated on it)",
    )
    export.add_argument(
        "--tokenizer", metavar="PATH", help="tokenizer path, if it moved since the run"
    )
    export.set_defaults(func=cmd_export)


def _add_history(sub: Any) -> None:
    history = sub.add_parser(
        "history",
        help="runs side by side (records, rates, tok/s, output lengths, wall time per "
        "partition), then the evals",
    )
    add_dataset(history, many=True)
    history.add_argument("--partition", action="append", metavar="NAME", help="only this one")
    history.add_argument("--last", type=int, metavar="N", help="only the last N rows")
    history.add_argument(
        "--evals",
        action="store_true",
        help="only the evals: date, draft, accept length with its 95%% interval, gate verdict",
    )
    history.add_argument(
        "--all-attempts",
        action="store_true",
        help="a run retried from the UI: every attempt's rows (default: the final attempt's)",
    )
    history.set_defaults(func=cmd_history)


def add_commands(sub: Any) -> None:
    """The validate, export, history, coverage and rejects subcommands, in that order."""
    _add_validate(sub)
    _add_export(sub)
    _add_history(sub)
    _add_coverage(sub)
    _add_rejects(sub)

"""``eagle3-datagen run`` and ``eagle3-datagen demo``: a pipeline run from the command line,
then the dataset's summary (exit 0) or why it failed (exit 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen.errors import (
    ConfigError,
    InputFileError,
    OutputConflictError,
    OutputWriteError,
    ServerStartupError,
    TokenizerError,
)
from eagle3_datagen_cli.console import one_line
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.prefect_home import waiting_line


def _print_summary(manifest: dict[str, Any], output_dir: str) -> None:
    print(f"dataset: {output_dir}")
    for name, part in manifest.get("partitions", {}).items():
        reasons = ", ".join(f"{k}={v}" for k, v in part.get("rejects_by_reason", {}).items())
        reused, lines = part.get("reused_lines") or 0, (part.get("input") or {}).get("lines")
        print(
            f"  {name}: {part.get('accepted', 0)} accepted, {part.get('rejected', 0)} rejected"
            + (f" ({reasons})" if reasons else "")
            + (
                f"; reused {reused:,}{f' of {lines:,}' if lines else ''} input lines done by "
                "earlier runs"
                if reused
                else ""
            )
            + f" -> {Path(output_dir) / name}"
        )
    print(f"manifest: {Path(output_dir) / 'manifest.json'}")
    if any(part.get("rejected") for part in manifest.get("partitions", {}).values()):
        _print_rejects(output_dir)


def _print_rejects(output_dir: str) -> None:
    """The first rejected lines, each ``file:line: reason``, and how to list them all."""
    from eagle3_datagen.errors import DatasetError
    from eagle3_datagen.report.rejected_lines import rejected_lines, rejects_summary

    try:
        lines = rejected_lines(output_dir)
    except DatasetError as err:  # the run is done; its summary above stands
        print(f"rejected lines: cannot read them: {one_line(str(err))}")
        return
    for line in rejects_summary(lines, output_dir):
        print(line)


def _check_first(
    config: PipelineConfig, partitions: list[str] | None, overwrite: bool, server_url: str | None
) -> None:
    """The flow's checks before its server, made here before Prefect's temporary server starts
    (seconds to a minute): inputs and the output path first (no tokenizer: about a second),
    that an attached server's URL has something listening, then the tokenizer, special tokens
    and the data already in the output directory. The flow makes them again in this process at
    no cost: input line counts and the tokenizer are cached."""
    from eagle3_datagen.precheck import (
        check_attached_servers,
        check_before_server,
        check_inputs_and_output,
    )

    check_inputs_and_output(config, partitions)
    check_attached_servers(config, server_url)
    check_before_server(config, partitions, overwrite=overwrite)


def _run_and_report(
    what: str, config: PipelineConfig, *, said: bool = False, **options: Any
) -> int:
    """Run the pipeline; print the dataset's summary (exit 0) or why ``what`` failed (exit 1).

    The first line says what the command waits for (unless ``said``: the caller's first line
    did). Without a fan-out (whose jobs check their inputs on their own machines), what the
    flow checks before its server is checked first, with the flow's words and exit status."""
    if not said:
        print(f"eagle3-datagen: {waiting_line()}", file=sys.stderr, flush=True)
    if not options.get("fan_out"):
        try:
            _check_first(
                config,
                options.get("partitions"),
                bool(options.get("overwrite")),
                options.get("server_url"),
            )
        except (
            InputFileError,
            OutputWriteError,
            TokenizerError,
            OutputConflictError,
            ServerStartupError,
        ) as err:
            print(f"eagle3-datagen: {what} failed: {one_line(str(err))}", file=sys.stderr)
            return 1
    ok, result = run_pipeline(config, **options)
    if not ok:
        print(f"eagle3-datagen: {what} failed: {result}", file=sys.stderr)
        return 1
    assert isinstance(result, dict)
    _print_summary(result, config.output_dir)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    updates: dict[str, Any] = {}
    if args.output:
        updates["output_dir"] = str(Path(args.output).resolve())
    if args.wait_for_lock is not None:
        updates["lock_wait_s"] = None if args.wait_for_lock < 0 else args.wait_for_lock
    if updates:
        config = config.model_copy(update=updates)
    config.select(args.partition)
    if args.fan_out and args.server_url:
        raise ConfigError("--fan-out and --server-url exclude each other: each job has its server")
    return _run_and_report(
        "run",
        config,
        partitions=args.partition,
        server_url=args.server_url,
        overwrite=args.overwrite,
        fan_out=args.fan_out,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from eagle3_datagen.demo import default_output_dir, demo_config

    output = Path(args.output) if args.output else default_output_dir()
    config = demo_config(output, tokenizer=args.tokenizer)
    print(
        f"demo: emulator on port {config.server.port}, output {output}; {waiting_line()}",
        flush=True,
    )
    return _run_and_report("demo", config, said=True)


def _add_run(sub: Any) -> None:
    """eagle3-datagen run: one flow run of a config (here, or fanned out)."""
    run = sub.add_parser("run", help="one ad-hoc flow run of a config")
    run.add_argument("config", help="pipeline config YAML")
    run.add_argument("--server-url", help="attach to a running SGLang-compatible server")
    run.add_argument(
        "--partition", action="append", metavar="NAME", help="run only this partition (repeatable)"
    )
    run.add_argument("--output", metavar="DIR", help="output directory (overrides the config)")
    run.add_argument(
        "--overwrite", action="store_true", help="allow writing over data of another fingerprint"
    )
    run.add_argument(
        "--wait-for-lock",
        type=float,
        metavar="SECONDS",
        help="when another run is writing a partition of the output directory, wait this long "
        "for it (-1: as long as it takes) instead of refusing at once",
    )
    run.add_argument(
        "--fan-out",
        metavar="DEPLOYMENT",
        nargs="?",
        const="eagle3-datagen/partition-job",
        help="run each partition as a job of this deployment on its work pool's workers "
        "(default: eagle3-datagen/partition-job); needs PREFECT_API_URL",
    )
    run.set_defaults(func=cmd_run)


def _add_demo(sub: Any) -> None:
    """eagle3-datagen demo: the whole pipeline on this machine."""
    demo = sub.add_parser("demo", help="the whole pipeline on this machine, with the emulator")
    demo.add_argument("--output", metavar="DIR", help="output directory (default: a new one)")
    demo.add_argument(
        "--tokenizer",
        choices=["mini", "tiktoken"],
        default="mini",
        help="bundled tokenizer: mini (fast) or tiktoken (Kimi-K2.5's remote-code class path)",
    )
    demo.set_defaults(func=cmd_demo)


def add_commands(sub: Any) -> None:
    """The run and demo subcommands."""
    _add_run(sub)
    _add_demo(sub)

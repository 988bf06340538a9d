"""The ``eagle3-datagen`` command: run, demo, emulator, validate, export, history, failures,
alarm.

The top layer: it starts the flows (and sets the Prefect settings a local run needs), so the
library below never imports Prefect. Prefect is imported only by the commands that use it, so
``eagle3-datagen emulator`` starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen.errors import ConfigError, DatagenError


def _prefect_env() -> None:
    # Telemetry writes race the embedded SQLite database ("database is locked").
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "eagle3_datagen")
    # The embedded backend migrates a new SQLite database on first start: ~20 s on 2 cores.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:2000]


def run_pipeline(
    config: PipelineConfig,
    *,
    partitions: list[str] | None = None,
    server_url: str | None = None,
    overwrite: bool = False,
    fan_out: str | None = None,
) -> tuple[bool, dict[str, Any] | str]:
    """Run the parent flow in this process; return (completed, manifest or one-line reason
    naming the flow run whose log holds the tracebacks, which the terminal does not show).

    With ``fan_out`` (a deployment name), each partition instead runs as a job of that
    deployment on its work pool's workers, and this process only waits and merges. SIGINT or
    SIGTERM stops the run within seconds, marks it Cancelled and raises
    :class:`~eagle3_datagen_cli.prefect_server.Interrupted` (see ``prefect_server.py``).
    """
    from eagle3_datagen_cli.prefect_server import (
        Interrupted,
        mark_cancelled,
        stop_on_signals,
        temporary_prefect_server,
    )

    _prefect_env()
    from eagle3_datagen_cli.console import quiet_console_tracebacks

    quiet_console_tracebacks()
    runs: list[Any] = []  # the flow run, once Prefect says how it ended (its hooks)

    def seen(flow: Any, flow_run: Any, state: Any) -> None:
        runs.append(flow_run)

    async def _run() -> Any:  # the flow's final Prefect State (flows/ is where Prefect is)
        if fan_out:
            from eagle3_datagen_flows.fanout import datagen_fanout

            return await datagen_fanout.with_options(
                on_crashed=[*datagen_fanout.on_crashed_hooks, seen]
            )(
                config=config,
                partitions=partitions or None,
                deployment=fan_out,
                overwrite=overwrite,
                return_state=True,
            )
        from eagle3_datagen_flows.pipeline import datagen

        return await datagen.with_options(on_crashed=[*datagen.on_crashed_hooks, seen])(
            config=config,
            partitions=partitions or None,
            server_url=server_url,
            overwrite=overwrite,
            return_state=True,
        )

    async def _main() -> Any:
        # A task that ended on the interrupt while the loop itself was interrupted is not news.
        asyncio.get_running_loop().set_exception_handler(_quiet_interrupts)
        try:
            return await stop_on_signals(_run())
        except Interrupted as stop:
            for run in runs[:1]:
                await mark_cancelled(run.id, f"cancelled by {stop}")
            raise

    from prefect.exceptions import TerminationSignal

    with temporary_prefect_server():
        try:
            state = asyncio.run(_main())
        except TerminationSignal as sig:  # Prefect's SIGTERM bridge, armed while a flow runs
            stop = Interrupted(sig.signal)
            for run in runs[:1]:
                asyncio.run(mark_cancelled(run.id, f"cancelled by {stop}"))
            raise stop from None
        if state.is_completed():
            return True, asyncio.run(state.aresult())
    return False, _failed(state)


def _failed(state: Any) -> str:
    """A failed run's reason in one line, naming where its tracebacks are."""
    from eagle3_datagen_flows.prefect_text import failure_reason

    reason = failure_reason(state.message, state.type.value)
    run_id = state.state_details.flow_run_id
    return _one_line(f"{reason} (log: prefect flow-run logs {run_id})" if run_id else reason)


def _quiet_interrupts(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    from eagle3_datagen_cli.prefect_server import Interrupted

    err = context.get("exception")
    if not isinstance(err, Interrupted | asyncio.CancelledError):
        loop.default_exception_handler(context)


def _print_summary(manifest: dict[str, Any], output_dir: str) -> None:
    print(f"dataset: {output_dir}")
    for name, part in manifest.get("partitions", {}).items():
        reasons = ", ".join(f"{k}={v}" for k, v in part.get("rejects_by_reason", {}).items())
        print(
            f"  {name}: {part.get('accepted', 0)} accepted, {part.get('rejected', 0)} rejected"
            + (f" ({reasons})" if reasons else "")
            + f" -> {Path(output_dir) / name}"
        )
    print(f"manifest: {Path(output_dir) / 'manifest.json'}")


def _run_and_report(what: str, config: PipelineConfig, **options: Any) -> int:
    """Run the pipeline; print the dataset's summary (exit 0) or why ``what`` failed (exit 1)."""
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
    for name in args.partition or []:
        config.partition(name)
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
    print(f"demo: emulator on port {config.server.port}, Prefect local backend, output {output}")
    return _run_and_report("demo", config)


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
    from eagle3_datagen.write.export import ExportOptions, export_dataset

    options = ExportOptions(
        truncated="drop" if args.skip_truncated else args.truncated,
        over_length=args.over_length,
        max_length=args.max_length,
        validation=args.validation,
        split_seed=args.split_seed,
    )
    result = export_dataset(
        args.dataset, args.format, args.output, options=options, tokenizer=args.tokenizer
    )
    print("\n".join(result.report()))
    parts = ", ".join(f"{k}={v}" for k, v in result.written.items())
    skipped = f", {result.skipped_truncated} truncated skipped" if result.skipped_truncated else ""
    print(f"exported {result.total} records ({parts}){skipped} as {args.format} -> {result.path}")
    print(f"metadata and report: {result.metadata_path}, {result.report_path}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """The runs recorded in output directories, side by side (no Prefect: read from disk)."""
    from eagle3_datagen.report.history import history_rows, history_text, read_history

    entries = [e for d in args.dataset for e in read_history(d)]
    if not entries:
        raise ConfigError(f"no runs recorded in {', '.join(args.dataset)} (no history.jsonl)")
    rows = history_rows(entries, args.partition, all_attempts=args.all_attempts)
    print(history_text(rows[-args.last :] if args.last else rows))
    return 0


@contextlib.contextmanager
def _prefect_api() -> Iterator[str]:
    """The Prefect API a command reads: PREFECT_API_URL's, or else Prefect's local database
    (where runs started without PREFECT_API_URL are) through the temporary server; yields what
    to call it. An API that cannot be reached, or no local database, is one line."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    from eagle3_datagen_cli.prefect_server import local_database, temporary_prefect_server

    _prefect_env()
    url = PREFECT_API_URL.value()
    where = f"the Prefect API at {url}"
    if not url:
        database = local_database()
        if database is not None and not database.exists():
            raise ConfigError(
                f"nothing to read: PREFECT_API_URL is not set and Prefect's local database "
                f"{database} does not exist (no run without PREFECT_API_URL was made here)"
            )
        where = f"Prefect's local database {database} (PREFECT_API_URL is not set)"
    try:
        with temporary_prefect_server():
            yield where
    except httpx.TransportError as err:
        raise ConfigError(
            f"cannot reach {where}: {err or type(err).__name__}; is the server running?"
        ) from None


def cmd_failures(args: argparse.Namespace) -> int:
    """A run's failed batches from the Prefect API (PREFECT_API_URL, or the local database)."""
    from eagle3_datagen_cli.failures import failed_batches, failures_text

    with _prefect_api() as where:
        found = asyncio.run(failed_batches(args.flow_run, where, all_attempts=args.all_attempts))
    print(failures_text(found))
    return 0


def cmd_alarm_install(args: argparse.Namespace) -> int:
    """The shipped automations (throughput low, run failed) with a named notification block."""
    from eagle3_datagen_cli.failures import ALARM_FILES, install_alarms

    with _prefect_api():
        done = asyncio.run(
            install_alarms(args.block, [Path(args.file)] if args.file else ALARM_FILES)
        )
    print(done)
    return 0


def cmd_alarm_unschedulable(args: argparse.Namespace) -> int:
    """The automations that fail a run whose Kubernetes pod stays unschedulable."""
    from eagle3_datagen_cli.failures import install_unschedulable

    with _prefect_api():
        done = asyncio.run(install_unschedulable(args.minutes))
    print(done)
    return 0


def cmd_emulator(argv: list[str]) -> int:
    """Become ``python -m sglang_emulator ARGV``: the emulator is a separate package, never
    imported by the library, shipped in the same wheel; exec keeps the pid, so signals reach it."""
    from eagle3_datagen.sglang.launch_command import EMULATOR_MODULE

    os.execv(sys.executable, [sys.executable, "-m", EMULATOR_MODULE, *argv])
    return 127  # not reached: execv replaces this process or raises OSError


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


def _add_dataset_commands(sub: Any) -> None:
    """validate and export: a finished dataset, offline."""
    validate = sub.add_parser(
        "validate", help="re-validate every record of a finished dataset (exit 1 if any fails)"
    )
    validate.add_argument("dataset", metavar="DIR", help="the run's output directory")
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

    export = sub.add_parser("export", help="write a dataset as a trainer's JSONL")
    export.add_argument("dataset", metavar="DIR", help="the run's output directory")
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
        default=0.0,
        metavar="FRACTION",
        help="hold out this fraction of conversations (all their turns and samples) in "
        "<output stem>.validation.jsonl",
    )
    export.add_argument("--split-seed", type=int, default=0, help="seed of the validation split")
    export.add_argument(
        "--tokenizer", metavar="PATH", help="tokenizer path, if it moved since the run"
    )
    export.set_defaults(func=cmd_export)

    history = sub.add_parser(
        "history",
        help="runs side by side: records, rates, tok/s, output lengths, wall time per partition",
    )
    history.add_argument("dataset", nargs="+", metavar="DIR", help="output directories")
    history.add_argument("--partition", action="append", metavar="NAME", help="only this one")
    history.add_argument("--last", type=int, metavar="N", help="only the last N rows")
    history.add_argument(
        "--all-attempts",
        action="store_true",
        help="a run retried from the UI: every attempt's rows (default: the final attempt's)",
    )
    history.set_defaults(func=cmd_history)


def _add_ops_commands(sub: Any) -> None:
    """failures and alarm install: the Prefect API of a deployment."""
    failures = sub.add_parser(
        "failures",
        help="a run's failed batches (batch, lines, attempts, cause) from the Prefect API",
    )
    failures.add_argument(
        "flow_run",
        nargs="?",
        metavar="FLOW_RUN",
        help="flow run id or name (default: the latest eagle3-datagen run)",
    )
    failures.add_argument(
        "--all-attempts",
        action="store_true",
        help="a retried run: also the failed batches of its earlier attempts (default: the "
        "final attempt's)",
    )
    failures.set_defaults(func=cmd_failures)

    alarm = sub.add_parser(
        "alarm", help="the Prefect automations: throughput low, run failed, pod unschedulable"
    )
    alarm_sub = alarm.add_subparsers(dest="alarm_command", required=True)
    install = alarm_sub.add_parser(
        "install",
        help="create or update the automations of flows/automations (throughput-low.yaml, "
        "run-failed.yaml)",
    )
    install.add_argument(
        "--block",
        required=True,
        metavar="NAME",
        help="notification block to send through: NAME or TYPE/NAME, as `prefect block ls` shows",
    )
    install.add_argument("--file", metavar="YAML", help="another automation file")
    install.set_defaults(func=cmd_alarm_install)
    unschedulable = alarm_sub.add_parser(
        "unschedulable",
        help="create or update the automations that fail a run whose Kubernetes pod stays "
        "unschedulable (pod-unschedulable.yaml, pod-unschedulable-failed.yaml)",
    )
    unschedulable.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="how long a pod may stay unschedulable before its run fails (default 30)",
    )
    unschedulable.set_defaults(func=cmd_alarm_unschedulable)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-datagen",
        description="Exact-token EAGLE-3 training data from SGLang, orchestrated by Prefect.",
    )
    from eagle3_datagen.provenance import pipeline_version

    parser.add_argument(
        "--version", action="version", version=f"eagle3-datagen {pipeline_version()}"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_demo(sub)
    _add_dataset_commands(sub)
    _add_ops_commands(sub)
    sub.add_parser(
        "emulator",
        help="run the SGLang emulator (takes sglang.launch_server flags; see --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "emulator":
        return cmd_emulator(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DatagenError as err:
        print(f"eagle3-datagen: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eagle3-datagen: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        from eagle3_datagen_cli.prefect_server import Interrupted

        if not isinstance(err, Interrupted):
            raise
        print(
            f"eagle3-datagen: {err}: the run stopped and is marked Cancelled; rerun the same "
            "command to finish it",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())

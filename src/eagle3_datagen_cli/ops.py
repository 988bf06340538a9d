"""``eagle3-datagen failures`` and ``eagle3-datagen alarm``: the commands that read and set up
a Prefect API (``PREFECT_API_URL``'s, or the local database's through a temporary server).

Prefect is imported only when one of them runs (``failures.py``, ``alarms.py``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from eagle3_datagen_cli.prefect_server import prefect_api


def cmd_failures(args: argparse.Namespace) -> int:
    """A run's failed batches from the Prefect API (PREFECT_API_URL, or the local database),
    after the line that names which one it read."""
    with prefect_api() as where:  # before the import: "nothing to read" needs only settings
        from eagle3_datagen_cli.failures import failed_batches, failures_text

        found = asyncio.run(failed_batches(args.flow_run, where, all_attempts=args.all_attempts))
    print(f"read from {where}")
    print(failures_text(found))
    return 0


def cmd_alarm_install(args: argparse.Namespace) -> int:
    """The shipped automations (throughput low, run failed) with a named notification block."""
    from eagle3_datagen_cli.alarms import ALARM_FILES, install_alarms

    with prefect_api():
        done = asyncio.run(
            install_alarms(args.block, [Path(args.file)] if args.file else ALARM_FILES)
        )
    print(done)
    return 0


def cmd_alarm_unschedulable(args: argparse.Namespace) -> int:
    """The automations that fail a run whose Kubernetes pod stays unschedulable."""
    from eagle3_datagen_cli.alarms import install_unschedulable

    with prefect_api():
        done = asyncio.run(install_unschedulable(args.minutes))
    print(done)
    return 0


def _add_failures(sub: Any) -> None:
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


def _add_alarm(sub: Any) -> None:
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


def add_commands(sub: Any) -> None:
    """The failures and alarm subcommands."""
    _add_failures(sub)
    _add_alarm(sub)

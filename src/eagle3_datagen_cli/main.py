"""The ``eagle3-datagen`` command: run, demo, emulator, validate, export, history, coverage,
rejects, select, eval, failures, alarm. This module parses the arguments, calls the command and
turns its end into one line (a config's errors: one line each) and an exit status.

The top layer: it starts the flows (and sets the Prefect settings a local run needs), so the
library below never imports Prefect. Prefect is imported only by the commands that use it, so
``eagle3-datagen emulator`` starts fast. Each group of commands is its own module: ``run.py``
(run, demo), ``dataset.py`` (validate, export, history, coverage, rejects), ``select.py`` (select),
``ops.py`` (failures, alarm).
"""

from __future__ import annotations

import argparse
import os
import sys

from eagle3_datagen.errors import ConfigError, DatagenError
from eagle3_datagen_cli import dataset, evaluate, ops, run, select
from eagle3_datagen_cli.console import one_line
from eagle3_datagen_cli.signals import Interrupted


def cmd_emulator(argv: list[str]) -> int:
    """Become ``python -m sglang_emulator ARGV``: the emulator is a separate package, never
    imported by the library, shipped in the same wheel; exec keeps the pid, so signals reach it."""
    from eagle3_datagen.sglang.launch_command import EMULATOR_MODULE

    os.execv(sys.executable, [sys.executable, "-m", EMULATOR_MODULE, *argv])
    return 127  # not reached: execv replaces this process or raises OSError


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
    run.add_commands(sub)
    dataset.add_commands(sub)
    select.add_commands(sub)
    evaluate.add_commands(sub)
    ops.add_commands(sub)
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
    except ConfigError as err:  # one line per problem (a config's fields: one each)
        for line in str(err).splitlines() or [""]:
            print(f"eagle3-datagen: {one_line(line)}", file=sys.stderr)
        return 2
    except DatagenError as err:
        print(f"eagle3-datagen: {one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eagle3-datagen: interrupted", file=sys.stderr)
        return 130
    except Interrupted as err:
        print(
            f"eagle3-datagen: {err}: the run stopped and is marked Cancelled; rerun the same "
            "command to finish it",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())

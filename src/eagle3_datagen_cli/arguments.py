"""The command-line arguments several commands share, spelled once: a finished run's output
directory (``validate``, ``export``, ``coverage``, ``history``, ``select``, ``eval``)."""

from __future__ import annotations

import argparse


def add_dataset(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """The positional ``dataset``: a run's output directory (``many``: one or more)."""
    if many:
        parser.add_argument(
            "dataset", nargs="+", metavar="DIR", help="the runs' output directories"
        )
    else:
        parser.add_argument("dataset", metavar="DIR", help="the run's output directory")

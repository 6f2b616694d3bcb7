"""What every bench script shares: one command line of subcommands (``bench/GROUP.py SUBCOMMAND ARGS``).

Each script keeps a ``COMMANDS`` table, subcommand -> (a function adding its arguments to a parser, a function running
it with ``(args, parser)``), and a ``main(argv)`` that hands both to ``run_subcommand``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_subcommand(doc: str, commands: dict, argv=None):
    """Parse ``argv`` for one of ``commands`` and run it; returns what it returns. ``doc``: the script's docstring
    (its first paragraph describes the script; each runner's first docstring line is its subcommand's help)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    parsers = {}
    for name, (arguments, run) in commands.items():
        parsers[name] = subcommands.add_parser(name, help=run.__doc__.splitlines()[0].replace("%", "%%"),
                                               description=run.__doc__.split("\n\n")[0])
        arguments(parsers[name])
    args = parser.parse_args(argv)
    return commands[args.subcommand][1](args, parsers[args.subcommand])


def exit_code(result) -> int:
    """A runner's return value as the process's exit code: an int as it is, anything else (a report) 0."""
    return result if isinstance(result, int) else 0


def measured_line() -> str:
    """The provenance line every ``bench/results`` table is headed with: when, at which commit, on which machine (its
    cores, ``OMP_NUM_THREADS`` and the load average when the line is written)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()
    return (f"# measured {time.strftime('%Y-%m-%d %H:%M:%S %z')}, commit {commit}, machine: {platform.node()} "
            f"({os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end)")

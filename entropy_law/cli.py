"""The ``entropy-law`` command line: discovers sub-commands in ``entropy_law.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from entropy_law import __version__, commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="entropy-law",
        description="Measure and model when speculative drafting pays (the entropy law).",
    )
    parser.add_argument("--version", action="version", version=f"entropy-law {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as err:
        print(f"entropy-law {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

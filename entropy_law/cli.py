"""The ``entropy-law`` command line: discovers sub-commands in ``entropy_law.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

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


_PACKAGE = str(Path(__file__).resolve().parent)


@contextmanager
def _one_line_warnings(command: str):
    """While a command runs, the package's own warnings (a ``UserWarning`` raised in ``entropy_law``: few
    requests, an incomplete run, a broken lock) are printed as one line each, ``entropy-law COMMAND: warning:
    ...`` (above any progress bar), and a message already printed is not printed again; other warnings keep
    Python's format. Only the format changes (``warnings.formatwarning``): filters, and whoever records
    warnings (``pytest.warns``), see every warning as before."""
    default, seen = warnings.formatwarning, set()

    def formatwarning(message, category, filename, lineno, line=None):
        if not (issubclass(category, UserWarning) and str(Path(filename).resolve()).startswith(_PACKAGE)):
            return default(message, category, filename, lineno, line)
        text = str(message)
        if text in seen:
            return ""
        seen.add(text)
        # written here, past any progress bar on the terminal (tqdm clears and redraws it), not by the caller
        from tqdm import tqdm
        tqdm.write(f"entropy-law {command}: warning: {text}", file=sys.stderr)
        return ""

    warnings.formatwarning = formatwarning
    try:
        yield
    finally:
        warnings.formatwarning = default


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _one_line_warnings(args.command):
            return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as err:
        print(f"entropy-law {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

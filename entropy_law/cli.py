"""The ``entropy-law`` command line: every module of ``entropy_law.commands`` has ``register(subparsers)``, which
adds its parser and sets ``func``."""

from __future__ import annotations

import argparse
import importlib
import os
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
    """While a command runs, the package's own ``UserWarning``s print as one line each, ``entropy-law COMMAND:
    warning: ...`` (above any progress bar), once per message. Only ``warnings.formatwarning`` changes: filters and
    ``pytest.warns`` see every warning as before."""
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


def _existing_ancestor(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path(".")


def check_output_file(path, *, overwrite: bool, option: str = "--out") -> Path:
    """Refuse, before any work, an output file that is a folder, lies below a file, or exists without
    ``--overwrite`` (a ``FileExistsError`` naming the file and the flag). For the commands that write one."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{option} {path} is a folder; give a file path, e.g. {path / 'out.jsonl'}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{option} {path} exists; pass --overwrite to replace it, or give another {option}")
    parent = _existing_ancestor(path)
    if not parent.is_dir():
        raise NotADirectoryError(f"{option} {path}: {parent} is a file, not a folder")
    return path


def check_output_folder(path, names, *, overwrite: bool, option: str = "--out") -> Path:
    """Refuse, before any work, an output folder that is a file, lies below a file, or already holds one of
    ``names`` (files or folders the command writes) without ``--overwrite``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{option} {path} is a file; give a folder (created if missing)")
    parent = _existing_ancestor(path)
    if not parent.is_dir():
        raise NotADirectoryError(f"{option} {path}: {parent} is a file, not a folder")
    taken = [name for name in names if (path / name).exists()]
    if taken and not overwrite:
        raise FileExistsError(f"{option} {path} already holds {', '.join(taken)}; pass --overwrite to replace "
                              f"{'them' if len(taken) > 1 else 'it'}, or give another {option}")
    return path


def _os_error_line(err: OSError) -> str:
    """An ``OSError`` in one line that names the path (``IsADirectoryError: [Errno 21] ...: 'x'`` becomes
    ``x: is a directory``); an error raised with a message of ours keeps it."""
    if err.filename is None or not err.strerror:
        return str(err)
    paths = f"{err.filename}" + (f" -> {err.filename2}" if err.filename2 is not None else "")
    return f"{paths}: {err.strerror[:1].lower()}{err.strerror[1:]}"


def _user_error(err: Exception) -> bool:
    """Errors that are the input's or the machine's, said in one line: bad values, missing packages, any
    ``OSError`` (a path that is a folder, not a folder, not allowed, full...), a writer that lost its run."""
    if isinstance(err, (OSError, ValueError, ModuleNotFoundError)):
        return True
    recorder = sys.modules.get("entropy_law.traces.recorder")  # loaded by whoever could raise it
    return recorder is not None and isinstance(err, recorder.RunLockLostError)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _one_line_warnings(args.command):
            return int(args.func(args) or 0)
    except KeyboardInterrupt as err:  # a command may say what was kept and how to go on (the message)
        print(f"entropy-law {args.command}: interrupted" + (f"; {err}" if str(err) else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of standard output went away (`... | head`): nothing to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's flush does not fail again
        return 1
    except Exception as err:
        if not _user_error(err):
            raise
        text = _os_error_line(err) if isinstance(err, OSError) else str(err)
        print(f"entropy-law {args.command}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

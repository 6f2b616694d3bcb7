"""``entropy-law export --format glance|specbench RUN [RUN ...] > out.jsonl``: a trace run as GLANCE's round log
(``importers.glance.export_glance_rounds``) or Spec-Bench's answer file (``importers.specbench``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FORMATS = ("glance", "specbench")  # specbench: Spec-Bench's answer file (entropy_law.importers.specbench)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a trace run in another tool's format (glance: GLANCE's round log; specbench: Spec-Bench's "
             "answer file; JSONL)",
        description="Write the drafting rounds of one drafting arm as GLANCE's round log or as Spec-Bench's answer "
                    "file (JSONL) to standard output or --out. Details: docs/cli.md.")
    p.add_argument("traces", nargs="+", help="trace run folder(s) of one drafting arm")
    p.add_argument("--format", required=True, choices=FORMATS, help="output format")
    p.add_argument("--out", default=None, help="file to write (default: standard output)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; pandas and pyarrow load only here
    from entropy_law.cli import check_output_file
    from entropy_law.importers.glance import export_glance_rounds
    from entropy_law.traces.reader import load_traces

    missing = [p for p in args.traces if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"trace path(s) not found: {', '.join(missing)}")
    if args.out is not None:  # before reading: never replaces a file unasked
        check_output_file(args.out, overwrite=args.overwrite)
    traces = load_traces(args.traces)
    if args.format == "specbench":
        from entropy_law.importers.specbench import export_specbench

        if args.out is not None:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        n = export_specbench(traces, sys.stdout if args.out is None else args.out)
        print(f"exported {n} question(s) in Spec-Bench's answer format" + (f" to {args.out}" if args.out else ""),
              file=sys.stderr)
        return 0
    try:
        if args.out is None:
            n = export_glance_rounds(traces, sys.stdout)
        else:
            n = _export_to_file(traces, Path(args.out), export_glance_rounds)
    except ValueError as err:
        if "several drafting arms" not in str(err):
            raise
        raise ValueError(f"{err}. On the command line: pass the run folder(s) of one drafting arm") from None
    print(f"exported {n} round(s) in GLANCE's round-log format" + (f" to {args.out}" if args.out else ""),
          file=sys.stderr)
    return 0


def _export_to_file(traces, out: Path, export) -> int:
    """``export(traces, file)`` into a temporary file beside ``out``, renamed over it once complete: a failed
    export leaves ``out`` as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            n = export(traces, fh)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return n

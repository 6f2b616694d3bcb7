"""``entropy-law report TRACES``: a self-contained summary (HTML, or Markdown with PNGs) of a trace set."""

from __future__ import annotations

from pathlib import Path

REPORT_OUTPUTS = ("report.html", "report.md", "figures")  # what a report writes into --out (jobs.report)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="write an HTML (or Markdown) report with tables and figures of a trace set",
        description="Fit the entropy law to traces and write the results tables and figures into a folder.")
    p.add_argument("traces", nargs="+", help="trace run directories, or folders that hold runs")
    p.add_argument("--out", required=True, help="folder for the report (created)")
    p.add_argument("--format", choices=("html", "md"), default="html",
                   help="html: one self-contained page; md: report.md with PNG figures (default: %(default)s)")
    p.add_argument("--family", help="law family fitted per arm (default: the primary law, or its fallback)")
    p.add_argument("--n-boot", type=int, default=100, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the CV folds and the bootstrap (default: %(default)s)")
    p.add_argument("--ar-ms-per-token", type=float, help="AR cost per token where the traces hold no AR run")
    p.add_argument("--compare-families", nargs="+", metavar="FAMILY", help="families in the CV comparison")
    p.add_argument("--results-md", metavar="FILE", help="also write the results section (Markdown) to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-pdf", action="store_true", help="PNG figures only (default: a PDF beside each PNG)")
    p.add_argument("--overwrite", action="store_true", help="replace a report already in --out (and --results-md)")
    p.add_argument("--out-of-core", action="store_true",
                   help="runs over memory: per-category results, law per arm, a figure (docs/out-of-core.md)")
    p.add_argument("--memory-limit", metavar="SIZE", help="with --out-of-core: DuckDB's memory limit, e.g. 2GB")
    p.add_argument("--no-memory-check", action="store_true", help="skip the check that the runs fit in memory")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; pandas and matplotlib load only for a report
    import matplotlib

    matplotlib.use("Agg")
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.jobs.report import results_markdown, write_report
    from entropy_law.traces.reader import load_traces

    if args.n_boot < 0:
        raise ValueError(f"--n-boot must be >= 0, got {args.n_boot}")
    paths = [Path(p) for p in args.traces]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"trace path(s) not found: {', '.join(missing)}")
    if args.memory_limit is not None and not args.out_of_core:
        raise ValueError("--memory-limit is a setting of --out-of-core: add --out-of-core, or drop it")
    if args.out_of_core:
        return _run_out_of_core(args)
    _check_outputs(args)
    if not args.no_memory_check:  # refuse before reading, rather than be killed for memory half way
        from entropy_law.outofcore import check_fits_in_memory

        check_fits_in_memory(load_traces(args.traces, validate=False),
                             "the report")
    traces = load_traces(args.traces)
    options = {} if args.compare_families is None else {"compare_families": tuple(args.compare_families)}
    import pandas as pd

    from entropy_law.traces.proposals import read_proposals

    proposals = [p for p in (read_proposals(path) for path in paths) if p is not None]  # LOCO depths "replayed"
    analysis = TraceAnalysis(traces, family=args.family, n_boot=args.n_boot, seed=args.seed,
                             ar_ms_per_token=args.ar_ms_per_token,
                             proposals=pd.concat(proposals, ignore_index=True) if proposals else None, **options)
    source = " ".join(args.traces)
    path = write_report(traces, args.out, fmt=args.format, analysis=analysis, source=source,
                        progress=not args.no_progress, figure_formats=("png",) if args.no_pdf else ("png", "pdf"))
    print(f"report: {path}")
    if args.results_md:
        out = Path(args.results_md)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(results_markdown(analysis, source=source), encoding="utf-8")
        print(f"results section: {out}")
    return 0


def _run_out_of_core(args) -> int:
    from entropy_law.jobs.report import write_report_out_of_core
    from entropy_law.traces.reader import load_traces

    given = [flag for flag, value in (("--results-md", args.results_md), ("--compare-families", args.compare_families),
                                      ("--ar-ms-per-token", args.ar_ms_per_token)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: not with --out-of-core, which fits the law and summarises the "
                         "categories only (speed, LOCO and the law comparison need the rows in memory): drop them, "
                         "or run without --out-of-core on a subset of the runs")
    _check_outputs(args)
    # the runs' metadata and file lists only: the rows stay on disk
    traces = load_traces(args.traces, validate=False)
    path = write_report_out_of_core(traces, args.out, fmt=args.format, family=args.family,
                                    source=" ".join(args.traces), memory_limit=args.memory_limit)
    print(f"report: {path}")
    return 0


def _check_outputs(args) -> None:
    """Before any reading or fitting: ``--out`` must be a folder (or not exist yet) without a report in it, and
    ``--results-md`` a file that does not exist, unless ``--overwrite``."""
    from entropy_law.cli import check_output_file, check_output_folder

    check_output_folder(args.out, REPORT_OUTPUTS, overwrite=args.overwrite)
    if args.results_md:
        check_output_file(args.results_md, overwrite=args.overwrite, option="--results-md")

"""``entropy-law law``: fit the entropy law per arm to traces (or simulated traces) and print it (docs/cli.md)."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "law", help="fit the entropy law to traces and print summaries",
        description="Fit the entropy law per arm and print its summary and the tokens per round it predicts; "
                    "--loco, --tests add transfer and hypothesis tests. Details: docs/cli.md.")
    p.add_argument("traces", nargs="?", help="a run directory, or a folder searched for runs (load_traces)")
    p.add_argument("--simulate", type=int, metavar="SEED", help="use simulated traces with this seed instead")
    p.add_argument("--family", default=None,
                   help="law family (default: the primary law, or its fallback, said); 'glance' / "
                        "'glance_readme': GLANCE's law (fit_glance)")
    p.add_argument("--drafter", help="only this arm, e.g. 'ngram chain' (default: every arm)")
    p.add_argument("--loco", action="store_true", help="leave-one-category-out transfer")
    p.add_argument("--tests", action="store_true", help="pre-registered tests P1-P3 with Holm correction")
    p.add_argument("--sensitivity", action="store_true", help="refit each arm's law on the entropy's lower and "
                   "upper bounds (runs imported with top-k log-probabilities): how far each coefficient moves")
    p.add_argument("--depths", default="observed", choices=("observed", "category", "full"),
                   help="drafted-depth model of the DP (default: %(default)s; full: every round drafts a block)")
    p.add_argument("--loco-depths", default="training", choices=("training", "replayed", "oracle"),
                   help="drafted depths of the held-out category in --loco (default: %(default)s; docs/cli.md)")
    p.add_argument("--context-match", action="store_true",
                   help="give the law the copyability: recorded, else rebuilt (--model, --tasks; docs/cli.md)")
    p.add_argument("--model", help="--context-match: the target that decoded the runs (default: their model_id)")
    p.add_argument("--tasks", help="--context-match: the prompts' task file, where run.json names none")
    p.add_argument("--out-of-core", action="store_true", help="fit runs larger than memory (docs/out-of-core.md)")
    p.add_argument("--no-memory-check", action="store_true", help="skip the check that the runs fit in memory")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the law layer (pandas, scipy) loads only here
    from entropy_law.analysis import TraceView, make_view
    from entropy_law.law.fit import PRIMARY_FAMILY, fallback_note, fit_law, primary_family
    from entropy_law.law.hypotheses import preregistered_tests
    from entropy_law.law.topk import entropy_sensitivity
    from entropy_law.law.transfer import block_prediction, loco_transfer

    defaulted = args.family is None
    if defaulted:
        args.family = PRIMARY_FAMILY
    glance = _check_args(args)
    if getattr(args, "out_of_core", False):  # larger than memory: the laws only (the rest needs the rows)
        return _run_out_of_core(args, defaulted)
    traces = _traces(args)
    if glance:
        return print_glance_laws(traces if isinstance(traces, TraceView) else make_view(traces), args.family,
                                 args.drafter)
    if defaulted and primary_family(traces.tokens) != PRIMARY_FAMILY:
        args.family = primary_family(traces.tokens)
        print(fallback_note(args.family))
    proposals = _loco_proposals(args)
    laws = fit_law(traces, args.family, by="drafter_id")
    drafters = [args.drafter] if args.drafter else list(laws.laws)
    for drafter in drafters:
        law = laws[drafter]
        print(f"=== {drafter} ===")
        law.print_summary()
        print()
        if args.sensitivity:  # the arm's law refitted on the entropy's lower and upper bounds
            arm = traces.select_runs(traces.runs.loc[traces.runs["drafter_id"] == drafter, "run_id"])
            print("sensitivity: the coefficients fitted on the entropy's lower and upper bounds (top-k), beside the "
                  f"estimate's\n{entropy_sensitivity(arm, args.family).to_string(float_format='{:.6g}'.format)}\n")
        block_prediction(law, traces, drafter=drafter, depths=args.depths).print_summary()
        print()
        if args.loco:
            loco_transfer(traces, args.family, drafter=drafter, depths=args.loco_depths,
                          proposals=proposals).print_summary()
            print()
    if args.tests:
        pre = preregistered_tests(traces, drafter=drafters[0])
        pre.print_summary()
        for test in pre.tests.values():
            print()
            test.print_summary()
    return 0


def _check_args(args) -> bool:
    """Refuse options that do not go together; whether ``--family`` names GLANCE's law."""
    from entropy_law.glance import GLANCE_FAMILIES

    context_match, out_of_core = getattr(args, "context_match", False), getattr(args, "out_of_core", False)
    if (args.model or args.tasks) and not context_match:
        raise ValueError("--model and --tasks go with --context-match")
    if context_match and (args.simulate is not None or out_of_core):
        raise ValueError("--context-match reads a trace folder into memory: drop --simulate / --out-of-core")
    glance = args.family in GLANCE_FAMILIES
    if glance and (args.loco or args.tests or out_of_core or args.sensitivity):
        raise ValueError(f"--family {args.family} fits GLANCE's round-level law in memory and prints it per arm: "
                         "drop --loco / --tests / --sensitivity / --out-of-core (they need a family of fit_law)")
    if out_of_core and (args.simulate is not None or args.loco or args.tests or args.sensitivity or not args.traces):
        raise ValueError("--out-of-core fits a trace folder (not --simulate) and prints the laws only: drop "
                         "--loco / --tests / --sensitivity, which need the rows in memory")
    return glance


def _run_out_of_core(args, defaulted: bool) -> int:
    """One law per arm (its label, as ``make_view`` gives it) fitted by DuckDB over the shards, printed."""
    from entropy_law.law.fit import PRIMARY_FALLBACK, PRIMARY_FAMILY
    from entropy_law.outofcore import fit_law_out_of_core
    from entropy_law.traces.validation import TraceValidationError

    try:
        laws = fit_law_out_of_core(args.traces, args.family, by="drafter_id", by_arm=True)
    except ValueError as err:
        if not defaulted or isinstance(err, TraceValidationError):  # damaged traces: no family fits them
            raise
        print(f"law: {PRIMARY_FALLBACK}, not the primary {PRIMARY_FAMILY} ({err})")
        laws = fit_law_out_of_core(args.traces, PRIMARY_FALLBACK, by="drafter_id", by_arm=True)
    for drafter in [args.drafter] if args.drafter else list(laws.laws):
        print(f"=== {drafter} ===")
        laws[drafter].print_summary()
        print()
    return 0


def _traces(args):
    """The simulated traces of ``--simulate``, else the trace folder's runs, one arm per drafter and tree."""
    from entropy_law.analysis import make_view
    from entropy_law.analysis.simulate import TreeSpec, simulate_traces
    from entropy_law.traces.reader import load_traces

    if args.simulate is not None:
        return simulate_traces(seed=args.simulate, n_requests_per_category=10, tree=TreeSpec(),
                               tokens_per_request=(60, 100))
    if not args.traces:
        raise ValueError("pass a trace folder, or --simulate SEED")
    if not args.no_memory_check:  # refuse before reading, rather than be killed for memory half way
        from entropy_law.outofcore import check_fits_in_memory

        check_fits_in_memory(args.traces, "the law")
    loaded = load_traces(args.traces)
    if getattr(args, "context_match", False):
        loaded = with_context_match(loaded, args.model, args.tasks)
    return make_view(loaded)


def _loco_proposals(args):
    """The runs' replayed proposals for ``--loco-depths replayed``, else None."""
    if not (args.loco and args.loco_depths == "replayed"):
        return None
    from entropy_law.traces.proposals import read_proposals

    proposals = read_proposals(args.traces) if args.traces and args.simulate is None else None
    if proposals is None:
        raise ValueError("--loco-depths replayed needs the runs' replayed proposals (proposals.parquet beside "
                         "run.json): make them with bench/law.py proposals --write")
    return proposals


def print_glance_laws(view, family: str, drafter: str | None = None) -> int:
    """GLANCE's law (``glance.fit_glance``, form ``family``) of each drafting arm of ``view`` (an arm-labelled
    ``TraceView``: ``analysis.make_view``), or of ``drafter`` alone, printed one after another."""
    from entropy_law.glance import fit_glance

    runs = view.runs
    arms = list(dict.fromkeys(runs.loc[~runs["is_ar"], "drafter_id"]))
    if drafter is not None and drafter not in arms:
        raise ValueError(f"no drafting arm {drafter!r}; arms: {arms}")
    for arm in [drafter] if drafter is not None else arms:
        print(f"=== {arm} ===")
        fit_glance(view.select_runs(runs.loc[runs["drafter_id"] == arm, "run_id"]), family).print_summary()
        print()
    return 0


def with_context_match(traces, model: str | None = None, tasks: str | None = None, *, what: str = "the runs"):
    """``traces`` with ``context_match`` at every position (``jobs.reference.ensure_context_matches``; rebuilt
    whenever ``model`` or ``tasks`` is given), saying on stdout which, naming ``what``."""
    from entropy_law.jobs.reference import ensure_context_matches

    try:
        filled, rebuilt = ensure_context_matches(traces, model, tasks=tasks,
                                                 rebuild=model is not None or tasks is not None)
    except ValueError as err:
        if tasks is None and "task file" in str(err):
            raise ValueError(f"{err} (--tasks FILE or a built-in name such as spec_bench)") from err
        raise
    positions = len(filled.tokens)
    print(f"copyability of {what}: their recorded context_match column ({positions} positions)" if rebuilt is None
          else f"copyability of {what}: rebuilt from the prompts with {rebuilt}'s tokenizer ({positions} positions)")
    return filled

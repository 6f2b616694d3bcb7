"""``entropy-law predict``: will drafting pay on a workload no drafter has decoded yet?

Reads the workload's target entropies (a trace set: e.g. ``entropy-law record --drafter ar`` on your prompts, or
an imported engine log with ``entropy-law entropy``) and, per drafting arm of ``--from`` (trace runs of that
drafter on the same target, timed with an AR run on the same machine), prices each workload request with the arm's
law, drafted depths and cost model (``TraceAnalysis.predict``). Prints per category the verdict first, the
predicted speedup with its interval, and that interval widened by the law's transfer error (its largest
leave-one-category-out error on the arm's own categories), which the verdict needs on one side of 1.
"""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="will drafting pay on a workload? predicted from its target entropies "
                                              "with a drafting arm's law and costs")
    p.add_argument("workload", help="trace runs of the workload (any arm: AR is enough), a run or a folder of runs")
    p.add_argument("--from", dest="arm_traces", required=True, metavar="TRACES",
                   help="trace runs of the drafting arm(s) and an AR run, timed together on this target and machine "
                        "(e.g. data/traces_timed)")
    p.add_argument("--drafter", action="append", metavar="ARM",
                   help="only this arm, e.g. 'ngram ddtree16' (repeatable; default: every drafting arm)")
    p.add_argument("--transfer-error", type=float, default=None, metavar="X",
                   help="the law's relative error on a new category, e.g. 0.2 (default: measured by "
                        "leave-one-category-out on the arm's categories)")
    p.add_argument("--n-boot", type=int, default=100, help="replicates for the intervals (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the law layer loads only here
    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.traces.reader import load_traces

    if args.n_boot < 0:
        raise ValueError(f"--n-boot must be >= 0, got {args.n_boot}")
    if args.transfer_error is not None and not args.transfer_error >= 0:
        raise ValueError(f"--transfer-error must be >= 0 (a relative error such as 0.2), got {args.transfer_error}")
    workload = load_traces(args.workload)
    analysis = TraceAnalysis(load_traces(args.arm_traces), n_boot=args.n_boot, seed=args.seed)
    arms = args.drafter or analysis.arms
    if not arms:
        raise ValueError(f"{args.arm_traces} holds no drafting arm: --from needs trace runs of a drafter (and AR)")
    unknown = [a for a in arms if a not in analysis.arms]
    if unknown:
        raise ValueError(f"no drafting arm {', '.join(map(repr, unknown))} in {args.arm_traces}; arms: "
                         f"{', '.join(analysis.arms)}")
    for arm in arms:
        result = analysis.predict(arm, workload, transfer_error=args.transfer_error)
        print(result.title)
        print(result.answer())
        for note in result.notes:
            print(f"  note: {note}")
        print()
    return 0

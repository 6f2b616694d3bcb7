"""``entropy-law controllers``: the law policy against the controllers engines ship, replayed over the same requests."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "controllers", help="compare the law policy with the engines' draft-length controllers (replayed, modelled)",
        description="Replay the field's draft-length controllers, the law policy, fixed trees and the replay oracle "
                    "over the greedy outputs of recorded requests; price every round by the measured cost curve; print "
                    "per category tokens per round, modelled speedup with a request bootstrap interval and the share "
                    "of the oracle's speedup.")
    p.add_argument("traces", nargs="+", help="trace sets with an AR run (TRACES/ar) or AR runs: the requests replayed")
    p.add_argument("--policy", required=True, metavar="FITTED.json",
                   help="the drafter's law policy parameters (entropy-law policy ... --out)")
    p.add_argument("--from", dest="source", default="data/traces_timed",
                   help="timed traces whose drafter arm gives the drafter, tree and cost curve (default: %(default)s)")
    p.add_argument("--drafter", choices=("ngram", "block"), default="ngram",
                   help="the drafter replayed, with its DDTree16 arm of --from (block: a target pass per request)")
    p.add_argument("--arm", default=None, metavar="RUN",
                   help="the drafting run whose drafter and tree are replayed (default: --from's DDTree16 arm)")
    p.add_argument("--sample", type=int, default=None, metavar="K",
                   help="a seeded sample of K requests per category of each trace set (default: all)")
    p.add_argument("--min-prompt-tokens", type=int, default=0, metavar="N",
                   help="only requests whose prompt has at least N tokens (the long prompts)")
    p.add_argument("--tasks", default=None, help="the prompts' task file, where a run's run.json names none")
    p.add_argument("--seed", type=int, default=0, help="the sample's, the folds' and the bootstrap's seed")
    p.set_defaults(func=run)


def compare(args) -> tuple:
    """(the rows, the per-category table, the cost curve): every configuration replayed over ``args.traces``."""
    import pandas as pd

    from entropy_law.analysis import TraceAnalysis
    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.controllers import replay_controllers
    from entropy_law.payoff.controllers import controller_table
    from entropy_law.payoff.cost import verify_curve
    from entropy_law.payoff.policy import load_policy
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.reader import load_traces

    if args.sample is not None and args.sample < 1:
        raise ValueError(f"--sample must be >= 1 requests a category, got {args.sample}")
    source = TraceAnalysis(load_traces(args.source), n_boot=0)
    arms = [a for a in source.arms if a.startswith(args.drafter) and a.endswith("ddtree16")]
    if not arms:
        raise ValueError(f"{args.source} holds no {args.drafter} DDTree16 arm: give --from timed traces that do")
    path_of = dict(zip(source.runs["arm"], source.runs["path"]))
    arm_meta = read_run_json(Path(getattr(args, "arm", None) or path_of[arms[0]]) / RUN_FILE)
    law = load_policy(args.policy)
    if law.get("drafter_id") not in (None, arm_meta.get("drafter_id")):
        raise ValueError(f"--policy is fitted for drafter {law.get('drafter_id')!r}, --drafter {args.drafter} is "
                         f"{arm_meta.get('drafter_id')!r}: give that drafter's law policy")
    curve = VerifyCost.from_config(verify_curve(source.cost_model(arms[0])))
    target = load_target(arm_meta.get("model_id") or "smollm2-135m")
    frames = []
    for trace_set in map(Path, args.traces):
        ar = trace_set / "ar" if (trace_set / "ar").is_dir() else trace_set
        requests = load_traces(ar).requests
        requests = requests.loc[requests["prompt_tokens"] >= getattr(args, "min_prompt_tokens", 0)]
        if requests.empty:
            raise ValueError(f"{ar}: no request with at least {args.min_prompt_tokens} prompt tokens")
        if args.sample is not None:
            requests = requests.groupby("category", observed=True, group_keys=False).apply(
                lambda g: g.sample(min(args.sample, len(g)), random_state=args.seed))
        frames.append(replay_controllers(ar, arm_meta, target, law, curve, seed=args.seed, workload=trace_set.name,
                                         requests=requests["request_id"].astype(str).tolist(),
                                         tasks=getattr(args, "tasks", None)))
    rows = pd.concat(frames, ignore_index=True)
    return rows, controller_table(rows, seed=args.seed), curve


def report(rows, table, curve, args) -> str:
    """The printed comparison: speedup per category, the overall line of each configuration, law / best field."""
    from entropy_law.jobs.controllers import LAW, is_field
    from entropy_law.payoff.controllers import paired_ratio

    wide = table.pivot(index="config", columns="category", values="speedup").round(3)
    overall = table.loc[table["category"] == "all"].set_index("config")
    lines = [f"verify cost c(n) of {args.source}'s {args.drafter} DDTree16 cost model: {curve.describe()}",
             f"{rows['request'].nunique()} requests of {', '.join(args.traces)}",
             "", "modelled speedup over AR per category (replayed, priced; not timed)", wide.to_string(), "",
             "all requests: tokens per round, speedup [95% request bootstrap], share of the oracle's, information read"]
    for config, r in overall.sort_values("speedup", ascending=False).iterrows():
        lines.append(f"  {config:<58} {r['tokens_per_round']:5.2f}  {r['speedup']:.3f}x [{r['lo']:.3f}, "
                     f"{r['hi']:.3f}]  {r['of_oracle']:6.1%}  {r['information']}")
    best = overall.loc[[c for c in overall.index if is_field(c)], "speedup"].idxmax()
    ratio, lo, hi = paired_ratio(rows, LAW, best, seed=args.seed)
    lines += ["", f"law policy / best field controller ({best}): {ratio:.3f} [{lo:.3f}, {hi:.3f}] (paired request "
              f"bootstrap); law policy reaches {overall.loc[LAW, 'of_oracle']:.1%} of the oracle"]
    return "\n".join(lines)


def run(args) -> int:
    print(report(*compare(args), args))
    return 0

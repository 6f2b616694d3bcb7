"""Will drafting pay on a category the tool never saw? Predicted from target entropies alone, against measured.

For every drafting arm of a timed trace set (``data/traces_timed``: AR, n-gram chain, n-gram DDTree16 and block
DDTree16 decoding the same 40 Spec-Bench prompts, interleaved, CPU clock) and every category c:

1. hold c out of every run (the arm's and AR's): the law, the drafted-depth model, the cost model and t_AR are
   fitted on the other categories only;
2. predict the arm's speedup on c from the AR run's target entropies of c (``TraceAnalysis.predict``: what a
   researcher has before drafting: an AR run of the new workload). Its verdict interval is widened by the
   transfer error, the largest leave-one-category-out |error| of tokens per round among the other categories;
3. compare with the arm's measured paired speedup on c (all runs, CPU clock; ``TraceAnalysis.speedup``).

With ``--replayed`` each prediction is made a second way, as ``entropy-law predict --replay`` makes it: the arm's
drafter replayed over the AR run's outputs of the held-out category with the arm's ratio gate
(``jobs.reference.workload_proposals``; loads the default target) gives the drafted depth at every position and,
through ``law_exp_obs_ceil_drafttop``, the drafter's confidence; that law is fitted on ``--law-traces`` (recorded
``draft_top1_prob`` and replayed proposals; default ``data/traces``) without the held-out category, and the transfer
error is its LOCO error with replayed depths there.

With ``--rounds`` a third way, as ``entropy-law predict --replay-rounds`` makes it: the arm's rounds replayed
exactly over the AR run's outputs of the held-out category (``jobs.reference.workload_rounds``: its tree, budget and
gate; a drafter that proposes from the context decodes the same rounds on the same greedy output), priced by the
cost model and t_AR fitted on the other categories, no law; the verdict's interval is widened by the cost model's
largest error on the other categories given their recorded rounds (``TraceAnalysis.cost_error``).

Reports per arm x category the predicted speedup, its interval and verdict, the measured speedup and interval,
the relative error, and whether the verdict was right: "pays" is right where the measured interval lies above 1
(wrong where it lies below), "does not pay" the reverse; "unclear" is never wrong, and is counted as no answer.
Ends with ONE JSON line.

    OMP_NUM_THREADS=1 python bench/predict_unseen.py data/traces_timed | tee bench/results/predict_unseen.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entropy_law.law.analysis import TraceAnalysis  # noqa: E402
from entropy_law.law.workload import DOES_NOT_PAY, PAYS, REPLAYED_FAMILY, verdict_right  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402


right = verdict_right  # whether a verdict agrees with the measured interval (law.workload, shared with other benches)


def subset(traces, keep) -> SimpleNamespace:
    """The four tables restricted to the requests whose category ``keep(category)`` accepts (runs kept)."""
    out = {}
    for name in ("tokens", "rounds", "requests"):
        table = getattr(traces, name)
        if name == "rounds":  # rounds carry no category: by request
            ids = set(traces.requests.loc[keep(traces.requests["category"].astype(str)), "request_id"].astype(str))
            out[name] = table.loc[table["request_id"].astype(str).isin(ids)].reset_index(drop=True)
        else:
            out[name] = table.loc[keep(table["category"].astype(str))].reset_index(drop=True)
    return SimpleNamespace(runs=traces.runs, **out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="?", default="data/traces_timed")
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replayed", action="store_true",
                        help="also predict with the drafter's replayed proposals and law_exp_obs_ceil_drafttop")
    parser.add_argument("--law-traces", default="data/traces",
                        help="with --replayed: traces of the same arms with recorded draft_top1_prob and replayed "
                             "proposals, for the law in the drafter's confidence (default data/traces)")
    parser.add_argument("--rounds", action="store_true",
                        help="also predict from the arm's rounds replayed exactly over the AR outputs (no law)")
    parser.add_argument("--context-match", action="store_true",
                        help="attach the context's copyability (rebuilt from the prompts with the runs' target's "
                             "tokenizer where not recorded): the drafted-depth model then reads it")
    parser.add_argument("--family", default=None,
                        help="the law that prices the workloads (default: the primary law, law.analysis."
                             "DEFAULT_FAMILY); e.g. law_exp_obs_ceil_top1, whose DP reads the target's top-1 "
                             "probability at every position of the AR run")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # SmallSampleWarning et al.: the notes and the table say it
    family = {} if args.family is None else {"family": args.family}
    t0 = time.process_time()
    traces = load_traces(args.traces)
    if args.context_match:
        from entropy_law.jobs.reference import ensure_context_matches

        traces, rebuilt = ensure_context_matches(traces)
        source = f"rebuilt from the prompts with {rebuilt}'s tokenizer" if rebuilt else "as recorded"
        print(f"context's copyability {source}: the drafted-depth model reads it", flush=True)
    full = TraceAnalysis(traces, n_boot=args.n_boot, seed=args.seed, **family)
    ar_runs = set(full.runs.loc[full.runs["is_ar"], "run_id"])
    if not ar_runs:
        raise SystemExit(f"{args.traces} has no AR run: the workload's entropies come from one")
    print(f"traces {args.traces}: arms {full.arms}; categories {full.categories}; law {full.family}; "
          f"{args.n_boot} replicates (seed {args.seed})")
    replays, replayed_rounds = {}, {}
    if (args.replayed or args.rounds) and len(ar_runs) != 1:
        raise SystemExit("--replayed / --rounds replay the drafters over one AR run: the traces hold several")
    if args.replayed or args.rounds:
        import torch

        from entropy_law.decoding.loading import load_target
        from entropy_law.jobs.reference import workload_proposals, workload_rounds
        from entropy_law.traces.proposals import read_proposals

        torch.set_num_threads(1)
        target = load_target("smollm2-135m")
        ar_path = full.runs.loc[full.runs["is_ar"], "path"].iloc[0]
        if args.replayed:
            law_traces, law_proposals = load_traces(args.law_traces), read_proposals(args.law_traces)
            if law_proposals is None:
                raise SystemExit(f"--replayed: no proposals.parquet in {args.law_traces}")
        for arm in full.arms:  # the arm's drafter over the AR run's outputs, with the arm's gate
            arm_meta = json.loads((Path(full.runs.loc[full.runs["arm"] == arm, "path"].iloc[0]) / "run.json")
                                  .read_text())
            if args.replayed:
                replays[arm] = workload_proposals(ar_path, arm_meta, target)
                print(f"  {arm}: proposals replayed over {ar_path} with {replays[arm].attrs['gate']}", flush=True)
            if args.rounds:
                replayed_rounds[arm] = workload_rounds(ar_path, arm_meta, target)
                print(f"  {arm}: rounds replayed over {ar_path} with {replayed_rounds[arm].attrs['gate']}", flush=True)
    modes = ["entropy"] + (["replayed"] if args.replayed else []) + (["rounds"] if args.rounds else [])
    rows = []
    for mode, arm in [(m, a) for m in modes for a in full.arms]:
        measured = full.speedup(arm).set_index("category")
        for category in full.categories:
            train_traces = subset(traces, lambda c, held=category: c != held)
            held = subset(traces, lambda c, held=category: c == held)
            workload = SimpleNamespace(runs=held.runs.loc[held.runs["run_id"].isin(ar_runs)],
                                       tokens=held.tokens.loc[held.tokens["run_id"].isin(ar_runs)],
                                       rounds=held.rounds, requests=held.requests)
            held_ids = set(held.requests["request_id"].astype(str))
            if mode == "entropy":
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                pred = train.predict(arm, workload)
            elif mode == "rounds":  # the arm's rounds replayed over the held-out AR outputs, priced without a law
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                table = replayed_rounds[arm]
                pred = train.predict(arm, workload, rounds=table.loc[table["request_id"].astype(str).isin(held_ids)])
            else:  # the arm's drafter replayed over the held-out AR outputs
                # the law in the drafter's confidence needs recorded draft_top1_prob: from the law traces (the
                # same arm, without the held-out category), with its LOCO error there (replayed depths)
                ref = TraceAnalysis(subset(law_traces, lambda c, held=category: c != held), n_boot=args.n_boot,
                                    seed=args.seed, family=REPLAYED_FAMILY, proposals=law_proposals)
                accuracy = ref.loco(arm, "replayed").accuracy.loc["tokens_per_round"]
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                pred = train.predict(arm, workload, law=ref.law(arm),
                                     transfer_error=float(accuracy["max_abs_relative_error"]),
                                     proposals=replays[arm].loc[replays[arm]["request_id"].isin(held_ids)])
            p = pred.summary.loc[category]
            m = measured.loc[category] if category in measured.index else None
            m_speed, m_lo, m_hi = ((float(m["speedup"]), float(m["lo"]), float(m["hi"])) if m is not None
                                   else (np.nan, np.nan, np.nan))
            rows.append(dict(mode=mode, arm=arm, category=category, predicted=float(p["predicted_speedup"]),
                             ci_low=float(p["ci_low"]), ci_high=float(p["ci_high"]), low=float(p["low"]),
                             high=float(p["high"]), transfer_error=pred.transfer_error, verdict=p["verdict"],
                             predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                             measured=m_speed, measured_lo=m_lo, measured_hi=m_hi,
                             measured_tokens_per_round=float(m["tokens_per_round"]) if m is not None else np.nan,
                             relative_error=float(p["predicted_speedup"]) / m_speed - 1,
                             inside_widened=bool(p["low"] <= m_speed <= p["high"]),
                             inside_measured=bool(m_lo <= p["predicted_speedup"] <= m_hi),
                             right=right(p["verdict"], m_lo, m_hi)))
            print(f"  {mode:<8} {arm:<36} {category:<15} predicted {p['predicted_speedup']:.2f}x [{p['low']:.2f}, "
                  f"{p['high']:.2f}] {p['verdict']:<12} measured {m_speed:.2f}x [{m_lo:.2f}, {m_hi:.2f}]", flush=True)
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print()
        print(table.round(3).to_string(index=False))
    out = {"bench": "predict_unseen", "traces": str(args.traces), "family": full.family, "n_boot": args.n_boot,
           "seed": args.seed, "cpu_s": round(time.process_time() - t0, 1), "arms": {}}
    print()
    for (mode, arm), g in table.groupby(["mode", "arm"], sort=False):
        answered = g["verdict"].isin([PAYS, DOES_NOT_PAY])
        judged = g["right"].notna()
        summary = {"categories": len(g), "speedup_mean_abs_error": float(g["relative_error"].abs().mean()),
                   "speedup_max_abs_error": float(g["relative_error"].abs().max()),
                   "inside_widened": int(g["inside_widened"].sum()), "inside_measured": int(g["inside_measured"].sum()),
                   "answered": int(answered.sum()),
                   "right": int((g["right"] == True).sum()), "wrong": int((g["right"] == False).sum()),  # noqa: E712
                   "judged": int(judged.sum()), "transfer_error_mean": float(g["transfer_error"].mean()),
                   "tokens_per_round_mean_error": float((g["predicted_tokens_per_round"]
                                                         / g["measured_tokens_per_round"] - 1).mean())}
        out["arms"][arm if mode == "entropy" else f"{arm} ({mode})"] = summary
        print(f"{arm} ({mode}): speedup |error| mean {summary['speedup_mean_abs_error']:.1%} (max "
              f"{summary['speedup_max_abs_error']:.1%}); measured inside the widened interval in "
              f"{summary['inside_widened']} of {len(g)}, predicted inside the measured interval in "
              f"{summary['inside_measured']} of {len(g)}; verdicts given {summary['answered']} of {len(g)}, right "
              f"{summary['right']}, wrong {summary['wrong']} (judged where the measured interval excludes 1); "
              f"transfer error used {summary['transfer_error_mean']:.1%} on average; tokens/round predicted "
              f"{summary['tokens_per_round_mean_error']:+.1%} against the timed run on average")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

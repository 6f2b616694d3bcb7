"""The issue's "must show" checks on simulated traces, as one script.

1. Recovery: on ``--sets`` simulated data sets (known k, lambda_d, no category effect), the share in
   which the 95% cluster-robust intervals of law_exp contain the true k and lambda_1 (goal >= 90%).
2. Universality under the null: rejection rate at 5% of the robust score test (decision) and of the
   robust Wald test, on the same data sets (goal: about 5%).
3. Universality with a category effect (``--power-sets`` data sets, rag's rate x exp(0.3)): power.
4. Wrong link: grouped 5-fold CV log-loss of law_exp vs law_logit on ``--cv-sets`` data sets.
5. Block level: DP-predicted vs observed tokens per round (pooled relative error per data set) and
   the i.i.d. plug-in with the category-mean acceptance at round starts.
6. Drafted depth: ``--depth-sets`` data sets whose chain drafts a variable depth per round
   (``DepthSpec``: 25% no draft; independent of the context, and coupled to the entropy at the round
   start), DP with the drafted-depth models observed / category / full (goal: observed within 2%).

Prints a table per check and ends with one JSON line. Runs in a few minutes on one core.

    python bench/law_recovery.py [--sets 50] [--power-sets 20] [--cv-sets 5] [--depth-sets 20] [--requests 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entropy_law.law.compare import compare_laws  # noqa: E402
from entropy_law.law.fit import fit_law  # noqa: E402
from entropy_law.law.hypotheses import universality_test  # noqa: E402
from entropy_law.law.simulate import DepthSpec, simulate_traces  # noqa: E402
from entropy_law.law.transfer import block_prediction  # noqa: E402

K_TRUE = 0.8
LAMBDA_TRUE = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]


def simulate(seed, requests, effects=None, depths=None):
    return simulate_traces(seed=seed, n_requests_per_category=requests, k=K_TRUE, lambda_d=LAMBDA_TRUE, block_size=8,
                           tokens_per_request=(80, 140), category_effects=effects, block_depths=depths)


def depth_check(seed, requests, coupling):
    """Pooled relative error of the DP's tokens per round under each drafted-depth model."""
    tr = simulate(seed, requests, depths=DepthSpec(entropy_coupling=coupling))
    law = fit_law(tr, "law_exp")
    row = dict(coupling=coupling)
    for mode in ("observed", "category", "full"):
        bp = block_prediction(law, tr, depths=mode).summary
        w = bp["requests"]
        row[mode] = (bp["dp_tokens_per_round"] @ w) / (bp["observed_tokens_per_round"] @ w) - 1
        if mode == "observed":
            row["observed_max_abs_category"] = bp["dp_relative_error"].abs().max()
            row["observed_mean_accepted"] = (bp["dp_mean_accepted"] @ w) / (bp["observed_mean_accepted"] @ w) - 1
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=50)
    parser.add_argument("--power-sets", type=int, default=20)
    parser.add_argument("--cv-sets", type=int, default=5)
    parser.add_argument("--depth-sets", type=int, default=20, help="data sets per coupling of the drafted-depth check")
    parser.add_argument("--requests", type=int, default=20, help="requests per category (5 categories)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()

    rows = []
    for i in range(args.sets):
        tr = simulate(args.seed * 10_000 + i, args.requests)
        law = fit_law(tr, "law_exp")
        s = law.summary
        uni = universality_test(tr).summary["value"]
        bp = block_prediction(law, tr).summary
        w = bp["requests"]
        rows.append(dict(
            k=s.loc["k", "estimate"], k_se=s.loc["k", "std_err"],
            k_covered=s.loc["k", "ci_low"] <= K_TRUE <= s.loc["k", "ci_high"],
            lambda_1=s.loc["lambda[d=1]", "estimate"],
            lambda_1_covered=s.loc["lambda[d=1]", "ci_low"] <= LAMBDA_TRUE[0] <= s.loc["lambda[d=1]", "ci_high"],
            p_score=uni["p_value"], p_wald=uni["p_wald_f"],
            dp_rel_error=(bp["dp_tokens_per_round"] @ w) / (bp["observed_tokens_per_round"] @ w) - 1,
            dp_max_abs_category_error=bp["dp_relative_error"].abs().max(),
            iid_round_start_rel_error=(bp["iid_round_start_tokens_per_round"] @ w)
            / (bp["observed_tokens_per_round"] @ w) - 1,
            iid_round_start_math=bp.loc["math_reasoning", "iid_round_start_relative_error"],
            iid_position_rel_error=(bp["iid_position_tokens_per_round"] @ w) / (bp["observed_tokens_per_round"] @ w) - 1,
        ))
    rec = pd.DataFrame(rows)

    power = []
    for i in range(args.power_sets):
        tr = simulate(args.seed * 10_000 + 5000 + i, args.requests, effects={"rag": 0.3})
        uni = universality_test(tr).summary["value"]
        power.append(dict(p_score=uni["p_value"], p_wald=uni["p_wald_f"]))
    power = pd.DataFrame(power)

    cv = []
    for i in range(args.cv_sets):
        tr = simulate(args.seed * 10_000 + 8000 + i, args.requests)
        comp = compare_laws(tr, ("law_exp", "law_logit", "law_power"), n_folds=5, seed=i)
        diff, se = comp.paired_difference("law_logit", "law_exp")
        cv.append(dict(law_exp=comp.summary.loc["law_exp", "cv_log_loss"],
                       law_logit=comp.summary.loc["law_logit", "cv_log_loss"],
                       law_power=comp.summary.loc["law_power", "cv_log_loss"], logit_minus_exp=diff, se=se,
                       best=comp.best))
    cv = pd.DataFrame(cv)

    depth = pd.DataFrame([depth_check(args.seed * 10_000 + 9000 + i, args.requests, coupling)
                          for coupling in (0.0, 1.0) for i in range(args.depth_sets)])

    out = dict(sets=args.sets, requests_per_category=args.requests, categories=5)
    if len(rec):
        out.update(
            k_coverage=float(rec["k_covered"].mean()), lambda_1_coverage=float(rec["lambda_1_covered"].mean()),
            k_mean=float(rec["k"].mean()), k_sd=float(rec["k"].std()), k_mean_se=float(rec["k_se"].mean()),
            lambda_1_mean=float(rec["lambda_1"].mean()),
            null_rejection_score=float((rec["p_score"] < 0.05).mean()),
            null_rejection_wald=float((rec["p_wald"] < 0.05).mean()))
    out.update(
        power_sets=args.power_sets, power_score=float((power["p_score"] < 0.05).mean()) if len(power) else None,
        power_wald=float((power["p_wald"] < 0.05).mean()) if len(power) else None,
        cv_sets=args.cv_sets, cv_exp_beats_logit=float((cv["logit_minus_exp"] > 2 * cv["se"]).mean()) if len(cv) else None,
        cv_mean_logit_minus_exp=float(cv["logit_minus_exp"].mean()) if len(cv) else None)
    if len(rec):
        out.update(
            dp_mean_rel_error=float(rec["dp_rel_error"].mean()),
            dp_mean_abs_rel_error=float(rec["dp_rel_error"].abs().mean()),
            dp_max_abs_category_error=float(rec["dp_max_abs_category_error"].max()),
            iid_round_start_mean_rel_error=float(rec["iid_round_start_rel_error"].mean()),
            iid_round_start_math_mean_rel_error=float(rec["iid_round_start_math"].mean()),
            iid_position_mean_rel_error=float(rec["iid_position_rel_error"].mean()))
        out["goal_recovery_met"] = out["k_coverage"] >= 0.9 and out["lambda_1_coverage"] >= 0.9
        out["goal_dp_met"] = abs(out["dp_mean_rel_error"]) <= 0.02
    out["depth_sets"] = args.depth_sets
    if len(depth):
        for mode in ("observed", "category", "full"):
            for c in (0.0, 1.0):
                out[f"depth_{mode}_mean_rel_error_coupling_{c:g}"] = float(depth.loc[depth["coupling"] == c, mode].mean())
        out["depth_observed_max_abs_category_error"] = float(depth["observed_max_abs_category"].max())
        out["depth_observed_mean_accepted_mean_rel_error"] = float(depth["observed_mean_accepted"].mean())
        out["goal_depth_dp_met"] = all(abs(out[f"depth_observed_mean_rel_error_coupling_{c:g}"]) <= 0.02
                                       for c in (0.0, 1.0))
    out["seconds"] = round(time.perf_counter() - t0, 1)

    print(f"1-2. recovery and universality under the null: {args.sets} data sets, 5 categories x {args.requests} "
          f"requests, true k = {K_TRUE}, lambda_1 = {LAMBDA_TRUE[0]}")
    print(rec.describe().loc[["mean", "std", "min", "max"]].round(4).to_string() if len(rec) else "(skipped)")
    print(f"\n3. universality with rag's rate x exp(0.3): {args.power_sets} data sets")
    print(power.describe().round(4).to_string() if len(power) else "(skipped)")
    print(f"\n4. wrong link by grouped 5-fold CV log-loss: {args.cv_sets} data sets")
    print(cv.round(5).to_string() if len(cv) else "(skipped)")
    print(f"\n6. drafted depth per round (DepthSpec, 25% no draft): {args.depth_sets} data sets per coupling; pooled "
          "relative error of the DP's tokens per round by depth model")
    print(depth.groupby("coupling").describe().T.round(4).to_string() if len(depth) else "(skipped)")
    print("\nsummary")
    for key, value in out.items():
        print(f"  {key:40s} {value}")
    print(json.dumps({"bench": "law_recovery", **out}))


if __name__ == "__main__":
    main()

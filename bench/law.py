"""The law itself: its categories, its leads, its recovery on simulations, its intervals, the drafter's confidence and
the replayed proposals it reads.

Subcommands (each prints a table and ends with one JSON line):

    python bench/law.py categories [ARGS]
    python bench/law.py leads [ARGS]
    python bench/law.py recovery [ARGS]
    python bench/law.py intervals [ARGS]
    python bench/law.py confidence [ARGS]
    python bench/law.py proposals [ARGS]
    python bench/law.py category-table [ARGS]

``python bench/law.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, run_subcommand  # noqa: E402

import entropy_law.payoff.predict as predict  # noqa: E402
from entropy_law.law import arms, atrisk  # noqa: E402
from entropy_law.analysis import TraceAnalysis  # noqa: E402
from entropy_law.law.compare import (COVARIATE_CANDIDATES, PRIMARY_CANDIDATES,  # noqa: E402
                                     category_share_of_gain, choose_primary, compare_laws)
from entropy_law.law.fit import PRIMARY_FAMILY, fit_law, get_family  # noqa: E402
from entropy_law.law.hypotheses import universality_test  # noqa: E402
from entropy_law.payoff.predict import OVERDISPERSION_SOURCES, loco_predictions  # noqa: E402
from entropy_law.analysis.simulate import DepthSpec, simulate_traces  # noqa: E402
from entropy_law.law.transfer import block_prediction  # noqa: E402
from entropy_law.law.transfer import loco_transfer  # noqa: E402
from entropy_law.traces.proposals import read_proposals  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402
from entropy_law.traces.stats import CONTEXT_MATCH_MAX as COPY_MAX  # noqa: E402


# --- categories ------------------------------------------------------------------------------------------------------

GOALS = dict(tokens_per_round_mae=0.10, mean_tau_mae=0.15, category_share=0.05, rho=1.0, coverage=(0.85, 0.95))
RHO_ARMS = ("block-drafter-b8-l2-copy ddtree16", "ngram chain")  # the ranking goal names these two arms
DRAFTER_AWARE = "law_exp_obs_ceil_drafttop"  # law_exp_obs_ceil + the drafter's top-1 probability (replayed DP)
COPY_FAMILY = "law_exp_obs_ceil_copy"  # law_exp_obs_ceil + the context's copyability (tokens column context_match)
DRAFTER_AWARE_COPY = "law_exp_obs_ceil_drafttop_copy"  # both
TOP1_COPY = "law_exp_obs_ceil_top1_copy"  # the target's top-1 probability and the copyability
DRAFTER_AWARE_TOP1_COPY = "law_exp_obs_ceil_drafttop_top1_copy"  # the drafter's and the target's top-1, copyability


def has_values(rows: pd.DataFrame, column: str) -> bool:
    return column in rows and bool(rows[column].notna().all())


def replayed_section(view, arm: str, rows: pd.DataFrame, proposals: pd.DataFrame, primary: str, draws: int,
                     seed: int, drafter_aware: tuple = (DRAFTER_AWARE,), overdispersion: str = "nested") -> dict:
    """Section 5 for one arm: LOCO with the replayed proposals, the drafter-aware laws (those whose inputs the
    at-risk rows hold) and the primary law."""
    laws = [f for f in drafter_aware if has_values(rows, "draft_top1_prob")
            and all(has_values(rows, c) for c in get_family(f).position_columns)] + [primary]
    out = {}
    for family in laws:
        loco = loco_transfer(view, family, drafter=arm, depths="replayed", proposals=proposals)
        acc = loco.accuracy
        pred = loco_predictions(view, family, drafter=arm, n_draws=draws, seed=seed, proposals=proposals,
                                overdispersion=overdispersion)
        centre = pred.category_accuracy()
        low, high = pred.coverage_interval()
        res = dict(tokens_per_round_mae=centre["mean_abs_relative_error"],
                   tokens_per_round_max=centre["max_abs_relative_error"],
                   tokens_per_round_signed=centre["mean_relative_error"], rho=centre["spearman_rho"],
                   rho_p=centre["p_permutation"],
                   dp_tokens_per_round_mae=float(acc.loc["tokens_per_round", "mean_abs_relative_error"]),
                   dp_rho=float(acc.loc["tokens_per_round", "spearman_rho"]),
                   mean_tau_mae=centre["mean_accepted_mean_abs_relative_error"],
                   mean_tau_max=centre["mean_accepted_max_abs_relative_error"],
                   dp_mean_tau_mae=float(acc.loc["mean_accepted", "mean_abs_relative_error"]),
                   depth_only_tokens_per_round_mae=float(acc.loc["tokens_per_round_depth_only",
                                                                 "mean_abs_relative_error"]),
                   depth_only_mean_tau_mae=float(acc.loc["mean_accepted_depth_only", "mean_abs_relative_error"]),
                   coverage=pred.coverage, coverage_low=low, coverage_high=high,
                   coverage_min_category=float(pred.summary["coverage"].min()),
                   mean_relative_width=float(((pred.requests["upper"] - pred.requests["lower"])
                                              / pred.requests["center"]).mean()))
        if family != primary:
            share = category_share(rows, family, seed)
            res.update(category_share=share["cv_category_share"], cv_gain_law=share["cv_gain_law_vs_depth_only"],
                       cv_gain_cat=share["cv_gain_cat_vs_law"])
        print(f"\n-- {arm}, {family}, replayed proposals --")
        dp = loco.summary[["depth_only_tokens_per_round", "depth_only_mean_accepted"]]
        intervals = pred.summary[["coverage", "mean_relative_width", "bias"]]
        print(pred.category_predictions().join(dp).join(intervals).round(3).to_string())
        print(f"centres: tokens/round |err| {res['tokens_per_round_mae']:.1%} (max {res['tokens_per_round_max']:.1%}, "
              f"signed {res['tokens_per_round_signed']:+.1%}), rho {res['rho']:.1f}, mean tau |err| "
              f"{res['mean_tau_mae']:.1%} (max {res['mean_tau_max']:.1%}); raw DP |err| "
              f"{res['dp_tokens_per_round_mae']:.1%}, tau {res['dp_mean_tau_mae']:.1%}; depth-only control "
              f"|err| {res['depth_only_tokens_per_round_mae']:.1%}, tau {res['depth_only_mean_tau_mae']:.1%}; 90% PI "
              f"coverage {res['coverage']:.1%} [{low:.1%}, {high:.1%}]"
              + (f"; category share {res['category_share']:.3f}" if "category_share" in res else ""), flush=True)
        out[family] = res
    return out


def category_share(rows, family: str, seed: int) -> dict:
    """``compare.category_share_of_gain``, or NaNs and why where it cannot be measured (a trace set with too few
    requests per category for the category terms' fits: the goal is then not met, and the table says nan)."""
    try:
        return category_share_of_gain(rows, family, seed=seed)
    except ValueError as err:
        why = str(err)
        return dict(cv_category_share=float("nan"), cv_gain_law_vs_depth_only=float("nan"),
                    cv_gain_cat_vs_law=float("nan"), why=why if len(why) < 300 else why[:300] + "...")


def categories_arguments(parser) -> None:
    """The arguments of ``categories``."""
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--draws", type=int, default=20, help="coefficient draws per held-out category")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overdispersion", choices=OVERDISPERSION_SOURCES, default="nested",
                        help="where the intervals' bias and overdispersion come from: the training categories' "
                             "residuals out of sample (nested LOCO, default) or in sample (payoff/predict.py)")
    parser.add_argument("--model", default=None,
                        help="the target whose tokenizer rebuilds the prompts (the context's copyability; default: "
                             "the one the runs name)")
    parser.add_argument("--tasks", default="spec_bench", help="the prompts' task file where run.json names none")
    parser.add_argument("--no-context-match", action="store_true",
                        help="do not attach the context's copyability to runs recorded without it (the copy laws "
                             "are then left out)")


def run_categories(args, parser) -> dict:
    """The law across categories: the goals, measured on a trace set, leave one category out.

    For every drafting arm of the traces (default ``data/traces``; the AR arm drafts nothing and is skipped):

    1. The primary-law rule of docs/law.md ("Choosing the primary law"): leave-one-category-out CV log-loss per
       at-risk trial of every candidate family (``compare.PRIMARY_CANDIDATES``; ``law_exp_draftent`` is scored
       where the drafter logs its entropy, for information: it is not a candidate), the mean over arms, the
       winner, and whether it equals ``fit.PRIMARY_FAMILY``.
    2. For the primary law (and ``law_exp``, the previous primary, for contrast), leak-free LOCO
       (``loco_transfer(depths="training")``): tokens/round mean |relative error| and max, mean accepted
       length per drafting round (mean tau) mean |relative error|, Spearman rho of the tokens/round ranking,
       next to the depth-only control with the same depth model.
    3. The primary law's category share of its CV gain over depth only (``compare.category_share_of_gain``:
       grouped 5-fold CV by request, category rates and exponents added to the primary law).
    4. The 90% per-request prediction intervals (``predict.loco_predictions``): coverage of the observed
       tokens/round over all held-out requests, with its Wilson 95% interval.

    5. Where the runs hold replayed proposals (``<run>/proposals.parquet``, written by ``bench/law.py proposals
       --write``: the drafter's own proposal at every output position, rebuilt offline from the prompt and the
       greedy output, no round's outcome): the same LOCO with depths ``"replayed"`` for the drafter-aware law
       ``law_exp_obs_ceil_drafttop`` (law_exp_obs_ceil + the drafter's top-1 probability, whose DP needs them) and
       for the primary law, its per-request intervals (``loco_predictions(proposals=...)``), the category
       predictions of their centres (the DP's T / E[N] times e^b, b the mean residual of the TRAINING categories'
       requests: ``RequestPredictions.category_predictions``), and the drafter-aware law's category share.

    The context's copyability (tokens column ``context_match``: the longest suffix of the prompt and the output before a
    position that occurred earlier, up to 8) is attached from the prompts to runs recorded without it (``--model``'s
    tokenizer, ``--tasks``; ``jobs.reference.attach_context_matches``; ``--no-context-match`` leaves it out). Where every
    arm's trials hold it, ``law_exp_obs_ceil_copy`` (law_exp_obs_ceil + the copyability) is a candidate of the rule in
    section 1; so are ``law_exp_obs_ceil_top1`` (law_exp_obs_ceil + the target's own top-1 probability at the position,
    tokens column ``target_top1_prob``) and ``law_exp_obs_ceil_top1_copy`` (both) wherever every arm's trials hold their
    columns (docs/law.md). Sections 2-5 evaluate the rule's winner in the primary law's place
    (``PRIMARY_FAMILY`` is the law for traces without those columns); section 5's drafter-aware law is chosen by the
    same rule among ``law_exp_obs_ceil_drafttop``, ``law_exp_obs_ceil_drafttop_copy`` and
    ``law_exp_obs_ceil_drafttop_top1_copy``.

    Goals: tokens/round mean |rel. error| <= 10% and mean tau <= 15% on every arm; category share
    <= 5% on every arm; rho = 1.0 on block DDTree16 and n-gram chain; coverage in [85%, 95%] on every arm.
    They are evaluated for the training depth model (section 2-4) and, separately, for the replayed proposals
    (section 5; tokens/round, rho and mean tau from the interval centres: mean tau = (T - rounds) / drafting
    rounds with each request's rounds at T / centre and the DP's share of drafting rounds in it, so that both come
    from one calibrated round count; the raw DP's mean tau beside it).
    A goal not met is printed as not met. Nothing here is tuned to the categories of the traces. Ends with one
    JSON line. CPU time with OMP_NUM_THREADS=1 on a shared machine: several minutes.

        OMP_NUM_THREADS=1 python bench/law.py categories [--traces data/traces] [--draws 20]
    """
    warnings.simplefilter("ignore")  # few-request warnings etc.: the fits here only predict
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    clock = time.process_time()
    traces = load_traces(args.traces)
    if not args.no_context_match:
        from entropy_law.jobs.reference import ensure_context_matches

        traces, rebuilt = ensure_context_matches(traces, args.model, tasks=args.tasks)
        if rebuilt:
            print(f"context's copyability attached from the prompts ({rebuilt}'s tokenizer, {args.tasks}): "
                  f"{int(traces.tokens['context_match'].notna().sum())} positions", flush=True)
    an = TraceAnalysis(traces)
    arms = an.arms
    print(f"traces {args.traces}: arms {arms}; categories {an.categories}; interval overdispersion: {args.overdispersion}")

    comparisons, views, rows_of = {}, {}, {}
    for arm in arms:
        views[arm] = an.arm_view(arm)
        rows_of[arm] = atrisk.at_risk_table(views[arm], drafters=[arm])
        def holds_columns(family):  # the at-risk rows hold every per-position column the law reads
            return all(has_values(rows_of[arm], c) for c in get_family(family).position_columns)

        families = list(PRIMARY_CANDIDATES) + [f for f in COVARIATE_CANDIDATES if holds_columns(f)]
        if has_values(rows_of[arm], "draft_entropy_nats"):
            families.append("law_exp_draftent")
        if has_values(rows_of[arm], "draft_top1_prob"):  # the drafter-aware laws (section 5), not candidates
            families += [f for f in (DRAFTER_AWARE, DRAFTER_AWARE_COPY, DRAFTER_AWARE_TOP1_COPY) if holds_columns(f)]
        comparisons[arm] = compare_laws(rows_of[arm], families, folds="category", seed=args.seed)
        for note in comparisons[arm].notes:
            print(f"  {arm}: {note}")
    copy = all(COPY_FAMILY in c.summary.index for c in comparisons.values())
    # the covariate laws are candidates of the rule (docs/law.md) wherever
    # every arm's at-risk trials hold their columns
    added = tuple(f for f in COVARIATE_CANDIDATES
                  if all(f in c.summary.index for c in comparisons.values()))
    candidates = tuple(PRIMARY_CANDIDATES) + added
    winner, table = choose_primary(comparisons, candidates)
    print("\n== 1. leave-one-category-out CV log-loss per at-risk trial (rule: docs/law.md) ==")
    print(table.round(4).to_string())
    for family in added:
        print(f"{family} is a candidate: every arm's at-risk trials hold its columns "
              f"{list(get_family(family).position_columns)}")
    aware = tuple(f for f in (DRAFTER_AWARE, DRAFTER_AWARE_COPY, DRAFTER_AWARE_TOP1_COPY)
                  if all(f in c.summary.index for c in comparisons.values()))
    aware_winner = None
    if aware:
        aware_winner, aware_table = choose_primary(comparisons, aware)
        print("drafter-aware laws (section 5; not candidates: their DP needs the replayed proposals), same rule:")
        print(aware_table[[*arms, "mean_cv_log_loss", "delta_vs_best", "delta_se", "tied", "n_params"]].round(4)
              .to_string())
        print(f"drafter-aware law by the rule: {aware_winner}")
    info = {arm: float(c.summary.loc["law_exp_draftent", "cv_log_loss"]) for arm, c in comparisons.items()
            if "law_exp_draftent" in c.summary.index}
    if info:
        print("not a candidate (drafter entropy, no DP, absent for n-gram arms): law_exp_draftent "
              + ", ".join(f"{a}: {v:.4f}" for a, v in info.items()))
    print(f"rule's winner: {winner}; PRIMARY_FAMILY = {PRIMARY_FAMILY} ({'same' if winner == PRIMARY_FAMILY else 'DIFFERENT'})")

    primary = winner
    if primary != PRIMARY_FAMILY:
        read = get_family(PRIMARY_FAMILY).position_columns
        extra = [c for c in get_family(primary).position_columns if c not in read]
        print(f"sections 2-5 evaluate the rule's winner {primary} (PRIMARY_FAMILY {PRIMARY_FAMILY} on traces "
              f"without its columns {extra}); its goals below are the ones that count here")
    results, lines = {}, []
    for arm in arms:
        view = views[arm]
        loco = {fam: loco_transfer(view, fam, drafter=arm, depths="training") for fam in dict.fromkeys((primary, "law_exp"))}
        acc = loco[primary].accuracy
        old = loco["law_exp"].accuracy
        share = category_share(rows_of[arm], primary, args.seed)
        pred = loco_predictions(view, primary, drafter=arm, n_draws=args.draws, seed=args.seed,
                                overdispersion=args.overdispersion)
        low, high = pred.coverage_interval()
        res = dict(
            tokens_per_round_mae=float(acc.loc["tokens_per_round", "mean_abs_relative_error"]),
            tokens_per_round_max=float(acc.loc["tokens_per_round", "max_abs_relative_error"]),
            tokens_per_round_signed=float(acc.loc["tokens_per_round", "mean_relative_error"]),
            mean_tau_mae=float(acc.loc["mean_accepted", "mean_abs_relative_error"]),
            rho=float(acc.loc["tokens_per_round", "spearman_rho"]),
            rho_p=float(acc.loc["tokens_per_round", "p_permutation"]),
            depth_only_tokens_per_round_mae=float(acc.loc["tokens_per_round_depth_only", "mean_abs_relative_error"]),
            depth_only_mean_tau_mae=float(acc.loc["mean_accepted_depth_only", "mean_abs_relative_error"]),
            depth_only_rho=float(acc.loc["tokens_per_round_depth_only", "spearman_rho"]),
            law_exp_tokens_per_round_mae=float(old.loc["tokens_per_round", "mean_abs_relative_error"]),
            law_exp_mean_tau_mae=float(old.loc["mean_accepted", "mean_abs_relative_error"]),
            law_exp_rho=float(old.loc["tokens_per_round", "spearman_rho"]),
            category_share=share["cv_category_share"], cv_gain_law=share["cv_gain_law_vs_depth_only"],
            cv_gain_cat=share["cv_gain_cat_vs_law"], coverage=pred.coverage, coverage_low=low, coverage_high=high,
            coverage_min_category=float(pred.summary["coverage"].min()),
            mean_relative_width=float(((pred.requests["upper"] - pred.requests["lower"]) / pred.requests["center"]).mean()),
            requests=int(len(pred.requests)))
        res["goals"] = dict(
            tokens_per_round=res["tokens_per_round_mae"] <= GOALS["tokens_per_round_mae"],
            mean_tau=res["mean_tau_mae"] <= GOALS["mean_tau_mae"],
            category_share=res["category_share"] <= GOALS["category_share"],
            coverage=GOALS["coverage"][0] <= res["coverage"] <= GOALS["coverage"][1])
        if arm in RHO_ARMS:
            res["goals"]["rho"] = res["rho"] >= GOALS["rho"] - 1e-12
        results[arm] = res
        print(f"\n== {arm} ==")
        print("LOCO (leak-free depths) per category, primary law:")
        print(loco[primary].summary[["observed_tokens_per_round", "predicted_tokens_per_round", "relative_error",
                                     "depth_only_tokens_per_round", "observed_mean_accepted",
                                     "predicted_mean_accepted", "mean_accepted_relative_error"]].round(3).to_string())
        print("per-request 90% intervals per category:")
        print(pred.summary.round(3).to_string())
        if share.get("why"):
            print(f"category share of CV gain ({primary}): not measured ({share['why']})")
        else:
            print(f"category share of CV gain ({primary}): {share['cv_category_share']:.3f} (gain of the law over depth "
                  f"only {share['cv_gain_law_vs_depth_only']:.4f}, of category terms {share['cv_gain_cat_vs_law']:.4f} "
                  "nats/trial)")
        print(f"[cumulative CPU {time.process_time() - clock:.0f} s]", flush=True)

    proposals = read_proposals(args.traces)
    replayed = {}
    if proposals is not None:
        print("\n== 5. replayed proposals (leak-free: the drafter's own proposal at every output position) ==")
        for arm in arms:
            run_ids = set(views[arm].runs["run_id"].astype(str))
            mine = proposals.loc[proposals["run_id"].isin(run_ids)]
            if set(mine["run_id"]) != run_ids:
                print(f"{arm}: no replayed proposals for every run (bench/law.py proposals --write); skipped")
                continue
            replayed[arm] = replayed_section(views[arm], arm, rows_of[arm], mine, primary, args.draws, args.seed,
                                             drafter_aware=aware, overdispersion=args.overdispersion)
            print(f"[cumulative CPU {time.process_time() - clock:.0f} s]", flush=True)

    print("\n== goals, LOCO over the categories, leak-free depths ==")
    head = ["arm", "tok/round |err| (≤10%)", "max", "control", "law_exp", "mean τ |err| (≤15%)", "control",
            "law_exp", "ρ (1.0)", "control ρ", "cat. share (≤5%)", "90% PI coverage (85–95%)", "goals met"]
    table_rows = []
    for arm, r in results.items():
        met = [k for k, v in r["goals"].items() if v]
        missed = [k for k, v in r["goals"].items() if not v]
        table_rows.append([arm, f"{r['tokens_per_round_mae']:.1%}", f"{r['tokens_per_round_max']:.1%}",
                           f"{r['depth_only_tokens_per_round_mae']:.1%}", f"{r['law_exp_tokens_per_round_mae']:.1%}",
                           f"{r['mean_tau_mae']:.1%}", f"{r['depth_only_mean_tau_mae']:.1%}",
                           f"{r['law_exp_mean_tau_mae']:.1%}",
                           f"{r['rho']:.1f}" + ("" if arm in RHO_ARMS else " (no goal)"), f"{r['depth_only_rho']:.1f}",
                           f"{r['category_share']:.3f}",
                           f"{r['coverage']:.1%} [{r['coverage_low']:.1%}, {r['coverage_high']:.1%}]",
                           "met: " + (",".join(met) or "none") + "; NOT met: " + (",".join(missed) or "none")])
    print(pd.DataFrame(table_rows, columns=head).to_string(index=False))
    every = {goal: all(r["goals"][goal] for r in results.values() if goal in r["goals"])
             for goal in ("tokens_per_round", "mean_tau", "category_share", "rho", "coverage")}
    for goal, ok in every.items():
        print(f"goal {goal}: {'met on every arm' if ok else 'NOT met'}")
    print(f"(control: depth-only acceptance, same leak-free depth model and DP; law_exp: the previous primary law)")
    replayed_goals = {}
    if replayed:
        print("\n== goals with the replayed proposals: drafter-aware law where it can be fitted ==")
        table_rows = []
        for arm, by_family in replayed.items():
            family = aware_winner if aware_winner in by_family else primary
            r = by_family[family]
            goals = dict(tokens_per_round=r["tokens_per_round_mae"] <= GOALS["tokens_per_round_mae"],
                         mean_tau=r["mean_tau_mae"] <= GOALS["mean_tau_mae"],
                         coverage=GOALS["coverage"][0] <= r["coverage"] <= GOALS["coverage"][1])
            if "category_share" in r:
                goals["category_share"] = r["category_share"] <= GOALS["category_share"]
            if arm in RHO_ARMS:
                goals["rho"] = r["rho"] >= GOALS["rho"] - 1e-12
            r["goals"], r["family"] = goals, family
            met = [k for k, v in goals.items() if v]
            missed = [k for k, v in goals.items() if not v]
            table_rows.append([arm, family, f"{r['tokens_per_round_mae']:.1%}", f"{r['tokens_per_round_max']:.1%}",
                               f"{r['dp_tokens_per_round_mae']:.1%}", f"{r['mean_tau_mae']:.1%}",
                               f"{r['dp_mean_tau_mae']:.1%}",
                               f"{r['rho']:.1f}" + ("" if arm in RHO_ARMS else " (no goal)"),
                               f"{r['category_share']:.3f}" if "category_share" in r else "n/a",
                               f"{r['coverage']:.1%} [{r['coverage_low']:.1%}, {r['coverage_high']:.1%}]",
                               "met: " + (",".join(met) or "none") + "; NOT met: " + (",".join(missed) or "none")])
        print(pd.DataFrame(table_rows, columns=["arm", "law", "tok/round |err| (≤10%)", "max", "raw DP",
                                                "mean τ |err| (≤15%)", "raw DP", "ρ (1.0)", "cat. share (≤5%)",
                                                "90% PI coverage (85–95%)", "goals met"]).to_string(index=False))
        replayed_goals = {goal: all(r[f]["goals"][goal] for r in replayed.values()
                                    for f in [aware_winner if aware_winner in r else primary] if goal in r[f]["goals"])
                          for goal in ("tokens_per_round", "mean_tau", "category_share", "rho", "coverage")}
        for goal, ok in replayed_goals.items():
            print(f"goal {goal} (replayed proposals): {'met on every arm' if ok else 'NOT met'}")
        print("(tokens/round, rho and mean tau: the per-request centres, T / E[N] x e^b with b from the training "
              "categories, mean tau from the same rounds with the DP's share of drafting rounds; raw DP: without b)")
    print(f"CPU time {time.process_time() - clock:.0f} s, OMP_NUM_THREADS=1, shared machine")
    out = {"bench": "law_categories", "traces": args.traces, "primary": primary, "rule_winner": winner,
           "drafter_aware": aware_winner, "context_match": copy, "covariate_candidates": list(added),
           "goals_met": every, "arms": results, "replayed_goals_met": replayed_goals, "replayed": replayed}
    print(json.dumps(out, default=lambda v: bool(v) if isinstance(v, np.bool_) else float(v)))
    return out


# --- leads -----------------------------------------------------------------------------------------------------------

# suffix matches longer than this share its level: the traces' cap of the tokens column context_match

BASE = "C(depth_factor) + log_entropy + log_lag_entropy + log_run_mean_entropy + log1p_position + log_drafted_depth"
CLASS_TERMS = "C(token_class) + C(prev_token_class)"
COPY_TERMS = "C(copy_level)"
HISTORY_TERMS = "logit_running_acceptance"
TARGET_MISS_TERMS = "log_target_miss"  # log(1 - the target's top-1 probability + 1e-3) at the drafted position
SINGLE = {"depth + log(H + 1e-3)": "C(depth_factor) + log_entropy",  # one target statistic each, nothing else
          "depth + log(1 - p1 + 1e-3)": f"C(depth_factor) + {TARGET_MISS_TERMS}"}
PRIOR_TRIALS = 8.0
MAX_DEPTH_FACTOR = 7  # deeper depths share the depth-7 level (few trials)


def token_classes(tokenizer) -> list[str]:
    """One class per token id of ``tokenizer`` (a Hugging Face tokenizer), from its piece: ``special``,
    ``newline``, ``digit``, ``punct``, ``word_start`` (the piece begins with a space marker) or ``word_cont``."""
    import re

    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out = []
    for i, piece in enumerate(pieces):
        piece = piece or ""
        if i in special:
            out.append("special")
            continue
        starts_space = piece.startswith(("Ġ", "▁", " "))
        text = piece.lstrip("Ġ▁ ")
        if "Ċ" in piece or "\n" in piece or piece == "<0x0A>":
            out.append("newline")
        elif text and re.fullmatch(r"\d+", text):
            out.append("digit")
        elif not re.search(r"[^\W\d_]", text):
            out.append("punct")
        else:
            out.append("word_start" if starts_space else "word_cont")
    return out


def add_candidates(table, tokens, classes, lengths=None):
    """The at-risk ``table`` with ``token_class`` / ``prev_token_class`` (of the committed tokens at the drafted
    position and the one before, from ``tokens``), ``logit_running_acceptance`` (earlier rounds of the request) and,
    given ``lengths`` (``jobs.reference.context_matches`` rows), ``copy_level``: the context's suffix-match length
    before the drafted position, up to ``COPY_MAX``."""
    import numpy as np
    import pandas as pd

    keyed = tokens[["run_id", "request_id", "position", "token_id"]].copy()
    cls = np.asarray(classes, dtype=object)
    keyed["token_class"] = cls[keyed["token_id"].to_numpy(np.int64)]
    prev = keyed[["run_id", "request_id", "position", "token_class"]].assign(position=keyed["position"] + 1)
    prev = prev.rename(columns={"token_class": "prev_token_class"})
    out = table.merge(keyed[["run_id", "request_id", "position", "token_class"]],
                      on=["run_id", "request_id", "position"], how="left", validate="many_to_one")
    out = out.merge(prev, on=["run_id", "request_id", "position"], how="left", validate="many_to_one")
    out["prev_token_class"] = out["prev_token_class"].fillna("none")
    if out["token_class"].isna().any():
        raise ValueError("at-risk rows without a committed token at their position: the traces are inconsistent")
    per_round = out.groupby(["run_id", "request_id", "round_index"], sort=True).agg(
        hits=("accepted", "sum"), trials=("accepted", "size")).reset_index()
    earlier = per_round.groupby(["run_id", "request_id"])[["hits", "trials"]].cumsum() - per_round[["hits", "trials"]]
    per_round["running"] = (earlier["hits"] + PRIOR_TRIALS / 2) / (earlier["trials"] + PRIOR_TRIALS)
    out = out.merge(per_round[["run_id", "request_id", "round_index", "running"]],
                    on=["run_id", "request_id", "round_index"], how="left", validate="many_to_one")
    out["logit_running_acceptance"] = np.log(out["running"] / (1 - out["running"]))
    if lengths is not None:
        # the given lengths replace a copyability column the at-risk table already carries (at_risk_table adds one,
        # null where the traces were recorded without it)
        out = out.drop(columns=["context_match", "log1p_copy", "copy_full"], errors="ignore")
        keyed = lengths[["run_id", "request_id", "position", "context_match"]].assign(
            run_id=lengths["run_id"].astype(str), request_id=lengths["request_id"].astype(str))
        out = out.assign(run_id=out["run_id"].astype(str), request_id=out["request_id"].astype(str)).merge(
            keyed, on=["run_id", "request_id", "position"], how="left", validate="many_to_one")
        if out["context_match"].isna().any():
            raise ValueError("at-risk rows without a context length at their position: give every run's lengths")
        out["copy_level"] = out["context_match"].clip(upper=COPY_MAX).astype(int).astype(str)
    out["depth_factor"] = out["depth"].clip(upper=MAX_DEPTH_FACTOR).astype(str)
    return pd.DataFrame(out)


def copy_levels_of_rounds(table):
    """Per copyability level at a round's start (its depth-1 row's ``copy_level``): the drafting rounds' mean accepted
    drafts and their number, and that mean per category (from the at-risk ``table`` of ``add_candidates``)."""
    import pandas as pd

    rounds = table.groupby(["run_id", "request_id", "round_index"], sort=False).agg(
        accepted=("accepted", "sum"), category=("category", "first"))
    first = table.loc[table["depth"] == 1].set_index(["run_id", "request_id", "round_index"])["copy_level"]
    rounds = rounds.join(first, how="inner")
    rounds["copy_level"] = rounds["copy_level"].astype(int)
    out = rounds.groupby("copy_level")["accepted"].agg(["mean", "size"]).rename(
        columns={"mean": "mean_accepted", "size": "rounds"})
    per_category = rounds.pivot_table(index="copy_level", columns="category", values="accepted", aggfunc="mean")
    return pd.concat([out.round(3), per_category.round(2)], axis=1)


def _fit(formula, frame):
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    family = sm.families.Binomial(link=sm.families.links.CLogLog())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return smf.glm(formula, frame, family=family).fit()


def screen(table, models: dict) -> dict:
    """In-sample gain per trial of each model over the first, of category terms over each, and LOCO
    category-mean errors of the per-trial rejection rate."""
    import numpy as np

    n = len(table)
    llfs = {name: _fit(f"rejected ~ {terms}", table).llf for name, terms in models.items()}
    base_llf = next(iter(llfs.values()))  # the first model is the base
    categories = sorted(table["category"].unique())
    out = {}
    for name, terms in models.items():
        llf = llfs[name]
        llf_cat = _fit(f"rejected ~ {terms} + C(category)", table).llf
        errors = {}
        for held in categories:
            train, test = table.loc[table["category"] != held], table.loc[table["category"] == held]
            test = test.loc[test["token_class"].isin(train["token_class"].unique())
                            & test["prev_token_class"].isin(train["prev_token_class"].unique())
                            & test["copy_level"].isin(train["copy_level"].unique())]
            predicted = float(np.mean(_fit(f"rejected ~ {terms}", train).predict(test)))
            errors[held] = {"observed": float(test["rejected"].mean()), "predicted": predicted}
        out[name] = {"gain": (llf - base_llf) / n, "category_gain": (llf_cat - llf) / n,
                     "loco": errors,
                     "loco_mae": float(np.mean([abs(e["predicted"] - e["observed"]) for e in errors.values()]))}
    return out


def leads_arguments(parser) -> None:
    """The arguments of ``leads``."""
    parser.add_argument("traces", nargs="?", default="data/traces", help="trace runs (default %(default)s)")
    parser.add_argument("--model", default="smollm2-135m", help="the target whose tokenizer classes the tokens")
    parser.add_argument("--tasks", default="spec_bench", help="the prompts' task file (the copyability reads the prompts)")


def run_leads(args, parser) -> dict:
    """Four candidate covariates for the category gap: do they explain what category terms add?

    The primary law conditions on the target's entropy at the drafted position and on decode-time functions of the
    output's entropy sequence; the drafter-aware law adds the drafter's confidence in its own proposal. Category terms
    still add log-likelihood after both (``bench/law.py categories``). This bench tests two further covariates that are
    no category's name and asks how much of the category terms' gain each leaves:

    - **the target token's class** at the drafted position and at the position before it: word start, word
      continuation, digit, punctuation or symbol, newline, special, read off the target's tokenizer (the piece's
      leading-space marker ``Ġ`` / ``▁`` and its characters). Like the entropy at the drafted position it is a
      property of the target's greedy output, so an AR run of a workload gives it at every position and the law's DP
      could use it;
    - **the context's copyability** at the drafted position: the length of the longest suffix of the prompt and the
      output before it that occurred earlier in them (``decoding.policy.context_match_length``, up to 8, as a factor;
      ``jobs.reference.context_matches``). Known before the draft there is checked (at depth d > 1 its context holds the
      accepted drafts), a property of the greedy output and the prompt like the entropy, so an AR run gives it at every
      position; the law policy reads it at each round's start (``fit_policy(context_match=)``);
    - **the target's own top-1 probability** p1 at the drafted position, as log(1 - p1 + 1e-3) (``log_target_miss``):
      a greedy draft is accepted exactly when it is the target's argmax, and 1 - p1 is the target's mass off it, where
      the entropy also counts how that mass spreads. A tokens column of every run our decoder records (and of imported
      runs after ``entropy-law entropy``), so an AR run gives it like H. A second set of models compares the two
      statistics alone (depth + one of them);
    - **the request's running acceptance**: the share of drafted tokens accepted in the request's earlier rounds,
      ``(hits + m / 2) / (trials + m)`` with ``m = 8`` pseudo-trials, as a logit. Known before each round online and
      computable from any engine's round log; but it depends on the path, so the DP that prices a workload from its
      entropies cannot use it (it fits a per-round comparison such as GLANCE's, not a workload price).

    Method: the package's at-risk table (``law.atrisk.at_risk_table``), one cloglog GLM on rejection per model
    (statsmodels, row level, depth as a factor, ``log(H + 1e-3)`` with no profiled offset: a screening fit, not the
    primary law). Per arm it prints (1) the in-sample log-likelihood gain per at-risk trial of each model over the
    base, and of category terms over each model (their share is what a covariate leaves unexplained), and (2)
    leave-one-category-out: each category's mean rejection rate per trial predicted by the model fitted on the other
    categories, against the observed rate (mean |error| over categories; the per-trial mean, not the law's DP over
    rounds). Ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/law.py leads
    """

    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import context_matches
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.atrisk import at_risk_table
    from entropy_law.traces.reader import load_traces

    t0 = time.process_time()
    traces = load_traces(args.traces)
    analysis = TraceAnalysis(traces, n_boot=0)
    target = load_target(args.model)
    classes = token_classes(target.tokenizer)
    models = {"base (primary law's terms)": BASE, "+ token class": f"{BASE} + {CLASS_TERMS}",
              "+ copyability": f"{BASE} + {COPY_TERMS}",
              "+ target's top-1 miss": f"{BASE} + {TARGET_MISS_TERMS}",
              "+ running acceptance": f"{BASE} + {HISTORY_TERMS}",
              "+ both": f"{BASE} + {CLASS_TERMS} + {HISTORY_TERMS}"}
    drafter_aware = {"base + drafter's confidence": f"{BASE} + log_draft_miss",
                     "+ token class": f"{BASE} + log_draft_miss + {CLASS_TERMS}",
                     "+ copyability": f"{BASE} + log_draft_miss + {COPY_TERMS}",
                     "+ running acceptance": f"{BASE} + log_draft_miss + {HISTORY_TERMS}",
                     "+ both": f"{BASE} + log_draft_miss + {CLASS_TERMS} + {HISTORY_TERMS}"}
    result = {"bench": "law_leads", "traces": args.traces, "arms": {}}
    for arm in analysis.arms:
        ids = list(analysis.runs.loc[analysis.runs["arm"] == arm, "run_id"])
        part = traces.filter(run_id=ids)
        lengths = context_matches(list(part.runs["path"]), target, tasks=args.tasks, max_length=COPY_MAX)
        table = add_candidates(at_risk_table(part), part.tokens, classes, lengths)
        print(f"\n== {arm}: {len(table)} at-risk trials, {table['request_id'].nunique()} requests ==", flush=True)
        share = pd.crosstab(table["category"], table["token_class"], normalize="index").round(3)
        print("token classes of the at-risk positions, share per category:\n" + share.to_string())
        by_level = copy_levels_of_rounds(table)
        print("drafting rounds by the copyability at their start (what the law policy reads before drafting): "
              "mean accepted drafts, rounds\n" + by_level.to_string())
        arm_result = {"rounds_by_copy_level": by_level.reset_index().to_dict(orient="list")}
        sets = [("entropy law", models), ("one target statistic", SINGLE)]
        if table["log_draft_miss"].notna().all():
            sets.append(("drafter-aware", drafter_aware))
        for label, group in sets:
            screened = screen(table, group)
            rows = []
            for name, r in screened.items():
                rows.append({"model": name, "gain_per_trial": round(r["gain"], 4),
                             "category_terms_add": round(r["category_gain"], 4),
                             "loco_category_mean_abs_error": round(r["loco_mae"], 4),
                             **{f"{c} obs/pred": f"{e['observed']:.3f}/{e['predicted']:.3f}"
                                for c, e in r["loco"].items()}})
            with pd.option_context("display.width", 250, "display.max_columns", 20):
                print(f"-- {label}: gain over '{next(iter(group))}' and what category terms add after it "
                      "(nats per trial); LOCO mean rejection per trial, observed/predicted --")
                print(pd.DataFrame(rows).set_index("model").to_string())
            arm_result[label] = screened
        result["arms"][arm] = arm_result
    result["cpu_s"] = round(time.process_time() - t0, 1)
    print(f"\nCPU {result['cpu_s']} s")
    print(json.dumps(result))
    return result


# --- recovery --------------------------------------------------------------------------------------------------------

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


def recovery_arguments(parser) -> None:
    """The arguments of ``recovery``."""
    parser.add_argument("--sets", type=int, default=50)
    parser.add_argument("--power-sets", type=int, default=20)
    parser.add_argument("--cv-sets", type=int, default=5)
    parser.add_argument("--depth-sets", type=int, default=20, help="data sets per coupling of the drafted-depth check")
    parser.add_argument("--requests", type=int, default=20, help="requests per category (5 categories)")
    parser.add_argument("--seed", type=int, default=0)


def run_recovery(args, parser) -> None:
    """The law's checks on simulated traces: recovery, selection, universality, transfer.

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

        python bench/law.py recovery [--sets 50] [--power-sets 20] [--cv-sets 5] [--depth-sets 20] [--requests 20] [--seed 0]
    """
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


# --- intervals -------------------------------------------------------------------------------------------------------

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
ESTIMATORS = ("nested", "nested, divisor k-1", "in-sample")
BAND = (0.85, 0.95)


@contextlib.contextmanager
def in_sample_divisor():
    """``Overdispersion.estimate`` with the in-sample divisor k - 1 whatever residuals it is given."""
    original = predict.Overdispersion.estimate.__func__
    predict.Overdispersion.estimate = classmethod(lambda cls, residual, out_of_sample=False: original(cls, residual))
    try:
        yield
    finally:
        predict.Overdispersion.estimate = classmethod(original)


def coverage(traces, estimator: str, draws: int) -> float:
    mode = "in-sample" if estimator == "in-sample" else "nested"
    with in_sample_divisor() if estimator == "nested, divisor k-1" else contextlib.nullcontext():
        return float(predict.loco_predictions(traces, "law_exp", n_draws=draws, seed=0, overdispersion=mode).coverage)


def intervals_arguments(parser) -> None:
    """The arguments of ``intervals``."""
    parser.add_argument("--sets", type=int, default=40, help="simulated trace sets per SD")
    parser.add_argument("--sds", type=float, nargs="+", default=[0.0, 0.4],
                        help="SD of the per-category log-rate shift (default 0 and 0.4)")
    parser.add_argument("--requests", type=int, default=16, help="requests per category")
    parser.add_argument("--draws", type=int, default=0, help="coefficient draws per held-out category")
    parser.add_argument("--seed", type=int, default=0)


def run_intervals(args, parser) -> dict:
    """Are the per-request 90% intervals of a category the law never saw calibrated? Simulated, with the truth known.

    ``payoff.predict.loco_predictions`` gives each held-out request a 90% interval on its tokens per round whose width has
    a between-category part: how far an unseen category's mean lands from the law. It is estimated from the training
    categories' residuals, either in sample (``overdispersion="in-sample"``: under the law fitted on all of them) or
    out of sample (``"nested"``, the default: each training category predicted by a law fitted without it). This bench
    draws ``--sets`` trace sets from ``law_exp`` (``analysis.simulate.simulate_traces``, 5 categories x ``--requests``) in
    which every category's rejection rate is shifted by exp(u), u ~ N(0, SD) drawn per set, for each SD of ``--sds``
    (0: no category effect; the category-free law cannot know u), and reports for each estimator the pooled coverage of
    the held-out requests over all five LOCO folds: mean over the sets (nominal 0.90), its SD across sets, the 5% and
    95% quantiles, and the share of sets whose coverage lies in the 85-95% band of the coverage goal.

    Estimators: ``nested`` (the package's: out-of-sample residual means, their sum of squares about the bias over k, times
    (k - 1) / k: each was predicted by a fit on k - 1 categories),
    ``nested, divisor k-1`` (the same residuals with the in-sample divisor: an earlier estimator, which counts
    the fit's error twice) and ``in-sample``.

    What it says about real traces: the across-set SD is the spread a calibrated interval's pooled coverage has on five
    categories (requests of one category share its mean's error), so a coverage on ``data/traces`` outside 85-95% is not
    by itself a miscalibration; and where the law is misspecified across categories beyond a rate shift (as on real
    traces), in-sample residual means understate it, which the simulation, drawn from the law, cannot show.

    Prints a table and ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/law.py intervals [--sets 40] [--sds 0 0.4]
    """
    if args.sets < 2:
        raise SystemExit("--sets must be at least 2")
    warnings.simplefilter("ignore")  # few requests per category: SmallSampleWarning (the simulation's own choice)
    t0 = time.process_time()
    rows = []
    for sd in args.sds:
        for i in range(args.sets):
            seed = args.seed + i
            rng = np.random.default_rng([seed, int(round(sd * 1000))])
            effects = {c: float(rng.normal(0.0, sd)) for c in CATEGORIES}
            traces = simulate_traces(seed=seed, n_requests_per_category=args.requests, tokens_per_request=(60, 100),
                                     categories=list(CATEGORIES), category_effects=effects)
            for estimator in ESTIMATORS:
                rows.append(dict(sd=sd, set=i, estimator=estimator, coverage=coverage(traces, estimator, args.draws)))
        print(f"[SD {sd:g}: {args.sets} sets, cumulative CPU {time.process_time() - t0:.0f} s]", flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby(["sd", "estimator"], sort=False)["coverage"].agg(
        mean="mean", sd="std", q05=lambda c: c.quantile(0.05), q95=lambda c: c.quantile(0.95),
        in_band=lambda c: float(((c >= BAND[0]) & (c <= BAND[1])).mean()))
    pd.set_option("display.width", 200)
    print(f"\npooled coverage of the held-out requests' 90% intervals, LOCO over 5 simulated categories x "
          f"{args.requests} requests, {args.sets} sets per SD (law_exp, {args.draws} coefficient draws; nominal 0.90; "
          f"in_band: share of sets in [{BAND[0]:.2f}, {BAND[1]:.2f}])")
    print(summary.round(3).to_string())
    cpu = round(time.process_time() - t0, 1)
    print(f"CPU time {cpu} s")
    out = {"bench": "interval_calibration", "sets": args.sets, "requests_per_category": args.requests,
           "categories": len(CATEGORIES), "draws": args.draws, "cpu_s": cpu,
           "coverage": {f"sd={sd:g}": {est: {k: round(float(v), 4) for k, v in summary.loc[(sd, est)].items()}
                                       for est in ESTIMATORS} for sd in args.sds}}
    print(json.dumps(out))
    return out


# --- confidence ------------------------------------------------------------------------------------------------------

FAMILIES = ("law_exp", "law_exp_drafttop", "law_exp_obs_ceil", "law_exp_obs_ceil_drafttop")


def replay_top1(run: Path, plain, target, tasks) -> tuple[pd.DataFrame, int, int]:
    """(rows run_id, request_id, round_index, depth, draft_top1_prob; requests replayed; rounds checked) of one
    n-gram or block-drafter run. Raises if any replayed round differs from the recorded one, or (block drafter) if
    the replayed drafter entropy differs from the recorded ``draft_entropy_nats``."""
    from entropy_law.decoding.replay import replay_rounds
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.jobs.arms import arm_spec, make_drafter
    from entropy_law.jobs.reference import recorded_prompts, replay_drafter
    from entropy_law.traces.reader import load_traces
    from entropy_law.traces.stats import draft_stats

    meta = json.loads((run / "run.json").read_text())
    traces = load_traces(run)
    tokens = traces.tokens.sort_values(["request_id", "position"])
    rounds = traces.rounds.sort_values(["request_id", "round_index"])
    prompts = recorded_prompts(run, lambda task: plain.encode_prompt(task.messages()), tasks)
    eos, max_context = plain.config["eos_token_ids"], plain.adapter.max_context
    fields = ["round_index", "start_position", "tree_nodes", "tree_depth", "accepted", "committed"]
    block = meta["drafter_id"] != "ngram"
    block_drafter = make_drafter(arm_spec(meta["arm"]), target) if block else None
    if block and block_drafter.drafter_id != meta["drafter_id"]:
        raise ValueError(f"{run}: recorded with {meta['drafter_id']}, the shipped checkpoint is "
                         f"{block_drafter.drafter_id}")
    rows, checked = [], 0
    for rid, part in tokens.groupby("request_id", observed=True, sort=False):
        rid = str(rid)
        prompt, output = prompts[rid], part["token_id"].astype(int).tolist()
        drafter = replay_drafter(block_drafter if block else NgramDrafter(**meta["drafter_config"]), target, prompt,
                                 output)
        result = replay_rounds(prompt, output, drafter,
                               meta["tree_policy"], meta.get("tree_budget"), eos_token_ids=eos,
                               max_new_tokens=meta["max_new_tokens"], max_context=max_context,
                               verify_cost_ratio=meta.get("verify_cost_ratio", 1.0))
        mine = [tuple(int(getattr(r, f)) for f in fields) for r in result.rounds]
        theirs = [tuple(int(v) for v in row) for row in rounds.loc[rounds["request_id"] == rid, fields].itertuples(
            index=False, name=None)]
        if mine != theirs:
            first = next(i for i, (a, b) in enumerate(zip(mine + [None], theirs + [None])) if a != b)
            raise ValueError(f"{run}: request {rid}: replayed round {first} differs from the recorded one "
                             f"({mine[first] if first < len(mine) else None} vs "
                             f"{theirs[first] if first < len(theirs) else None}; fields {fields})")
        checked += len(mine)
        for record, proposal in zip(result.rounds, result.proposals):
            if proposal is None or proposal.depth == 0:
                continue
            depth = min(proposal.depth, record.committed)  # what the recorder scores (decoding.observers)
            committed = list(record.committed_ids)
            if proposal.logits is not None:
                stats = draft_stats(proposal.logits[:depth].float().numpy(), committed)
            else:
                stats = draft_stats(committed_ids=committed, candidates=proposal.tokens[:depth],
                                    candidate_logprobs=proposal.logprobs[:depth])
            rows += [(rid, record.round_index, d + 1, float(stats["top1_prob"][d]), float(stats["entropy_nats"][d]))
                     for d in range(depth)]
    keys = ["request_id", "round_index", "depth"]
    frame = pd.DataFrame(rows, columns=[*keys, "draft_top1_prob", "replayed_entropy"])
    worst_entropy = 0.0
    if block:  # the replayed drafter's entropies against the recorded ones, on the same rows
        recorded = tokens[[*keys, "draft_entropy_nats"]].astype({"request_id": str})
        both = frame.merge(recorded, on=keys, how="left", validate="one_to_one")
        worst_entropy = float((both["replayed_entropy"] - both["draft_entropy_nats"].astype(float)).abs().max())
    if not worst_entropy <= 1e-3:  # NaN (a recorded entropy missing) fails too
        raise ValueError(f"{run}: the replayed drafter entropy differs from the recorded one by up to "
                         f"{worst_entropy:.2e} nats: not the drafter that recorded the run")
    if block:
        print(f"  {run.name}: replayed drafter entropy within {worst_entropy:.1e} nats of the recorded", flush=True)
    return frame.drop(columns="replayed_entropy").assign(run_id=meta["run_id"]), tokens["request_id"].nunique(), checked


def write_column(run: Path, top1: pd.DataFrame, checked: int, drafter: str) -> int:
    """Add ``draft_top1_prob`` to every tokens.parquet of ``run`` (rows without a value: null); returns rows filled."""
    from entropy_law.traces.layout import write_json_atomic, write_parquet_atomic
    from entropy_law.traces.schema import TOKENS_SCHEMA

    look = top1.set_index(["request_id", "round_index", "depth"])["draft_top1_prob"]
    filled = 0
    for path in sorted((run / "shards").glob("*/tokens.parquet")):
        table = pq.read_table(path)
        frame = table.select(["request_id", "round_index", "depth"]).to_pandas()
        keys = pd.MultiIndex.from_arrays([frame["request_id"].astype(str), frame["round_index"].astype(int),
                                          frame["depth"].astype(int)])
        values = look.reindex(keys).to_numpy(dtype=float)
        column = pa.array(values.astype(np.float32), mask=np.isnan(values), type=pa.float32())
        if "draft_top1_prob" in table.column_names:
            table = table.drop(["draft_top1_prob"])
        new = table.append_column(TOKENS_SCHEMA.field("draft_top1_prob"), column).select(TOKENS_SCHEMA.names)
        new = new.cast(TOKENS_SCHEMA)
        strings = [f.name for f in TOKENS_SCHEMA if pa.types.is_string(f.type)]
        recorded = [name for name in TOKENS_SCHEMA.names if name != "draft_top1_prob"]

        def unchanged(tmp, table=table, path=path):  # the recorded columns read back equal: else nothing replaced
            back = pq.read_table(tmp).select(recorded)
            if not back.equals(table.select(recorded).cast(back.schema)):
                raise RuntimeError(f"{path}: the rewritten recorded columns differ; nothing replaced")

        # as the recorder writes shards: zstd, dictionary strings
        write_parquet_atomic(path, new, check=unchanged, compression="zstd", use_dictionary=strings)
        filled += int((~np.isnan(values)).sum())
    meta_path = run / "run.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("backfilled", []).append({
        "column": "tokens.draft_top1_prob", "how": f"offline replay of {drafter} (decoding.replay.replay_rounds"
        f"{'' if drafter == 'ngram' else ' through PrecomputedBlockDrafter on a teacher-forced target pass'}) on the "
        "recorded greedy outputs; every replayed round equalled the recorded one"
        + ("" if drafter == "ngram" else ", and every drafter entropy the recorded draft_entropy_nats within 1e-3"),
        "rounds_checked": checked, "rows_filled": filled, "by": "bench/law.py confidence",
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    write_json_atomic(meta_path, meta)
    return filled


def confidence_arguments(parser) -> None:
    """The arguments of ``confidence``."""
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--write", action="store_true", help="add draft_top1_prob to the replayed runs' shards")
    parser.add_argument("--no-fit", action="store_true", help="replay (and write) only")
    parser.add_argument("--no-replay", action="store_true",
                        help="fit only, on runs whose shards already hold draft_top1_prob (written by --write)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drafters", default="ngram", help="ngram, block or ngram,block (block: a teacher-forced "
                        "target pass per request, about 2 s each)")


def run_confidence(args, parser) -> dict:
    """Does the drafter's confidence in its own proposal explain the category gap? (n-gram arms)

    The n-gram drafter is context-only, so its proposals are a function of the prompt, the greedy output and the round
    boundaries; ``decoding.replay.replay_rounds`` rebuilds every round of a recorded n-gram run without the target. This
    script replays each n-gram arm of a trace set (prompts re-encoded with the default target's chat template, the
    drafter configuration and gate of the run's ``run.json``) and checks that every replayed round equals the recorded
    one (start, nodes, depth, accepted, committed). Only then does it take, per committed token at depth d <= the
    verified depth, ``draft_top1_prob``: the drafter's probability of its own most probable candidate at depth d (the
    trace column the decoder now logs, ``traces.stats.draft_stats``), known before verification. With ``--write`` it
    adds that column to the run's shards (each tokens.parquet rewritten through a temporary file and renamed; the
    recorded columns are compared before the rename; run.json says what was backfilled and how).

    Then per arm, on the at-risk trials (CV log-loss per trial, random request folds and leave-one-category-out):
    ``law_exp`` and the primary law ``law_exp_obs_ceil``, each with and without ``log(1 - draft_top1_prob + 1e-3)``
    (``law_exp_drafttop``, ``law_exp_obs_ceil_drafttop``), and the share of the CV gain over depth only that category
    terms add (``compare.category_share_of_gain``; the goal is <= 5%). The families with the drafter's confidence need
    it at every trial, so they score trials but cannot run the DP over whole outputs (no tokens-per-round LOCO).

        OMP_NUM_THREADS=1 python bench/law.py confidence [--traces data/traces] [--write]
    """
    warnings.simplefilter("ignore")  # few-request warnings etc.: the fits here only score
    pd.set_option("display.width", 200)
    clock = time.process_time()

    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.law import atrisk
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.compare import category_share_of_gain, compare_laws
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.reader import load_traces

    root = Path(args.traces)
    kinds = args.drafters.split(",")
    runs = [p.parent for p in sorted(root.glob("*/run.json"))
            if (json.loads(p.read_text()).get("drafter_id") == "ngram" and "ngram" in kinds)
            or (json.loads(p.read_text()).get("drafter_id", "").startswith("block") and "block" in kinds)]
    if not runs:
        raise SystemExit(f"{root}: no run of {kinds}")
    top1 = []
    if not args.no_replay:
        target = load_target("smollm2-135m")
        plain = SpeculativeDecoder(target)
        tasks = {t.request_id: t for t in load_tasks("spec_bench")}
        for run in runs:
            frame, n_req, checked = replay_top1(run, plain, target, tasks)
            top1.append(frame)
            print(f"{run.name}: replayed {n_req} requests, {checked} rounds, every one equal to the recorded; "
                  f"{len(frame)} drafted token rows", flush=True)
            if args.write:
                drafter = json.loads((run / "run.json").read_text())["drafter_id"]
                print(f"  wrote draft_top1_prob into {write_column(run, frame, checked, drafter)} rows of {run}")
    if args.no_fit:
        return {}
    run_ids = {json.loads((run / "run.json").read_text())["run_id"] for run in runs}
    replayed = (pd.concat(top1, ignore_index=True) if top1 else
                pd.DataFrame(columns=["run_id", "request_id", "round_index", "depth", "draft_top1_prob"]))
    an = TraceAnalysis(load_traces(root))
    out = {}
    for arm in an.arms:
        view = an.arm_view(arm)
        rows = atrisk.at_risk_table(view, drafters=[arm])
        if not set(rows["run_id"].astype(str)) <= run_ids:
            continue  # not an arm of the drafters asked for
        if args.no_replay and ("draft_top1_prob" not in rows or rows["draft_top1_prob"].isna().any()):
            print(f"\n{arm}: skipped, its shards do not hold draft_top1_prob at every trial (backfill with --write)")
            continue
        if "draft_top1_prob" not in rows or rows["draft_top1_prob"].isna().any():  # not written: merge the replay
            keys = ["run_id", "request_id", "round_index", "depth"]
            merged = rows[keys].astype({"run_id": str, "request_id": str}).merge(
                replayed, on=keys, how="left", validate="many_to_one")
            rows["draft_top1_prob"] = merged["draft_top1_prob"].to_numpy(float)
            atrisk.add_log_covariates(rows)
        if rows["draft_top1_prob"].isna().any():
            raise ValueError(f"{arm}: {int(rows['draft_top1_prob'].isna().sum())} at-risk trials without a replayed "
                             "draft_top1_prob")
        result = {}
        for folds in ("requests", "category"):
            comp = compare_laws(rows, ("depth_only", *FAMILIES), folds=folds, seed=args.seed)
            result[folds] = comp.summary["cv_log_loss"].to_dict()
        shares = {fam: category_share_of_gain(rows, fam, seed=args.seed) for fam in
                  ("law_exp_obs_ceil", "law_exp_obs_ceil_drafttop")}
        by_cat = rows.groupby("category", observed=True).agg(trials=("accepted", "size"),
                                                             acceptance=("accepted", "mean"),
                                                             mean_H=("target_entropy_nats", "mean"),
                                                             mean_top1=("draft_top1_prob", "mean"))
        print(f"\n== {arm}: {len(rows)} at-risk trials ==")
        print(by_cat.round(3).to_string())
        table = pd.DataFrame({"cv_log_loss (request folds)": result["requests"],
                              "cv_log_loss (leave one category out)": result["category"]})
        print(table.round(4).to_string())
        for fam, share in shares.items():
            print(f"category share of CV gain ({fam}): {share['cv_category_share']:.3f} (law over depth only "
                  f"{share['cv_gain_law_vs_depth_only']:.4f}, category terms {share['cv_gain_cat_vs_law']:.4f} "
                  "nats/trial; goal <= 0.05)")
        out[arm] = dict(trials=len(rows), cv_requests=result["requests"], cv_loco=result["category"],
                        category_share={f: s["cv_category_share"] for f, s in shares.items()})
    print(f"[CPU {time.process_time() - clock:.0f} s]")
    print(json.dumps({"bench": "draft_confidence", "traces": str(root), "arms": out}))
    return out


# --- proposals -------------------------------------------------------------------------------------------------------

def agreement(run: Path, frame: pd.DataFrame) -> dict:
    """Replayed against recorded, at the recorded rounds' starts: depth equal, top-1 probability difference."""
    from entropy_law.traces.reader import load_traces

    traces = load_traces(run)
    columns = ["request_id", "round_index", "start_position", "tree_depth"]
    rounds = traces.rounds.loc[traces.rounds["round_index"] > 0, columns].astype({"request_id": str})
    firsts = frame.drop_duplicates(["request_id", "start_position"])[["request_id", "start_position", "proposal_depth"]]
    both = rounds.merge(firsts, on=["request_id", "start_position"], how="left")
    out = {"recorded_rounds": len(both), "replayed_at_start": float(both["proposal_depth"].notna().mean()),
           "depth_equal": float((both["tree_depth"] == both["proposal_depth"]).mean())}
    tokens = traces.tokens
    if "draft_top1_prob" in tokens:
        rec = tokens.loc[tokens["draft_top1_prob"].notna(), ["request_id", "round_index", "depth", "draft_top1_prob"]]
        rec = rec.astype({"request_id": str}).merge(rounds[["request_id", "round_index", "start_position"]],
                                                    on=["request_id", "round_index"])
        rec = rec.merge(frame[["request_id", "start_position", "depth", "top1_prob"]],
                        on=["request_id", "start_position", "depth"], how="inner")
        diff = rec["top1_prob"].astype(float) - rec["draft_top1_prob"].astype(float)
        out.update(top1_rows=len(rec), top1_mean_diff=float(diff.mean()), top1_mean_abs_diff=float(diff.abs().mean()),
                   top1_corr=float(np.corrcoef(rec["top1_prob"], rec["draft_top1_prob"])[0, 1]) if len(rec) > 2
                   else float("nan"))
    return out


def proposals_arguments(parser) -> None:
    """The arguments of ``proposals``."""
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--write", action="store_true", help="write <run>/proposals.parquet for every run replayed")
    parser.add_argument("--drafters", default="ngram,block", help="ngram, block or ngram,block (block: a "
                        "teacher-forced target pass per request, shared by the block runs)")


def run_proposals(args, parser) -> dict:
    """Replay each drafter's proposal at every output position of the reference traces (leak-free depths).

    A law predicts a held-out request's tokens per round by a DP over rounds that could start at any output position
    (``law.transfer``). Which depth the drafter drafts there, and how confident it is, is a function of the context
    alone for the n-gram drafter (prompt + greedy output) and for the block drafter (the target's teacher-forced
    hidden states): ``decoding.replay.replay_proposals`` rebuilds it offline, without any round's outcome. This script
    does so for every run of a trace set (prompts re-encoded with the default target's chat template and checked
    against the recorded prompt length; the drafter configuration and tree of the run's ``run.json``) and, with
    ``--write``, stores them as ``<run>/proposals.parquet`` (``traces.proposals``), which ``bench/law.py categories``
    reads for its "replayed" depth mode.

    The run's ratio gate is applied (``decoding.replay.run_gate_threshold``: a start where the run would have declined
    to draft proposes nothing; ``verify_cost_ratio`` 1 in ``data/traces``, so nothing is declined there; the default 2
    in ``data/traces_timed``); a cost gate or law policy is not reproduced (every proposal kept).

    It reports, at the starts of the recorded rounds, how often the replayed depth equals the recorded drafted depth
    and how close the replayed ``top1_prob`` is to the recorded ``draft_top1_prob``: the n-gram drafter is consulted at
    every position here (its self-calibration then rests on more evidence than online), so they need not be equal.

        OMP_NUM_THREADS=1 python bench/law.py proposals --write [--drafters ngram,block]
    """
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    clock = time.process_time()

    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.decoding.replay import replay_proposals, run_gate_threshold
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.jobs.arms import arm_spec, make_drafter
    from entropy_law.jobs.reference import recorded_prompts, replay_drafter
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.proposals import write_proposals
    from entropy_law.traces.reader import load_traces

    root = Path(args.traces)
    kinds = args.drafters.split(",")
    metas = {p.parent: json.loads(p.read_text()) for p in sorted(root.glob("*/run.json"))}
    runs = [r for r, m in metas.items() if m.get("drafter_id") not in (None, "none")
            and ((m["drafter_id"] == "ngram" and "ngram" in kinds) or (m["drafter_id"].startswith("block")
                                                                      and "block" in kinds))]
    if not runs:
        raise SystemExit(f"{root}: no run of {kinds}")
    target = load_target("smollm2-135m")
    plain = SpeculativeDecoder(target)
    eos, max_context = plain.config["eos_token_ids"], plain.adapter.max_context
    tasks = {t.request_id: t for t in load_tasks("spec_bench")}
    outputs, prompts = {}, {}
    for run in runs:
        prompts.update(recorded_prompts(run, lambda task: plain.encode_prompt(task.messages()), tasks))
        tokens = load_traces(run).tokens.sort_values(["request_id", "position"])
        for rid, part in tokens.groupby("request_id", observed=True, sort=False):
            outputs[(run, str(rid))] = part["token_id"].astype(int).tolist()

    frames = {run: [] for run in runs}
    block_runs = [r for r in runs if metas[r]["drafter_id"] != "ngram"]
    block_drafter = make_drafter(arm_spec(metas[block_runs[0]]["arm"]), target) if block_runs else None
    for run in block_runs:
        if metas[run]["drafter_id"] != block_drafter.drafter_id:
            raise SystemExit(f"{run}: recorded with {metas[run]['drafter_id']}, the shipped checkpoint is "
                             f"{block_drafter.drafter_id}")
    done = 0
    for rid in sorted(prompts):
        cache = {}  # one teacher-forced pass per (prompt, output), shared by the block runs
        for run in runs:
            if (run, rid) not in outputs:
                continue
            meta, output = metas[run], outputs[(run, rid)]
            if meta["drafter_id"] == "ngram":
                drafter = NgramDrafter(**meta["drafter_config"])
            else:
                key = tuple(output)
                if key not in cache:
                    cache[key] = replay_drafter(block_drafter, target, prompts[rid], output)
                drafter = cache[key]
            threshold = run_gate_threshold(meta)  # the run's ratio gate (None: cost gate / policy, not replayed)
            frame = replay_proposals(prompts[rid], output, drafter, meta["tree_policy"], meta.get("tree_budget"),
                                     eos_token_ids=eos, max_new_tokens=meta["max_new_tokens"], max_context=max_context,
                                     min_expected_accepted=threshold if threshold is not None else 0.0)
            frames[run].append(frame.assign(run_id=meta["run_id"], request_id=rid))
        done += 1
        if done % 50 == 0:
            print(f"  {done} / {len(prompts)} prompts, CPU {time.process_time() - clock:.0f} s", flush=True)

    report = {}
    for run in runs:
        frame = pd.concat(frames[run], ignore_index=True)
        agree = agreement(run, frame)
        report[run.name] = {"rows": len(frame), "starts": int(frame.drop_duplicates(["request_id", "start_position"])
                                                               .shape[0]), **agree}
        print(f"{run.name}: {report[run.name]['starts']} start positions, {len(frame)} rows; at the "
              f"{agree['recorded_rounds']} recorded rounds' starts the replayed depth equals the recorded one in "
              f"{agree['depth_equal']:.1%}"
              + (f"; top1_prob replayed - recorded: mean {agree['top1_mean_diff']:+.4f}, mean |.| "
                 f"{agree['top1_mean_abs_diff']:.4f}, correlation {agree['top1_corr']:.3f} ({agree['top1_rows']} rows)"
                 if "top1_rows" in agree else ""), flush=True)
        if args.write:
            threshold = run_gate_threshold(metas[run])
            how = {"by": "bench/law.py proposals", "gate_threshold": threshold,
                   "how": "decoding.replay.replay_proposals on the recorded greedy outputs, with the run's ratio gate" + ("" if metas[run]["drafter_id"] == "ngram" else
                                       " through PrecomputedBlockDrafter on a teacher-forced target pass"),
                   "drafter_id": metas[run]["drafter_id"], "tree_policy": metas[run]["tree_policy"],
                   "tree_budget": metas[run].get("tree_budget"), **agree,
                   "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            print(f"  wrote {write_proposals(run, frame, how)}", flush=True)
    print(f"CPU time {time.process_time() - clock:.0f} s, OMP_NUM_THREADS=1")
    print(json.dumps({"bench": "replayed_proposals", "traces": str(root), "runs": report}))
    return report


# --- category-table --------------------------------------------------------------------------------------------------

TABLE_TRACES = ("data/traces_timed", "data/traces_open_timed", "data/traces_probe")  # 5 + 6 + 6 categories
COPY_CAP = 64.0  # the copyability enters item 6 as log1p(min(context_match, COPY_CAP))


def category_table_arguments(parser) -> None:
    """The arguments of ``category-table``."""
    parser.add_argument("--traces", nargs="+", default=list(TABLE_TRACES),
                        help="trace folders read together; runs of one arm (arms.run_arms: model, drafter, checkpoint, "
                             "tree, budget, gate) are pooled, different arms never")
    parser.add_argument("--family", default=None, help="the law (category-free; default: the primary law of the traces)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the category share's request folds")
    parser.add_argument("--no-share", action="store_true", help="skip the category share (item 4)")
    parser.add_argument("--min-categories", type=int, default=5, help="arms with fewer categories are skipped")
    parser.add_argument("--arms", nargs="+", default=None, metavar="TEXT",
                        help="only the arms whose label contains one of these (e.g. 'ngram ddtree16')")


def arm_views(traces, min_categories: int) -> dict:
    """label -> the traces of one drafting arm (its runs only: ``arms.run_arms`` keys them, so runs that differ in
    model, drafter, checkpoint, tree, budget or gate are never pooled), with how many categories it holds."""
    found = arms.run_arms(traces.runs)
    found = found.loc[~found["is_ar"]]
    views = {}
    for label, part in found.groupby("arm", sort=False):
        view = traces.filter(run_id=list(part["run_id"]))
        n = view.requests["category"].nunique()
        if n < min_categories:
            print(f"arm {label}: {n} categories (runs {list(part['run_id'])}): skipped (fewer than {min_categories})")
            continue
        views[label] = view
    return views


def _online(frame: pd.DataFrame, value: str) -> tuple[np.ndarray, np.ndarray]:
    """Per drafting round, over the same request's EARLIER drafting rounds (in round order): the sum of ``value``
    and their number (0 for the first round): what is known of the request before the round is drafted."""
    g = frame.groupby(["run_id", "request_id"], sort=False)[value]
    total = g.cumsum() - frame[value]
    return total.to_numpy(dtype=float), g.cumcount().to_numpy(dtype=float)


def _ols(train: pd.DataFrame, test: pd.DataFrame, features: list) -> np.ndarray:
    """accepted ~ 1 + features, fitted (OLS) on the training categories' rounds, predicting the held-out ones."""
    import statsmodels.api as sm

    fit = sm.OLS(train["accepted"].to_numpy(float), sm.add_constant(train[features].to_numpy(float),
                                                                    has_constant="add")).fit()
    return fit.predict(sm.add_constant(test[features].to_numpy(float), has_constant="add"))


def _request_effect(train: pd.DataFrame, residual: str) -> float:
    """k = residual variance / between-request variance of ``residual`` on the training rounds (statsmodels
    MixedLM, a random intercept per request): the shrinkage of the online per-request intercept
    n / (n + k) * (mean residual of the earlier rounds); inf where the request variance is estimated at 0."""
    import statsmodels.formula.api as smf

    data = train.assign(group=train["run_id"].astype(str) + "/" + train["request_id"].astype(str))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = smf.mixedlm(f"{residual} ~ 1", data, groups=data["group"]).fit(reml=True)
    between = float(fit.cov_re.iloc[0, 0])
    return float(fit.scale) / between if between > 1e-12 else float("inf")


def _add_steps(rounds: pd.DataFrame, cat: str, steps: dict, base: str, confidence: bool) -> dict:
    """Item 6 in one set, one held-out category: the law alone (``base``), then + the copyability, + the request's
    acceptance so far, + a request-level random effect (online BLUP), and (``confidence``) + the drafter's
    confidence, each OLS-recalibrated on the training categories' rounds only."""
    held = rounds["category"] == cat
    train, test = rounds.loc[~held].copy(), rounds.loc[held].copy()
    out = {"law alone": test[base].to_numpy(float)}
    feats = [base]
    if "copy" in rounds:
        feats = feats + ["copy"]
        out["+ copyability"] = _ols(train, test, feats)
    feats = feats + ["own_mean", "own_first"]
    out["+ own acceptance so far"] = _ols(train, test, feats)
    import statsmodels.api as sm

    fitted = sm.OLS(train["accepted"].to_numpy(float), sm.add_constant(train[feats].to_numpy(float),
                                                                       has_constant="add")).fit()
    for part in (train, test):
        part["resid"] = part["accepted"] - fitted.predict(sm.add_constant(part[feats].to_numpy(float),
                                                                          has_constant="add"))
    k = _request_effect(train, "resid")
    for part in (train, test):
        total, n = _online(part, "resid")
        part["effect"] = total / (n + k) if np.isfinite(k) else 0.0
    feats = feats + ["effect"]
    out["+ request random effect"] = _ols(train, test, feats)
    if confidence:
        out["+ drafter confidence"] = _ols(train, test, feats + ["confidence"])
    for name, pred in out.items():
        steps.setdefault(name, {})[cat] = float(np.mean(pred))
    return steps


def category_means(view, family: str, *, per_round: bool = True, without: tuple = ()) -> dict:
    """Leave-one-category-out category means of one arm's mean accepted length per drafting round ((tokens -
    rounds) / drafting rounds; the DP's expected counts alike), each category predicted by fits on the others
    only: ``observed``, ``predicted`` (predictor -> {category: mean}, with its information set), ``rounds``
    (``per_round``: per drafting round, the before-drafting / before-verifying law's expectation for item 6).
    ``without``: categories left out of everything (the jackknife's runs)."""
    from entropy_law.glance import fit_glance, glance_rounds, loco_glance
    from entropy_law.law.blocks import expected_round_counts
    from entropy_law.law.categories import root_frame, tau_given_depth
    from entropy_law.law.transfer import (TrainingDepthModel, depth_only_acceptance, drafted_depths, loco_inputs,
                                          sequence_context, with_start_entropy)
    from scipy import special

    fam, drafter, rounds, B, _, counts, categories, seqs = loco_inputs(view, family, drafter=None, B=None,
                                                                       eps=atrisk.EPS_NATS, min_categories=3)
    drafts = B - 1
    drafted_h = with_start_entropy(drafted_depths(view, drafter), seqs)
    table = glance_rounds(view)
    categories = [c for c in categories if c not in without]
    seqs, counts, drafted_h, table = (f.loc[f["category"].astype(str).isin(categories)]
                                      for f in (seqs, counts, drafted_h, table))
    code, _ = loco_glance(table, form="code")
    table = table.assign(glance_code=code)
    by_request = {key: part for key, part in table.groupby(["run_id", "request_id"], sort=False)}
    rounds = rounds.merge(seqs[["run_id", "request_id", "category"]], on=["run_id", "request_id"], validate="many_to_one")
    observed = rounds.groupby("category").agg(tokens=("committed", "sum"), rounds=("round_index", "size"),
                                              drafting=("tree_depth", lambda d: int((d > 0).sum())))
    observed = (observed["tokens"] - observed["rounds"]) / observed["drafting"]
    expect = {name: {} for name in ("workload", "before_drafting", "depth_only", "glance_readme_dp")}
    round_rows = []
    for cat in categories:
        law = fit_law(counts.loc[counts["category"] != cat], fam, cov_type="nonrobust")
        model = TrainingDepthModel.fit(drafted_h.loc[drafted_h["category"] != cat], drafts)
        control = depth_only_acceptance(counts.loc[counts["category"] != cat], drafts)
        glance = fit_glance(table.loc[table["category"] != cat], "readme", per_category=False, n_boot=0)
        sums = {name: np.zeros(2) for name in expect}
        held_out = [rec for rec in seqs.itertuples() if rec.category == cat]
        rooted = list(seqs.itertuples()) if per_round else held_out
        frames, shapes = [], []  # the requests' root rows, then the held-out requests' workload rows: one predict
        for rec in rooted:
            frame, shape = root_frame(law, rec.entropy, drafts, **sequence_context(law, rec))
            frames.append(frame)
            shapes.append(shape)
        for rec in held_out:
            frame, shape = law.sequence_frame(np.asarray(rec.entropy, dtype=float), drafts, **sequence_context(law, rec))
            frames.append(frame)
            shapes.append(shape)
        accept = law.predict_frame(pd.concat(frames, ignore_index=True))
        ends = np.cumsum([len(f) for f in frames])
        arrays = [law.shape_acceptance(accept[end - len(f):end], shape) for f, end, shape in zip(frames, ends, shapes)]
        workload = dict(zip([(r.run_id, r.request_id) for r in held_out], arrays[len(rooted):]))
        for rec, root in zip(rooted, arrays):
            h = np.asarray(rec.entropy, dtype=float)
            probs = model.probabilities(h, getattr(rec, "context_match", None))
            mine = by_request.get((rec.run_id, rec.request_id))
            if mine is not None and per_round:  # per drafting round: E[tau] given the root, the depth model or D
                t = mine["start_position"].to_numpy(dtype=np.int64)
                d = mine["tree_depth"].to_numpy(dtype=np.int64)
                tau = tau_given_depth(root)
                p = probs[t, 1:] / np.maximum(1.0 - probs[t, :1], 1e-12)
                round_rows.append(mine.assign(fold=cat, before_drafting=(p * tau[t]).sum(axis=1),
                                             before_verifying=tau[t, d - 1]))
            if rec.category != cat:
                continue
            dp = {"workload": workload[(rec.run_id, rec.request_id)], "before_drafting": root,
                  "depth_only": np.tile(control, (h.size, 1)),
                  "glance_readme_dp": np.tile(special.expit(glance.b0 - glance.b1_fitted * h)[:, None], (1, drafts))}
            for name, a in dp.items():
                n_rounds, n_drafting = expected_round_counts(a, probs)
                sums[name] += (h.size - n_rounds, n_drafting)
        for name in expect:
            expect[name][cat] = sums[name][0] / sums[name][1]
    expect["glance_code"] = table.groupby("category")["glance_code"].mean().to_dict()
    return dict(family=fam.name, drafter=drafter, block=B, observed=observed.loc[categories],
                predicted=expect, rounds=pd.concat(round_rows, ignore_index=True) if per_round else None,
                tokens=view.tokens)


def jackknife_refits(view, family: str, categories: list) -> list:
    """Per category c, ``category_means`` of the arm without c: every fold's fits lack both the held-out category
    and c (the table's leave-one-category-out jackknife refits)."""
    return [category_means(view, family, per_round=False, without=(dropped,)) for dropped in categories]


# predictor -> (its information set, what it reads)
TABLE_ROWS = {
    "workload": ("workload", "the law, entropies at every position + training depth model"),
    "before_drafting": ("before_drafting", "the law from the round's root only + training depth model"),
    "depth_only": ("before_drafting", "control: acceptance per depth, no entropy + training depth model"),
    "glance_readme_dp": ("before_drafting", "GLANCE README form, p(H_root), L from the training depth model"),
    "glance_code": ("before_drafting", "GLANCE code form (glance.loco_glance), mean over the observed round roots"),
}


def item6(rounds: pd.DataFrame, tokens: pd.DataFrame, categories: list) -> dict:
    """set -> step -> {category: mean predicted accepted per drafting round}; and observed per category (the
    drafting rounds' mean accepted). Each step adds one input to the one before, fitted without the held-out
    category (the law's expectation in every row comes from the fold's law)."""
    keys = ["run_id", "request_id", "round_index"]
    first = tokens.loc[tokens["depth"] == 1, keys + [c for c in ("context_match", "draft_top1_prob") if c in tokens]]
    rounds = rounds.merge(first.drop_duplicates(keys), on=keys, how="left", validate="many_to_one")
    rounds = rounds.sort_values(["fold", "run_id", "request_id", "round_index"], kind="stable")
    confidence = "draft_top1_prob" in rounds and bool(rounds["draft_top1_prob"].notna().all())
    if confidence:
        rounds["confidence"] = rounds["draft_top1_prob"]
    steps = {"before_drafting": {}, "before_verifying": {}}
    for cat in categories:
        fold = rounds.loc[rounds["fold"] == cat].copy()
        if "context_match" in fold and fold["context_match"].notna().all():
            fold["copy"] = np.log1p(np.minimum(fold["context_match"].to_numpy(float), COPY_CAP))
        total, n = _online(fold, "accepted")
        fold["own_first"] = (n == 0).astype(float)
        fold["own_mean"] = np.where(n > 0, total / np.maximum(n, 1), 0.0)
        for info in steps:
            _add_steps(fold, cat, steps[info], info, confidence=confidence and info == "before_verifying")
    observed = rounds.loc[rounds["fold"] == categories[0]].groupby("category")["accepted"].mean()
    return dict(steps=steps, observed=observed.loc[categories], confidence=confidence)


def _fit_line(name: str, info: str, fit: dict) -> str:
    return (f"  {name:<28} {info:<16} R2 {fit['r2']:+.3f} [{fit['r2_lo']:+.3f}, {fit['r2_hi']:+.3f}]  "
            f"MAE {fit['mae']:.3f} [{fit['mae_lo']:.3f}, {fit['mae_hi']:.3f}]")


def run_category_table(args, parser) -> dict:
    """Category means held out (issue 64 items 3, 4 and 6): per arm and information set, R-squared and MAE.

    For every drafting arm of the traces (runs pooled by ``arms.run_arms``: never across drafters, checkpoints,
    trees, budgets or gates), every category is held out in turn; the law (``--family``, category-free), its
    drafted-depth model (``TrainingDepthModel``), the depth-only control and GLANCE's law are fitted on the other
    categories only and predict the held-out category's mean accepted length per drafting round ((tokens -
    rounds) / drafting rounds, through the exact DP over the request's greedy output with D from the depth
    model):

    3. per predictor and information set (``law.information``): R-squared and MAE of the predicted against the
       observed category means, with a leave-one-category-out jackknife 90% interval that refits: each category
       c left out of the whole LOCO run, every other category predicted by fits without it and without c
       (``jackknife_refits``: K more LOCO runs per arm).
    4. the category terms' CV share of the law's gain over depth only, added last and added first, and their
       mean (Shapley), grouped 5-fold CV by request (``law.categories.share_both_orders``; category terms are
       fitted with as few as 1 request of a category in a training fold: the pooled sets hold 3-4 per category).
    6. what explains category means before drafting, per drafting round, each input added in turn (OLS on the
       training categories' rounds): the law's expectation from the root (before drafting: with the depth model;
       before verifying: with the round's D), + the context's copyability at the root, + the request's own
       acceptance so far (its earlier drafting rounds' mean accepted), + a request random effect (online BLUP
       with MixedLM's variance ratio), + the drafter's confidence at depth 1 (before verifying; where logged);
       its jackknife keeps the fold fits.

    Seeded; prints its time. ``OMP_NUM_THREADS=1 python bench/law.py category-table [--traces ...]``
    """
    from entropy_law.law.categories import category_fit, share_both_orders
    from entropy_law.law.fit import primary_family
    from entropy_law.law.information import InfoSet, check_information, predictor_inputs

    sys.stdout.reconfigure(line_buffering=True)  # a long run: each line as it comes
    started = time.time()
    traces = load_traces(args.traces)
    family = args.family or primary_family(traces.tokens)
    fam = get_family(family)
    # what each predictor reads, checked against the set it is printed under
    check_information(InfoSet.WORKLOAD, predictor_inputs(fam, "training"), what=f"{family} (workload)")
    check_information(InfoSet.BEFORE_DRAFTING, predictor_inputs(fam, "training", root_only=True),
                      what=f"{family} root only")
    print(f"traces {args.traces}; law {family}; quantity: mean accepted length per drafting round; "
          "every category held out in turn (fits on the others only); R2 / MAE [90% leave-one-category-out "
          "jackknife: the table's refitted without each category, item 6's with the fold fits kept]", flush=True)
    report = {}
    for label, view in arm_views(traces, args.min_categories).items():
        if args.arms is not None and not any(text in label for text in args.arms):
            continue
        t0 = time.time()
        res = category_means(view, family)
        cats = list(res["observed"].index)
        obs = res["observed"].to_numpy(float)
        print(f"\n=== {label}: {len(cats)} categories, {len(view.requests)} requests, B = {res['block']}", flush=True)
        frame = pd.DataFrame({"observed": res["observed"]})
        entry = {"categories": cats, "table": {}}
        jack = jackknife_refits(view, family, cats)
        for name, (info, what) in TABLE_ROWS.items():
            pred = np.array([res["predicted"][name][c] for c in cats])
            frame[name] = pred
            fit = category_fit(obs, pred, [(r["observed"].to_numpy(float), np.array(
                [r["predicted"][name][c] for c in r["observed"].index])) for r in jack])
            entry["table"][name] = {"set": info, **fit}
            print(_fit_line(name, InfoSet(info).label, fit) + f"   ({what})")
        print(frame.round(3).to_string())
        six = item6(res["rounds"], res["tokens"], cats)
        print("item 6, per drafting round, each input added in turn (category means of the round predictions; "
              "observed: the drafting rounds' mean accepted):")
        entry["explain"] = {}
        for info, steps in six["steps"].items():
            for step, means in steps.items():
                fit = category_fit(six["observed"].to_numpy(float), np.array([means[c] for c in cats]))
                entry["explain"][f"{info}: {step}"] = fit
                print(_fit_line(step, InfoSet(info).label, fit))
        if not six["confidence"]:
            print("  (the drafter's confidence is not logged at every round of this arm: not added)")
        if not args.no_share:
            rows = atrisk.at_risk_table(view, drafters=[res["drafter"]])
            try:
                share = share_both_orders(rows, family, seed=args.seed, min_requests_per_category=1)
                print(f"item 4, category share of the CV gain ({family} + category terms over depth only, "
                      f"{share['cv_gain_total']:+.4f} nats/trial; the law alone {share['cv_gain_law']:+.4f}, depth + "
                      f"category alone {share['cv_gain_category']:+.4f}): entropy first {share['entropy_first']:.3f}, "
                      f"category first {share['category_first']:.3f}, Shapley {share['shapley']:.3f}")
            except ValueError as err:
                share = {"why": str(err)}
                print(f"item 4: not measured ({err})")
            entry["share"] = share
        print(f"({time.time() - t0:.0f} s)", flush=True)
        report[label] = entry
    elapsed = time.time() - started
    print(f"\ntime {elapsed:.0f} s")
    out = {"bench": "law_category_table", "traces": args.traces, "family": family, "seconds": round(elapsed),
           "arms": report}
    print(json.dumps(out, default=float))
    return out


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "categories": (categories_arguments, run_categories),
    "leads": (leads_arguments, run_leads),
    "recovery": (recovery_arguments, run_recovery),
    "intervals": (intervals_arguments, run_intervals),
    "confidence": (confidence_arguments, run_confidence),
    "proposals": (proposals_arguments, run_proposals),
    "category-table": (category_table_arguments, run_category_table),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))

"""GLANCE's law beside ours, per arm, held out by category.

Subcommands (each prints a table and ends with one JSON line):

    python bench/glance.py law [ARGS]
    python bench/glance.py matched [ARGS]

``python bench/glance.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, run_subcommand  # noqa: E402

from entropy_law.analysis import TraceAnalysis  # noqa: E402
from entropy_law.law.atrisk import at_risk_table  # noqa: E402
from entropy_law.law.fit import PRIMARY_FALLBACK, get_family, prepare_counts  # noqa: E402
from entropy_law.glance import (category_frame, fit_glance, glance_rounds, loco_glance,  # noqa: E402
                                    read_glance_rounds, round_scores)
from entropy_law.glance import matched  # noqa: E402
from entropy_law.glance.compare import entropy_by_request  # noqa: E402
from entropy_law.law.stats import r_squared  # noqa: E402
from entropy_law.law.information import InfoSet, check_information, predictor_inputs, sets_allowing  # noqa: E402
from entropy_law.plots.glance import glance_wins, loco_ours, primary_family  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402


# --- law -------------------------------------------------------------------------------------------------------------

GOAL_MSE_REDUCTION = 0.15  # the primary law's per-round MSE at least this far below GLANCE's
GOAL_CATEGORY_RATIO = 0.5  # the primary law's category-mean error at most this share of GLANCE's
GLANCE_FORMS = {"glance": "code", "glance_readme": "readme"}
DRAFTER_AWARE = "law_exp_obs_ceil_drafttop"  # + the drafter's confidence in its own proposal (--drafter-aware)
COPY_AWARE = "law_exp_obs_ceil_copy"  # + the context's copyability before each position (tokens column context_match)
DRAFTER_AWARE_COPY = "law_exp_obs_ceil_drafttop_copy"  # both (--drafter-aware, with the copyability)
TOP1_AWARE = "law_exp_obs_ceil_top1"  # + the target's own top-1 probability at each position (target_top1_prob)
TOP1_COPY = "law_exp_obs_ceil_top1_copy"  # + the target's top-1 probability and the copyability
DRAFTER_AWARE_TOP1_COPY = "law_exp_obs_ceil_drafttop_top1_copy"  # all three (--drafter-aware)
# the covariate laws beside the primary: (family, report key, what it adds); what each needs is its family's
COVARIATE_LAWS = (
    (COPY_AWARE, "copy_aware", "+ the context's copyability before each position"),
    (TOP1_AWARE, "top1_aware", "+ the target's own top-1 probability at each position"),
    (TOP1_COPY, "top1_copy_aware", "+ the target's top-1 probability and the context's copyability"),
    (DRAFTER_AWARE_COPY, "drafter_aware_copy", "+ the drafter's confidence and the context's copyability"),
    (DRAFTER_AWARE_TOP1_COPY, "drafter_aware_top1_copy", "+ the drafter's confidence, the target's top-1 probability "
     "and the context's copyability"),
)
COLUMNS = ["mse", "cat_mae", "cat_max", "r2_curve", "r2_round", "r2_ceiling", "frac_of_ceiling", "holds"]


def covariate_laws(copy: bool, top1: bool, drafts: bool) -> list:
    """The rows of ``COVARIATE_LAWS`` whose inputs are there: ``copy`` (the traces hold the context's
    copyability), ``top1`` (the target's top-1 probability at every position), ``drafts`` (the round proposals)."""
    families = {row[0]: get_family(row[0]) for row in COVARIATE_LAWS}
    return [row for row in COVARIATE_LAWS
            if (copy or not families[row[0]].needs_context_match) and (top1 or not families[row[0]].needs_target_top1)
            and (drafts or not families[row[0]].needs_draft_stats)]


def our_laws(copy: bool = False, top1: bool = False) -> dict:
    """name -> (family, root entropy only): the primary law (read at call time), the same with the root
    entropy at every depth (GLANCE's information, plus D), ``fit.PRIMARY_FALLBACK`` (the primary law of traces
    without the target's top-1 probability) and law_exp (the first primary law), for reference;
    and the covariate laws without the drafter whose inputs are there (``covariate_laws``), each with its root
    variant (the root's entropy and covariates at every depth: known before the round)."""
    primary = primary_family()
    laws = {primary: (primary, False), f"{primary}_root": (primary, True)}
    if primary != PRIMARY_FALLBACK:  # the primary of traces without the target's top-1 probability
        laws[PRIMARY_FALLBACK] = (PRIMARY_FALLBACK, False)
    if primary != "law_exp":
        laws["law_exp"] = ("law_exp", False)
    for family, *_ in covariate_laws(copy, top1, drafts=False):  # without the drafter's confidence
        if family != primary:
            laws.update({family: (family, False), f"{family}_root": (family, True)})
    return laws


def score_arm(view, arm: str, drafts: pd.DataFrame | None = None, copy: bool = False, top1: bool = False):
    """(scores by law, category means, GLANCE's in-sample law, the rounds, LOCO predictions by law). With
    ``drafts`` (the arm's round proposals), also the drafter-aware law ``DRAFTER_AWARE``; and the covariate laws
    whose inputs are there (``covariate_laws``: ``copy``, the context's copyability; ``top1``, the target's top-1
    probability)."""
    rounds = glance_rounds(view)
    in_sample = fit_glance(rounds)
    scores, predictions = {}, {}
    for name, form in GLANCE_FORMS.items():
        predictions[name], fits = loco_glance(rounds, form=form)
        scores[name] = round_scores(rounds, predictions[name], slope=[f.b1_fitted for f in fits.values()])
    rows = at_risk_table(view, drafters=[arm])
    laws = our_laws(copy, top1)
    for family in dict.fromkeys(family for family, _ in laws.values()):  # each family fitted once per fold
        names = [name for name, (f, _) in laws.items() if f == family]
        predicted, slopes = loco_ours(view, arm, rounds, family, rows=rows,
                                      root_only=tuple(laws[name][1] for name in names))
        for name, values in zip(names, predicted if len(names) > 1 else (predicted,)):
            predictions[name] = values
            scores[name] = round_scores(rounds, values, slope=slopes, slope_max=np.inf)
    if drafts is not None:
        for family in (DRAFTER_AWARE, *[row[0] for row in covariate_laws(copy, top1, drafts=True)
                                        if get_family(row[0]).needs_draft_stats]):
            predictions[family], slopes = loco_ours(view, arm, rounds, family, rows=rows, drafts=drafts)
            scores[family] = round_scores(rounds, predictions[family], slope=slopes, slope_max=np.inf)
    return scores, category_frame(scores), in_sample, rounds, predictions


N_BOOT = 1000  # request-bootstrap replicates of the ratios (seeded)


def ratio_intervals(rounds: pd.DataFrame, ours: np.ndarray, theirs: np.ndarray, *, n_boot: int = N_BOOT,
                    seed: int = 0) -> dict:
    """95% percentile intervals of 1 - MSE(ours) / MSE(theirs) and of the category-mean error ratio, resampling
    requests within each category (the rounds of a request stay together; multinomial weights, seeded)."""
    a = rounds["accepted"].to_numpy(dtype=float)
    keys = rounds["run_id"].astype(str) + "\0" + rounds["request_id"].astype(str)
    per = pd.DataFrame({"key": keys, "category": rounds["category"].astype(str), "n": 1.0, "obs": a,
                        "ours": ours, "theirs": theirs, "se_ours": (ours - a) ** 2, "se_theirs": (theirs - a) ** 2})
    per = per.groupby(["category", "key"], sort=True).sum(numeric_only=True)
    rng = np.random.default_rng(seed)
    total = {c: np.zeros(n_boot) for c in ("n", "se_ours", "se_theirs")}
    err_ours, err_theirs = [], []
    for _, part in per.groupby(level="category", sort=True):
        w = rng.multinomial(len(part), np.full(len(part), 1.0 / len(part)), size=n_boot).astype(float)
        sums = {c: w @ part[c].to_numpy() for c in ("n", "obs", "ours", "theirs", "se_ours", "se_theirs")}
        for c in total:
            total[c] += sums[c]
        err_ours.append(np.abs(sums["ours"] - sums["obs"]) / sums["n"])
        err_theirs.append(np.abs(sums["theirs"] - sums["obs"]) / sums["n"])
    reduction = 1.0 - total["se_ours"] / total["se_theirs"]
    ratio = np.mean(err_ours, axis=0) / np.mean(err_theirs, axis=0)
    q = lambda x: [float(v) for v in np.percentile(x, [2.5, 97.5])]  # noqa: E731
    return {"mse_reduction_ci": q(reduction), "category_mean_error_ratio_ci": q(ratio)}


def goal_lines(entry: dict, ours: str, scores: dict, predictions: dict, rounds: pd.DataFrame, *,
               indent: str = "") -> bool:
    """Print law ``ours`` against both GLANCE forms (the goals, with request-bootstrap intervals), fill
    ``entry["vs_<form>"]``; whether both goals are met against both forms."""
    goal = True
    for name in GLANCE_FORMS:
        reduction = 1.0 - scores[ours]["mse"] / scores[name]["mse"]
        ratio = scores[ours]["category_mean_mae"] / scores[name]["category_mean_mae"]
        met = bool(reduction >= GOAL_MSE_REDUCTION and ratio <= GOAL_CATEGORY_RATIO)
        goal &= met
        ci = ratio_intervals(rounds, predictions[ours], predictions[name])
        entry[f"vs_{name}"] = {"mse_reduction": reduction, "category_mean_error_ratio": ratio, "goal_met": met, **ci}
        lo, hi = ci["mse_reduction_ci"]
        rlo, rhi = ci["category_mean_error_ratio_ci"]
        print(f"{indent}{ours} vs {name}: per-round MSE {reduction:+.1%} lower [{lo:+.1%}, {hi:+.1%}] "
              f"(goal >= {GOAL_MSE_REDUCTION:.0%}), category-mean error x{ratio:.2f} [{rlo:.2f}, {rhi:.2f}] "
              f"(goal <= {GOAL_CATEGORY_RATIO}): {'goal met' if met else 'GOAL NOT MET'}")
    return goal


def round_drafts(analysis, arm: str, tasks: str, cache: Path | None) -> pd.DataFrame:
    """The arm's round proposals (``jobs.reference.round_proposals`` over each of its runs: every recorded round
    replayed and checked equal first; the block drafter needs a teacher-forced target pass per request), read from
    ``cache/<arm>.parquet`` where an earlier run wrote them, else computed (and written there)."""
    path = cache / f"{arm.replace(' ', '_')}.parquet" if cache is not None else None
    if path is not None and path.is_file():
        return pd.read_parquet(path)
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import round_proposals

    torch.set_num_threads(1)
    target = load_target("smollm2-135m")
    t0 = time.process_time()
    paths = analysis.runs.loc[analysis.runs["arm"] == arm, "path"]
    frame = pd.concat([round_proposals(Path(p), target, tasks=tasks) for p in paths], ignore_index=True)
    print(f"{arm}: {len(frame)} drafted depths of {frame.groupby(['run_id', 'request_id', 'round_index']).ngroups} "
          f"rounds replayed, every round equal to the recorded one [{time.process_time() - t0:.0f} s CPU]", flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(path, index=False)
    return frame


def table(scores: dict) -> pd.DataFrame:
    return pd.DataFrame({name: {"mse": s["mse"], "cat_mae": s["category_mean_mae"], "cat_max": s["category_mean_max_abs"],
                                "r2_curve": s["r2_curve"], "r2_round": s["r2_round"], "r2_ceiling": s["r2_ceiling"],
                                "frac_of_ceiling": s["frac_of_ceiling"], "holds": s["holds"]}
                         for name, s in scores.items()}).T[COLUMNS]


def law_arguments(parser) -> None:
    """The arguments of ``law``."""
    parser.add_argument("--traces", default="data/traces", help="trace folder (default: the shipped reference traces)")
    parser.add_argument("--glance-log", default=None, help="also fit GLANCE's law to this GLANCE round log (JSONL)")
    parser.add_argument("--drafter-aware", action="store_true",
                        help=f"also score {DRAFTER_AWARE}: replays every arm's rounds for the drafter's confidence at "
                             "each verified depth (loads the default target; the block arms take a teacher-forced pass "
                             "per request, about half an hour for data/traces)")
    parser.add_argument("--tasks", default="spec_bench", help="--drafter-aware: the prompts the runs decoded, for runs "
                        "whose run.json names none (default spec_bench)")
    parser.add_argument("--drafts-cache", default=None, metavar="DIR",
                        help="--drafter-aware: read the replayed round proposals from DIR/<arm>.parquet, or write them")
    parser.add_argument("--no-context-match", action="store_true",
                        help=f"leave out {COPY_AWARE} (by default the context's copyability is attached from the "
                             "prompts to runs recorded without it, with the tokenizer of the target they name)")


def run_law(args, parser) -> None:
    """GLANCE's draftability law against our primary law, round by round, leave-one-category-out.

    The primary law is ``entropy_law.analysis.DEFAULT_FAMILY`` (read at run time through
    ``entropy_law.plots.glance.primary_family``; ``law_exp_obs_ceil`` when this was written). For every drafting arm
    of the traces (default ``data/traces``; the AR arm drafts nothing and is skipped):

    1. GLANCE's law as GLANCE fits it (code form, per category and pooled, in sample): b0, b1, r2_curve,
       r2_round / r2_ceiling, Spearman rho and holds().
    2. Leave-one-category-out, per drafting round (H = the root entropy, a = accepted drafts): for each category,
       each law is fitted without it and predicts the accepted drafts of every one of its rounds:
       - ``glance``: GLANCE's law, code form, E[a | H] = min(exp(b0 - b1 H), 15);
       - ``glance_readme``: GLANCE's law, README form, p + ... + p^15;
       - PRIMARY: our primary law, E[tau] = sum_k prod_{j<=k} a(x_{t+j-1}, j) over the round's drafted depth D
         (``tree_depth``, known before verification), along the entropies of the greedy output
         (``glance.law_round_expectations``);
         The entropies at depths 2..D are those of positions the round has not reached yet: they describe the
         round (as the law does), they are not all known before it;
       - PRIMARY_root: the same law with the root entropy at every depth (GLANCE's information, plus D): what a
         prediction made before the round can use (printed beside the goals, not a goal);
       - ``law_exp``: the first primary law, for reference (not a goal);
       - ``law_exp_obs_ceil_copy`` (and ``_root``): law_exp_obs_ceil + the context's copyability before each position
         (tokens column ``context_match``, attached from the prompts to runs recorded without it; ``--no-context-match``
         leaves it out), with its goal lines; with ``--drafter-aware`` also ``law_exp_obs_ceil_drafttop_copy``;
       - ``law_exp_obs_ceil_top1`` and ``law_exp_obs_ceil_top1_copy`` (and ``_root``): law_exp_obs_ceil + the target's
         own top-1 probability at each position (tokens column ``target_top1_prob``), without and with the
         copyability; with ``--drafter-aware`` also ``law_exp_obs_ceil_drafttop_top1_copy`` (``COVARIATE_LAWS``).
       Scores (``glance.round_scores``): per-round MSE, |mean predicted - mean observed| per category (mean
       over categories: ``cat_mae``), r2_curve (bin means of the predictions against bin means of a, 10
       root-entropy quantile bins), r2_round / r2_ceiling and GLANCE's holds() (slope: every fold's b1 or k).
       Ratios come with 95% intervals from 1000 request-bootstrap replicates (requests resampled within each
       category, seeded).
    3. The goals, per arm: the primary law's per-round MSE at least 15% below GLANCE's (both forms) and
       its category-mean error at most half of GLANCE's; and every place where a GLANCE form does at least as well.

    ``--glance-log FILE.jsonl`` also fits GLANCE's law to one of GLANCE's round logs (our law needs per-depth
    entropies, which those logs do not hold). Prints tables and ends with one JSON line; a few minutes on one core
    (shared machine).

        OMP_NUM_THREADS=1 python bench/glance.py law [--traces data/traces] [--glance-log rounds.jsonl]
    """
    started = time.time()
    primary = primary_family()
    traces = load_traces(args.traces)
    copy = not args.no_context_match
    if copy:
        from entropy_law.jobs.reference import ensure_context_matches

        traces, rebuilt = ensure_context_matches(traces, tasks=args.tasks)
        if rebuilt:
            print(f"context's copyability attached from the prompts ({rebuilt}'s tokenizer, {args.tasks})", flush=True)
    top1 = "target_top1_prob" in traces.tokens and bool(traces.tokens["target_top1_prob"].notna().all())
    analysis = TraceAnalysis(traces)
    report, all_wins, aware_wins, covariate_wins = {}, [], [], {}
    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 20)
    for arm in analysis.arms:
        view = analysis.arm_view(arm)
        drafts = (round_drafts(analysis, arm, args.tasks, Path(args.drafts_cache) if args.drafts_cache else None)
                  if args.drafter_aware else None)
        scores, categories, in_sample, rounds, predictions = score_arm(view, arm, drafts, copy, top1)
        print(f"\n=== {arm}: GLANCE's law in sample (code form, as GLANCE's experiments/fit_law.py reports it)")
        print(in_sample.summary[["n_rounds", "mean_accepted", "b0", "b1", "r2_curve", "r2_round", "r2_ceiling",
                                 "frac_of_ceiling", "spearman_rho", "holds"]].round(4).to_string())
        print(f"\n--- {arm}: leave-one-category-out, per drafting round ({scores[primary]['n_rounds']} rounds)")
        print(table(scores).to_string(float_format=lambda v: f"{v:.4f}"))
        print("mean accepted drafts per category, observed and LOCO-predicted:")
        print(categories.round(3).to_string())
        ours = scores[primary]
        entry = {"rounds": ours["n_rounds"], "mean_accepted": ours["mean_accepted"]}
        goal = goal_lines(entry, primary, scores, predictions, rounds)
        if DRAFTER_AWARE in scores:
            print(f"  the drafter-aware law ({DRAFTER_AWARE}: + the drafter's confidence in its own proposal at each "
                  "depth, known before verification, from the rounds replayed):")
            aware = {}
            entry["drafter_aware"] = aware
            aware["goal_met"] = goal_lines(aware, DRAFTER_AWARE, scores, predictions, rounds, indent="  ")
        for name, key, what, *_ in COVARIATE_LAWS:
            if name in scores:
                print(f"  the covariate law {name} ({what}):")
                entry[key] = {}
                entry[key]["goal_met"] = goal_lines(entry[key], name, scores, predictions, rounds, indent="  ")
        root = scores[f"{primary}_root"]  # before the round: the root entropy and D only, GLANCE's information + D
        for name in GLANCE_FORMS:
            reduction = 1.0 - root["mse"] / scores[name]["mse"]
            ratio = root["category_mean_mae"] / scores[name]["category_mean_mae"]
            entry[f"root_only_vs_{name}"] = {"mse_reduction": reduction, "category_mean_error_ratio": ratio}
            print(f"  {primary}_root (pre-round information only) vs {name}: per-round MSE {reduction:+.1%} lower, "
                  f"category-mean error x{ratio:.2f} (not a goal)")
        entry["goal_met"] = goal
        entry["laws"] = {name: {k: s[k] for k in ("mse", "category_mean_mae", "r2_curve", "r2_round", "r2_ceiling",
                                                  "frac_of_ceiling", "holds")} for name, s in scores.items()}
        entry["glance_in_sample"] = {"b0": in_sample.b0, "b1": in_sample.b1, "r2_curve": in_sample.r2_curve,
                                     "frac_of_ceiling": in_sample.frac_of_ceiling, "holds": in_sample.holds()}
        wins = glance_wins(arm, {k: v for k, v in scores.items() if k in (primary, *GLANCE_FORMS)}, primary)
        all_wins += wins
        if DRAFTER_AWARE in scores:
            aware_wins += glance_wins(arm, {k: v for k, v in scores.items() if k in (DRAFTER_AWARE, *GLANCE_FORMS)},
                                      DRAFTER_AWARE)
        for name, *_ in COVARIATE_LAWS:
            if name in scores:
                covariate_wins.setdefault(name, []).extend(
                    glance_wins(arm, {k: v for k, v in scores.items() if k in (name, *GLANCE_FORMS)}, name))
        report[arm] = entry
    skipped = analysis.ar_arms
    print(f"\nskipped (no drafting rounds): {', '.join(skipped) or 'none'}")
    print(f"\nwhere GLANCE's law does at least as well as {primary} (LOCO):")
    print("\n".join(f"  {w}" for w in all_wins) if all_wins else "  nowhere")
    if args.drafter_aware:
        print(f"\nwhere GLANCE's law does at least as well as {DRAFTER_AWARE} (LOCO):")
        print("\n".join(f"  {w}" for w in aware_wins) if aware_wins else "  nowhere")
    for name, wins in covariate_wins.items():
        print(f"\nwhere GLANCE's law does at least as well as {name} (LOCO):")
        print("\n".join(f"  {w}" for w in wins) if wins else "  nowhere")
    imported = None
    if args.glance_log:
        log_rounds = read_glance_rounds(args.glance_log)
        law = fit_glance(log_rounds)
        print(f"\n=== GLANCE round log {args.glance_log}")
        law.print_summary()
        imported = {"path": args.glance_log, "rounds": law.n_rounds, "b0": law.b0, "b1": law.b1,
                    "r2_curve": law.r2_curve, "holds": law.holds()}
    every = all(entry["goal_met"] for entry in report.values())
    print(f"\ngoals ({primary} vs both GLANCE forms, every arm): {'met' if every else 'NOT met'}")
    if args.drafter_aware:
        met = [arm for arm, entry in report.items() if entry["drafter_aware"]["goal_met"]]
        print(f"goals ({DRAFTER_AWARE} vs both GLANCE forms): met on {', '.join(met) or 'no arm'}; not met on "
              f"{', '.join(a for a in report if a not in met) or 'none'}")
    for name, key, *_ in COVARIATE_LAWS:
        if all(key in entry for entry in report.values()) and report:
            met = [arm for arm, entry in report.items() if entry[key]["goal_met"]]
            print(f"goals ({name} vs both GLANCE forms): met on {', '.join(met) or 'no arm'}; not met on "
                  f"{', '.join(a for a in report if a not in met) or 'none'}")
    print(json.dumps({"bench": "glance_law", "traces": args.traces, "primary_family": primary, "goal_met_every_arm": every, "arms": report,
                      "skipped_arms": skipped, "glance_wins": all_wins,
                      "glance_wins_drafter_aware": aware_wins if args.drafter_aware else None,
                      "glance_wins_covariate_laws": covariate_wins, "glance_log": imported,
                      "seconds": round(time.time() - started, 1)}, default=float))


# --- matched ---------------------------------------------------------------------------------------------------------

MATCHED_GOALS = {"mse_change": -0.15, "category_ratio": 0.7, "category_r2": 0.5}  # each on a one-sided bound
N_BOOT_MATCHED = 20  # request-bootstrap replicates, each refitting both laws in every fold
# GLANCE's predictors and the inputs each reads (law.information.INPUTS)
GLANCE_INPUTS = {
    "GLANCE code, cap 15": frozenset({"entropy_root"}),
    "GLANCE README, L = 15": frozenset({"entropy_root"}),
    "GLANCE README, L ~ depth model": frozenset({"entropy_root", "depth_model"}),
    "GLANCE README, L = D": frozenset({"entropy_root", "drafted_depth"}),
}
OURS = {  # our primary law: name -> (where D comes from, law.information.DEPTH_INPUTS; the root's entropy only)
    "ours, path + D": ("observed", False),
    "ours, path + depth model": ("training", False),
    "ours, root + depth model": ("training", True),
    "ours, root + D": ("observed", True),
}
BEST_BEFORE_VERIFYING = "the best before-verifying law"
MATCHED_ROWS = (  # (set, ours, the predictors it is compared with); "as published" is no set: ours reads more
    ("as published", "ours, path + D", ("GLANCE code, cap 15", "GLANCE README, L = 15")),
    (InfoSet.WORKLOAD, "ours, path + depth model", ("GLANCE code, cap 15", "GLANCE README, L ~ depth model")),
    (InfoSet.BEFORE_DRAFTING, "ours, root + depth model", ("GLANCE code, cap 15", "GLANCE README, L ~ depth model")),
    (InfoSet.BEFORE_VERIFYING, "ours, root + D", ("GLANCE README, L = D",)),
    (InfoSet.AFTER_VERIFYING, "ours, path + D", (BEST_BEFORE_VERIFYING,)),
)


def matched_inputs(family: str) -> dict:
    """name -> the inputs it reads, for every predictor of ``OURS`` (``family``) and ``GLANCE_INPUTS``."""
    fam = get_family(family)
    ours = {name: predictor_inputs(fam, depths, root_only=root) for name, (depths, root) in OURS.items()}
    return {**ours, **GLANCE_INPUTS}


def weighted_cells(cells: pd.DataFrame, weight: np.ndarray) -> pd.DataFrame:
    """The cells of an aggregate (``prepare_counts``) with weight > 0, their counts times their (integer) weight:
    the aggregate of the at-risk rows with each cell's request drawn ``weight`` times (the cells are per request)."""
    keep = weight > 0
    out = cells.loc[keep].copy()
    for column in ("n_acc", "n_rej", "n"):
        out[column] = out[column].to_numpy() * weight[keep].astype(np.int64)
    out.attrs.update(cells.attrs)
    return out


def matched_predictions(view, rounds: pd.DataFrame, cells: pd.DataFrame, family: str, drafts: int,
                        round_pick: np.ndarray, cell_weight: np.ndarray, sequences=None) -> tuple[dict, dict]:
    """({name: LOCO predictions, NaN where not predicted}, {held-out category: our law's offset c of log(H + c)}):
    the data are the rounds at positions ``round_pick`` (a request drawn twice counts twice) and the at-risk cells
    ``cells`` (``prepare_counts`` of the arm's rows, per request) counted ``cell_weight`` times; each category of it
    is held out in turn, every predictor fitted on the other categories' picked data (its drafted-depth model too,
    and our law's offset c where its family profiles it) and predicting the held-out category's rounds."""
    from entropy_law.glance import law_round_expectations
    from entropy_law.law.fit import fit_law

    category = rounds["category"].astype(str).to_numpy()
    cell_category = cells["category"].astype(str).to_numpy()
    out = {name: np.full(len(rounds), np.nan) for name in [*OURS, *GLANCE_INPUTS]}
    used = {}
    for held_out in sorted(set(category[round_pick])):
        train = rounds.iloc[round_pick[category[round_pick] != held_out]]
        test = np.unique(round_pick[category[round_pick] == held_out])
        tested = rounds.iloc[test]
        h = tested["entropy"].to_numpy(dtype=float)
        for name, form in (("GLANCE code, cap 15", "code"), ("GLANCE README, L = 15", "readme")):
            out[name][test] = fit_glance(train, form, per_category=False, n_boot=0).predict(h)
        b0, b1 = matched.fit_glance_reach(train["entropy"], train["accepted"],
                                          matched.observed_reach(train["tree_depth"], drafts))
        probs = matched.round_depth_probabilities(matched.round_depth_model(train, drafts), tested)
        out["GLANCE README, L ~ depth model"][test] = matched.glance_reach_expected(h, b0, b1, matched.model_reach(probs))
        out["GLANCE README, L = D"][test] = matched.glance_reach_expected(
            h, b0, b1, matched.observed_reach(tested["tree_depth"], drafts))
        law = fit_law(weighted_cells(cells, cell_weight * (cell_category != held_out)), family, cov_type="nonrobust")
        used[held_out] = law.eps
        for name, (depths, root) in OURS.items():
            out[name][test] = (
                law_round_expectations(law, view, tested, root_only=root, sequences=sequences) if depths == "observed"
                else matched.law_expected_over_depths(law, view, tested, probs, root_only=root, sequences=sequences))
    return out, used


def weighted_scores(rounds: pd.DataFrame, predicted: np.ndarray, weight: np.ndarray) -> dict:
    """Per-round MSE, the category-mean error (mean over categories of |mean predicted - mean observed|) and the
    R-squared of the category means, each round counted ``weight`` times (rounds without a prediction: 0)."""
    w = np.where(np.isfinite(predicted), weight, 0.0)
    a = rounds["accepted"].to_numpy(dtype=float)
    p = np.nan_to_num(predicted)
    frame = pd.DataFrame({"c": rounds["category"].astype(str).to_numpy(), "w": w, "wa": w * a, "wp": w * p})
    sums = frame.groupby("c").sum()
    sums = sums.loc[sums["w"] > 0]
    observed, means = sums["wa"] / sums["w"], sums["wp"] / sums["w"]
    return {"mse": float((w * (p - a) ** 2).sum() / w.sum()), "cat_error": float((means - observed).abs().mean()),
            "cat_r2": r_squared(observed, means)}


def pair_stats(scores: dict, ours: str, theirs: str) -> dict:
    """MSE change, category-mean error ratio and both category-mean R-squared of ``ours`` against ``theirs``."""
    o, t = scores[ours], scores[theirs]
    return {"mse_change": o["mse"] / t["mse"] - 1.0, "category_ratio": o["cat_error"] / t["cat_error"],
            "category_r2": o["cat_r2"], "category_r2_theirs": t["cat_r2"]}


def jackknife_interval(full: float, leave_outs: list) -> list:
    """95% leave-one-category-out jackknife interval (pseudo-values, t with K - 1 df) of a statistic ``full``."""
    from scipy import stats

    k = len(leave_outs)
    pseudo = k * full - (k - 1) * np.asarray(leave_outs, dtype=float)
    half = stats.t.ppf(0.975, k - 1) * pseudo.std(ddof=1) / np.sqrt(k)
    return [float(pseudo.mean() - half), float(pseudo.mean() + half)]


def cell_requests(rows: pd.DataFrame, row_code: np.ndarray, cells: pd.DataFrame) -> np.ndarray:
    """The request (``row_code``'s numbering) of each cell of ``cells``; a (category, request_id) of two runs'
    requests raises (their cells would pool two requests a bootstrap draws apart)."""
    keys = rows["category"].astype(str) + "\0" + rows["request_id"].astype(str)
    owner = pd.Series(row_code).groupby(keys.to_numpy()).agg(["min", "max"])
    if (owner["min"] != owner["max"]).any():
        raise ValueError(f"request ids {list(owner.index[owner['min'] != owner['max']][:3])} name requests of two "
                         "runs in one category: the per-request cells would pool them")
    return owner["min"].reindex(cells["category"].astype(str) + "\0" + cells["request_id"].astype(str)).to_numpy()


def matched_arm(view, arm: str, *, n_boot: int, seed: int, jackknife: bool = True) -> dict:
    """The matched comparison of one arm: point estimates, the request bootstrap (requests resampled within each
    category, both laws refitted in every fold) and the leave-one-category-out jackknife (each category dropped,
    the other categories' LOCO refitted); ``{"pairs": [...], "fits": n, ...}``."""
    family = primary_family(view)
    rounds = glance_rounds(view).reset_index(drop=True)
    rows = at_risk_table(view, drafters=[arm]).reset_index(drop=True)
    cells = prepare_counts(rows, get_family(family)).reset_index(drop=True)  # per request: fitted once per weight
    sequences = entropy_by_request(view, rounds["run_id"].unique(), columns=get_family(family).position_columns)
    drafts = int(rounds["tree_depth"].max())
    request = pd.Index((rounds["run_id"].astype(str) + "\0" + rounds["request_id"].astype(str)).unique())
    code = request.get_indexer(rounds["run_id"].astype(str) + "\0" + rounds["request_id"].astype(str))
    row_code = request.get_indexer(rows["run_id"].astype(str) + "\0" + rows["request_id"].astype(str))
    if (row_code < 0).any():
        raise ValueError(f"{arm}: at-risk rows of requests without a drafting round")
    cell_code = cell_requests(rows, row_code, cells)
    category = rounds["category"].astype(str).to_numpy()
    every = np.arange(len(rounds))

    def scored(request_weight):
        picks = np.repeat(every, request_weight[code].astype(int))
        predicted, used = matched_predictions(view, rounds, cells, family, drafts, picks,
                                              request_weight[cell_code], sequences)
        return {name: weighted_scores(rounds, values, request_weight[code]) for name, values in predicted.items()}, used

    point, offsets = scored(np.ones(len(request)))
    fits = len(offsets)
    before = ["ours, root + D", "GLANCE README, L = D"]
    best = min(before, key=lambda name: point[name]["mse"])
    pairs = [(info, ours, best if theirs == BEST_BEFORE_VERIFYING else theirs)
             for info, ours, names in MATCHED_ROWS for theirs in names]
    rng = np.random.default_rng(seed)
    per_category = {c: np.unique(code[category == c]) for c in sorted(set(category))}
    boot = []
    for _ in range(n_boot):
        count = np.zeros(len(request))
        for members in per_category.values():
            np.add.at(count, rng.choice(members, size=len(members), replace=True), 1.0)
        scores, used = scored(count)
        fits += len(used)
        boot.append(scores)
    jack = []
    for dropped in per_category if jackknife else ():
        scores, used = scored(np.isin(np.arange(len(request)), per_category[dropped], invert=True).astype(float))
        fits += len(used)
        jack.append(scores)
    inputs = matched_inputs(family)
    out = []
    for info, ours, theirs in pairs:
        entry = {"set": info if isinstance(info, str) else info.value, "ours": ours, "theirs": theirs,
                 "ours_inputs": sorted(inputs[ours]), "theirs_inputs": sorted(inputs[theirs]),
                 **pair_stats(point, ours, theirs)}
        if not isinstance(info, str):  # refuse a side that reads more than the set holds
            check_information(info, inputs[ours], what=ours)
            check_information(info, inputs[theirs], what=theirs)
        for key in ("mse_change", "category_ratio", "category_r2", "category_r2_theirs"):
            values = [pair_stats(s, ours, theirs)[key] for s in boot]
            entry[f"{key}_boot"] = [float(v) for v in np.nanpercentile(values, [2.5, 97.5])] if boot else None
        entry["category_ratio_jackknife"] = jackknife_interval(
            entry["category_ratio"], [pair_stats(s, ours, theirs)["category_ratio"] for s in jack]) if jack else None
        out.append(entry)
    return {"family": family, "rounds": len(rounds), "requests": len(request), "drafts": drafts, "fits": fits,
            "n_boot": n_boot, "jackknife": bool(jack), "offsets": offsets, "pairs": out}


def goal_check(entry: dict) -> dict | None:
    """The goals on one-sided bounds (the ends of the printed 95% intervals; the category ratio's larger of the
    bootstrap's and the jackknife's); None for rows without goals (as published, after verifying)."""
    if entry["set"] in ("as published", InfoSet.AFTER_VERIFYING.value) or entry["mse_change_boot"] is None:
        return None
    ratio_high = max(entry["category_ratio_boot"][1], (entry["category_ratio_jackknife"] or [-np.inf, -np.inf])[1])
    return {"mse_change": bool(entry["mse_change_boot"][1] <= MATCHED_GOALS["mse_change"]),
            "category_ratio": bool(ratio_high <= MATCHED_GOALS["category_ratio"]),
            "category_r2": bool(entry["category_r2_boot"][0] >= MATCHED_GOALS["category_r2"])}


def print_matched(arm: str, result: dict) -> None:
    def ci(values, fmt):
        return f"[{fmt(values[0])}, {fmt(values[1])}]" if values else "[not run]"

    pct, num = (lambda v: f"{v:+.1%}"), (lambda v: f"{v:.2f}")
    print(f"\n=== {arm}: {result['rounds']} drafting rounds, {result['requests']} requests, our law {result['family']}, "
          f"D <= {result['drafts']}; {result['n_boot']} bootstrap replicates"
          f"{' and a leave-one-category-out jackknife' if result['jackknife'] else ', no jackknife'}, "
          f"each refitting the laws ({result['fits']} fits of our law; the point fits' offsets c of log(H + c) by "
          f"held-out category: {', '.join(f'{c:g}' for c in result['offsets'].values())})")
    for e in result["pairs"]:
        label = "as published (no set: ours reads more)" if e["set"] == "as published" else InfoSet(e["set"]).label
        print(f"- {label}: {e['ours']} vs {e['theirs']}")
        print(f"    ours reads {', '.join(e['ours_inputs'])} (sets: "
              f"{', '.join(s.value for s in sets_allowing(e['ours_inputs'])) or 'none'}); "
              f"theirs reads {', '.join(e['theirs_inputs'])}")
        print(f"    MSE change {pct(e['mse_change'])} {ci(e['mse_change_boot'], pct)}; category-mean error "
              f"x{e['category_ratio']:.2f} {ci(e['category_ratio_boot'], num)} jackknife "
              f"{ci(e['category_ratio_jackknife'], num)}; category-mean R2 ours {e['category_r2']:.2f} "
              f"{ci(e['category_r2_boot'], num)}, theirs {e['category_r2_theirs']:.2f} "
              f"{ci(e['category_r2_theirs_boot'], num)}")
        goals = goal_check(e)
        if goals is not None:
            print("    goals (MSE <= -15%, category error <= x0.7, R2 >= 0.5, on the interval bounds): " + ", ".join(
                f"{k} {'met' if v else 'NOT met'}" for k, v in goals.items()))


def matched_arguments(parser) -> None:
    parser.add_argument("--traces", default="data/traces", help="trace folder (default: the shipped reference traces)")
    parser.add_argument("--arms", nargs="+", default=None, metavar="TEXT",
                        help="only the drafting arms whose name contains one of these (e.g. ngram)")
    parser.add_argument("--boot", type=int, default=N_BOOT_MATCHED,
                        help=f"request-bootstrap replicates, each refitting both laws (default {N_BOOT_MATCHED})")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.add_argument("--no-jackknife", action="store_true",
                        help="leave out the leave-one-category-out jackknife (with --boot 0: point estimates only)")


def run_matched(args, parser) -> None:
    """GLANCE's law and ours given the same information, per arm and information set, leave-one-category-out.

    Rows (``MATCHED_ROWS``): as published (ours given the path's entropies and the round's drafted depth D,
    GLANCE's law neither); workload and before drafting (both given the drafted-depth model of the training
    categories, ``matched.round_depth_model``: GLANCE as its code has it, cap 15, and in its README form with L drawn
    from that model; ours along the path's entropies / from the root's only); before verifying (both given D:
    GLANCE's README form with L = D, ours from the root with D); after verifying (ours with the path and D against
    the best before-verifying law: what the path adds). Every side's inputs are checked against its set
    (``law.information.check_information``). Columns: per-round MSE change against the other side, category-mean
    error ratio and category-mean R-squared, with 95% intervals from a request bootstrap that refits both laws and
    a leave-one-category-out jackknife of the ratio; the goals on their one-sided bounds. Ends with one JSON line.
    Cost: one leave-one-category-out run of both laws per arm, plus one per bootstrap replicate and one per category
    of the jackknife (every refit profiles c as the point fit does; our law is refitted on the arm's per-request
    cells with each request's draws as weights, ``weighted_cells``, and the entropy sequences are read once): the
    defaults take 26 runs per arm (see ``bench/results/glance-matched.txt`` for the CPU time); ``--boot 0
    --no-jackknife`` gives the point estimates.

        OMP_NUM_THREADS=1 python bench/glance.py matched [--traces data/traces] [--arms ngram] [--boot 20]
    """
    started = time.time()
    if args.boot < 0:
        parser.error("--boot must be >= 0")
    analysis = TraceAnalysis(load_traces(args.traces))
    arms = [a for a in analysis.arms if args.arms is None or any(text in a for text in args.arms)]
    if not arms:
        parser.error(f"no drafting arm matches --arms {args.arms}; arms: {analysis.arms}")
    report = {}
    for arm in arms:
        report[arm] = matched_arm(analysis.arm_view(arm), arm, n_boot=args.boot, seed=args.seed,
                                  jackknife=not args.no_jackknife)
        print_matched(arm, report[arm])
        for entry in report[arm]["pairs"]:
            entry["goals"] = goal_check(entry)
    unmet = [f"{arm}: {e['set']} vs {e['theirs']}" for arm, r in report.items() for e in r["pairs"]
             if e["goals"] is not None and not all(e["goals"].values())]
    print(f"\ngoals not met in {len(unmet)} of "
          f"{sum(e['goals'] is not None for r in report.values() for e in r['pairs'])} matched rows")
    print(json.dumps({"bench": "glance_matched", "traces": args.traces, "boot": args.boot, "seed": args.seed,
                      "goals": MATCHED_GOALS, "arms": report, "goals_not_met": unmet,
                      "seconds": round(time.time() - started, 1)}, default=float))
    return 0


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "law": (law_arguments, run_law),
    "matched": (matched_arguments, run_matched),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))

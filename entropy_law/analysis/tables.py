"""The tables the report, the figures and the notebooks show of an analysed trace set, across the rooms.

Known here: per arm and category the results table (requests, tokens, entropies, accepted length, tokens per
round, the law's in-sample and leave-one-category-out predictions, the measured speedup and its verdict:
``results_table``), per arm the law's parameters with the break-even entropy (``law_table``), and how an
estimate with its interval is printed (``format_interval``). Each table takes ``an``, a ``TraceAnalysis``.

Not known here: how any of it is computed (``entropy_law.law``, ``entropy_law.payoff``), plotting.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.law.results import Attempt


def results_table(an) -> pd.DataFrame:
    """Per arm and category: requests (run and request pairs), tokens, mean / median target entropy
    (nats, of the arm's model), mean accepted length per drafting round (tau), committed tokens per
    round, the law's DP prediction of tokens per round (in-sample; acceptance capped at each round's
    drafted depth), the LOCO predictions of tokens per round and of the mean accepted length per
    drafting round, and the measured decode speedup over AR of the same model and machine (if timed), with
    its verdict (``speedup_verdict``: only "measured" is a result; ``speedup``)."""
    def compute():
        ent = an.entropy_tokens()
        h = ent.groupby(["model_id", "category"])["target_entropy_nats"].agg(mean_entropy_nats="mean",
                                                                              median_entropy_nats="median")
        rnd = an.view.rounds.merge(an.runs[["run_id", "arm"]], on="run_id")
        rnd = rnd.merge(an.view.requests[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
        decode = rnd.loc[rnd["round_index"] > 0]
        rows = []
        speed = an.attempt("measured_speedups")
        sp = speed.value if speed.ok else None
        for arm in an.arms + an.ar_arms:
            is_ar = arm in an.ar_arms
            model = an.model_of(arm)
            mine = decode.loc[decode["arm"] == arm]
            drafted = mine.loc[mine["tree_nodes"] > 0]
            block = an.attempt("block", arm) if not is_ar else Attempt(error="AR")
            loco = an.attempt("loco", arm) if not is_ar else Attempt(error="AR")
            for cat, part in mine.groupby("category"):
                row = dict(arm=arm, category=cat, requests=len(part[["run_id", "request_id"]].drop_duplicates()),
                           tokens=int(part["committed"].sum()),
                           mean_entropy_nats=h.loc[(model, cat), "mean_entropy_nats"],
                           median_entropy_nats=h.loc[(model, cat), "median_entropy_nats"],
                           mean_accepted=float(drafted.loc[drafted["category"] == cat, "accepted"].mean())
                           if (drafted["category"] == cat).any() else np.nan,
                           committed_per_round=float(part["committed"].sum() / len(part)))
                row["law_tokens_per_round"] = (float(block.value.summary.loc[cat, "dp_tokens_per_round"])
                                               if block.ok and cat in block.value.summary.index else np.nan)
                row["loco_tokens_per_round"] = (float(loco.value.summary.loc[cat, "predicted_tokens_per_round"])
                                                if loco.ok and cat in loco.value.summary.index else np.nan)
                row["loco_mean_accepted"] = (float(loco.value.summary.loc[cat, "predicted_mean_accepted"])
                                             if loco.ok and cat in loco.value.summary.index else np.nan)
                row["speedup_requests"] = 0
                row["speedup_verdict"] = None
                if is_ar and sp is not None:
                    row["speedup_vs_ar"] = 1.0
                    row["speedup_requests"] = int(row["requests"])
                    row["speedup_verdict"] = "the reference"
                elif sp is not None and len(sp):
                    hit = sp.loc[(sp["arm"] == arm) & (sp["category"] == cat)]
                    row["speedup_vs_ar"] = float(hit["speedup"].iloc[0]) if len(hit) else np.nan
                    row["speedup_requests"] = int(hit["requests"].iloc[0]) if len(hit) else 0
                    row["speedup_verdict"] = hit["verdict"].iloc[0] if len(hit) else None
                else:
                    row["speedup_vs_ar"] = np.nan
                rows.append(row)
        return pd.DataFrame(rows)

    return an._cached("results", compute)


def law_table(an) -> pd.DataFrame:
    """Per arm: the law's exponent k (and w, the exponent of 1 - p1, for a law in the target's top-1
    probability) and depth-1 rate lambda with their 95% intervals, the break-even entropy (bootstrap interval)
    where the arm is timed."""
    rows = []
    for arm in an.arms:
        law = an.attempt("law", arm)
        row = dict(arm=arm)
        if law.ok:
            d = law.value.derived
            for name, key in (("k", "k"), ("w", "w"), ("lambda_d1", f"lambda[d={law.value.depths[0]}]")):
                if key in d.index:
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = (float(d.loc[key, "estimate"]),
                                                                          float(d.loc[key, "ci_low"]),
                                                                          float(d.loc[key, "ci_high"]))
            # requests: the law's clusters (request ids: two runs of one arm on one prompt decode the same
            # greedy output, one cluster), what its intervals rest on; results_table counts every decode
            row["trials"], row["requests"] = law.value.n_rows, law.value.n_requests
        pays = an.attempt("pays", arm)
        if pays.ok:
            s = pays.value.summary.loc["breakeven_entropy_nats"]
            row["breakeven_nats"], row["breakeven_low"], row["breakeven_high"] = (
                float(s["estimate"]), float(s["ci_low"]), float(s["ci_high"]))
            row["drafting_pays"] = pays.value.breakeven_verdict
        rows.append(row)
    return pd.DataFrame(rows)


def format_interval(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """``"0.81 [0.75, 0.88]"``; ``"n/a"`` for NaN; infinite values (break-even: "always pays") as ``inf``."""
    def one(v):
        return "inf" if v == np.inf else f"{{:.{digits}g}}".format(v)

    if estimate is None or np.isnan(estimate):
        return "n/a"
    if low is None or high is None or np.isnan(low) or np.isnan(high):
        return one(estimate)
    return f"{one(estimate)} [{one(low)}, {one(high)}]"

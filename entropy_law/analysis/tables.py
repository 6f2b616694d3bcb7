"""The tables the report, the figures and the notebooks show of a ``TraceAnalysis``: per arm and category the
results (``results_table``), per arm the law's parameters with the break-even entropy (``law_table``), and how an
estimate with its interval is printed (``format_interval``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.law.results import Attempt

INTERVAL = ("estimate", "ci_low", "ci_high")


def results_table(an) -> pd.DataFrame:
    """Per arm and category: requests, tokens, mean / median entropy, mean accepted length per drafting round, tokens
    per round, the law's in-sample and LOCO predictions, and the measured speedup with its verdict."""
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
                row["law_tokens_per_round"] = _summary_value(block, cat, "dp_tokens_per_round")
                row["loco_tokens_per_round"] = _summary_value(loco, cat, "predicted_tokens_per_round")
                row["loco_mean_accepted"] = _summary_value(loco, cat, "predicted_mean_accepted")
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


def _summary_value(attempt: Attempt, category: str, column: str) -> float:
    ok = attempt.ok and category in attempt.value.summary.index
    return float(attempt.value.summary.loc[category, column]) if ok else np.nan


def law_table(an) -> pd.DataFrame:
    """Per arm: the law's exponent k (and w, for a law in the target's top-1 probability) and depth-1 rate with
    their 95% intervals, and the break-even entropy where the arm is timed."""
    rows = []
    for arm in an.arms:
        law = an.attempt("law", arm)
        row = dict(arm=arm)
        if law.ok:
            d = law.value.derived
            for name, key in (("k", "k"), ("w", "w"), ("lambda_d1", f"lambda[d={law.value.depths[0]}]")):
                if key in d.index:
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = (float(d.loc[key, c]) for c in INTERVAL)
            # requests: the law's clusters (two runs of one arm on one prompt are one cluster)
            row["trials"], row["requests"] = law.value.n_rows, law.value.n_requests
        pays = an.attempt("pays", arm)
        if pays.ok:
            s = pays.value.summary.loc["breakeven_entropy_nats"]
            row["breakeven_nats"], row["breakeven_low"], row["breakeven_high"] = (float(s[c]) for c in INTERVAL)
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

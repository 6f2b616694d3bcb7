"""Two candidate covariates for the category gap (issue #18 item 3, #20): do they explain what category terms add?

The primary law conditions on the target's entropy at the drafted position and on decode-time functions of the
output's entropy sequence; the drafter-aware law adds the drafter's confidence in its own proposal. Category terms
still add log-likelihood after both (``bench/law_categories.py``). This bench tests two further covariates that are
no category's name and asks how much of the category terms' gain each leaves:

- **the target token's class** at the drafted position and at the position before it: word start, word
  continuation, digit, punctuation or symbol, newline, special, read off the target's tokenizer (the piece's
  leading-space marker ``Ġ`` / ``▁`` and its characters). Like the entropy at the drafted position it is a
  property of the target's greedy output, so an AR run of a workload gives it at every position and the law's DP
  could use it;
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

    OMP_NUM_THREADS=1 python bench/law_leads.py | tee bench/results/law_leads.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = "C(depth_factor) + log_entropy + log_lag_entropy + log_run_mean_entropy + log1p_position + log_drafted_depth"
CLASS_TERMS = "C(token_class) + C(prev_token_class)"
HISTORY_TERMS = "logit_running_acceptance"
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


def add_candidates(table, tokens, classes):
    """The at-risk ``table`` with ``token_class`` / ``prev_token_class`` (of the committed tokens at the drafted
    position and the one before, from ``tokens``) and ``logit_running_acceptance`` (earlier rounds of the request)."""
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
    out["depth_factor"] = out["depth"].clip(upper=MAX_DEPTH_FACTOR).astype(str)
    return pd.DataFrame(out)


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
                            & test["prev_token_class"].isin(train["prev_token_class"].unique())]
            predicted = float(np.mean(_fit(f"rejected ~ {terms}", train).predict(test)))
            errors[held] = {"observed": float(test["rejected"].mean()), "predicted": predicted}
        out[name] = {"gain": (llf - base_llf) / n, "category_gain": (llf_cat - llf) / n,
                     "loco": errors,
                     "loco_mae": float(np.mean([abs(e["predicted"] - e["observed"]) for e in errors.values()]))}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="?", default="data/traces", help="trace runs (default %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="the target whose tokenizer classes the tokens")
    args = p.parse_args(argv)

    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.atrisk import at_risk_table
    from entropy_law.traces.reader import load_traces

    t0 = time.process_time()
    traces = load_traces(args.traces)
    analysis = TraceAnalysis(traces, n_boot=0)
    classes = token_classes(load_target(args.model).tokenizer)
    models = {"base (primary law's terms)": BASE, "+ token class": f"{BASE} + {CLASS_TERMS}",
              "+ running acceptance": f"{BASE} + {HISTORY_TERMS}",
              "+ both": f"{BASE} + {CLASS_TERMS} + {HISTORY_TERMS}"}
    drafter_aware = {"base + drafter's confidence": f"{BASE} + log_draft_miss",
                     "+ token class": f"{BASE} + log_draft_miss + {CLASS_TERMS}",
                     "+ running acceptance": f"{BASE} + log_draft_miss + {HISTORY_TERMS}",
                     "+ both": f"{BASE} + log_draft_miss + {CLASS_TERMS} + {HISTORY_TERMS}"}
    result = {"bench": "law_leads", "traces": args.traces, "arms": {}}
    for arm in analysis.arms:
        ids = list(analysis.runs.loc[analysis.runs["arm"] == arm, "run_id"])
        part = traces.filter(run_id=ids)
        table = add_candidates(at_risk_table(part), part.tokens, classes)
        print(f"\n== {arm}: {len(table)} at-risk trials, {table['request_id'].nunique()} requests ==", flush=True)
        share = pd.crosstab(table["category"], table["token_class"], normalize="index").round(3)
        print("token classes of the at-risk positions, share per category:\n" + share.to_string())
        arm_result = {}
        sets = [("entropy law", models)]
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


if __name__ == "__main__":
    main()

"""Four candidate covariates for the category gap (issue #18 item 3, #20): do they explain what category terms add?

The primary law conditions on the target's entropy at the drafted position and on decode-time functions of the
output's entropy sequence; the drafter-aware law adds the drafter's confidence in its own proposal. Category terms
still add log-likelihood after both (``bench/law_categories.py``). This bench tests two further covariates that are
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

# suffix matches longer than this share its level: the traces' cap of the tokens column context_match
from entropy_law.traces.stats import CONTEXT_MATCH_MAX as COPY_MAX  # noqa: E402

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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="?", default="data/traces", help="trace runs (default %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="the target whose tokenizer classes the tokens")
    p.add_argument("--tasks", default="spec_bench", help="the prompts' task file (the copyability reads the prompts)")
    args = p.parse_args(argv)

    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import context_matches
    from entropy_law.law.analysis import TraceAnalysis
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


if __name__ == "__main__":
    main()

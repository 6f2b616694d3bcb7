"""The law's analyses of one arm of an analysed trace set, and their tables across arms: LOCO transfer, P1 with
the category share of the CV gain, and the comparison of law families. Each function takes ``an``, a
``TraceAnalysis`` (passed in, never imported).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.law.compare import category_share_of_gain, compare_laws
from entropy_law.law.fit import fit_law, get_family
from entropy_law.law.transfer import loco_transfer

LOCO_REPORTED = ("training", "oracle")  # LOCO drafted-depth modes shown: leak-free first, then the oracle
COMPARE_FAMILIES = ("law0_cat", "law_logit", "law_exp", "law_exp0", "law_power", "law_renyi2", "law_spline",
                    "law_iso")


def loco(an, arm: str, depths: str = "training"):
    """``transfer.loco_transfer`` of the arm; ``depths``: ``"training"``, ``"replayed"`` or ``"oracle"``."""
    def compute():
        proposals = None
        if depths == "replayed":
            runs = set(an.arm_view(arm).runs["run_id"].astype(str))
            proposals = (None if an.proposals is None
                         else an.proposals.loc[an.proposals["run_id"].astype(str).isin(runs)])
            if proposals is None or set(proposals["run_id"].astype(str)) != runs:
                raise ValueError(f"no replayed proposals for every run of arm {arm!r} (proposals.parquet beside "
                                 "run.json: bench/law.py proposals --write)")
        return loco_transfer(an.arm_view(arm), an.family, drafter=arm, depths=depths, proposals=proposals)

    return an._cached(("loco", arm, depths), compute)


def category_share(an, arm: str) -> dict:
    """P1 (``FittedLaw.universality``) and ``compare.category_share_of_gain`` for the analysis' law."""
    def compute():
        p1 = an.law(arm).universality()
        if not p1:
            raise ValueError(f"P1 does not apply to {an.family} on arm {arm!r} (a GLM family without category "
                             "terms, fitted on 2+ categories of 5+ requests each)")
        rows = atrisk.at_risk_table(an.arm_view(arm), drafters=[arm])
        share = category_share_of_gain(rows, an.family, n_folds=an.n_folds, seed=an.seed)
        return {**p1, **share}

    return an._cached(("category_share", arm), compute)


def universality_table(an) -> pd.DataFrame:
    """Per arm: P1 and the CV gains per trial of ``law_exp`` and, where the analysis' law is another family, of it too
    (``law_*``; NaN with a note where it cannot run). Raises if no arm can run P1."""
    rows, errors = [], []
    for arm in an.arms:
        p1 = an.attempt("universality", arm)
        if not p1.ok:
            errors.append(p1.error)
            continue
        v = p1.value.summary["value"]
        row = dict(arm=arm, score_statistic=v["score_statistic"], df=int(v["df"]), p_value=v["p_value"],
                   wald_statistic=v["wald_statistic"], p_wald_chi2=v["p_wald_chi2"],
                   cv_gain_law_vs_depth_only=v.get("cv_gain_law_vs_depth_only", np.nan),
                   cv_gain_cat_vs_law=v.get("cv_gain_cat_vs_law", np.nan),
                   cv_category_share=v.get("cv_category_share", np.nan),
                   requests=int(v["requests"]), categories=int(v["categories"]))
        if an.family != "law_exp":
            mine = an.attempt("category_share", arm)
            value = mine.value if mine.ok else {}
            if not mine.ok:
                errors.append(mine.error)
            row.update(law_family=an.family, law_score_statistic=value.get("score_statistic", np.nan),
                       law_df=value.get("df", np.nan), law_p_value=value.get("p_value", np.nan),
                       law_cv_gain_vs_depth_only=value.get("cv_gain_law_vs_depth_only", np.nan),
                       law_cv_gain_cat=value.get("cv_gain_cat_vs_law", np.nan),
                       law_cv_category_share=value.get("cv_category_share", np.nan))
        rows.append(row)
    if not rows:
        raise ValueError("P1 could not run for any arm: " + "; ".join(errors))
    out = pd.DataFrame(rows)
    out.attrs["notes"] = errors
    return out


def loco_accuracy(an) -> pd.DataFrame:
    """``LocoTransfer.accuracy`` per arm and drafted-depth mode; arms whose LOCO cannot run are left out."""
    def compute():
        frames = []
        for arm in an.arms:
            for depths in an.loco_depths:
                loco = an.attempt("loco", arm, depths)
                if loco.ok:
                    frames.append(loco.value.accuracy.rename_axis("quantity").reset_index()
                                  .assign(arm=arm, depths=depths))
        if not frames:
            raise ValueError("leave-one-category-out transfer could not run for any arm")
        out = pd.concat(frames, ignore_index=True)
        return out[["arm", "depths", *[c for c in out.columns if c not in ("arm", "depths")]]]

    return an._cached("loco_accuracy", compute)


def comparison(an, arm: str):
    """Cross-validated comparison of law families; those that cannot be fitted are left out with a note."""
    def compute():
        rows = atrisk.at_risk_table(an.arm_view(arm), drafters=[arm])
        n_requests = rows["request_id"].nunique()
        if n_requests < 3:  # every training fold needs 2 requests (compare_laws)
            raise ValueError(f"the law comparison of arm {arm!r} cross-validates over folds of requests and "
                             f"needs at least 3 requests (2 in every training fold); it has {n_requests}")
        families, dropped = [], []
        for fam in an.compare_families:
            try:
                fit_law(rows, fam, cov_type="nonrobust")
                families.append(fam)
            except Exception as err:  # not identified / degenerate here: leave it out, say why
                dropped.append(f"{fam} ({err})")
        if not families:
            raise ValueError("no law family can be fitted to these traces")
        n_folds = min(an.n_folds, n_requests)
        try:
            result = compare_laws(rows, families, n_folds=n_folds, seed=an.seed)
        except Exception as err:  # a category family failed inside a training fold: leave them out
            kept = [f for f in families if not get_family(f).needs_categories]
            dropped += [f"{f} (in a CV fold: {err})" for f in families if f not in kept]
            if not kept:
                raise
            result = compare_laws(rows, kept, n_folds=n_folds, seed=an.seed)
        result.notes.extend(f"left out: {d}" for d in dropped)
        return result

    return an._cached(("compare", arm), compute)

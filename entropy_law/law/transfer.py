"""Block-level prediction and leave-one-category-out (LOCO) transfer.

Known here: per-request entropy sequences from the token table (one per request and run: the
target entropy at every committed output position), the law-implied tokens per round by exact
dynamic programming over those sequences (``FittedLaw.predict_rounds``) next to the i.i.d. plug-in
(a category-mean acceptance in (1 - alpha^(D+1)) / (1 - alpha)), compared with the observed tokens
per round (committed tokens / rounds, so rounds cut by the end of a request count as observed); and
LOCO: fit without a category, predict that category's tokens per round and the log-likelihood of its
trials, next to a refit on the category itself (transfer ratio, research notes 6.7).

Not known here: the statistics of the category ranking (``hypotheses``). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.law.blocks import iid_tokens_per_round
from entropy_law.law.fit import FittedLaw, fit_law, get_family, prepare_counts
from entropy_law.law.results import Result


def _single_drafter(traces, drafter: str | None) -> tuple[str, pd.DataFrame]:
    """The drafter to analyse and its draft runs' rounds."""
    runs = traces.runs
    rounds = traces.rounds.merge(runs[["run_id", "drafter_id"]], on="run_id", how="left")
    drafting = rounds.loc[rounds["tree_nodes"] > 0, "drafter_id"].dropna().unique()
    if drafter is None:
        if len(drafting) != 1:
            raise ValueError(f"traces hold drafters {sorted(drafting)}: pass drafter= one of them")
        drafter = drafting[0]
    if drafter not in set(drafting):
        raise ValueError(f"drafter {drafter!r} has no drafting rounds; drafters: {sorted(drafting)}")
    return drafter, rounds.loc[rounds["drafter_id"] == drafter]


def entropy_sequences(traces, drafter: str) -> pd.DataFrame:
    """One row per request of the drafter's runs: ``request_id``, ``category``, ``run_id`` and
    ``entropy`` (array over output positions 0..T-1). Raises on gaps, NaN or negative entropies."""
    runs = traces.runs.loc[traces.runs["drafter_id"] == drafter, "run_id"]
    tokens = traces.tokens.loc[traces.tokens["run_id"].isin(runs),
                               ["run_id", "request_id", "category", "position", "target_entropy_nats"]]
    tokens = atrisk.validate_covariates(tokens, ["target_entropy_nats"])
    tokens = tokens.sort_values(["run_id", "request_id", "position"])
    out = []
    for (run_id, request_id), group in tokens.groupby(["run_id", "request_id"], sort=False):
        pos = group["position"].to_numpy()
        if not np.array_equal(pos, np.arange(len(pos))):
            raise ValueError(f"request {request_id} of run {run_id}: output positions are not 0..T-1 without gaps")
        out.append(dict(run_id=run_id, request_id=request_id, category=group["category"].iloc[0],
                        entropy=group["target_entropy_nats"].to_numpy(dtype=float)))
    return pd.DataFrame(out)


def _block_size(rounds: pd.DataFrame) -> int:
    return int(rounds["tree_depth"].max()) + 1


def predict_requests(law: FittedLaw, sequences: pd.DataFrame, B: int, *, drafter=None) -> pd.DataFrame:
    """Per request: T, DP-expected rounds, and the law's mean depth-1 acceptance over its positions."""
    rows = []
    cat_arg = law.family.needs_categories
    for rec in sequences.itertuples():
        cat = rec.category if cat_arg else None
        rounds = law.predict_rounds(rec.entropy, B, category=cat, drafter=drafter)
        a1 = law.predict_acceptance(rec.entropy, 1, cat, drafter=drafter)
        rows.append(dict(request_id=rec.request_id, category=rec.category, run_id=rec.run_id, tokens=len(rec.entropy),
                         predicted_rounds=rounds, sum_acceptance_d1=float(a1.sum())))
    return pd.DataFrame(rows)


@dataclass
class BlockPrediction(Result):
    """Observed vs predicted tokens per round per category: exact DP and i.i.d. plug-in."""

    summary: pd.DataFrame
    per_request: pd.DataFrame
    block_size: int
    notes: list = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"tokens per round, observed vs law-predicted (B = {self.block_size})"


def _block_summary(pred: pd.DataFrame, observed: pd.DataFrame, drafts: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    per_req = pred.merge(observed, on=["run_id", "request_id"], how="inner", validate="one_to_one")
    g = per_req.groupby("category")
    summary = pd.DataFrame({
        "requests": g.size(),
        "observed_tokens_per_round": g["tokens"].sum() / g["observed_rounds"].sum(),
        "dp_tokens_per_round": g["tokens"].sum() / g["predicted_rounds"].sum(),
    })
    summary["dp_relative_error"] = summary["dp_tokens_per_round"] / summary["observed_tokens_per_round"] - 1
    # three i.i.d. plug-ins of a "category-mean acceptance" (see docs/law.md, block-level prediction)
    plugins = {
        "round_start": g["observed_first_accepted"].sum() / g["observed_rounds"].sum(),
        "at_risk": g["observed_accepted_sum"].sum() / g["observed_at_risk"].sum(),
        "position": g["sum_acceptance_d1"].sum() / g["tokens"].sum(),
    }
    for name, alpha in plugins.items():
        summary[f"alpha_{name}"] = alpha
        summary[f"iid_{name}_tokens_per_round"] = iid_tokens_per_round(alpha.to_numpy(), drafts)
        summary[f"iid_{name}_relative_error"] = (summary[f"iid_{name}_tokens_per_round"]
                                                 / summary["observed_tokens_per_round"] - 1)
    return summary, per_req


def _observed_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    frame = rounds.assign(_first=(rounds["accepted"] >= 1).astype(int),
                          _at_risk=rounds["accepted"] + (rounds["accepted"] < rounds["tree_depth"]))
    return frame.groupby(["run_id", "request_id"], as_index=False).agg(
        observed_rounds=("round_index", "size"), observed_tokens=("committed", "sum"),
        observed_first_accepted=("_first", "sum"), observed_accepted_sum=("accepted", "sum"),
        observed_at_risk=("_at_risk", "sum"))


def block_prediction(law: FittedLaw, traces, *, drafter: str | None = None, B: int | None = None) -> BlockPrediction:
    """Observed vs predicted tokens per round per category for ``drafter``'s runs (in-sample law)."""
    drafter, rounds = _single_drafter(traces, drafter)
    B = B or _block_size(rounds)
    seqs = entropy_sequences(traces, drafter)
    pred = predict_requests(law, seqs, B, drafter=drafter if law.family.needs_drafters else None)
    summary, per_req = _block_summary(pred, _observed_rounds(rounds), B - 1)
    return BlockPrediction(summary=summary, per_request=per_req, block_size=B,
                           notes=["iid_round_start: alpha = observed share of rounds whose first draft is accepted; iid_at_risk: "
                                  "alpha = accepted / at-risk trials (rounds table); iid_position: alpha = the law's "
                                  "depth-1 acceptance averaged over all output positions"])


@dataclass
class LocoTransfer(Result):
    """Leave-one-category-out: predicted vs observed per held-out category."""

    summary: pd.DataFrame
    family: str
    block_size: int
    notes: list = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"leave-one-category-out transfer of {self.family} (B = {self.block_size})"


def loco_transfer(traces, family: str = "law_exp", *, drafter: str | None = None, B: int | None = None,
                  eps: float = atrisk.EPS_NATS, min_categories: int = 3, **fit_options) -> LocoTransfer:
    """Fit ``family`` (category-free) without each category in turn and predict that category.

    Columns: observed and LOCO-predicted tokens per round (DP) and their relative error, observed and
    predicted mean accepted length (predicted = tokens per round - 1), held-out log-likelihood per
    trial under the LOCO law, a refit on the category, and a depth-only null; ``transfer_ratio`` =
    (LL_null - LL_loco) / (LL_null - LL_refit).
    """
    fam = get_family(family)
    if fam.needs_categories:
        raise ValueError(f"{family} has category terms and cannot predict an unseen category; use a category-free law")
    drafter, rounds = _single_drafter(traces, drafter)
    B = B or _block_size(rounds)
    rows = atrisk.at_risk_table(traces, eps=eps, drafters=[drafter])
    counts = prepare_counts(rows, fam, eps=eps)
    categories = sorted(counts["category"].unique())
    if len(categories) < min_categories:
        raise ValueError(f"LOCO transfer needs at least {min_categories} categories; the traces hold {categories}")
    seqs = entropy_sequences(traces, drafter)
    observed = _observed_rounds(rounds)
    out = []
    for cat in categories:
        train, test = counts.loc[counts["category"] != cat], counts.loc[counts["category"] == cat]
        loco = fit_law(train, fam, **fit_options)
        refit = fit_law(test, fam, **fit_options)
        null = test.groupby("depth")[["n_acc", "n"]].sum()
        p_null = test["depth"].map(null["n_acc"] / null["n"]).to_numpy().clip(1e-12, 1 - 1e-12)
        ll_null = float((test["n_acc"] * np.log(p_null) + test["n_rej"] * np.log1p(-p_null)).sum())
        ll_loco, ll_refit = float(loco.log_likelihood(test).sum()), float(refit.log_likelihood(test).sum())
        pred = predict_requests(loco, seqs.loc[seqs["category"] == cat], B)
        summary, per_req = _block_summary(pred, observed, B - 1)
        n = float(test["n"].sum())
        out.append(dict(category=cat, requests=int(summary["requests"].iloc[0]),
                        observed_tokens_per_round=summary["observed_tokens_per_round"].iloc[0],
                        predicted_tokens_per_round=summary["dp_tokens_per_round"].iloc[0],
                        relative_error=summary["dp_relative_error"].iloc[0],
                        observed_mean_accepted=float(rounds.loc[rounds["request_id"].isin(per_req["request_id"]),
                                                                "accepted"].mean()),
                        predicted_mean_accepted=summary["dp_tokens_per_round"].iloc[0] - 1,
                        loglik_loco=ll_loco / n, loglik_refit=ll_refit / n, loglik_null=ll_null / n,
                        transfer_ratio=(ll_null - ll_loco) / (ll_null - ll_refit) if ll_refit > ll_null else np.nan))
    summary = pd.DataFrame(out).set_index("category")
    return LocoTransfer(summary=summary, family=fam.name, block_size=B,
                        notes=["predicted_mean_accepted = predicted tokens per round - 1 (ignores rounds cut by the end "
                               "of a request)"])

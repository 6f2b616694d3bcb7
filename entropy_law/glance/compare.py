"""GLANCE's law against ours, round by round.

``law_round_expectations`` (our law's E[tau] per recorded round), ``loco_glance`` (GLANCE's law fitted without each
category), ``round_scores`` (GLANCE's scores for any per-round predictor) and ``category_frame``. No torch.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from entropy_law.glance.law import (B1_MAX, CAP, CEILING_BINS, CURVE_BINS, decile_curve, fit_glance, holds_checks,
                                    r2_ceiling)
from entropy_law.law.stats import r_squared
from entropy_law.glance.rounds import glance_rounds, round_table
from entropy_law.law import atrisk
from entropy_law.law.information import check_information, predictor_inputs

def loco_glance(rounds: pd.DataFrame, *, form: str = "code", cap: float = CAP) -> tuple[np.ndarray, dict]:
    """LOCO predictions of GLANCE's pooled law (aligned with ``rounds``) and the fits by held-out category."""
    rounds = round_table(rounds)
    predicted = np.full(len(rounds), np.nan)
    category = rounds["category"].astype(str).to_numpy()
    fits = {}
    for held_out in sorted(set(category)):
        train = rounds.loc[category != held_out]
        law = fit_glance(train, form, per_category=False, cap=cap, n_boot=0)
        fits[held_out] = law
        test = category == held_out
        predicted[test] = law.predict(rounds.loc[test, "entropy"].to_numpy(dtype=float))
    return predicted, fits


def entropy_by_request(traces, run_ids, *, columns: tuple = ()) -> tuple[dict, np.ndarray, dict]:
    """(run_id, request_id) -> (offset, T) into one flat array of the entropies at positions 0..T-1, and the
    per-position ``columns`` alike (None where missing): ``atrisk.sequences_of`` end to end."""
    tokens = traces.tokens
    sequences = atrisk.sequences_of(tokens.loc[tokens["run_id"].astype(str).isin(set(run_ids))])
    if sequences.empty:
        return {}, np.zeros(0), dict.fromkeys(columns)
    lengths = [len(e) for e in sequences["entropy"]]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    where = {(str(run), str(request)): (int(offset), n) for run, request, offset, n in
             zip(sequences["run_id"], sequences["request_id"], offsets, lengths)}
    values = {}
    for column in columns:
        arrays = list(sequences[column]) if column in sequences else [None]
        values[column] = None if any(a is None for a in arrays) else np.concatenate(arrays).astype(float)
    return where, np.concatenate(list(sequences["entropy"])), values


def law_round_expectations(law, traces, rounds: pd.DataFrame | None = None, *, root_only: bool = False,
                           drafter: str | None = None, drafts: pd.DataFrame | None = None, info=None,
                           depths: str = "observed", sequences: tuple | None = None) -> np.ndarray:
    """Our law's expected accepted drafts of each round of ``rounds`` (``glance_rounds`` rows, default all): E[tau] =
    sum_{k=1}^{D} prod_{j=1}^{k} a(H_{t+j-1}, j), t the round's start, D its drafted depth (``tree_depth``) and H the
    entropies along the greedy output (past its end the last one, as the DP). ``root_only``: H_t at every depth.

    ``law``: anything with ``predict_frame``. ``drafts``: the drafter's top-1 probability at every verified depth for
    a law in it (a missing (round, depth) raises). ``info``: the information set the predictions must stay within,
    given ``root_only`` and ``depths``; a law that reads more raises. ``sequences``: ``entropy_by_request`` of
    these traces and the family's columns, computed once by a caller that predicts them many times.
    """
    if info is not None:
        path = "root only" if root_only else "entropies ahead"
        check_information(info, predictor_inputs(law.family, depths, root_only=root_only),
                          what=f"{law.family.name} ({path}, {depths} depths)")
    rounds = glance_rounds(traces) if rounds is None else rounds
    if rounds.empty:
        return np.zeros(0)
    columns = law.family.position_columns
    where, entropy, values = sequences or entropy_by_request(traces, rounds["run_id"].unique(), columns=columns)
    lacking = [c for c in columns if values[c] is None]
    if lacking:
        raise ValueError(f"{law.family.name} reads the tokens column(s) {lacking} at every position, which these "
                         "traces lack at some position: attach the copyability (jobs.reference."
                         "attach_context_matches); compute the target's statistics of imported runs "
                         "(`entropy-law entropy RUN --model M`)")
    keys = list(zip(rounds["run_id"].astype(str), rounds["request_id"].astype(str)))
    missing = [k for k in keys if k not in where]
    if missing:
        raise ValueError(f"request {missing[0][1]} of run {missing[0][0]} has no token rows")
    offset = np.array([where[k][0] for k in keys], dtype=np.int64)
    length = np.array([where[k][1] for k in keys], dtype=np.int64)
    start = rounds["start_position"].to_numpy(dtype=np.int64)
    drafted = rounds["tree_depth"].to_numpy(dtype=np.int64)
    if np.any(drafted < 1):
        raise ValueError("law_round_expectations predicts rounds that drafted (tree_depth >= 1)")
    which = np.repeat(np.arange(len(rounds)), drafted)  # one row per (round, depth 1..D)
    depth = np.arange(which.size) - np.repeat(np.cumsum(drafted) - drafted, drafted) + 1
    position = np.minimum(start[which] + (0 if root_only else depth - 1), length[which] - 1)
    h = entropy[offset[which] + position]
    cum = pd.Series(h).groupby(which).cumsum().to_numpy() - h  # entropy of the round's earlier depths
    frame = pd.DataFrame({"target_entropy_nats": h, "depth": depth, "drafted_depth": drafted[which],
                          "cum_entropy_nats": cum, "category": rounds["category"].astype(str).to_numpy()[which]})
    # the decode-time covariates of the row's output position, as atrisk.sequence_covariates computes them
    csum = np.cumsum(entropy)
    first = offset[which]
    before = np.where(first > 0, csum[np.maximum(first - 1, 0)], 0.0)
    frame["lag_entropy_nats"] = entropy[first + np.maximum(position - 1, 0)]
    frame["run_mean_entropy_nats"] = (csum[first + position] - before) / (position + 1.0)
    frame["position"] = position
    frame["log1p_position"] = np.log1p(position.astype(float))
    for column in columns:  # the copyability / the target's top-1 probability at the row's position (root_only: root's)
        frame[column] = values[column][first + position]
    if drafter is not None:
        frame["drafter_id"] = drafter
    if drafts is not None:
        frame["draft_top1_prob"] = _round_drafts(rounds, drafts, which, depth)
    accept = np.asarray(law.predict_frame(frame), dtype=float)
    reach = pd.Series(accept).groupby(which).cumprod().to_numpy()  # P(depth k accepted and all before)
    return np.bincount(which, weights=reach, minlength=len(rounds))


def _round_drafts(rounds: pd.DataFrame, drafts: pd.DataFrame, which: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """``top1_prob`` of ``drafts`` at each (round ``which``, ``depth``) row of ``law_round_expectations``."""
    keys = ["run_id", "request_id", "round_index", "depth"]
    missing = [c for c in [*keys, "top1_prob"] if c not in drafts]
    if missing:
        raise ValueError(f"drafts lacks columns {missing} (jobs.reference.round_proposals gives them)")
    lookup = drafts.astype({"run_id": str, "request_id": str}).set_index(keys)["top1_prob"]
    if not lookup.index.is_unique:
        raise ValueError("drafts has more than one row for a (run_id, request_id, round_index, depth)")
    want = pd.MultiIndex.from_arrays([rounds["run_id"].astype(str).to_numpy()[which],
                                      rounds["request_id"].astype(str).to_numpy()[which],
                                      rounds["round_index"].to_numpy(dtype=np.int64)[which], depth], names=keys)
    values = lookup.reindex(want).to_numpy(dtype=float)
    if np.isnan(values).any():
        bad = want[int(np.flatnonzero(np.isnan(values))[0])]
        raise ValueError(f"drafts has no drafter confidence for depth {bad[3]} of round {bad[2]} of request {bad[1]} "
                         f"(run {bad[0]}): replay the run's rounds (jobs.reference.round_proposals)")
    return values


def round_scores(rounds: pd.DataFrame, predicted, *, slope, slope_max: float = B1_MAX,
                 bins: int = CURVE_BINS, ceiling_bins: int = CEILING_BINS) -> dict:
    """Per-round predictions ``predicted`` of accepted drafts scored against ``rounds`` (``entropy``, ``accepted``,
    ``category``) as GLANCE scores its law: ``mse``, ``category_mean_mae`` / ``category_mean_max_abs``, ``r2_curve``
    (over ``bins`` root-entropy quantile bins of >= 5 rounds, on the predictions' bin means), ``r2_round``,
    ``r2_ceiling``, ``frac_of_ceiling``, Spearman rho and ``holds`` with its ``checks`` (``slope``: the law's entropy
    slope, one value or one per LOCO fold; ``slope_max``: its bound, ``inf`` for none)."""
    h = rounds["entropy"].to_numpy(dtype=float)
    a = rounds["accepted"].to_numpy(dtype=float)
    pred = np.asarray(predicted, dtype=float)
    if pred.shape != a.shape or np.any(~np.isfinite(pred)):
        raise ValueError("predicted must be one finite value per round")
    curve = decile_curve(h, a, bins=bins, n_boot=0, predicted=pred)
    r2_curve = r_squared(curve["accepted"].to_numpy(), curve["predicted"].to_numpy())  # NaN below 2 bins
    r2_round = r_squared(a, pred)
    ceiling = r2_ceiling(h, a, bins=ceiling_bins)
    frac = r2_round / ceiling if np.isfinite(ceiling) and ceiling > 0 else float("nan")
    rank = stats.spearmanr(h, a)
    by_category = pd.DataFrame({"category": rounds["category"].astype(str).to_numpy(), "observed": a,
                                "predicted": pred}).groupby("category").mean()
    error = (by_category["predicted"] - by_category["observed"]).abs()
    checks = holds_checks(slope=slope, spearman_rho=float(rank.statistic), spearman_p=float(rank.pvalue),
                          r2_curve=r2_curve, frac_of_ceiling=frac, mean_accepted=float(a.mean()), slope_max=slope_max)
    return dict(n_rounds=int(len(a)), mean_accepted=float(a.mean()), mean_predicted=float(pred.mean()),
                mse=float(np.mean((pred - a) ** 2)), category_mean_mae=float(error.mean()),
                category_mean_max_abs=float(error.max()), r2_curve=r2_curve, r2_round=r2_round, r2_ceiling=ceiling,
                frac_of_ceiling=frac, spearman_rho=float(rank.statistic), spearman_p=float(rank.pvalue),
                holds=all(checks.values()), checks=checks,
                category_means={c: (float(r.observed), float(r.predicted)) for c, r in by_category.iterrows()})


def category_frame(scores: Mapping[str, dict]) -> pd.DataFrame:
    """Observed and predicted mean accepted drafts per category, a column per predictor of ``scores``."""
    frames = []
    for name, score in scores.items():
        means = pd.DataFrame.from_dict(score["category_means"], orient="index", columns=["observed", name])
        frames.append(means if not frames else means[[name]])
    out = pd.concat(frames, axis=1)
    out.index.name = "category"
    return out

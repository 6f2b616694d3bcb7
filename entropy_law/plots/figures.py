"""Plot functions, one per figure of the entropy law: data first, keyword-only options, ``ax=None -> ax``.

Inputs are plain DataFrames (trace columns, at-risk tables of ``law.atrisk``) and fitted laws; the ``*_table``
helpers return the binning and intervals behind a figure so its numbers can be checked.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.law.atrisk import EPS_NATS
from entropy_law.law.stats import wilson_interval
from entropy_law.plots.style import ENTROPY_LABEL, MARKERS, new_axes, palette


def _legend(ax, **kwargs):
    """A legend only when something is labelled (no warning on empty panels)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _quantile_bins(values: np.ndarray, n_bins: int) -> np.ndarray:
    """The bin of each value among ``n_bins`` quantile bins (tied edges merged)."""
    edges = np.unique(np.quantile(values, np.linspace(0, 1, n_bins + 1)))
    return np.clip(np.searchsorted(edges, values, side="right") - 1, 0, max(len(edges) - 2, 0))


def _square(ax, lo: float, hi: float) -> None:
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")


def _yerr(estimate, low, high) -> np.ndarray:
    """Non-negative error-bar lengths (Wilson bounds at 0 or 1 can miss the estimate by round-off)."""
    estimate, low, high = (np.asarray(v, dtype=float) for v in (estimate, low, high))
    return np.clip(np.vstack([estimate - low, high - estimate]), 0, None)


def entropy_distributions(tokens: pd.DataFrame, *, eps: float = EPS_NATS, ax=None):
    """ECDF of the target entropy (log axis, ``H + eps``) per category, medians marked."""
    ax = new_axes(ax)
    colours = palette(tokens["category"].unique())
    for cat, colour in colours.items():
        h = np.sort(tokens.loc[tokens["category"].astype(str) == cat, "target_entropy_nats"].to_numpy(float)) + eps
        if h.size == 0:
            continue
        y = np.arange(1, h.size + 1) / h.size
        ax.step(h, y, where="post", color=colour, label=f"{cat} (median {np.median(h) - eps:.2g})")
        ax.plot([np.median(h)], [0.5], marker="|", markersize=10, color=colour)
    ax.set_xscale("log")
    ax.set_xlabel(f"{ENTROPY_LABEL} + {eps:g}")
    ax.set_ylabel("fraction of output tokens")
    ax.set_ylim(0, 1)
    _legend(ax, loc="lower right")
    return ax


def binned_acceptance_table(at_risk: pd.DataFrame, *, depth: int | str = 1, n_bins: int = 20,
                            by: str = "category", level: float = 0.95) -> pd.DataFrame:
    """Acceptance per entropy bin (quantile bins of H over the selected rows) and ``by`` group: ``n``, ``accepted``,
    ``rate``, Wilson ``ci_low``/``ci_high``, mean H of the bin. ``depth``: an int, or ``"2+"`` for every depth >= 2."""
    rows = at_risk.loc[at_risk["depth"] >= 2] if depth == "2+" else at_risk.loc[at_risk["depth"] == int(depth)]
    if rows.empty:
        return pd.DataFrame(columns=[by, "bin", "n", "accepted", "rate", "ci_low", "ci_high", "entropy_nats"])
    h = rows["target_entropy_nats"].to_numpy(float)
    frame = pd.DataFrame({by: rows[by].astype(str).to_numpy(), "bin": _quantile_bins(h, n_bins), "h": h,
                          "acc": rows["accepted"].to_numpy(int)})
    table = frame.groupby([by, "bin"]).agg(n=("acc", "size"), accepted=("acc", "sum"),
                                           entropy_nats=("h", "mean")).reset_index()
    table["rate"] = table["accepted"] / table["n"]
    table["ci_low"], table["ci_high"] = wilson_interval(table["accepted"], table["n"], level=level)
    return table


def acceptance_vs_entropy(at_risk: pd.DataFrame, *, law=None, depth: int | str = 1, n_bins: int = 20,
                          min_trials: int = 5, eps: float = EPS_NATS, ax=None):
    """Acceptance at ``depth`` (or ``"2+"``) vs target entropy: quantile-binned data with Wilson 95%
    intervals, one colour per category, and the fitted law (black) when ``law`` is given."""
    table = binned_acceptance_table(at_risk, depth=depth, n_bins=n_bins)
    h = at_risk["target_entropy_nats"]
    h_range = (float(h.min()), float(h.max())) if len(at_risk) else None
    return binned_acceptance(table, law=law, depth=depth, h_range=h_range, min_trials=min_trials, eps=eps, ax=ax)


def binned_acceptance(table: pd.DataFrame, *, law=None, depth: int | str = 1, h_range: tuple | None = None,
                      min_trials: int = 5, eps: float = EPS_NATS, ax=None):
    """Plot a ``binned_acceptance_table`` (or ``outofcore.acceptance_curve_sql``): bins of at least ``min_trials``
    trials with their Wilson 95% intervals per category, and the fitted law over ``h_range`` when given."""
    ax = new_axes(ax)
    colours = palette(table["category"].astype(str).unique())
    table = table.loc[table["n"] >= min_trials]
    for cat, part in table.groupby("category"):
        x = part["entropy_nats"].to_numpy(dtype=float) + eps
        rate = part["rate"].to_numpy(dtype=float)
        ax.errorbar(x, rate, yerr=_yerr(rate, part["ci_low"].to_numpy(dtype=float),
                                        part["ci_high"].to_numpy(dtype=float)),
                    fmt="o", ms=3.5, lw=0.8, capsize=0, color=colours[str(cat)], label=str(cat), alpha=0.85)
    if law is not None and h_range is not None:
        h = np.geomspace(max(h_range[0], 1e-4), max(h_range[1], 1e-2), 200)
        d = 2 if depth == "2+" else int(depth)
        ax.plot(h + eps, law.predict_acceptance(h, d), color="k", lw=1.8, label=f"fitted {law.family.name} (d={d})")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"{ENTROPY_LABEL} + {eps:g}")
    ax.set_ylabel(f"P(accept | reached depth {'≥ 2' if depth == '2+' else depth})")
    _legend(ax, loc="lower left")
    return ax


def survival_table(at_risk: pd.DataFrame, *, by: str = "category") -> pd.DataFrame:
    """Product-limit survival S(k) = P(tau >= k) = prod_{d <= k} a_d with a_d = accepted / at risk at
    depth d, and a Greenwood 95% band (on log S), per ``by`` group; ``k = 0`` has S = 1."""
    out = []
    for key, part in at_risk.groupby(by, observed=True):
        counts = part.groupby("depth")["accepted"].agg(["sum", "size"]).sort_index()
        a = counts["sum"] / counts["size"]
        s = np.cumprod(a.to_numpy())
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a_d = 0: S = 0 from there on
            var_log = np.cumsum((1 - a.to_numpy()) / (counts["size"].to_numpy() * a.to_numpy()))
            half = 1.96 * np.sqrt(var_log)
            low, high = np.nan_to_num(s * np.exp(-half)), np.minimum(np.nan_to_num(s * np.exp(half), nan=0.0), 1)
        out.append(pd.DataFrame({by: str(key), "k": np.r_[0, counts.index.to_numpy()], "survival": np.r_[1.0, s],
                                 "ci_low": np.r_[1.0, low], "ci_high": np.r_[1.0, high],
                                 "conditional_acceptance": np.r_[np.nan, a.to_numpy()],
                                 "at_risk": np.r_[np.nan, counts["size"].to_numpy()]}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def survival_by_depth(at_risk: pd.DataFrame, *, ax=None):
    """S(k) = P(accepted length >= k) per category (product-limit over depths, Greenwood band)."""
    ax = new_axes(ax)
    table = survival_table(at_risk)
    colours = palette(table["category"].unique()) if len(table) else {}
    for cat, part in table.groupby("category"):
        ax.plot(part["k"], part["survival"], marker="o", ms=3, color=colours[cat], label=cat)
        ax.fill_between(part["k"], part["ci_low"], part["ci_high"], color=colours[cat], alpha=0.15, lw=0)
    ax.set_xlabel("depth k")
    ax.set_ylabel("S(k) = P(accepted length ≥ k)")
    ax.set_ylim(0, 1.02)
    _legend(ax, loc="upper right")
    return ax


def _accepted_per_round(tokens, rounds, drafting):
    """(tokens - rounds) / drafting rounds: accepted drafts per drafting round (``drafting`` None: per round)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (tokens - rounds) / (rounds if drafting is None else drafting)


def accepted_length_table(per_request: pd.DataFrame, *, n_boot: int = 200, seed: int = 0) -> pd.DataFrame:
    """Per category: token-weighted mean entropy, observed (request-bootstrap 95% interval) and predicted mean accepted
    length, per drafting round where ``per_request`` has the drafting-round columns."""
    rng = np.random.default_rng(seed)
    drafting = {"observed_drafting_rounds", "predicted_drafting_rounds"} <= set(per_request.columns)
    rows = []
    for cat, part in per_request.groupby("category"):
        t, r = part["tokens"].to_numpy(float), part["observed_rounds"].to_numpy(float)
        rd = part["observed_drafting_rounds"].to_numpy(float) if drafting else None
        idx = rng.integers(0, len(part), size=(n_boot, len(part)))
        boot = _accepted_per_round(t[idx].sum(1), r[idx].sum(1), rd[idx].sum(1) if drafting else None)
        pred_d = part["predicted_drafting_rounds"].sum() if drafting else None
        rows.append(dict(category=str(cat), requests=len(part),
                         mean_entropy_nats=float(np.sum(part["mean_entropy_nats"] * t) / t.sum()),
                         observed=float(_accepted_per_round(t.sum(), r.sum(), rd.sum() if drafting else None)),
                         ci_low=float(np.nanquantile(boot, 0.025)), ci_high=float(np.nanquantile(boot, 0.975)),
                         predicted=float(_accepted_per_round(t.sum(), part["predicted_rounds"].sum(), pred_d))))
    return pd.DataFrame(rows)


def accepted_length_vs_entropy(per_request: pd.DataFrame, *, n_boot: int = 200, seed: int = 0, ax=None):
    """Mean accepted length vs mean entropy (``accepted_length_table``): requests (dots), categories (large, with
    intervals) and the law's DP prediction per category (open diamonds)."""
    ax = new_axes(ax)
    colours = palette(per_request["category"].astype(str).unique())
    drafting = {"observed_drafting_rounds", "predicted_drafting_rounds"} <= set(per_request.columns)
    req = per_request.assign(observed=_accepted_per_round(
        per_request["tokens"], per_request["observed_rounds"],
        per_request["observed_drafting_rounds"].where(per_request["observed_drafting_rounds"] > 0) if drafting else None))
    for cat, part in req.groupby("category"):
        ax.scatter(part["mean_entropy_nats"], part["observed"], s=8, alpha=0.35, color=colours[str(cat)], lw=0)
    table = accepted_length_table(per_request, n_boot=n_boot, seed=seed)
    for row in table.itertuples():
        c = colours[row.category]
        ax.errorbar([row.mean_entropy_nats], [row.observed], yerr=_yerr([row.observed], [row.ci_low], [row.ci_high]),
                    fmt="o", ms=7, color=c, label=row.category, capsize=2)
        ax.plot([row.mean_entropy_nats], [row.predicted], marker="D", ms=7, mfc="none", mec=c, mew=1.5)
    ax.plot([], [], marker="D", ls="", mfc="none", mec="k", label="law (DP) prediction")
    ax.set_xlabel(f"mean {ENTROPY_LABEL}")
    ax.set_ylabel("accepted drafts per drafting round" if drafting else "accepted tokens per round (tokens/round − 1)")
    _legend(ax, loc="upper right")
    return ax


def loco_predicted_vs_observed(loco: pd.DataFrame, *, ax=None):
    """LOCO-predicted vs observed tokens per round per category (colour) and arm (marker); ``loco``: ``arm``,
    ``category``, ``predicted_tokens_per_round``, ``observed_tokens_per_round``."""
    ax = new_axes(ax, figsize=(4.2, 4.0))
    colours = palette(loco["category"].astype(str).unique())
    arms = list(dict.fromkeys(loco["arm"]))
    for i, arm in enumerate(arms):
        part = loco.loc[loco["arm"] == arm]
        for row in part.itertuples():
            ax.scatter(row.predicted_tokens_per_round, row.observed_tokens_per_round, color=colours[str(row.category)],
                       marker=MARKERS[i % len(MARKERS)], s=40, zorder=3)
        ax.scatter([], [], marker=MARKERS[i % len(MARKERS)], color="grey", label=arm)
    for cat, c in colours.items():
        ax.scatter([], [], marker="s", color=c, label=cat)
    values = loco[["predicted_tokens_per_round", "observed_tokens_per_round"]].to_numpy(float)
    lo, hi = (np.nanmin(values) * 0.95, np.nanmax(values) * 1.05) if values.size else (1, 2)
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls="--")
    _square(ax, lo, hi)
    ax.set_xlabel("predicted tokens per round (LOCO law, DP)")
    ax.set_ylabel("observed tokens per round")
    _legend(ax, loc="upper left", fontsize=7)
    return ax


def calibration_table(accepted: np.ndarray, predicted: np.ndarray, *, n_bins: int = 10) -> pd.DataFrame:
    """Reliability: quantile bins of the predicted acceptance; mean prediction, observed rate, Wilson CI."""
    accepted, predicted = np.asarray(accepted, int), np.asarray(predicted, float)
    frame = pd.DataFrame({"bin": _quantile_bins(predicted, n_bins), "p": predicted, "y": accepted})
    table = frame.groupby("bin").agg(n=("y", "size"), accepted=("y", "sum"), predicted=("p", "mean")).reset_index()
    table["observed"] = table["accepted"] / table["n"]
    table["ci_low"], table["ci_high"] = wilson_interval(table["accepted"], table["n"])
    return table


def expected_calibration_error(table: pd.DataFrame) -> float:
    """Trial-weighted mean |observed - predicted| over the bins of ``calibration_table``."""
    return float(np.sum(table["n"] * np.abs(table["observed"] - table["predicted"])) / table["n"].sum())


def calibration(at_risk: pd.DataFrame, predicted: np.ndarray, *, n_bins: int = 10, ax=None):
    """Reliability diagram: observed acceptance vs predicted, pooled (black, Wilson CIs) and per
    category (thin lines); the expected calibration error (ECE) in the legend."""
    ax = new_axes(ax, figsize=(4.2, 4.0))
    predicted = np.asarray(predicted, float)
    colours = palette(at_risk["category"].astype(str).unique())
    cats = at_risk["category"].astype(str).to_numpy()
    for cat, c in colours.items():
        sel = cats == cat
        if sel.sum() < n_bins:
            continue
        t = calibration_table(at_risk["accepted"].to_numpy()[sel], predicted[sel], n_bins=n_bins)
        ax.plot(t["predicted"], t["observed"], color=c, lw=1, alpha=0.8, label=f"{cat} (ECE {expected_calibration_error(t):.3f})")
    t = calibration_table(at_risk["accepted"].to_numpy(), predicted, n_bins=n_bins)
    ax.errorbar(t["predicted"], t["observed"], yerr=_yerr(t["observed"], t["ci_low"], t["ci_high"]), fmt="o",
                color="k", ms=4, label=f"pooled (ECE {expected_calibration_error(t):.3f})")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=0.8)
    _square(ax, 0, 1)
    ax.set_xlabel("predicted P(accept)")
    ax.set_ylabel("observed acceptance")
    _legend(ax, loc="upper left", fontsize=7)
    return ax


def law_comparison(summary: pd.DataFrame, *, ax=None):
    """Held-out log-loss per at-risk trial relative to the best family (0 = best), ±1.96 SE over
    requests. ``summary``: ``compare_laws(...).summary`` (index: family; ``delta_vs_best``, ``delta_se``)."""
    ax = new_axes(ax)
    s = summary.sort_values("cv_log_loss", ascending=False)
    y = np.arange(len(s))
    ax.barh(y, s["delta_vs_best"], xerr=1.96 * s["delta_se"], color="C0", alpha=0.8, error_kw={"lw": 0.8})
    ax.set_yticks(y, s.index)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("Δ CV log-loss per trial vs best (nats)")
    return ax


def speedup_vs_entropy(curve: pd.DataFrame, *, breakeven: tuple | None = None, observed: pd.DataFrame | None = None,
                       label: str | None = None, color=None, ax=None):
    """Predicted speedup at constant entropy (``curve``: ``entropy_nats``, ``estimate``, optional ``ci_low`` /
    ``ci_high``), S = 1, the break-even entropy and measured category speedups (``observed``)."""
    ax = new_axes(ax)
    label = label or "predicted"
    if breakeven is not None:
        est = breakeven[0]
        label += (" (never pays)" if est == 0 else " (always pays)" if not np.isfinite(est)
                  else f" (break-even {est:.2g} nats)")
    line = ax.plot(curve["entropy_nats"], curve["estimate"], color=color, label=label)[0]
    if {"ci_low", "ci_high"} <= set(curve.columns):
        ax.fill_between(curve["entropy_nats"], curve["ci_low"], curve["ci_high"], color=line.get_color(), alpha=0.2, lw=0)
    ax.axhline(1.0, color="k", lw=0.8)
    if breakeven is not None and np.isfinite(breakeven[0]) and breakeven[0] > 0:
        est, lo, hi = breakeven
        ax.axvline(est, color=line.get_color(), ls=":", lw=1)
        if np.isfinite(lo) and np.isfinite(hi):
            ax.axvspan(lo, hi, color=line.get_color(), alpha=0.08, lw=0)
    if observed is not None and len(observed):
        colours = palette(observed["category"].astype(str).unique())
        for row in observed.itertuples():
            ax.scatter(row.mean_entropy_nats, row.speedup, color=colours[str(row.category)], marker="s", s=30, zorder=3,
                       edgecolor=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel(ENTROPY_LABEL)
    ax.set_ylabel("decode speedup over AR")
    _legend(ax, loc="upper right")
    return ax


def example_response(tokens: pd.DataFrame, rounds: pd.DataFrame, *, max_positions: int | None = None, ax=None):
    """One response: target entropy per output position (bars) with each round's accepted drafts shaded (alternating
    shades per round), corrections marked. ``tokens`` / ``rounds``: trace rows of ONE request of one run."""
    ax = new_axes(ax, figsize=(9.0, 2.8))
    tok = tokens.sort_values("position")
    if max_positions is not None:
        tok = tok.loc[tok["position"] < max_positions]
    ax.bar(tok["position"], tok["target_entropy_nats"], width=0.9, color="0.35", label="target entropy")
    top = float(tok["target_entropy_nats"].max()) if len(tok) else 1.0
    shade = 0
    for r in rounds.sort_values("round_index").itertuples():
        if r.accepted <= 0 or (max_positions is not None and r.start_position >= max_positions):
            continue
        ax.axvspan(r.start_position - 0.5, r.start_position + r.accepted - 0.5, color=("C2" if shade % 2 else "C0"),
                   alpha=0.25, lw=0)
        shade += 1
    corr = tok.loc[tok["role"].astype(str) == "correction"]
    ax.plot(corr["position"], np.full(len(corr), -0.04 * max(top, 1e-3)), "x", color="C3", ms=4, label="rejected draft")
    ax.axvspan(0, 0, color="C0", alpha=0.25, label="accepted block")
    ax.set_xlim(-0.5, (tok["position"].max() + 0.5) if len(tok) else 1)
    ax.set_xlabel("output position")
    ax.set_ylabel("H (nats)")
    _legend(ax, loc="upper right", ncol=3)
    return ax

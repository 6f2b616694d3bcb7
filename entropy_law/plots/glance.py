"""GLANCE's law beside ours: the side-by-side scores (LOCO, per round), the decile figure and the report section.

Each law, fitted without a category, predicts the accepted drafts of that category's rounds (``glance.round_scores``
scores them); runs with only the round-root entropy (an imported GLANCE log) get GLANCE's law alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law import glance
from entropy_law.law import fit
from entropy_law.law.atrisk import at_risk_table
from entropy_law.law.fit import fit_law
from entropy_law.plots.style import new_axes, panels, short_message, unavailable

SCORE_COLUMNS = ("mse", "category_mean_mae", "r2_curve", "r2_round", "r2_ceiling", "frac_of_ceiling", "holds")


def primary_family(view=None) -> str:
    """Our primary law's family for ``view``'s traces (``fit.primary_family`` of its tokens)."""
    return fit.primary_family(None if view is None else view.tokens)


def law_slope(law) -> float:
    """The law's exponent of entropy (the slope ``holds()`` wants positive): ``k``, or for a cloglog law whose H-only
    answer moves other inputs with H, the slope of log(-log a) on log(H + c) along that curve at depth 1 over the
    trials' 5-95% entropy range. NaN where none."""
    derived = law.derived
    k = float(derived["estimate"].iloc[0]) if len(derived) else float("nan")
    steady = [c for c in fit.STEADY_H_COLUMNS if c in law.family.means]
    if not steady or law.family.link != "cloglog" or law.counts is None or not np.isfinite(k):
        return k
    h, n = law.counts["target_entropy_nats"].to_numpy(float), law.counts["n"].to_numpy(float)
    order = np.argsort(h)
    share = np.cumsum(n[order]) / n.sum()
    low, high = h[order][np.searchsorted(share, 0.05)], h[order][min(np.searchsorted(share, 0.95), len(h) - 1)]
    if not high > low:
        return k
    grid = np.geomspace(max(low, 1e-4), high, 50)
    drafter = {c: float(np.average(law.counts[c], weights=n)) for c in law.family.draft_stats if c in law.counts}
    if len(drafter) < len(law.family.draft_stats):
        return k
    accept = law.predict_acceptance(grid, 1, **law.steady_state(grid), **drafter)
    return float(np.polyfit(np.log(grid + law.eps), np.log(-np.log(accept)), 1)[0])


def loco_ours(view, arm: str, rounds: pd.DataFrame, family: str, *, root_only=False,
              rows: pd.DataFrame | None = None, drafts: pd.DataFrame | None = None):
    """LOCO per-round predictions of our law ``family`` for ``rounds`` and each fold's slope; ``root_only``: a bool or
    ``(False, True)``; ``rows``: the arm's at-risk table; ``drafts``: as ``law_round_expectations``."""
    rows = at_risk_table(view, drafters=[arm]) if rows is None else rows
    variants = tuple(root_only) if isinstance(root_only, (tuple, list)) else (bool(root_only),)
    predicted = [np.full(len(rounds), np.nan) for _ in variants]
    slopes = []
    category = rounds["category"].astype(str).to_numpy()
    for held_out in sorted(set(category)):
        test = category == held_out
        law = fit_law(rows.loc[rows["category"].astype(str) != held_out], family, cov_type="nonrobust")
        slopes.append(law_slope(law))
        for out, root in zip(predicted, variants):
            out[test] = glance.law_round_expectations(law, view, rounds.loc[test], root_only=root, drafts=drafts)
    return (tuple(predicted) if len(variants) > 1 else predicted[0]), slopes


def side_by_side(view, arm: str, family: str | None = None, *, forms=("code",), rows_fn=None) -> dict:
    """Both laws on one arm, LOCO per round: ``{"rounds", "scores": {name: round_scores}, "errors": {name: why}}`` for
    ``glance``, ``glance_<form>``, ``family`` and ``"<family> (root entropy only)"``; ``rows_fn``: the at-risk table."""
    family = family or primary_family(view)
    rounds = glance.glance_rounds(view)
    out = {"rounds": rounds, "scores": {}, "errors": {}, "family": family}
    if rounds["category"].nunique() < 2:
        out["errors"]["loco"] = "leave-one-category-out needs at least two categories"
        return out
    for form in forms:
        name = "glance" if form == "code" else f"glance_{form}"
        try:
            predicted, fits = glance.loco_glance(rounds, form=form)
            out["scores"][name] = glance.round_scores(rounds, predicted, slope=[f.b1_fitted for f in fits.values()])
        except ValueError as err:
            out["errors"][name] = str(err)
    try:
        (full, root), slopes = loco_ours(view, arm, rounds, family, root_only=(False, True),
                                         rows=rows_fn() if rows_fn else None)
        out["scores"][family] = glance.round_scores(rounds, full, slope=slopes, slope_max=np.inf)
        out["scores"][f"{family} (root entropy only)"] = glance.round_scores(rounds, root, slope=slopes,
                                                                            slope_max=np.inf)
    except ValueError as err:
        out["errors"][family] = str(err)
    return out


def glance_wins(arm: str, scores: dict, ours: str) -> list[str]:
    """Each metric (and category mean) where a GLANCE form does at least as well as our law ``ours``."""
    if ours not in scores:
        return []
    mine, wins = scores[ours], []
    for name, theirs in scores.items():
        if not name.startswith("glance"):
            continue
        for metric, lower in (("mse", True), ("category_mean_mae", True), ("r2_curve", False),
                              ("frac_of_ceiling", False)):
            a, b = theirs[metric], mine[metric]
            if np.isfinite(a) and np.isfinite(b) and ((a <= b) if lower else (a >= b)):
                wins.append(f"{arm}: {name} {metric} {a:.4g} vs {ours} {b:.4g}")
        if theirs["holds"] and not mine["holds"]:
            wins.append(f"{arm}: {name} holds() and {ours} does not")
        for category, (observed, predicted) in theirs["category_means"].items():
            other = mine["category_means"][category][1]
            if abs(predicted - observed) < abs(other - observed):
                wins.append(f"{arm}: {name} is closer on the mean accepted drafts of {category} "
                            f"(|error| {abs(predicted - observed):.3f} vs {abs(other - observed):.3f})")
    return wins


def _side_by_side_cached(an, arm: str) -> dict:
    def rows():
        return an._cached(("atrisk", arm), lambda: at_risk_table(an.arm_view(arm), drafters=[arm]))

    return an._cached(("glance_side_by_side", arm),
                      lambda: side_by_side(an.arm_view(arm), arm, an.family, rows_fn=rows))


def glance_section(an) -> tuple[str, pd.DataFrame, list[str]]:
    """The report section: (title, one row per arm and law with the LOCO per-round scores and GLANCE's
    in-sample holds(), notes). Arms whose laws cannot be scored get a note with the reason."""
    title = "GLANCE's law beside ours: leave-one-category-out, per drafting round"
    rows, notes = [], []
    for arm in an.arms:
        try:
            result = _side_by_side_cached(an, arm)
            in_sample = an._cached(("glance_law", arm), lambda: glance.fit_glance(result["rounds"], n_boot=0))
        except ValueError as err:
            notes.append(f"GLANCE side by side, {arm}: not available: {err}")
            continue
        for name, why in result["errors"].items():
            notes.append(f"GLANCE side by side, {arm}: {name} not scored: {why}")
        for name, score in result["scores"].items():
            rows.append({"arm": arm, "law": name, "rounds": score["n_rounds"], "mean accepted": score["mean_accepted"],
                         **{c: score[c] for c in SCORE_COLUMNS}})
        rows.append({"arm": arm, "law": "glance (in sample, as GLANCE reports it)", "rounds": in_sample.n_rounds,
                     "mean accepted": in_sample.mean_accepted, "mse": np.nan, "category_mean_mae": np.nan,
                     "r2_curve": in_sample.r2_curve, "r2_round": in_sample.r2_round, "r2_ceiling": in_sample.r2_ceiling,
                     "frac_of_ceiling": in_sample.frac_of_ceiling, "holds": in_sample.holds()})
        wins = glance_wins(arm, result["scores"], result["family"])
        if result["family"] in result["scores"]:
            notes.append(f"GLANCE side by side, {arm}: where GLANCE's law does at least as well as "
                         f"{result['family']}: " + ("; ".join(w.split(': ', 1)[1] for w in wins) if wins else "nowhere"))
    notes.append("GLANCE side by side: our law's per-round expectation uses the target entropies at the round's "
                 "positions (they describe the round; they are not all known before it); '(root entropy only)' uses "
                 "the root entropy at every depth and the drafted depth D, what is known before the round. "
                 "frac_of_ceiling above 1: more than any function of the root entropy alone can explain")
    notes.append("GLANCE side by side: mse = mean squared error of the accepted drafts per round; category_mean_mae = "
                 "|mean predicted - mean observed| per category, averaged; r2_curve = R^2 of the mean prediction "
                 "against the mean accepted drafts in 10 root-entropy quantile bins; r2_round / r2_ceiling = "
                 "frac_of_ceiling; holds = GLANCE's four conditions (slope: every LOCO fold's b1, or our law's "
                 "exponent of entropy along its H-only curve, plots.glance.law_slope: k for a law in H alone)")
    columns = ["arm", "law", "rounds", "mean accepted", *SCORE_COLUMNS]
    return title, pd.DataFrame(rows, columns=columns), notes


def decile_plot(rounds: pd.DataFrame, law: "glance.GlanceLaw", ours=None, *, ours_label: str = "our law",
                ax=None):
    """GLANCE's decile curve of ``rounds`` and fitted E[a | H] (``law``) and, with ``ours`` (one prediction per
    round), the decile means of our law's per-round expectations. Returns ``ax``."""
    ax = new_axes(ax, figsize=(5, 3.5))
    law.plot(ax=ax, color="0.2", label=f"GLANCE E[a|H] ({law.form}): b0 {law.b0:.2f}, b1 {law.b1:.2f}")
    if ours is not None:
        curve = glance.decile_curve(rounds["entropy"], rounds["accepted"], n_boot=0, predicted=ours)
        ax.plot(curve["entropy"], curve["predicted"], "s--", ms=4, color="C3", label=ours_label)
    ax.legend(frameon=False, fontsize=7)
    return ax


def fig_glance(an):
    """Gallery figure: per drafting arm, GLANCE's decile curve with both laws' curves (in sample)."""
    arms = an.arms
    fig, axes = panels(len(arms))
    if not arms:
        unavailable(axes[0], "no drafting arm")
        return fig
    for ax, arm in zip(axes, arms):
        try:
            view = an.arm_view(arm)
            rounds = glance.glance_rounds(view)
            law = an._cached(("glance_law_boot", arm), lambda: glance.fit_glance(rounds, per_category=False,
                                                                                   seed=an.seed))
        except ValueError as err:
            unavailable(ax, short_message(f"{arm}: {err}"))
            continue
        ours, label = None, f"{an.family}: decile mean of E[a] per round"
        try:
            ours = glance.law_round_expectations(an.law(arm), view, rounds)
        except ValueError as err:
            label = None
            why = "this run holds the round-root entropy only" if "round's root only" in str(err) else str(err)
            ax.text(0.02, 0.02, short_message(f"{an.family} not shown: {why}", 90), transform=ax.transAxes,
                    fontsize=6, va="bottom", wrap=True)
        decile_plot(rounds, law, ours, ours_label=label or "", ax=ax)
        ax.set_title(f"{arm}: r2_curve GLANCE {law.r2_curve:.2f}", fontsize=8)
    return fig

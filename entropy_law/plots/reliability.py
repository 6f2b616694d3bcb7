"""Reliability diagram per category: predicted vs observed acceptance of held-out at-risk trials
(a ``predict.reliability_table``), and its gallery figure (one panel per drafting arm, leave-one-category-out).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.plots.style import new_axes, palette, panels, short_message, unavailable


def reliability_diagram(table: pd.DataFrame, *, ax=None, min_trials: int = 20):
    """Observed vs predicted acceptance per bin, a line per category (bins of ``min_trials`` or more); ``ax``."""
    needed = {"category", "predicted", "observed", "observed_low", "observed_high", "trials", "ece"}
    missing = sorted(needed - set(table.columns))
    if missing:
        raise ValueError(f"reliability_diagram needs a predict.reliability_table frame; missing {missing}")
    ax = new_axes(ax, figsize=(4.4, 4.2))
    categories = sorted(table["category"].unique())
    colours = palette(categories)
    ax.plot([0, 1], [0, 1], color="0.5", lw=0.8, ls="--", label="perfect")
    for cat in categories:
        part = table.loc[(table["category"] == cat) & (table["trials"] >= min_trials)].sort_values("predicted")
        if part.empty:
            continue
        yerr = np.vstack([part["observed"] - part["observed_low"], part["observed_high"] - part["observed"]])
        ax.errorbar(part["predicted"], part["observed"], yerr=yerr, marker="o", ms=3, lw=1.2, capsize=1.5,
                    color=colours[cat], label=f"{cat} (ECE {part['ece'].iloc[0]:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted acceptance (held-out category)")
    ax.set_ylabel("observed acceptance")
    ax.legend(fontsize=7)
    return ax


def fig_reliability(an):
    """Gallery figure: one reliability panel per drafting arm, the law fitted without each category."""
    from entropy_law.payoff.predict import analysis_predictions

    arms = an.arms
    fig, axes = panels(len(arms), height=4.4)
    if not arms:
        unavailable(axes[0], "no drafting arm")
    for ax, arm in zip(axes, arms):
        try:
            reliability_diagram(analysis_predictions(an, arm).reliability, ax=ax)
        except Exception as err:  # a panel that says why, never a crash (as every gallery figure)
            unavailable(ax, short_message(f"{type(err).__name__}: {err}"))
        ax.set_title(f"{arm} ({an.family}, leave-one-category-out)")
    return fig

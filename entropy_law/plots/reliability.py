"""Reliability diagram per category: predicted vs observed acceptance of held-out at-risk trials.

Known here: how to draw a ``predict.reliability_table`` (one line per category, observed acceptance with its
Wilson 95% interval against the mean predicted acceptance of each bin, the diagonal, the ECE in the legend)
and the gallery figure built from a ``TraceAnalysis`` (one panel per drafting arm, leave-one-category-out
law). Not known here: statistics (``entropy_law.payoff.predict``), torch, decoding.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from entropy_law.plots.style import palette


def reliability_diagram(table: pd.DataFrame, *, ax=None, min_trials: int = 20):
    """Observed vs mean predicted acceptance per bin, one line per category (bins with fewer than
    ``min_trials`` trials are not drawn); returns ``ax``."""
    needed = {"category", "predicted", "observed", "observed_low", "observed_high", "trials", "ece"}
    missing = sorted(needed - set(table.columns))
    if missing:
        raise ValueError(f"reliability_diagram needs a predict.reliability_table frame; missing {missing}")
    if ax is None:
        _, ax = plt.subplots(figsize=(4.4, 4.2))
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


def _message(ax, text: str, limit: int = 160):
    """A panel that says why it has no diagram (as the gallery's unavailable panels)."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    ax.text(0.5, 0.5, "not available:\n" + text, ha="center", va="center", fontsize=7, wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def fig_reliability(an):
    """Gallery figure: one reliability panel per drafting arm, the law fitted without each category."""
    from entropy_law.payoff.predict import analysis_predictions

    arms = an.arms
    ncols = min(max(len(arms), 1), 3)
    nrows = int(np.ceil(max(len(arms), 1) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.4 * nrows), squeeze=False)
    flat = axes.ravel()
    for ax in flat[len(arms):]:
        ax.set_visible(False)
    if not arms:
        _message(flat[0], "no drafting arm")
    for ax, arm in zip(flat, arms):
        try:
            reliability_diagram(analysis_predictions(an, arm).reliability, ax=ax)
        except Exception as err:  # a panel that says why, never a crash (as every gallery figure)
            _message(ax, f"{type(err).__name__}: {err}")
        ax.set_title(f"{arm} ({an.family}, leave-one-category-out)")
    return fig

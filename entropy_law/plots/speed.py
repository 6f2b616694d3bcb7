"""Speed validation figure: predicted vs measured speedup per arm and category (``speedup_validation``), and per
arm where measured per-request speedups cross 1 against the predicted workload break-even (``speedup_crossing``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.plots.style import palette, panels, short_message, unavailable

BAND = 0.10  # the goal: predicted within +-10% of measured


def predicted_vs_measured(table: pd.DataFrame, *, ax, colours: dict):
    """One point per row of a ``speedup_validation`` frame with a measurement and a prediction; returns ``ax``."""
    part = table.loc[table["measured"].notna() & table["predicted"].notna()]
    if part.empty:
        raise ValueError("no arm x category has both a measured and a predicted speedup")
    values = np.concatenate([part["measured"], part["predicted"], part["lo"].dropna(), part["hi"].dropna()])
    lo, hi = float(np.nanmin(values)) * 0.9, float(np.nanmax(values)) * 1.1
    line = np.linspace(lo, hi, 50)
    ax.plot(line, line, color="0.4", lw=0.8, ls="--", label="predicted = measured")
    ax.fill_between(line, line * (1 - BAND), line * (1 + BAND), color="0.85", label=f"±{BAND:.0%}")
    for arm, rows in part.groupby("arm", sort=False):
        result = rows["verdict"] == "measured"
        xerr = np.vstack([rows["measured"] - rows["lo"], rows["hi"] - rows["measured"]]).clip(min=0)
        ax.errorbar(rows["measured"], rows["predicted"], xerr=np.nan_to_num(xerr), fmt="none", ecolor=colours[arm],
                    lw=0.8, capsize=1.5)
        ax.scatter(rows.loc[result, "measured"], rows.loc[result, "predicted"], color=colours[arm], s=22, zorder=3,
                   label=arm if result.any() else None)
        ax.scatter(rows.loc[~result, "measured"], rows.loc[~result, "predicted"], facecolor="white",
                   edgecolor=colours[arm], s=22, zorder=3, label=f"{arm} (not a result)" if (~result).any() else None)
        for r in rows.itertuples():
            ax.annotate(r.category, (r.measured, r.predicted), fontsize=6, xytext=(3, 2), textcoords="offset points")
    if "cost_only_predicted" in part and part["cost_only_predicted"].notna().any():
        # the measured rounds priced by the cost model alone: the error left without the law's
        for arm, rows in part.groupby("arm", sort=False):
            ax.scatter(rows["measured"], rows["cost_only_predicted"], marker="x", color=colours[arm], s=18, lw=0.8,
                       zorder=3)
        ax.scatter([], [], marker="x", color="0.3", s=18, lw=0.8, label="its rounds priced by the cost model (no law)")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    clock = ", ".join(sorted({str(c) for c in part["clock"].dropna()}))
    ax.set_xlabel(f"measured speedup vs AR (paired, {clock} clock; 95% CI)")
    ax.set_ylabel("predicted speedup (law + cost model)")
    ax.legend(fontsize=6, loc="upper left")
    return ax


def crossing_panel(requests: pd.DataFrame, crossing: dict, *, ax, colour, workload=None):
    """Per-request measured speedup vs mean entropy for one arm and where it crosses 1; with ``workload`` also the
    predicted per-request speedups, both log-speedup lines and the workload break-even interval."""
    ax.scatter(requests["mean_entropy_nats"], requests["speedup"], s=10, color=colour, alpha=0.7, label="measured")
    ax.axhline(1.0, color="k", lw=0.6)
    h = requests["mean_entropy_nats"].to_numpy(float)
    grid = np.linspace(float(np.nanmin(h)), float(np.nanmax(h)), 50) if len(h) else np.array([])
    if workload is not None:
        pred = workload.requests
        ax.scatter(pred["mean_entropy_nats"], pred["predicted_speedup"], s=12, marker="x", color="0.3",
                   label="predicted (own entropy sequence)")
        summary = workload.summary
        for kind, style in (("measured", "-"), ("predicted", "--")):
            if f"{kind}_slope" not in summary.index or not len(grid):
                continue
            b0, b1 = (float(summary.loc[f"{kind}_{part}", "estimate"]) for part in ("intercept", "slope"))
            if np.isfinite(b0) and np.isfinite(b1):
                ax.plot(grid, np.exp(b0 + b1 * grid), style, color="0.2", lw=1, label=f"{kind} log-speedup line")
        low, high = crossing.get("workload_low", np.nan), crossing.get("workload_high", np.nan)
        if np.isfinite(low) and len(grid):
            ax.axvspan(low, min(high, grid[-1] * 1.5) if np.isfinite(high) else grid[-1] * 1.5, color=colour,
                       alpha=0.15, label=f"workload break-even {crossing['workload_breakeven']:.2f} nats (95% CI)")
    if np.isfinite(crossing["crossing_nats"]):
        ax.axvline(crossing["crossing_nats"], color=colour, ls=":", lw=1,
                   label=f"logistic: measured > 1 crosses 0.5 at {crossing['crossing_nats']:.2f} nats")
    else:
        ax.text(0.02, 0.02, crossing["reason"][:90], transform=ax.transAxes, fontsize=6)
    ax.set_xlabel("request mean target entropy (nats)")
    ax.set_ylabel(f"speedup vs AR ({requests.attrs.get('clock', '?')} clock)")
    ax.set_title(crossing["arm"], fontsize=8)
    ax.legend(fontsize=5)
    return ax


def fig_speed_validation(an):
    """The gallery figure: predicted vs measured (all arms), then one crossing panel per arm with requests."""
    arms = an.arms
    fig, axes = panels(1 + len(arms))
    colours = palette(arms)
    check = an.attempt("speedup_validation")
    if check.ok:
        try:
            predicted_vs_measured(check.value, ax=axes[0], colours=colours)
        except ValueError as err:
            statuses = ", ".join(sorted(set(check.value["status"])))
            unavailable(axes[0], short_message(f"{err} ({statuses})"))
    else:
        unavailable(axes[0], short_message(check.error))
    axes[0].set_title("predicted vs measured speedup per arm x category", fontsize=8)
    for ax, arm in zip(axes[1:], arms):
        req, crossing = an.attempt("request_speedups", arm), an.attempt("speedup_crossing", arm)
        if req.ok and crossing.ok:
            work = an.attempt("workload", arm)
            crossing_panel(req.value, crossing.value, ax=ax, colour=colours[arm],
                           workload=work.value if work.ok else None)
        else:
            unavailable(ax, short_message(req.error or crossing.error))
            ax.set_title(arm, fontsize=8)
    return fig


def fig_controllers(tables: dict):
    """Modelled speedup per controller per category, a panel per workload (``tables``: name -> a
    ``payoff.controllers.controller_table`` frame), the replay oracle as a line, AR at 1."""
    import seaborn as sns

    from entropy_law.payoff.controllers import ORACLE

    fig, axes = panels(len(tables), width=9.0, height=3.6, ncols=1)
    for ax, (name, table) in zip(axes, tables.items()):
        bars = table.loc[(table["config"] != ORACLE) & ~table["config"].str.startswith("fixed")]
        order = list(dict.fromkeys(table["category"]))
        sns.barplot(bars, x="category", y="speedup", hue="config", order=order, ax=ax,
                    palette=palette(bars["config"]), hue_order=sorted(bars["config"].unique()))
        oracle = table.loc[table["config"] == ORACLE].set_index("category").reindex(order)
        ax.plot(range(len(order)), oracle["speedup"], color="black", marker="_", ms=14, lw=1.0, label=ORACLE)
        ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set(title=name.replace("-", " "), xlabel="", ylabel="modelled speedup over AR")
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig

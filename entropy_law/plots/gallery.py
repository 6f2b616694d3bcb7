"""The figure set of a trace set, each figure built from a ``TraceAnalysis`` (analyses shared, computed once).

``FIGURES``: name -> title and builder; a per-arm figure has a panel per drafting arm, and an analysis that is not
available draws a panel that says why. ``make_figures`` writes them all; ``figures/`` and the report call them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from tqdm.auto import tqdm

from entropy_law.law import atrisk
from entropy_law.analysis import TraceAnalysis
from entropy_law.analysis.sample_traces import resolve_traces
from entropy_law.plots import figures as F
from entropy_law.plots.glance import fig_glance
from entropy_law.plots.reliability import fig_reliability
from entropy_law.plots.speed import fig_speed_validation
from entropy_law.plots.style import palette, save_figure, short_message, style, unavailable
from entropy_law.plots.style import panels as _panels
from entropy_law.traces.reader import load_traces


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str
    build: Callable  # (TraceAnalysis) -> matplotlib Figure


def _per_arm(an, analysis: str, draw, title, **panel_size):
    """One panel per drafting arm: ``draw(ax, arm, result)`` of ``an.attempt(analysis, arm)``, or why not."""
    fig, axes = _panels(len(an.arms), **panel_size)
    for ax, arm in zip(axes, an.arms):
        attempt = an.attempt(analysis, arm)
        if attempt.ok:
            draw(ax, arm, attempt.value)
        else:
            unavailable(ax, short_message(attempt.error))
        ax.set_title(title(arm))
    return fig


def fig_entropy_distributions(an):
    fig, (ax,) = _panels(1, width=5.5)
    F.entropy_distributions(an.entropy_tokens(), ax=ax)
    ax.set_title("target entropy by category")
    return fig


def at_risk_rows(an, arm: str) -> pd.DataFrame:
    return an._cached(("atrisk", arm), lambda: atrisk.at_risk_table(an.arm_view(arm), drafters=[arm]))


def fig_acceptance_vs_entropy(an):
    arms = an.arms
    fig, axes = _panels(2 * len(arms), ncols=2)
    for i, arm in enumerate(arms):
        law = an.attempt("law", arm)
        rows = at_risk_rows(an, arm)
        for j, depth in enumerate((1, "2+")):
            ax = axes[2 * i + j]
            F.acceptance_vs_entropy(rows, law=law.value if law.ok else None, depth=depth, ax=ax)
            ax.set_title(f"{arm}: depth {'≥ 2' if depth == '2+' else 1}")
    return fig


def fig_survival(an):
    arms = an.arms
    fig, axes = _panels(len(arms))
    for ax, arm in zip(axes, arms):
        F.survival_by_depth(at_risk_rows(an, arm), ax=ax)
        ax.set_title(arm)
    return fig


def request_entropy(an) -> pd.DataFrame:
    ent = an.entropy_tokens()
    return ent.groupby("request_id", as_index=False)["target_entropy_nats"].mean().rename(
        columns={"target_entropy_nats": "mean_entropy_nats"})


def accepted_length_requests(an, arm: str) -> pd.DataFrame:
    block = an.block(arm)
    return block.per_request.merge(request_entropy(an), on="request_id", how="left")


def fig_accepted_length(an):
    return _per_arm(an, "block", lambda ax, arm, _: F.accepted_length_vs_entropy(
        accepted_length_requests(an, arm), seed=an.seed, ax=ax), title=str)


def loco_frame(an) -> tuple[pd.DataFrame, list[str]]:
    frames, errors = [], []
    for arm in an.arms:
        attempt = an.attempt("loco", arm)
        if attempt.ok:
            frames.append(attempt.value.summary.reset_index().assign(arm=arm))
        else:
            errors.append(attempt.error)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), errors


def fig_loco(an):
    fig, (ax,) = _panels(1, width=4.6, height=4.4)
    frame, errors = loco_frame(an)
    if frame.empty:
        unavailable(ax, short_message("; ".join(errors)))
    else:
        F.loco_predicted_vs_observed(frame, ax=ax)
    ax.set_title("leave-one-category-out")
    return fig


def fig_calibration(an):
    def draw(ax, arm, law):
        rows = at_risk_rows(an, arm)
        F.calibration(rows, law.predict_frame(rows), ax=ax)

    return _per_arm(an, "law", draw, lambda arm: f"{arm} (in-sample {an.family})", height=4.2)


def fig_law_comparison(an):
    return _per_arm(an, "comparison", lambda ax, arm, comparison: F.law_comparison(comparison.summary, ax=ax),
                    lambda arm: f"{arm}: {an.n_folds}-fold CV by request")


def speedup_curve(pays) -> pd.DataFrame:
    rows = pays.summary.loc[pays.summary.index.str.startswith("speedup[H=")]
    h = rows.index.str.extract(r"H=([0-9.e+-]+)")[0].astype(float).to_numpy()
    return pd.DataFrame({"entropy_nats": h, "estimate": rows["estimate"].to_numpy(),
                         "ci_low": rows["ci_low"].to_numpy(), "ci_high": rows["ci_high"].to_numpy()}).sort_values("entropy_nats")


def observed_speedups(an, arm: str) -> pd.DataFrame:
    attempt = an.attempt("measured_speedups")
    if not attempt.ok or attempt.value.empty:
        return pd.DataFrame(columns=["category", "speedup", "mean_entropy_nats"])
    sp = attempt.value.loc[attempt.value["arm"] == arm]
    h = an.entropy_tokens().groupby("category")["target_entropy_nats"].mean().rename("mean_entropy_nats")
    return sp.merge(h, left_on="category", right_index=True)


def fig_speedup(an):
    fig, (ax,) = _panels(1, width=5.8, height=3.8)
    colours = palette(an.arms)
    errors, drawn = [], 0
    for arm in an.arms:
        pays = an.attempt("pays", arm)
        if not pays.ok:
            errors.append(pays.error)
            continue
        s = pays.value.summary.loc["breakeven_entropy_nats"]
        F.speedup_vs_entropy(speedup_curve(pays.value), breakeven=(s["estimate"], s["ci_low"], s["ci_high"]),
                             observed=observed_speedups(an, arm), label=arm, color=colours[arm], ax=ax)
        drawn += 1
    if not drawn:
        unavailable(ax, short_message("; ".join(errors) or "no drafting arm"))
    ax.set_title("when drafting pays (squares: measured per category)")
    return fig


def example_request(an, arm: str) -> tuple[str, str]:
    """(run_id, request_id) of the response of ``arm`` whose tokens per round is closest to the median."""
    view = an.arm_view(arm)
    rnd = view.rounds.loc[view.rounds["round_index"] > 0]
    per = rnd.groupby(["run_id", "request_id"])["committed"].agg(["sum", "size"]).reset_index()
    per = per.loc[per["sum"] >= 8] if (per["sum"] >= 8).any() else per
    if per.empty:
        raise ValueError(f"arm {arm!r} has no decoded rounds")
    rate = per["sum"] / per["size"]
    per = per.assign(dist=(rate - rate.median()).abs()).sort_values(["dist", "request_id"])
    return str(per.iloc[0]["run_id"]), str(per.iloc[0]["request_id"])


def fig_example_response(an):
    fig, (ax,) = _panels(1, width=9.0, height=2.8)
    arm = an.arms[0] if an.arms else None
    if arm is None:
        return unavailable(ax, "no drafting arm").figure
    run_id, request_id = example_request(an, arm)
    tok = an.view.tokens.loc[(an.view.tokens["run_id"] == run_id) & (an.view.tokens["request_id"] == request_id)]
    rnd = an.view.rounds.loc[(an.view.rounds["run_id"] == run_id) & (an.view.rounds["request_id"] == request_id)]
    F.example_response(tok, rnd, max_positions=160, ax=ax)
    ax.set_title(f"{request_id} ({arm})")
    return fig


FIGURES: dict[str, FigureSpec] = {s.name: s for s in [
    FigureSpec("fig1_entropy_distributions", "Target-entropy distributions by category", fig_entropy_distributions),
    FigureSpec("fig2_acceptance_vs_entropy", "Acceptance vs target entropy (binned, Wilson 95%) with the fitted law",
               fig_acceptance_vs_entropy),
    FigureSpec("fig3_survival_by_depth", "Acceptance by depth: survival S(k) = P(accepted length ≥ k)", fig_survival),
    FigureSpec("fig4_accepted_length", "Mean accepted length per drafting round vs mean entropy, with the law's prediction",
               fig_accepted_length),
    FigureSpec("fig5_loco", "Leave-one-category-out: predicted vs observed tokens per round", fig_loco),
    FigureSpec("fig6_calibration", "Calibration (reliability) of the fitted law", fig_calibration),
    FigureSpec("fig7_law_comparison", "Law comparison: cross-validated log-loss", fig_law_comparison),
    FigureSpec("fig8_speedup", "Predicted speedup vs entropy with the break-even point", fig_speedup),
    FigureSpec("fig9_example_response", "One response: per-position entropy, accepted blocks shaded", fig_example_response),
    FigureSpec("fig10_reliability", "Reliability per category: predicted vs observed acceptance, leave-one-category-out",
               fig_reliability),
    FigureSpec("fig11_glance", "GLANCE's decile curve (95% bootstrap) with GLANCE's law and ours", fig_glance),
    FigureSpec("fig12_speed_validation", "Predicted vs measured speedup; where measured speedups cross 1 vs the "
               "break-even entropy", fig_speed_validation),
]}


def build_figure(analysis, name: str):
    """The matplotlib Figure ``name`` (see ``FIGURES``) for ``analysis`` (a ``TraceAnalysis``)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; known: {list(FIGURES)}")
    with style():
        try:
            fig = FIGURES[name].build(analysis)
        except ValueError as err:  # the traces cannot support it (e.g. an imported GLANCE log): a panel saying why
            fig, (ax,) = _panels(1)
            unavailable(ax, short_message(str(err), 300))
        fig.suptitle(FIGURES[name].title, fontsize=10)
        fig.tight_layout()
    return fig


def make_figures(analysis, out_dir, *, names=None, formats=("png", "pdf"), progress: bool = False) -> dict:
    """Write every figure (or ``names``) to ``out_dir``; returns name -> list of paths."""
    names = list(FIGURES) if names is None else list(names)
    written = {}
    for name in tqdm(names, desc="figures", unit="fig", disable=not progress):
        fig = build_figure(analysis, name)
        written[name] = save_figure(fig, Path(out_dir), name, formats=formats)
        plt.close(fig)
    return written


def cli(names=None, argv=None, *, description: str | None = None) -> int:
    """Command line of the figure scripts (default traces: ``data/traces/``, else simulated ones, said so)."""
    matplotlib.use("Agg")  # the scripts only write files; the backend is chosen here, not at import
    p = argparse.ArgumentParser(description=description or "regenerate figures of the entropy law")
    p.add_argument("--traces", default=None, help="trace runs (default: data/traces/, else simulated traces)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "figures" / "out"),
                   help="output folder (default: figures/out)")
    p.add_argument("--n-boot", type=int, default=100, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of folds and bootstrap (default: %(default)s)")
    p.add_argument("--ar-ms-per-token", type=float, default=None, help="AR cost per token if the traces have no AR run")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        path, simulated = resolve_traces(args.traces)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"traces: {path}" + (" (SIMULATED: no reference traces found)" if simulated else ""), flush=True)
    analysis = TraceAnalysis(load_traces(path), n_boot=args.n_boot, seed=args.seed,
                             ar_ms_per_token=args.ar_ms_per_token)
    written = make_figures(analysis, args.out, names=names, progress=not args.no_progress)
    for name, paths in written.items():
        print(f"{name}: {', '.join(str(p) for p in paths)}")
    print(f"{sum(len(p) for p in written.values())} files in {time.perf_counter() - t0:.0f} s")
    return 0

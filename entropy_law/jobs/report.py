"""A summary of one trace set: tables and figures as a self-contained HTML page or Markdown with PNGs.

An analysis that cannot run on the given traces is listed with the reason instead of failing the report. The
statistics live in ``entropy_law.analysis`` and the rooms under it; this module formats them.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
from pathlib import Path

import numpy as np
import pandas as pd

from entropy_law.analysis import TraceAnalysis, format_interval
from entropy_law.law.fit import get_family
from entropy_law.payoff.cost import ABOVE_BOUND, MIN_PAIRED_REQUESTS, cpu_wall_factors
from entropy_law.payoff.predict import request_prediction_section
from entropy_law.payoff.workload import spread_text
from entropy_law.plots.glance import glance_section
from entropy_law.law.stats import FEW_REQUESTS

RESULT_COLUMNS = {
    "arm": "arm", "category": "category", "requests": "requests", "tokens": "tokens",
    "mean_entropy_nats": "mean H (nats)", "median_entropy_nats": "median H (nats)",
    "mean_accepted": "mean accepted τ", "loco_mean_accepted": "LOCO: mean accepted τ",
    "committed_per_round": "tokens / round",
    "law_tokens_per_round": "law: tokens / round", "loco_tokens_per_round": "LOCO: tokens / round",
    "speedup_vs_ar": "speedup vs AR", "speedup_requests": "speedup: paired requests",
}


def _fmt(value, digits: int = 3) -> str:
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return "–"
        if np.isinf(value):
            return "inf"
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown_table(frame: pd.DataFrame, *, digits: int = 3, index: bool = False) -> str:
    """A GitHub-flavoured Markdown table (``digits`` significant digits, NaN as "–", pipes in cells escaped)."""
    if index:
        frame = frame.reset_index()

    def cell(text) -> str:  # a pipe inside a cell ("|rel. error|") would end it: escaped
        return str(text).replace("|", "\\|")

    header = "| " + " | ".join(cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(_fmt(v, digits)) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def speedup_text(speedup, lo, hi, requests, verdict, apart: bool = False):
    """A measured speedup with its interval where ``category_verdict`` gives a verdict, else why not (``apart``:
    timed apart from its AR run). NaN stays NaN."""
    if not np.isfinite(speedup) or verdict == "the reference":
        return speedup
    if apart:
        return f"not measured (timed apart from AR; {speedup:.2f}x)"
    if verdict == ABOVE_BOUND:
        return f"{ABOVE_BOUND} ({speedup:.2f}x): not a result"
    got = category_verdict(requests, lo, hi)
    return got if got.startswith("not measured") else f"{speedup:.2f}x [{lo:.2f}, {hi:.2f}]"


def results_frame(analysis: TraceAnalysis) -> pd.DataFrame:
    """The per-arm, per-category results table with readable column names; speedups via ``speedup_text``."""
    table = analysis.results_table()
    speed = analysis.attempt("measured_speedups")
    if "speedup_vs_ar" in table and speed.ok:
        table = table.astype({"speedup_vs_ar": object})
        sp = speed.value.set_index(["arm", "category"])
        for i, row in table.iterrows():
            if (row["arm"], row["category"]) in sp.index:
                r = sp.loc[(row["arm"], row["category"])]
                table.at[i, "speedup_vs_ar"] = speedup_text(r["speedup"], r["lo"], r["hi"], r["requests"], r["verdict"],
                                                            r.get("timed_together") is False)
    return table[[c for c in RESULT_COLUMNS if c in table]].rename(columns=RESULT_COLUMNS)


MAX_INTERVAL_RATIO = 2.0  # an interval whose upper end is more than this times its lower end: not measured
MIN_CPU_SHARE = 0.8  # decoding that got less of its threads' time than this ran on a loaded machine: no verdict
LOADED = "not measured (machine loaded)"
PAYS, DOES_NOT_PAY, UNCLEAR = "pays", "does not pay", "unclear"


def category_verdict(requests: int, low: float, high: float, *, above_bound: bool = False) -> str:
    """Whether drafting pays in one category, from the speedup interval ``[low, high]`` over AR on ``requests``:
    ``"pays"`` (``low > 1``), ``"does not pay"`` (``high < 1``), ``"unclear"``, or ``"not measured (N requests)"``
    below ``MIN_PAIRED_REQUESTS``, without a finite positive interval, past ``MAX_INTERVAL_RATIO`` or the bound."""
    n = int(requests) if requests == requests else 0  # NaN requests: none
    if (n < MIN_PAIRED_REQUESTS or above_bound or not (np.isfinite(low) and np.isfinite(high)) or low <= 0
            or high > MAX_INTERVAL_RATIO * low):
        return f"not measured ({n} request{'' if n == 1 else 's'})"
    return PAYS if low > 1 else DOES_NOT_PAY if high < 1 else UNCLEAR


def _verdict_interval(row, category_requests: float) -> tuple[str, float, float, float, float]:
    """(source, requests, point, low, high) of a category's verdict: measured where paired, else predicted."""
    def number(value):
        return float(value) if value is not None and value == value else np.nan

    if number(row["requests"]) > 0:
        return "measured", number(row["requests"]), number(row["measured"]), number(row["lo"]), number(row["hi"])
    return ("predicted", number(category_requests), number(row["workload_predicted"]), number(row["workload_low"]),
            number(row["workload_high"]))


def answer_frame(analysis: TraceAnalysis, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per drafting arm and category: measured (``measured``: ``jobs.speed.paired_speedups`` rows, else the
    traces') and predicted speedup, and ``pays`` (``category_verdict``) on the interval of ``pays_from``
    ("measured" or "predicted", in the ``verdict_*`` columns). Empty where no arm can be predicted or measured."""
    check = analysis.attempt("speedup_validation")
    if not check.ok:
        return pd.DataFrame()
    frame = check.value.copy()
    if measured is not None and len(measured):
        m = measured.set_index(["arm", "category"])
        for i, r in frame.iterrows():
            if (r["arm"], r["category"]) in m.index:
                got = m.loc[(r["arm"], r["category"])]
                frame.loc[i, ["measured", "lo", "hi", "verdict", "requests", "clock"]] = [
                    float(got["speedup"]), float(got["lo"]), float(got["hi"]), got["verdict"], int(got["requests"]),
                    "cpu (jobs.speed)"]
    # the prediction's interval per category: the workload pricing of the arm's own requests (in-sample)
    frame = frame.assign(workload_predicted=np.nan, workload_low=np.nan, workload_high=np.nan, workload_spread=np.nan)
    for arm in frame["arm"].unique():
        work = analysis.attempt("workload", arm)
        if not work.ok or work.value.categories.empty:
            continue
        cats = work.value.categories
        rows = (frame["arm"] == arm) & frame["category"].astype(str).isin(cats.index)
        got = cats.loc[frame.loc[rows, "category"].astype(str)]
        frame.loc[rows, ["workload_predicted", "workload_low", "workload_high", "workload_spread"]] = got[
            ["predicted_speedup", "ci_low", "ci_high", "cost_spread"]].to_numpy(float)
    requests = analysis.results_table().set_index(["arm", "category"])["requests"]
    rows = [_verdict_interval(r, requests.get((r["arm"], r["category"]), np.nan)) for _, r in frame.iterrows()]
    frame = frame.assign(pays_from=[r[0] for r in rows], verdict_requests=[r[1] for r in rows],
                         verdict_speedup=[r[2] for r in rows], verdict_low=[r[3] for r in rows],
                         verdict_high=[r[4] for r in rows])
    return frame.assign(pays=[category_verdict(n, lo, hi, above_bound=v == ABOVE_BOUND) for n, lo, hi, v in zip(
        frame["verdict_requests"], frame["verdict_low"], frame["verdict_high"], frame["verdict"])])


def cpu_share(traces, threads: int = 1) -> float | None:
    """Median over requests of decoding's CPU over wall time per thread (``cost.cpu_wall_factors``): near 1 on a
    quiet machine. ``None`` where the traces hold no CPU timings."""
    factors = cpu_wall_factors(traces.rounds, traces.requests)
    return None if factors is None else float(np.median(factors["factor"])) / max(int(threads), 1)


def load_note(share: float | None, threads: int = 1) -> str | None:
    """A screen line saying the machine was loaded (``share`` below ``MIN_CPU_SHARE``), else ``None``."""
    if share is None or share >= MIN_CPU_SHARE:
        return None
    return (f"Machine loaded: decoding got {share:.0%} of {threads} thread(s)' time (below {MIN_CPU_SHARE:.0%}): no "
            f"verdict; rerun {'when quiet' if threads == 1 else 'with --threads 1'}")


def verdict_lines(analysis: TraceAnalysis, measured: pd.DataFrame | None = None, *,
                  loaded: str | None = None) -> list[str]:
    """The short answer on one screen: per drafting arm and category its verdict, speedup, interval, source and
    requests (``answer_frame``); ``loaded`` (``load_note``): said under the title, and no verdict (``LOADED``)."""
    frame = answer_frame(analysis, measured)
    if frame.empty:
        return ["When drafting pays: no drafting arm could be measured or predicted (see summary.txt)"]
    spread = frame["workload_spread"].max() if "workload_spread" in frame else np.nan  # the predicted intervals'
    lines = [f"When drafting pays: speedup vs AR, 95% interval (docs/demo.md); {spread_text(spread)}"]
    if loaded:
        lines.append(loaded)
        frame = frame.assign(pays=LOADED)
    width = max(len(str(c)) for c in frame["category"]) + 2
    for arm, part in frame.groupby("arm", sort=False):
        lines.append(str(arm))
        for r in part.itertuples():
            head = f"  {str(r.category):<{width}}"
            if r.pays.startswith("not measured"):
                lines.append(f"{head}{r.pays}")
                continue
            point = f"{r.verdict_speedup:.2f}x" if np.isfinite(r.verdict_speedup) else "–"
            lines.append(f"{head}{r.pays:<14}{point} [{r.verdict_low:.2f}, {r.verdict_high:.2f}]  {r.pays_from}, "
                         f"{int(r.verdict_requests)} requests")
    return lines


def _join(names) -> str:
    names = list(names)
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def answer_lines(analysis: TraceAnalysis, measured: pd.DataFrame | None = None, *, loaded: bool = False) -> list[str]:
    """The answer first, one line per drafting arm (its workload verdict and the categories it pays for), then
    per category measured and predicted speedup side by side; ``loaded``: no category gets a verdict (``LOADED``)."""
    frame = answer_frame(analysis, measured)
    frame = frame.assign(pays=LOADED) if loaded and len(frame) else frame
    lines = []
    for arm in analysis.arms:
        pays, work = analysis.attempt("pays", arm), analysis.attempt("workload", arm)
        # the workload answer first; the constant-entropy break-even is another quantity, named as such
        head = f"{arm}: drafting {work.value.verdict}" if work.ok else f"{arm}: workload break-even not computed"
        if pays.ok:
            head += f" (at constant entropy: {pays.value.breakeven_verdict})"
        apart = analysis.timed_together(arm)[0] is False
        if (work.ok or pays.ok) and apart:  # t_AR from a run timed apart
            head += " [priced with an AR cost timed apart from this arm: not measured reliably]"
        part = frame.loc[frame["arm"] == arm] if len(frame) else frame
        if len(part):
            yes = part.loc[part["pays"] == "pays", "category"]
            no = part.loc[part["pays"] == "does not pay", "category"]
            unclear = part.loc[part["pays"] == "unclear", "category"]
            unmeasured = part.loc[part["pays"].str.startswith("not measured"), "category"]
            words = [f"it pays for {_join(yes)}" if len(yes) else "it pays for none",
                     *([f"not for {_join(no)}"] if len(no) else []),
                     *([f"unclear for {_join(unclear)}"] if len(unclear) else []),
                     *([f"not measured for {_join(unmeasured)}"] if len(unmeasured) else [])]
            head += "; in these categories " + ", ".join(words)
            status = part["status"].iloc[0]
            if status != "compared":
                head += f" ({status})"
        lines.append(head)
        for r in part.itertuples():
            apart_here = apart and "jobs.speed" not in str(r.clock)  # jobs.speed times the arms interleaved
            got = speedup_text(r.measured, r.lo, r.hi, r.requests, r.verdict, apart_here) if isinstance(
                r.verdict, str) else ""
            got = f"{got} {r.clock}" if got.endswith("]") else got or "not measured"
            predicted = f"{r.predicted:.2f}x" if np.isfinite(r.predicted) else "–"
            if np.isfinite(r.workload_predicted):  # per request, with the interval the verdict also rests on
                band = (f"[{r.workload_low:.2f}, {r.workload_high:.2f}]"
                        if np.isfinite(r.workload_low) and np.isfinite(r.workload_high) else "(no interval)")
                predicted += f", per request {r.workload_predicted:.2f}x {band} ({spread_text(r.workload_spread)})"
            source = f" ({r.pays_from})" if r.pays in (PAYS, DOES_NOT_PAY, UNCLEAR) else ""  # what it rests on
            lines.append(f"    {r.category:<16} measured {got:<44} predicted {predicted:<36} -> {r.pays}{source}")
        lines += [f"    ({attempt.error})" for attempt in (pays, work) if not attempt.ok]
    crossing = analysis.attempt("crossing_table")
    if crossing.ok:
        lines += [f"{r['arm']}: {crossing_sentence(r)}" for r in crossing.value.to_dict("records")]
    return lines


def crossing_sentence(r: dict) -> str:
    """Where measured per-request speedups cross 1, next to the break-even interval, in words."""
    extrapolated = f", extrapolated: {r['reason']}" if r.get("reason") else ""  # beyond every request's mean H
    where = (f"measured per-request speedups cross 1 at {r['crossing_nats']:.2f} nats (logistic fit, "
             f"{r['requests']} requests, {r['clock']} clock{extrapolated})" if np.isfinite(r["crossing_nats"])
             else f"measured per-request speedups: no crossing placed ({r['reason']}; "
                  f"{r['share_above_1']:.0%} of {r['requests']} requests above 1)")
    if np.isfinite(r["breakeven_low"]) and np.isfinite(r["crossing_nats"]):
        # another scale than a request's mean entropy: shown for reference, not compared
        where += (f"; for reference, the constant-entropy break-even is {r['breakeven']:.2f} "
                  f"[{r['breakeven_low']:.2f}, {_nats(r['breakeven_high'])}] nats (one H everywhere: another scale "
                  "than a request's mean, not compared)")
    if r.get("workload_ok"):
        line = (f"the measured log-speedup line crosses 1 at {_nats(r['measured_line'])} "
                f"[{_nats(r['measured_line_low'])}, {_nats(r['measured_line_high'])}]"
                if not np.isnan(r["measured_line"]) else "no falling measured line")
        agree = {True: "agree", False: "disagree", None: "cannot be compared"}[r["workload_agree"]]
        where += (f". On one scale (request mean entropy): predicted workload break-even "
                  f"{_nats(r['workload_breakeven'])} [{_nats(r['workload_low'])}, {_nats(r['workload_high'])}], "
                  f"{line}; the verdicts {agree} (predicted: {r['workload_verdict']}; measured: "
                  f"{r['measured_line_verdict']})")
    return where


def _nats(value) -> str:
    value = float(value)
    return "∞" if np.isinf(value) else "–" if np.isnan(value) else f"{value:.2f}"


def law_frame(analysis: TraceAnalysis) -> pd.DataFrame:
    """Per arm: k (and w), lambda at depth 1, the break-even entropy (95% intervals, with the requests each
    rests on) and the verdicts on the workload and at constant entropy."""
    law = analysis.law_table()
    rows = []
    for r in law.to_dict("records"):
        work, pays = analysis.attempt("workload", r["arm"]), analysis.attempt("pays", r["arm"])
        w = ({"w: exponent of 1 − p₁ (95% CI)": format_interval(r.get("w", np.nan), r.get("w_low"),
                                                                r.get("w_high"))} if "w" in law else {})
        rows.append({"arm": r["arm"],
                     "k (95% CI)": format_interval(r.get("k", np.nan), r.get("k_low"), r.get("k_high")), **w,
                     "λ at depth 1 (95% CI)": format_interval(r.get("lambda_d1", np.nan), r.get("lambda_d1_low"),
                                                              r.get("lambda_d1_high")),
                     "at-risk trials": r.get("trials", np.nan), "requests": r.get("requests", np.nan),
                     "break-even H, nats (95% CI)": format_interval(r.get("breakeven_nats", np.nan),
                                                                    r.get("breakeven_low"), r.get("breakeven_high")),
                     "drafting pays (workload)": work.value.verdict if work.ok else "n/a",
                     "drafting pays (constant H)": (r.get("drafting_pays") if isinstance(r.get("drafting_pays"), str)
                                                    else "n/a"),
                     "break-even: requests": float(pays.value.summary["n_requests"].iloc[0]) if pays.ok else np.nan})
    return pd.DataFrame(rows)


def few_requests_notes(analysis: TraceAnalysis) -> list[str]:
    """The analysis' own notes, then one per arm whose intervals rest on fewer than ``FEW_REQUESTS`` requests."""
    notes = list(analysis.notes)
    for r in law_frame(analysis).to_dict("records"):
        for what, n in (("law intervals", r["requests"]),
                        ("break-even / speedup intervals", r["break-even: requests"])):
            if np.isfinite(n) and n < FEW_REQUESTS:
                notes.append(f"{r['arm']}: the {what} rest on {int(n)} requests (fewer than {FEW_REQUESTS}): "
                             "not measured reliably")
    return notes


LOCO_DEPTH_LABELS = {"training": "leak-free (depths from training categories)",
                     "replayed": "leak-free (the drafter's replayed proposals)",
                     "oracle": "oracle depths (held-out's own)"}


def loco_accuracy_frame(analysis: TraceAnalysis) -> pd.DataFrame:
    """Per arm and drafted-depth mode: ``TraceAnalysis.loco_accuracy`` in readable columns (``LOCO_TEXT``)."""
    acc = analysis.loco_accuracy()
    rows = []
    for (arm, depths), part in acc.groupby(["arm", "depths"], sort=False):
        q = part.set_index("quantity")
        row = {"arm": arm, "LOCO depths": LOCO_DEPTH_LABELS.get(depths, depths), "categories": int(q["categories"].iloc[0])}
        for name, label in (("tokens_per_round", "tokens / round"), ("tokens_per_round_depth_only", "depth-only control: tokens / round"),
                            ("mean_accepted", "mean accepted τ"), ("mean_accepted_depth_only", "depth-only control: mean accepted τ")):
            if name in q.index:
                r = q.loc[name]
                row[f"{label}: mean rel. error"] = r["mean_relative_error"]
                row[f"{label}: mean |rel. error|"] = r["mean_abs_relative_error"]
                row[f"{label}: max |rel. error|"] = r["max_abs_relative_error"]
                row[f"{label}: Spearman ρ (exact p)"] = (f"{_fmt(r['spearman_rho'])} ({_fmt(r['p_permutation'], 2)})")
        if "tokens_per_round_full_depth" in q.index:
            row["full-depth DP tokens / round: mean rel. error"] = q.loc["tokens_per_round_full_depth", "mean_relative_error"]
        rows.append(row)
    return pd.DataFrame(rows)


def universality_frame(analysis: TraceAnalysis) -> pd.DataFrame:
    """Per arm: ``TraceAnalysis.universality_table`` in readable columns (``P1_TEXT``)."""
    t = analysis.universality_table()
    out = pd.DataFrame({
        "arm": t["arm"], "P1 score χ²": t["score_statistic"], "df": t["df"], "P1 p": t["p_value"],
        "Wald χ²": t["wald_statistic"], "Wald p": t["p_wald_chi2"],
        "CV gain of the law over depth only (nats / trial)": t["cv_gain_law_vs_depth_only"],
        "CV gain of category terms (nats / trial)": t["cv_gain_cat_vs_law"],
        "category share of the CV gain": t["cv_category_share"], "requests": t["requests"]})
    if "law_family" in t:  # the analysis' own law (the primary law by default) beside law_exp
        name = str(t["law_family"].iloc[0])
        out[f"{name}: P1 score χ² (df)"] = [f"{x:.1f} ({int(d)})" if np.isfinite(x) and np.isfinite(d) else "–"
                                             for x, d in zip(t["law_score_statistic"], t["law_df"])]
        out[f"{name}: P1 p"] = t["law_p_value"]
        out[f"{name}: CV gain over depth only"] = t["law_cv_gain_vs_depth_only"]
        out[f"{name}: category share of the CV gain"] = t["law_cv_category_share"]
    return out


P1_TEXT = ("Universality (P1): does one category-free law hold in every category? Cluster-robust score test of the "
           "category rates and exponents of `law_exp_cat` against `law_exp` (χ² with 2(K − 1) df; small p: the "
           "categories differ beyond entropy), reported whether or not it rejects; category share of the CV gain = "
           "(CV log-loss of `law_exp` − of `law_exp_cat`) / (CV log-loss of acceptance by depth only − of "
           "`law_exp_cat`), grouped K-fold CV by request. The last columns: the same for the report's own law (the "
           "primary law unless chosen otherwise), category rates and exponents added to it (`with_category_terms`, "
           "at its fitted offset c where it profiles one).")
LOCO_TEXT = ("Leave-one-category-out accuracy across categories (the law fitted without each category predicts it): "
             "relative error of predicted vs observed (mean signed, mean and max |error|), Spearman ρ of predicted vs "
             "observed over the categories with its exact one-sided permutation p. Leak-free: the held-out category's "
             "drafted depths are predicted by a depth model fitted on the training categories (entropy at the round "
             "start, first round or later); replayed (where the runs hold proposals.parquet): the drafter's own "
             "proposal at every position, replayed from the prompt and the greedy output, no round's outcome; "
             "oracle depths: its own observed depths (uses the held-out outcome, not a "
             "transfer result). Depth-only control: acceptance per depth pooled over the training categories, no "
             "entropy, the same depth inputs and DP: what entropy adds is the gap to it. Last column: the old DP that "
             "assumes a full block every round.")


def results_markdown(analysis: TraceAnalysis, *, source: str = "") -> str:
    """The README results section: per-category table, the law per arm, and how it was made."""
    runs = analysis.runs
    model = ", ".join(sorted(runs["model_id"].astype(str).unique())) if "model_id" in runs else "?"
    replayed = runs.loc[runs["replayed"], "arm"].tolist()
    lines = ["## Results", "",
             f"Traces: `{source or 'the given trace set'}` — target `{model}`, "
             f"{analysis.view.requests['request_id'].nunique()} prompts in {len(analysis.categories)} categories, "
             f"arms: {', '.join(analysis.arms + analysis.ar_arms)}."
             + (f" Replayed offline from the same greedy outputs (no timings): {', '.join(replayed)}." if replayed else ""),
             "", "**When drafting pays** (measured: paired with AR on the same prompts; predicted: the fitted law and "
             "the cost model):", "", *[f"- `{line.strip()}`" if line.startswith("    ") else f"- {line}"
                                       for line in answer_lines(analysis)],
             "", markdown_table(results_frame(analysis)), "",
             "τ: accepted drafts per drafting round; tokens / round: committed tokens per verify pass (prefill excluded); "
             "law / LOCO: the fitted law's exact DP prediction on the same entropy sequences, with acceptance capped at "
             "each round's drafted depth (observed where a round started, else the category's depth distribution at "
             "that entropy; LOCO: law fitted without that category); LOCO mean accepted τ: predicted (tokens − rounds) "
             "/ drafting rounds; speedup: decode time per token of our AR baseline over the arm's, "
             "on the same prompts, on the CPU clock where the traces carry it (– where the arm was replayed or no AR "
             "run exists; \"not measured (N requests)\" by the demo's verdict rule, `category_verdict`: fewer than "
             f"{MIN_PAIRED_REQUESTS} paired prompts or an upper end more than {MAX_INTERVAL_RATIO:g}× the lower; never "
             "above the physical bound, tokens per round × c(1)/c(N+1)); paired requests: how many prompts both "
             "decoded.", "",
             f"Fitted law `{analysis.family}` ({get_family(analysis.family).description}; k and λ at depth 1 "
             "as `FittedLaw.derived` gives them, docs/law.md" + (
                 "; k is the exponent of H at fixed p₁ and w that of 1 − p₁, so a negative k does not make the "
                 "acceptance at entropy H alone rise: that answer is the steady state's, nonincreasing in H"
                 if get_family(analysis.family).needs_target_top1 else "")
             + "), 95% intervals clustered by request (CR1 "
             "sandwich, t with requests − 1 degrees of freedom); break-even entropy where the predicted decode "
             "speedup is 1 (request bootstrap); requests: how many requests each interval rests on (fewer than "
             f"{FEW_REQUESTS}: not measured reliably).", "",
             markdown_table(law_frame(analysis)), ""]
    few = few_requests_notes(analysis)
    lines += [f"- {n}" for n in few] + ([""] if few else [])
    p1 = analysis.attempt("universality_table")
    if p1.ok:
        lines += [P1_TEXT, "", markdown_table(universality_frame(analysis)), ""]
    else:
        lines += [f"Universality (P1): {p1.error}", ""]
    loco = analysis.attempt("loco_accuracy")
    if loco.ok:
        lines += [LOCO_TEXT, "", markdown_table(loco_accuracy_frame(analysis)), ""]
    lines.append(f"Made with `entropy-law report {source or 'TRACES'} --results-md FILE` "
                 "(entropy_law.jobs.report.results_markdown).")
    return "\n".join(lines) + "\n"


def _sections(analysis: TraceAnalysis):
    """(title, DataFrame or text) pairs of the report body, errors collected as notes."""
    notes = few_requests_notes(analysis)

    def attempt(*what):  # the analysis' value, or None with the reason among the notes
        result = analysis.attempt(*what)
        if not result.ok:
            notes.append(result.error)
        return result.value if result.ok else None

    answer = answer_lines(analysis)
    if answer:
        yield "When drafting pays (the answer)", answer
    runs, req = analysis.runs, analysis.view.requests.groupby("run_id").size().rename("requests")
    cols = [c for c in ("run_id", "arm", "model_id", "machine", "tree_policy", "replayed", "timed", "status")
            if c in runs]
    yield "Runs", runs[cols].merge(req, left_on="run_id", right_index=True, how="left")
    yield "Results per category", results_frame(analysis)
    yield "Fitted law per arm", law_frame(analysis)
    if attempt("universality_table") is not None:
        yield "Universality (P1) and the category share of the CV gain", universality_frame(analysis)
        notes.append(P1_TEXT)
    if attempt("loco_accuracy") is not None:
        yield "Leave-one-category-out accuracy across categories (leak-free and oracle depths, depth-only control)", \
            loco_accuracy_frame(analysis)
        notes.append(LOCO_TEXT)
    # per-request intervals and reliability (payoff.predict); GLANCE's law beside ours, LOCO per round (plots.glance)
    for section in (request_prediction_section, glance_section):
        title, frame, extra = section(analysis)
        yield title, frame
        notes.extend(extra)
    for arm in analysis.arms:
        for depths in analysis.loco_depths:
            if (loco := attempt("loco", arm, depths)) is not None:
                yield f"Leave-one-category-out transfer, {LOCO_DEPTH_LABELS[depths]}: {arm}", loco.summary.reset_index()
        if (comp := attempt("comparison", arm)) is not None:
            yield f"Law comparison (CV log-loss per trial): {arm}", comp.summary.reset_index()
            notes.extend(f"{arm}: {n}" for n in comp.notes)
        if (work := attempt("workload", arm)) is not None:
            yield (f"When drafting pays on a workload: {arm} (each request priced on its own entropy sequence; "
                   f"{work.verdict})", work.summary.reset_index()
                   .rename(columns={"index": "quantity", "n_requests": "requests"}))
            notes.extend(f"{arm}, workload: {n}" for n in work.notes)
        if (pays := attempt("pays", arm)) is not None:  # the requests the bootstrap resampled beside its interval
            yield (f"When drafting pays at constant entropy: {arm}", pays.summary.reset_index()
                   .rename(columns={"index": "quantity", "n_requests": "requests"}))
    check = analysis.attempt("speedup_validation")
    if check.ok:
        yield "Predicted vs measured speedup (same requests)", check.value
        notes.extend(check.value.attrs.get("notes", []))
    if (crossing := attempt("crossing_table")) is not None:
        yield ("Break-even vs where measured per-request speedups cross 1: the workload break-even and the measured "
               "log-speedup line on the request's mean entropy (one scale); the logistic crossing and the "
               "constant-entropy break-even beside them"), crossing
    for arm in analysis.arms:
        notes.extend(analysis.machine_warnings(arm))
    if (speed := attempt("measured_speedups")) is not None:  # why the arms without a speedup have none
        notes.extend(speed.attrs.get("notes", []))
    yield "Notes", notes


def write_report(traces, out_dir, *, fmt: str = "html", analysis: TraceAnalysis | None = None, source: str = "",
                 progress: bool = False, figure_formats=("png", "pdf"), **analysis_options) -> Path:
    """Write the report of ``traces`` into ``out_dir`` (figures also under ``out_dir/figures``); returns its path."""
    from entropy_law.plots.gallery import FIGURES, make_figures

    if fmt not in ("html", "md", "markdown"):
        raise ValueError(f"fmt must be 'html' or 'md', got {fmt!r}")
    analysis = analysis or TraceAnalysis(traces, **analysis_options)
    out_dir = Path(out_dir)
    written = make_figures(analysis, out_dir / "figures", formats=figure_formats, progress=progress)
    sections = list(_sections(analysis))
    figures = [(FIGURES[name].title, name, paths) for name, paths in written.items()]
    return _write_page(out_dir, fmt, f"entropy-law report: {source or out_dir.name}",
                       f"law family {analysis.family}, seed {analysis.seed}, {analysis.n_boot} bootstrap replicates",
                       sections, figures)


def _write_page(out_dir: Path, fmt: str, title: str, header: str, sections, figures) -> Path:
    """``report.html`` (figures embedded) or ``report.md`` (PNGs beside it) in ``out_dir``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        path = out_dir / "report.html"
        parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
                 "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
                 "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;"
                 "text-align:right}th{background:#f3f3f3}img{max-width:100%}</style></head><body>",
                 f"<h1>{html.escape(title)}</h1><p>generated {stamp}; {html.escape(header)}</p>"]
        for name, body in sections:
            parts.append(f"<h2>{html.escape(name)}</h2>")
            if isinstance(body, pd.DataFrame):
                parts.append(body.to_html(index=False, float_format=lambda v: _fmt(v, 4), na_rep="–"))
            else:
                parts.append("<ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in body) + "</ul>"
                             if body else "<p>none</p>")
        parts.append("<h2>Figures</h2>")
        for fig_title, name, paths in figures:
            png = next(p for p in paths if p.suffix == ".png")
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            parts.append(f"<h3>{html.escape(fig_title)}</h3><img alt='{name}' src='data:image/png;base64,{data}'>")
        parts.append("</body></html>")
        path.write_text("\n".join(parts), encoding="utf-8")
    else:
        path = out_dir / "report.md"
        parts = [f"# {title}", "", f"generated {stamp}; {header}", ""]
        for name, body in sections:
            parts += [f"## {name}", ""]
            if isinstance(body, pd.DataFrame):
                parts.append(markdown_table(body, digits=4))
            else:
                parts += [f"- {n}" for n in body] if body else ["none"]
            parts.append("")
        parts += ["## Figures", ""]
        for fig_title, name, paths in figures:
            png = next(p for p in paths if p.suffix == ".png")
            parts += [f"### {fig_title}", "", f"![{name}]({png.relative_to(out_dir).as_posix()})", ""]
        path.write_text("\n".join(parts), encoding="utf-8")
    return path


OUT_OF_CORE_COLUMNS = {
    "drafter_id": "arm", "category": "category", "requests": "requests", "tokens": "tokens",
    "mean_entropy_nats": "mean H (nats)", "mean_accepted": "mean accepted τ", "tokens_per_round": "tokens / round",
    "d1_acceptance": "depth-1 acceptance", "d1_trials": "depth-1 trials",
}
NOT_OUT_OF_CORE = ("not in an out-of-core report, because they need the rows in memory: the measured speedup and the "
                   "cost model (when drafting pays, the break-even entropy), leave-one-category-out transfer, the CV "
                   "law comparison, universality (P1), per-request prediction intervals, GLANCE's law beside ours, "
                   "the median entropy and the gallery's other figures. Run `entropy-law report` without "
                   "--out-of-core on a subset of the runs that fits in memory for them")


def out_of_core_law_frame(laws: dict) -> pd.DataFrame:
    """Per arm of ``laws`` (``FittedLaw`` or its failure's text): family, k, lambda at depth 1, trials, requests."""
    rows = []
    for arm, law in laws.items():
        if isinstance(law, str):
            rows.append({"arm": arm, "family": "n/a", "k (95% CI)": "n/a", "λ at depth 1 (95% CI)": "n/a",
                         "at-risk trials": np.nan, "requests": np.nan, "note": law})
            continue
        d = law.derived

        def interval(key):
            if key not in d.index:
                return "n/a"
            return format_interval(float(d.loc[key, "estimate"]), float(d.loc[key, "ci_low"]),
                                   float(d.loc[key, "ci_high"]))

        w = {"w: exponent of 1 − p₁ (95% CI)": interval("w")} if "w" in d.index else {}
        rows.append({"arm": arm, "family": law.family.name, "k (95% CI)": interval("k"), **w,
                     "λ at depth 1 (95% CI)": interval(f"lambda[d={law.depths[0]}]"), "at-risk trials": law.n_rows,
                     "requests": law.n_requests, "note": ""})
    return pd.DataFrame(rows)


def _runs_out_of_core(traces) -> pd.DataFrame:
    """One row per run from its ``run.json`` only (id, arm, model, tree policy, status, shards)."""
    from entropy_law.law.arms import run_arms
    from entropy_law.traces.reader import load_traces

    runs = (traces if hasattr(traces, "runs") else load_traces(traces, validate=False)).runs
    out = runs.assign(arm=run_arms(runs)["arm"].to_numpy())
    return out[[c for c in ("run_id", "arm", "model_id", "tree_policy", "status", "shards") if c in out]]


def write_report_out_of_core(traces, out_dir, *, fmt: str = "html", family: str | None = None, source: str = "",
                             figure_formats=("png", "pdf"), threads: int | None = None,
                             memory_limit: str | None = None, temp_directory: str | None = None) -> Path:
    """The report of runs larger than memory, from every row without holding the rows (DuckDB over groups of
    shards; ``threads``, ``memory_limit``, ``temp_directory``: its settings). ``traces``: a run directory, a folder
    of runs or a ``TraceSet``; ``family``: default ``PRIMARY_FAMILY``, else ``PRIMARY_FALLBACK`` (noted). What it
    leaves out: ``NOT_OUT_OF_CORE``. Returns the page's path."""
    from entropy_law.law.fit import PRIMARY_FALLBACK, PRIMARY_FAMILY
    from entropy_law.outofcore import fit_law_out_of_core, report_summaries_sql

    if fmt not in ("html", "md", "markdown"):
        raise ValueError(f"fmt must be 'html' or 'md', got {fmt!r}")
    defaulted, family = family is None, family or PRIMARY_FAMILY
    duck = dict(by_arm=True, threads=threads, memory_limit=memory_limit, temp_directory=temp_directory)
    out_dir = Path(out_dir)
    summary, curve = report_summaries_sql(traces, **duck)  # one read of the shards for both
    drafting = [a for a, part in summary.groupby("drafter_id", sort=False) if part["drafting_rounds"].sum() > 0]
    laws, notes = {}, [f"out of core: every number here comes from all {int(summary['tokens'].sum()):,} committed "
                       f"tokens of {int(summary['requests'].sum()):,} requests, aggregated by DuckDB over the Parquet "
                       "shards a group at a time; the laws fitted by streamed IRLS with request-clustered (CR1) "
                       "errors (docs/out-of-core.md)"]
    for arm in drafting:
        try:
            try:
                law = fit_law_out_of_core(traces, family, drafters=[arm], **duck)
            except ValueError as err:
                if not defaulted:
                    raise
                # the primary reads the target's top-1 probability, which imported logs lack: the fallback law
                law = fit_law_out_of_core(traces, PRIMARY_FALLBACK, drafters=[arm], **duck)
                notes.append(f"{arm}: law {PRIMARY_FALLBACK}, not the primary {PRIMARY_FAMILY} ({err})")
            laws[arm] = law
            notes.extend(f"{arm}: {n}" for n in law.notes)
        except ValueError as err:  # too few requests, invalid covariates: said, not raised
            laws[arm] = f"not fitted: {err}"
    written = _out_of_core_figure(curve, drafting, laws, out_dir, figure_formats)
    table = summary.loc[:, list(OUT_OF_CORE_COLUMNS)].rename(columns=OUT_OF_CORE_COLUMNS)
    notes.append(NOT_OUT_OF_CORE)
    sections = [("Runs", _runs_out_of_core(traces)), ("Results per category (out of core)", table),
                (f"Fitted law per arm (out of core, {family})", out_of_core_law_frame(laws)), ("Notes", notes)]
    figures = [("Depth-1 acceptance vs target entropy per category (log-spaced bins, Wilson 95%), fitted law",
                "acceptance_out_of_core", written)]
    return _write_page(out_dir, fmt, f"entropy-law report (out of core): {source or out_dir.name}",
                       f"law family {family}; out of core (DuckDB over the shards)", sections, figures)


def _out_of_core_figure(curve: pd.DataFrame, drafting: list, laws: dict, out_dir: Path, formats) -> list:
    """One panel per drafting arm: its depth-1 acceptance per entropy bin with its fitted law; the paths written."""
    import matplotlib.pyplot as plt

    from entropy_law.plots.figures import binned_acceptance
    from entropy_law.plots.style import save_figure, unavailable

    ncols = min(max(len(drafting), 1), 3)
    nrows = -(-max(len(drafting), 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows + 0.4), squeeze=False)
    for ax in axes.ravel()[max(len(drafting), 1):]:
        ax.set_visible(False)
    for ax, arm in zip(axes.ravel(), drafting or [None]):
        part = curve.loc[curve["drafter_id"] == arm] if arm is not None else curve.iloc[:0]
        law = laws.get(arm)
        if part.empty:
            unavailable(ax, "no depth-1 trials with a finite target entropy (an imported run: entropy-law "
                            "entropy fills it in)")
            continue
        h_range = (float(part["entropy_nats"].min()), float(part["entropy_nats"].max()))
        binned_acceptance(part, law=law if not isinstance(law, str) else None, h_range=h_range, ax=ax)
        ax.set_title(arm)
    labelled = {}
    for ax in axes.ravel():  # one legend for the figure, below the panels, instead of one over each panel's data
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if labelled:
        fig.legend(list(labelled.values()), list(labelled), loc="lower center", ncol=min(len(labelled), 6),
                   frameon=False, fontsize=8)
        fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))
    written = save_figure(fig, out_dir / "figures", "acceptance_out_of_core", formats=formats)
    plt.close(fig)
    return written


def terminal_summary(analysis: TraceAnalysis, measured: pd.DataFrame | None = None, *, loaded: bool = False) -> str:
    """The demo's closing summary: where drafting pays, per arm and category the mean entropy, tokens per round and
    speedup (``measured``: ``jobs.speed.paired_speedups`` rows, else the traces' own), the fitted law."""
    table = analysis.results_table()
    speeds = analysis.attempt("measured_speedups")
    cells = measured if measured is not None else speeds.value if speeds.ok else None
    reference = set(analysis.ar_arms)
    lines = ["When drafting pays (measured: paired with AR on the same prompts; predicted: the fitted law and the "
             "cost model):"]
    lines += [f"  {line}" for line in answer_lines(analysis, measured, loaded=loaded)] + [""]
    for arm, part in table.groupby("arm", sort=False):
        lines.append(f"{arm}:")
        lines.append(f"  {'category':<16}{'mean H (nats)':>14}{'tokens/round':>14}   speedup vs AR")
        for r in part.itertuples():
            lines.append(f"  {r.category:<16}{_fmt(r.mean_entropy_nats):>14}{_fmt(r.committed_per_round):>14}"
                         f"   {'(the reference)' if arm in reference else _speedup_cell(r, cells)}")
    lines += ["", f"fitted law {analysis.family} ({get_family(analysis.family).description}), 95% intervals"]
    for r in law_frame(analysis).to_dict("records"):
        at_p1 = (f" at fixed p1, w = {r['w: exponent of 1 − p₁ (95% CI)']}" if "w: exponent of 1 − p₁ (95% CI)" in r
                 else "")
        lines.append(f"  {r['arm']}: k = {r['k (95% CI)']}{at_p1}, lambda[d=1] = {r['λ at depth 1 (95% CI)']}"
                     f"{_requests(r['requests'])}; drafting {r['drafting pays (workload)']}; at constant entropy "
                     f"{r['drafting pays (constant H)']}{_requests(r['break-even: requests'])}")
    lines += [f"  note: {n}" for n in few_requests_notes(analysis)]
    return "\n".join(lines)


def _speedup_cell(row, measured: pd.DataFrame | None) -> str:
    if measured is None:
        return "–"
    match = measured.loc[(measured["arm"] == row.arm) & (measured["category"] == row.category)]
    if match.empty:
        return "not measured"
    m = match.iloc[0]
    got = speedup_text(m["speedup"], m["lo"], m["hi"], m["requests"], m["verdict"], m.get("timed_together") is False)
    return f"{got} ({m['requests']} requests)" if got.endswith("]") else _fmt(got)


def _requests(n) -> str:
    return f" (n = {int(n)} requests)" if np.isfinite(n) else ""

"""Measured decode speedups of an analysed trace set, and the prediction checked against them.

Timed arm requests are paired with timed AR requests of the same model, machine and prompts (``paired_requests``,
CPU clock where every pair has it). Each function takes ``an``, a ``TraceAnalysis`` (never imported).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from entropy_law.law.results import Attempt
from entropy_law.payoff.cost import UNRELIABLE, paired_speedup_interval, pooled_log_speedup_sd, speed_verdict

SPEEDUP_COLUMNS = ["arm", "category", "requests", "ar_ms_per_token", "arm_ms_per_token", "speedup", "lo", "hi",
                   "clock", "tokens_per_round", "bound", "verdict", "timed_together"]
TOGETHER_OVERLAP = 0.5  # time windows of an arm's run and its AR run: overlap / union at least this: timed together
SPEEDUP_BOOT = 2000  # request-bootstrap replicates of a measured speedup's interval (cheap: sums of arrays)


def paired_requests(an, arm: str) -> pd.DataFrame:
    """One row per (run, request) of the arm paired with its AR request: ``category``, ``decoded`` / ``ar_decoded``,
    ``ms`` / ``ar_ms`` (on ``attrs["clock"]``, "cpu" or "wall"), ``rounds``, ``verify_cost`` and ``mean_entropy_nats``.
    Raises, saying why, where nothing pairs."""
    def compute():
        req = an.view.requests.merge(an.runs[["run_id", "arm", "is_ar", "timed", "machine"]], on="run_id")
        req = req.loc[req["timed"]].assign(decoded=(req["new_tokens"] - 1).clip(lower=0))
        if "decode_cpu_ms" not in req:
            req["decode_cpu_ms"] = np.nan
        mine = req.loc[(req["arm"] == arm) & ~req["is_ar"]]
        if mine.empty:
            raise ValueError(f"arm {arm!r} has no timed run (replayed offline, 0 ms): no timings, no measured "
                             "speedup")
        keys = ["machine", "request_id"]
        ar = req.loc[req["is_ar"]].groupby(keys, as_index=False).agg(
            ar_decoded=("decoded", "sum"), ar_wall=("decode_ms", "sum"),
            ar_cpu=("decode_cpu_ms", lambda v: v.sum() if v.notna().all() else np.nan))
        paired = mine.drop(columns=["rounds"], errors="ignore").merge(ar, on=keys)  # rounds: counted below
        if paired.empty:
            here = "; ".join(sorted(set(req.loc[req["is_ar"], "machine"]))) or "none"
            raise ValueError(f"arm {arm!r}: no timed AR run of the same model and machine "
                             f"({'; '.join(sorted(set(mine['machine'])))}) decoded its prompts, so its speedup is "
                             f"not computed (timed AR runs here: {here}); record AR with that model on that "
                             "machine (entropy-law record --drafter ar)")
        cpu = bool(paired["decode_cpu_ms"].notna().all() and paired["ar_cpu"].notna().all())
        rounds = an.view.rounds.loc[an.view.rounds["run_id"].isin(set(paired["run_id"]))
                                      & (an.view.rounds["round_index"] > 0)]
        curves = dict(zip(an.runs["run_id"], an.runs["verify_cost"])) if "verify_cost" in an.runs else {}
        rounds = rounds.assign(cost=[_verify_cost(curves.get(r), n + 1)
                                     for r, n in zip(rounds["run_id"], rounds["tree_nodes"])])
        per_round = rounds.groupby(["run_id", "request_id"], as_index=False).agg(
            rounds=("round_index", "size"), verify_cost=("cost", "sum"))
        entropy = an.view.tokens.groupby(["run_id", "request_id"], as_index=False, observed=True).agg(
            mean_entropy_nats=("target_entropy_nats", "mean"))
        out = paired.merge(per_round, on=["run_id", "request_id"], how="left").merge(
            entropy, on=["run_id", "request_id"], how="left")
        out = out.assign(ms=out["decode_cpu_ms"] if cpu else out["decode_ms"],
                         ar_ms=out["ar_cpu"] if cpu else out["ar_wall"])
        out = out[["run_id", "request_id", "category", "machine", "decoded", "ms", "ar_decoded", "ar_ms",
                   "rounds", "verify_cost", "mean_entropy_nats"]].reset_index(drop=True)
        out.attrs["clock"] = "cpu" if cpu else "wall"
        return out

    return an._cached(("paired", arm), compute)


def request_speedups(an, arm: str) -> pd.DataFrame:
    """``paired_requests`` with each request's measured ``speedup`` (AR ms per token / the arm's)."""
    paired = an.paired_requests(arm)
    ok = (paired["decoded"] > 0) & (paired["ar_decoded"] > 0) & (paired["ms"] > 0)
    out = paired.loc[ok].assign(speedup=(paired["ar_ms"] / paired["ar_decoded"])
                                / (paired["ms"] / paired["decoded"]))
    out.attrs["clock"] = paired.attrs["clock"]
    return out.reset_index(drop=True)


def timed_together(an, arm: str) -> tuple[bool | None, str]:
    """``(together, why)``: whether every timed run of ``arm`` has an AR run on its machine that overlaps it by
    ``TOGETHER_OVERLAP`` of their union; None where runs do not say when they ran."""
    runs = an.runs
    if "start_time" not in runs or "end_time" not in runs:
        return None, "the runs do not record start_time / end_time: not checked"
    mine = runs.loc[(runs["arm"] == arm) & runs["timed"] & ~runs["is_ar"]]
    ar = runs.loc[runs["is_ar"] & runs["timed"] & runs["machine"].isin(set(mine["machine"]))]

    def window(r):
        start, end = pd.to_datetime(r["start_time"], utc=True, errors="coerce"), pd.to_datetime(
            r["end_time"], utc=True, errors="coerce")
        return (start, end) if pd.notna(start) and pd.notna(end) and end >= start else None

    worst = None
    for _, r in mine.iterrows():
        w = window(r)
        if w is None:
            return None, f"run {r['run_id']} does not record when it ran: not checked"
        best = 0.0
        for _, a in ar.loc[ar["machine"] == r["machine"]].iterrows():
            v = window(a)
            if v is None:
                return None, f"AR run {a['run_id']} does not record when it ran: not checked"
            overlap = (min(w[1], v[1]) - max(w[0], v[0])).total_seconds()
            union = (max(w[1], v[1]) - min(w[0], v[0])).total_seconds()
            best = max(best, max(overlap, 0.0) / union if union > 0 else 1.0)
        worst = best if worst is None else min(worst, best)
    if worst is None:
        return None, "no timed run pairs with an AR run: not checked"
    if worst >= TOGETHER_OVERLAP:
        return True, f"timed together (time windows overlap {worst:.0%} of their union)"
    return False, (f"{arm}: timed apart from its AR run (their time windows overlap {worst:.1%} of their union; "
                   f"record both in one run, interleaved: entropy-law record with several arms): its speedups are "
                   "not measured reliably")


def speedup(an, arm: str) -> pd.DataFrame:
    """Measured decode speedup of one arm over AR per category on its paired requests, with ``lo`` / ``hi``
    (``cost.paired_speedup_interval``), the physical ``bound`` and ``verdict`` (``cost.speed_verdict``; not reliable
    where timed apart from AR). Only "measured" is a result."""
    def compute():
        paired = an.paired_requests(arm)
        together, _ = an.timed_together(arm)
        rng = np.random.default_rng(an.seed)
        rows = []
        pooled = pooled_log_speedup_sd(paired["ar_ms"], paired["ar_decoded"], paired["ms"], paired["decoded"],
                                       paired["category"])
        for cat, part in paired.groupby("category"):
            a_ms, a_n = part["ms"].to_numpy(float), part["decoded"].to_numpy(float)
            r_ms, r_n = part["ar_ms"].to_numpy(float), part["ar_decoded"].to_numpy(float)
            arm_ms = a_ms.sum() / max(a_n.sum(), 1)
            ar_ms = r_ms.sum() / max(r_n.sum(), 1)
            speedup = ar_ms / arm_ms if arm_ms > 0 else np.nan
            lo = hi = np.nan
            if arm_ms > 0:
                lo, hi = paired_speedup_interval(r_ms, r_n, a_ms, a_n, rng=rng, n_boot=SPEEDUP_BOOT,
                                                 pooled=pooled)
            n_rounds, cost = part["rounds"].sum(), part["verify_cost"].sum()
            per_round = a_n.sum() / n_rounds if n_rounds else np.nan
            bound = per_round * n_rounds / cost if n_rounds and cost else per_round
            rows.append(dict(arm=arm, category=cat, requests=len(part), ar_ms_per_token=ar_ms,
                             arm_ms_per_token=arm_ms, speedup=speedup, lo=float(lo), hi=float(hi),
                             clock=paired.attrs["clock"], tokens_per_round=per_round, bound=bound,
                             verdict=(speed_verdict(speedup, lo, hi, bound, len(part)) if together is not False
                                      else UNRELIABLE), timed_together=together))
        return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)

    return an._cached(("speedup", arm), compute)


def measured_speedups(an) -> pd.DataFrame:
    """``speedup`` of every arm that has one, stacked; why others have none: ``attrs["notes"]``."""
    def compute():
        frames, reasons = [], []
        for arm in an.arms:
            try:
                frames.append(an.speedup(arm))
            except ValueError as err:
                reasons.append(str(err))
                continue
            together, why = an.timed_together(arm)
            if together is False:
                reasons.append(why)
        if not frames:
            raise ValueError("no measured speedup: " + ("; ".join(reasons) or "no drafting arm"))
        out = pd.concat(frames, ignore_index=True)
        out.attrs["notes"] = reasons
        return out

    return an._cached("speedups", compute)


def speedup_validation(an) -> pd.DataFrame:
    """The prediction against the measurement per drafting arm and category on the same requests: ``predicted`` (DP
    tokens per round x t_AR / t_round(N)), ``speedup``'s columns, ``relative_error``, ``within_10pct``,
    ``inside_interval``, ``cost_only_*`` (``cost_error``) and ``status``. Raises only where no arm has a prediction;
    ``attrs["notes"]`` says why."""
    def compute():
        results = an.results_table().set_index(["arm", "category"])
        rows, notes = [], []
        for arm in an.arms:
            timed = bool(an.runs.loc[an.runs["arm"] == arm, "timed"].any())
            measured = an.attempt("speedup", arm)
            pays = an.attempt("pays", arm) if timed else Attempt(error="no timings")
            if not measured.ok and measured.error not in notes:
                notes.append(measured.error)
            if timed and not pays.ok:
                notes.append(pays.error)
            status = ("compared" if measured.ok and pays.ok else "no timings: predicted only" if not timed
                      else "no AR arm: predicted only" if not an.has_ar else "measured only" if measured.ok
                      else "predicted only")
            nodes_of, priced = {}, {}
            if pays.ok:
                view = an.cost_view(arm)
                rounds = view.rounds.merge(view.runs[["run_id", "arm"]], on="run_id").merge(
                    view.requests[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
                nodes_of = rounds.loc[rounds["arm"] == arm].groupby("category")["tree_nodes"].mean().to_dict()
                cost_only = an.attempt("cost_error", arm)  # the recorded rounds, priced per request
                if cost_only.ok:
                    priced = cost_only.value.set_index("category")["priced"].to_dict()
                elif cost_only.error not in notes:
                    notes.append(cost_only.error)
            m = measured.value.set_index("category") if measured.ok else None
            for cat in an.categories:
                if (arm, cat) not in results.index:
                    continue
                per_round = float(results.loc[(arm, cat), "law_tokens_per_round"])
                observed = float(results.loc[(arm, cat), "committed_per_round"])
                predicted = np.nan
                if pays.ok and cat in nodes_of:
                    cost = pays.value.cost
                    predicted = per_round * cost.ar_ms_per_token / float(cost.round_ms(nodes_of[cat]))
                cost_only = priced.get(cat, np.nan)
                row = dict(arm=arm, category=cat, status=status, predicted_tokens_per_round=per_round,
                           observed_tokens_per_round=observed, predicted=predicted,
                           cost_only_predicted=cost_only, requests=0, measured=np.nan, lo=np.nan, hi=np.nan,
                           clock=None, verdict=None)
                if m is not None and cat in m.index:
                    r = m.loc[cat]
                    row.update(requests=int(r["requests"]), measured=float(r["speedup"]), lo=float(r["lo"]),
                               hi=float(r["hi"]), clock=r["clock"], verdict=r["verdict"])
                rows.append(row)
        if not rows:
            raise ValueError("no arm has a law prediction: " + "; ".join(notes))
        out = pd.DataFrame(rows)
        out["relative_error"] = out["predicted"] / out["measured"] - 1
        out["cost_only_error"] = out["cost_only_predicted"] / out["measured"] - 1
        out["within_10pct"] = out["relative_error"].abs() <= 0.10
        out["inside_interval"] = (out["predicted"] >= out["lo"]) & (out["predicted"] <= out["hi"])
        unknown = out["measured"].isna() | out["predicted"].isna()
        out["within_10pct"] = out["within_10pct"].astype(object).where(~unknown, None)
        out["inside_interval"] = out["inside_interval"].astype(object).where(~unknown, None)
        out.attrs["notes"] = notes
        return out

    return an._cached("speedup_validation", compute)


def speedup_crossing(an, arm: str) -> dict:
    """Where ``arm``'s per-request speedups cross 1 (``crossing_nats``, logistic regression of speedup > 1 on the
    request's mean entropy; NaN with a ``reason``) against ``pays``' break-even (``inside``), and on the request-mean
    scale ``workload_*`` and ``measured_line*`` with both verdicts in words."""
    def compute():
        import statsmodels.api as sm

        req = an.request_speedups(arm)
        y = (req["speedup"] > 1).to_numpy(int)
        h = req["mean_entropy_nats"].to_numpy(float)
        out = dict(arm=arm, requests=len(req), clock=req.attrs["clock"], share_above_1=float(y.mean()),
                   crossing_nats=np.nan, slope=np.nan, reason="", breakeven=np.nan, breakeven_low=np.nan,
                   breakeven_high=np.nan, inside=None)
        if y.min() == y.max():
            out["reason"] = f"every request {'above' if y[0] else 'below'} 1: no crossing in the observed entropies"
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fit = sm.Logit(y, sm.add_constant(h)).fit(disp=0, maxiter=200)
                b0, b1 = (float(v) for v in fit.params)
                lo_h, hi_h = float(h.min()), float(h.max())
                if not (np.isfinite(b0) and np.isfinite(b1)) or b1 == 0:
                    out["reason"] = "the logistic fit did not converge"
                elif b1 > 0:
                    out["reason"] = "speedup > 1 grows more likely with entropy: no break-even crossing"
                else:
                    out.update(crossing_nats=-b0 / b1, slope=b1)
                    if not lo_h <= -b0 / b1 <= hi_h:
                        out["reason"] = f"crossing outside the observed mean entropies [{lo_h:.2f}, {hi_h:.2f}]"
            except Exception as err:  # perfect separation and other degenerate fits
                out["reason"] = f"logistic fit failed: {type(err).__name__}: {err}"
        pays = an.attempt("pays", arm)
        if pays.ok:
            r = pays.value.summary.loc["breakeven_entropy_nats"]
            out.update(breakeven=float(r["estimate"]), breakeven_low=float(r["ci_low"]),
                       breakeven_high=float(r["ci_high"]))
            if np.isfinite(out["crossing_nats"]) and np.isfinite(out["breakeven_low"]):
                out["inside"] = bool(out["breakeven_low"] <= out["crossing_nats"] <= out["breakeven_high"])
        else:
            out["reason"] = "; ".join(x for x in (out["reason"], pays.error) if x)
        out.update(workload_breakeven=np.nan, workload_low=np.nan, workload_high=np.nan, measured_line=np.nan,
                   measured_line_low=np.nan, measured_line_high=np.nan, workload_ok=False, workload_inside=None,
                   workload_agree=None, workload_verdict="not computed", measured_line_verdict="not computed")
        work = an.attempt("workload", arm)
        if work.ok:
            w = work.value.summary
            out.update(workload_ok=True, workload_breakeven=float(w.loc["workload_breakeven_nats", "estimate"]),
                       workload_low=float(w.loc["workload_breakeven_nats", "ci_low"]),
                       workload_high=float(w.loc["workload_breakeven_nats", "ci_high"]),
                       workload_inside=work.value.inside, workload_agree=work.value.agree,
                       workload_verdict=work.value.verdict, measured_line_verdict=work.value.measured_verdict)
            if "measured_crossing_nats" in w.index:
                out.update(measured_line=float(w.loc["measured_crossing_nats", "estimate"]),
                           measured_line_low=float(w.loc["measured_crossing_nats", "ci_low"]),
                           measured_line_high=float(w.loc["measured_crossing_nats", "ci_high"]))
        else:
            out["workload_verdict"] = work.error
        return out

    return an._cached(("crossing", arm), compute)


def crossing_table(an) -> pd.DataFrame:
    """``speedup_crossing`` of every arm with a measured speedup (raises where none has one)."""
    rows, errors = [], []
    for arm in an.arms:
        got = an.attempt("speedup_crossing", arm)
        if got.ok:
            rows.append(got.value)
        else:
            errors.append(got.error)
    if not rows:
        raise ValueError("no arm has measured per-request speedups: " + "; ".join(errors))
    return pd.DataFrame(rows)


def _verify_cost(curve, n_tokens: int) -> float:
    """c(n) of a run's stored verify-cost curve, as ``decoding.gate.VerifyCost``; 1 without a curve."""
    if not isinstance(curve, dict) or not curve.get("sizes"):
        return 1.0
    sizes, costs = np.asarray(curve["sizes"], float), np.asarray(curve["costs"], float)
    if len(sizes) == 1:
        return float(costs[0])
    i = int(np.clip(np.searchsorted(sizes, n_tokens), 1, len(sizes) - 1))
    return float(costs[i - 1] + (costs[i] - costs[i - 1]) * (n_tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1]))

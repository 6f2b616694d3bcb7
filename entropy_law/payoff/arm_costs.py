"""What one timed arm of an analysed trace set costs, and whether drafting pays there or on a new workload.

An arm is priced on one machine with the AR runs of its model and machine (``cost_view``): ``pays``, the workload
break-even (``workload``), the cost model's own error (``cost_error``, ``cost_model_error``, ``variant_error``) and
``predict`` on a workload the arm never decoded. Each function takes ``an``, a ``TraceAnalysis`` (never imported).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from entropy_law.law.atrisk import sequences_of
from entropy_law.law.transfer import UNMEASURED_TRANSFER_ERROR
from entropy_law.law.view import TraceView, model_name, truthy
from entropy_law.payoff.cost import (MIN_PAIRED_REQUESTS, UNMEASURED_COST_ERROR, priced_cost_model,
                                     unmeasured_cost_note, when_drafting_pays)
from entropy_law.payoff.workload import predict_workload, price_rounds, round_counts, workload_breakeven

PAYS_ENTROPIES = tuple(float(h) for h in np.round(np.geomspace(0.01, 5.0, 13), 4))  # nats, speedup curve grid


def timed_machines(an, arm: str) -> list[str]:
    """The machines ``arm``'s timed runs ran on; refuses an arm timed on several (its costs would pool)."""
    runs = an.runs
    timed = runs.loc[(runs["arm"] == arm) & runs["timed"]]
    if timed.empty:
        raise ValueError(f"arm {arm!r} has no timed run (its rounds were replayed offline, 0 ms): its speedup "
                         "needs an online run of that drafter")
    machines = list(dict.fromkeys(timed["machine"]))
    if len(machines) > 1:
        raise ValueError(f"arm {arm!r} was timed on {len(machines)} machines ({'; '.join(machines)}): one cost "
                         "model would pool them. Select one machine's runs with traces.filter(run_id=[...])")
    return machines


def ar_ms_per_token(an, arm: str | None = None) -> float:
    """AR decode cost per token: given, or decode ms / tokens after the prefill of the timed AR runs of ``arm``'s model
    and machine (``arm=None``: all AR runs, if on one machine)."""
    if an.given_ar_ms is not None:
        return float(an.given_ar_ms)
    req = an.view.requests.merge(an.runs[["run_id", "is_ar", "timed", "machine"]], on="run_id")
    ar = req.loc[req["is_ar"] & req["timed"]]
    if arm is not None:
        machines = timed_machines(an, arm)
        others = sorted(set(ar["machine"]) - set(machines))
        ar = ar.loc[ar["machine"].isin(machines)]
        where = f" of {machines[0]}"
        others = (f" (the AR runs of {'; '.join(others)} are no baseline for arm {arm!r})" if others else "")
    else:
        machines = sorted(set(ar["machine"]))
        if len(machines) > 1:
            raise ValueError(f"timed AR runs on {len(machines)} machines ({'; '.join(machines)}): pass arm= "
                             "to take the AR cost of that arm's model and machine")
        where, others = "", ""
    decoded = (ar["new_tokens"] - 1).clip(lower=0).sum()
    if ar.empty or decoded <= 0:
        raise ValueError(f"no timed autoregressive run{where} in the traces{others}: record one (entropy-law "
                         "record --drafter ar) with the same model on the same machine, or pass ar_ms_per_token=")
    return float(ar["decode_ms"].sum() / decoded)


def cost_view(an, arm: str) -> TraceView:
    """Timed runs of ``arm`` and of AR on its model and machine, prefill rounds dropped."""
    runs = an.runs
    machines = timed_machines(an, arm)
    ids = (list(runs.loc[(runs["arm"] == arm) & runs["timed"], "run_id"])
           + list(runs.loc[runs["is_ar"] & runs["timed"] & runs["machine"].isin(machines), "run_id"]))
    view = an.view.select_runs(ids)
    prefill = (view.rounds["round_index"] == 0) & (view.rounds["tree_nodes"] == 0) & (view.rounds["verify_ms"] == 0)
    view.rounds = view.rounds.loc[~prefill].reset_index(drop=True)
    return view


def cost_model(an, arm: str):
    """``arm``'s cost model (``cost.CostModel``) as ``predict`` prices with it."""
    def compute():
        ar_requests, ar_ms = _ar_inputs(an, arm)
        return priced_cost_model(an.cost_view(arm), drafter=arm, ar_requests=ar_requests, clock="auto",
                                 ar_ms_per_token=ar_ms)[0]

    return an._cached(("cost_model", arm), compute)


def ar_requests(an, arm: str) -> pd.DataFrame | None:
    """The timed AR requests on ``arm``'s machine (``request_id``, ``decode_ms``, ``decode_cpu_ms``, ``decoded``); None
    where t_AR is given or there is none."""
    if an.given_ar_ms is not None:
        return None
    machines = timed_machines(an, arm)
    req = an.view.requests.merge(an.runs[["run_id", "is_ar", "timed", "machine"]], on="run_id")
    ar = req.loc[req["is_ar"] & req["timed"] & req["machine"].isin(machines)]
    if ar.empty:
        return None
    if "decode_cpu_ms" not in ar:
        ar = ar.assign(decode_cpu_ms=np.nan)
    return ar.assign(decoded=(ar["new_tokens"] - 1).clip(lower=0))[
        ["request_id", "decode_ms", "decode_cpu_ms", "decoded"]]


def _ar_inputs(an, arm: str) -> tuple[pd.DataFrame | None, float | None]:
    """(the timed AR requests of ``arm``, t_AR where there are none): how every price of the arm takes t_AR."""
    ar_requests = an.ar_requests(arm)
    return ar_requests, None if ar_requests is not None else an.ar_ms_per_token(arm)


def machine_warnings(an, arm: str) -> list[str]:
    """A warning per ``device`` / ``cpu_count`` on which ``arm``'s timed runs and its AR runs disagree."""
    runs = an.runs
    try:
        machines = timed_machines(an, arm)
    except ValueError:
        return []
    mine = runs.loc[(runs["arm"] == arm) & runs["timed"]]
    ar = runs.loc[runs["is_ar"] & runs["timed"] & runs["machine"].isin(machines)]
    out = []
    for key in ("device", "cpu_count"):
        if key not in runs:
            continue
        a = sorted({str(v) for v in mine[key] if truthy(v)})
        b = sorted({str(v) for v in ar[key] if truthy(v)})
        if a and b and a != b:
            out.append(f"{arm}: cost measurements from another machine: the arm's runs record {key} "
                       f"{', '.join(a)}, the AR runs {', '.join(b)}; predictions mix the two")
    return out


def pays(an, arm: str):
    """``when_drafting_pays`` for one timed arm (its bootstrap resamples the AR requests too)."""
    def compute():
        view = an.cost_view(arm)
        ar_requests, ar_ms = _ar_inputs(an, arm)
        for message in an.machine_warnings(arm):
            warnings.warn(message, stacklevel=2)
        return when_drafting_pays(view, drafter=arm, family=an.family, ar_ms_per_token=ar_ms,
                                  ar_requests=ar_requests, entropies=PAYS_ENTROPIES, n_boot=an.n_boot,
                                  seed=an.seed)

    return an._cached(("pays", arm), compute)


def workload(an, arm: str, *, law=None, proposals: pd.DataFrame | None = None):
    """``workload.workload_breakeven`` for one timed arm (``law`` / ``proposals``: given, then not cached)."""
    def compute():
        view = an.cost_view(arm)
        ar_requests, ar_ms = _ar_inputs(an, arm)
        measured = an.attempt("request_speedups", arm)
        mine = None
        if proposals is not None:
            runs = set(view.runs.loc[view.runs["arm"] == arm, "run_id"].astype(str))
            mine = proposals.loc[proposals["run_id"].astype(str).isin(runs)]
        return workload_breakeven(view, drafter=arm, law=an.law(arm) if law is None else law,
                                  ar_ms_per_token=ar_ms, ar_requests=ar_requests,
                                  measured=measured.value if measured.ok else None, proposals=mine,
                                  n_boot=an.n_boot, seed=an.seed)

    if law is not None or proposals is not None:
        return compute()
    return an._cached(("workload", arm), compute)


def cost_error(an, arm: str, rounds_of: str | None = None) -> pd.DataFrame:
    """The cost model's own error: each category's recorded rounds priced by ``arm``'s cost model against its measured
    paired speedup (``requests``, ``measured``, ``priced``, ``relative_error``); ``attrs["max_abs_error"]`` over
    categories with ``MIN_PAIRED_REQUESTS`` pairs. ``rounds_of``: another arm whose rounds are priced instead."""
    source = arm if rounds_of is None else rounds_of

    def compute():
        measured = an.speedup(source).set_index("category")
        view = an.cost_view(arm)
        ar_requests, ar_ms = _ar_inputs(an, arm)
        counts = round_counts(an.cost_view(source), source)
        priced = price_rounds(view, counts, drafter=arm, ar_requests=ar_requests, ar_ms_per_token=ar_ms,
                              n_boot=0, seed=an.seed).summary
        rows = [dict(category=c, requests=int(measured.loc[c, "requests"]),
                     measured=float(measured.loc[c, "speedup"]), priced=float(priced.loc[c, "predicted_speedup"]))
                for c in measured.index if c in priced.index]
        out = pd.DataFrame(rows, columns=["category", "requests", "measured", "priced"])
        out["relative_error"] = out["priced"] / out["measured"] - 1
        rated = out.loc[(out["requests"] >= MIN_PAIRED_REQUESTS) & out["relative_error"].notna()]
        out.attrs["max_abs_error"] = float(rated["relative_error"].abs().max()) if len(rated) else float("nan")
        out.attrs["rated"] = len(rated)
        return out

    return an._cached(("cost_error", arm, source), compute)


def same_drafter_arms(an, arm: str) -> list[str]:
    """The other drafting arms of ``arm``'s drafter (the recorded drafter id: another tree, budget or gate)."""
    drafter_of = dict(zip(an.runs["arm"], an.runs["recorded_drafter_id"]))
    return [a for a in an.arms if a != arm and drafter_of.get(a) == drafter_of.get(arm)]


def cost_model_error(an, arm: str) -> tuple[float, str]:
    """``(error, note)``: the cost model's own largest error, else ``cost.UNMEASURED_COST_ERROR``."""
    err = an.attempt("cost_error", arm)
    measured = err.value.attrs["max_abs_error"] if err.ok else float("nan")
    if np.isfinite(measured):
        return measured, (f"the cost model's own error: its largest |relative error| on the arm's "
                          f"{err.value.attrs['rated']} measured categories priced from their recorded rounds, "
                          f"{measured:.1%}")
    why = err.error if not err.ok else f"no category of the arm has {MIN_PAIRED_REQUESTS} paired requests"
    return UNMEASURED_COST_ERROR, unmeasured_cost_note(why)


def variant_error(an, arm: str) -> tuple[float, list[str]]:
    """The largest error of ``arm``'s cost model on itself and the drafter's other arms, with a note."""
    own = an.attempt("cost_error", arm)
    errors = {arm: own.value.attrs["max_abs_error"]} if own.ok else {}
    for other in an.same_drafter_arms(arm):
        got = an.attempt("cost_error", arm, other)
        if got.ok:
            errors[other] = got.value.attrs["max_abs_error"]
    errors = {a: e for a, e in errors.items() if np.isfinite(e)}
    cross = {a: e for a, e in errors.items() if a != arm}
    if not errors:
        return float("nan"), ["the cost model's error on other budgets not measured: no timed arm of this drafter "
                              "with enough paired requests"]
    worst = max(errors.values())
    if not cross:
        return worst, [f"the cost model's error on another tree or budget not measured (no other timed arm of this "
                       f"drafter): widened by its own error only, {worst:.1%}"]
    mine = f"its own arm's {errors[arm]:.1%}, " if arm in errors else ""
    return worst, [f"widened by the largest |relative error| of {arm}'s cost model pricing recorded rounds per "
                   f"category: {mine}" + ", ".join(f"{a}'s {e:.1%}" for a, e in sorted(cross.items()))
                   + f" (max {worst:.1%})"]


def predict(an, arm: str, workload, *, transfer_error: float | None = None,
            proposals: pd.DataFrame | None = None, law=None, rounds: pd.DataFrame | None = None,
            bias: float = 0.0):
    """Will drafting pay on ``workload``, a trace set this arm never decoded? ``workload.predict_workload`` with this
    arm's law, depths and cost model. ``transfer_error`` widens the verdict (default ``_transfer_error``);
    ``proposals``, ``law``, ``rounds`` (replayed rounds, priced by the cost model alone) and ``bias`` as
    ``predict_workload`` takes them. Requests the arm also decoded are named in the notes."""
    if rounds is not None and (proposals is not None or law is not None or bias):
        raise ValueError("rounds= prices the replayed rounds with no law: drop proposals=, law= and bias=")
    if rounds is not None and "request_id" not in rounds.columns:
        raise ValueError("rounds needs one row per request (jobs.reference.workload_rounds)")
    sequences = _workload_sequences(an, arm, workload)
    notes = []
    transfer_error = _transfer_error(an, arm, transfer_error, rounds=rounds, proposals=proposals, notes=notes)
    mine = set(an.arm_view(arm).requests["request_id"].astype(str))
    shared = sorted(set(sequences["request_id"].astype(str)) & mine)
    if shared:
        notes.append(f"{len(shared)} of the workload's {len(sequences)} requests were decoded by the arm itself "
                     f"(in-sample for its law and cost), e.g. {', '.join(shared[:3])}")
    view = an.cost_view(arm)
    ar_requests, ar_ms = _ar_inputs(an, arm)
    notes += an.machine_warnings(arm)
    if rounds is not None:
        means = pd.DataFrame({"request_id": sequences["request_id"].astype(str),
                              "mean_entropy_nats": [float(np.mean(e)) for e in sequences["entropy"]]})
        table = rounds.drop(columns=["mean_entropy_nats"], errors="ignore").astype({"request_id": str})
        table = table.merge(means, on="request_id", how="left")
        result = price_rounds(view, table, drafter=arm, ar_ms_per_token=ar_ms, ar_requests=ar_requests,
                              transfer_error=transfer_error, n_boot=an.n_boot, seed=an.seed)
        result.notes = notes + result.notes
        return result
    law = an.law(arm) if law is None else law
    result = predict_workload(view, sequences, drafter=arm, law=law, ar_ms_per_token=ar_ms, ar_requests=ar_requests,
                              transfer_error=transfer_error, proposals=proposals, n_boot=an.n_boot, seed=an.seed,
                              bias=bias)
    result.notes = notes + result.notes
    return result


def _workload_sequences(an, arm: str, workload) -> pd.DataFrame:
    """The workload's entropy sequences on ``arm``'s model, each request from the first run that holds it."""
    model = an.model_of(arm)
    w_runs = workload.runs
    models = {model_name(m) for m in w_runs["model_id"]} if "model_id" in w_runs else {"unknown-model"}
    if model not in models:
        raise ValueError(f"the workload was decoded by {', '.join(sorted(models))}, arm {arm!r} by {model}: a law "
                         "of one target predicts nothing for another; record the workload with that target")
    keep = w_runs.loc[w_runs["model_id"].map(model_name) == model, "run_id"]
    tokens = workload.tokens.loc[workload.tokens["run_id"].isin(keep)]
    first = tokens.drop_duplicates("request_id")[["request_id", "run_id"]]
    tokens = tokens.merge(first, on=["request_id", "run_id"])
    if tokens.empty:
        raise ValueError("the workload holds no tokens on this model: record it first")
    return sequences_of(tokens)


def _transfer_error(an, arm: str, transfer_error, *, rounds, proposals, notes: list) -> float:
    """The default widening of ``predict``'s verdict, with a note: the cost model's own error for replayed rounds, else
    the law's largest LOCO error, else ``UNMEASURED_TRANSFER_ERROR``."""
    if rounds is not None and (transfer_error is None or not np.isfinite(transfer_error)):
        transfer_error, note = an.cost_model_error(arm)
        notes.append(note)
    if transfer_error is None:
        mode = "training" if proposals is None else "replayed"
        loco = an.attempt("loco", arm, mode)
        if loco.ok:
            acc = loco.value.accuracy.loc["tokens_per_round"]
            transfer_error = float(acc["max_abs_relative_error"])
            notes.append(f"transfer error: the largest leave-one-category-out |relative error| of tokens per "
                         f"round on the arm's {int(acc['categories'])} categories, {transfer_error:.1%} (mean "
                         f"{float(acc['mean_abs_relative_error']):.1%}; law {an.family}, leak-free depths"
                         + (", replayed proposals)" if proposals is not None else ")"))
        else:
            transfer_error = UNMEASURED_TRANSFER_ERROR
            notes.append(f"transfer error not measured ({loco.error}): widened by {transfer_error:.0%}, the "
                         "largest leave-one-category-out error of tokens per round in this project's checks "
                         "(law.transfer.UNMEASURED_TRANSFER_ERROR); record the arm on at least 3 categories to "
                         "measure it")
    return transfer_error

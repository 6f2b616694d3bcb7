"""One trace set, analysed once: arms, fitted laws, transfer, comparison, costs and measured speedups.

Known here: how the figures, the report, the demo and the notebooks look at a trace set (trace format
v1, from ``load_traces`` or ``simulate_traces``): its *arms* (``law.arms``: one model, drafter with its
checkpoint, tree policy, budget and gate; two runs of the same drafter with different trees, or of two
models, are different arms, each fitted apart), which runs are the autoregressive (AR) baseline
(``drafter_id`` "none" / "ar" or ``tree_policy`` "none", one AR arm per model), which runs carry real
timings (replayed runs report 0 ms and never enter a cost model), the per-category results table
(requests counted per run and request), and measured decode speedups over an AR run of the same model
and machine on the same requests (none where no such AR run exists, and the reason says so): on the CPU
clock (``requests.decode_cpu_ms``) where every paired request has it, else the wall clock, with a
request-bootstrap interval and the verdict of ``cost.speed_verdict`` (physical bound, +-15%, 5 paired
prompts; the rule ``jobs.speed`` applies too), so figures, notebooks and the report say the same. The
prediction is checked against them (``speedup_validation``; "no timings: predicted only", "no AR arm:
predicted only"), and the break-even entropy against where measured per-request speedups cross 1
(``speedup_crossing``: a logistic fit on the request's mean entropy); ``machine_warnings`` names the
``device`` / ``cpu_count`` of arm and AR runs that differ. Each
analysis of the law layer (``fit_law``, ``block_prediction``, ``loco_transfer``, ``compare_laws``,
``when_drafting_pays``) is computed per arm on first use and cached; ``attempt`` runs one and turns a
``ValueError`` (too little data, ...) into a readable note instead of a crash, so a report on a small
run still shows what can be shown. Block-length predictions use the law layer's default drafted-depth
model (``transfer.block_prediction``: observed depths); LOCO is computed with leak-free depths (predicted
from the training categories, the default) and with oracle depths, each next to its depth-only control,
and P1 (``universality``) with the category share of the CV gain.

Not known here: torch, decoding, plotting (``entropy_law.plots``), file formats (``entropy_law.traces``).

Departures from the law layer's defaults, and why: the cost model drops each request's prefill round
(round 0 without a draft, ``verify_ms`` 0: its time is in ``prefill_ms``), which would otherwise pull
the verify-cost line and the AR cost towards 0, and takes t_AR from the AR runs of the arm's model and
machine (decode time / tokens decoded after the prefill) when there are some.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.law.arms import AR_LABEL, run_arms
from entropy_law.law.compare import category_share_of_gain, compare_laws
from entropy_law.law.cost import (MIN_PAIRED_REQUESTS, UNMEASURED_COST_ERROR, UNRELIABLE, paired_speedup_interval,
                                  pooled_log_speedup_sd, priced_cost_model, speed_verdict, unmeasured_cost_note,
                                  when_drafting_pays)
from entropy_law.law.fit import PRIMARY_FAMILY, fallback_note, fit_law, get_family, primary_family
from entropy_law.law.hypotheses import universality_test
from entropy_law.law.transfer import UNMEASURED_TRANSFER_ERROR, block_prediction, loco_transfer, sequences_of
from entropy_law.law.workload import predict_workload, price_rounds, round_counts, workload_breakeven

AR_ARM = AR_LABEL  # label of the autoregressive baseline in tables (one per model where there are several)
DEFAULT_FAMILY = PRIMARY_FAMILY
PAYS_ENTROPIES = tuple(float(h) for h in np.round(np.geomspace(0.01, 5.0, 13), 4))  # nats, speedup curve grid
SPEEDUP_COLUMNS = ["arm", "category", "requests", "ar_ms_per_token", "arm_ms_per_token", "speedup", "lo", "hi",
                   "clock", "tokens_per_round", "bound", "verdict", "timed_together"]
TOGETHER_OVERLAP = 0.5  # time windows of an arm's run and its AR run: overlap / union at least this: timed together
SPEEDUP_BOOT = 2000  # request-bootstrap replicates of a measured speedup's interval (cheap: sums of arrays)
LOCO_REPORTED = ("training", "oracle")  # LOCO drafted-depth modes shown: leak-free first, then the oracle
COMPARE_FAMILIES = ("law0_cat", "law_logit", "law_exp", "law_exp0", "law_power", "law_renyi2", "law_spline",
                    "law_iso")


@dataclass
class TraceView:
    """The four tables the law layer reads (``tokens``, ``rounds``, ``requests``, ``runs``), as plain
    DataFrames. ``runs.drafter_id`` holds the arm label; the recorded id is kept in ``recorded_drafter_id``,
    the arm's identity in ``arm_key`` and the machine it was timed on in ``machine``."""

    tokens: pd.DataFrame
    rounds: pd.DataFrame
    requests: pd.DataFrame
    runs: pd.DataFrame

    def select_runs(self, run_ids) -> "TraceView":
        keep = set(run_ids)
        return TraceView(*(t.loc[t["run_id"].isin(keep)].reset_index(drop=True)
                           for t in (self.tokens, self.rounds, self.requests, self.runs)))


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Categorical key columns -> str (merges across runs with different categories stay simple)."""
    out = frame.copy()
    for col in out.columns:
        if isinstance(out[col].dtype, pd.CategoricalDtype):
            out[col] = out[col].astype(str)
    return out


def _truthy(value) -> bool:
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


def make_view(traces) -> TraceView:
    """A ``TraceView`` of ``traces`` whose ``runs`` carry ``arm`` (the label, ``arms.run_arms``),
    ``arm_key``, ``is_ar``, ``machine``, ``replayed`` and ``timed`` columns, with ``drafter_id`` set to the
    arm label (so the law layer treats arms apart)."""
    tokens, rounds, requests = (_plain(traces.tokens), _plain(traces.rounds), _plain(traces.requests))
    runs = _plain(traces.runs).reset_index(drop=True)
    for col in ("drafter_id", "tree_policy"):
        if col not in runs:
            raise ValueError(f"traces.runs has no {col!r} column; every run needs drafter_id and tree_policy metadata")
    arms = run_arms(runs)
    runs["is_ar"] = arms["is_ar"].to_numpy()
    runs["replayed"] = [_truthy(v) for v in runs["replayed"]] if "replayed" in runs else False
    runs["recorded_drafter_id"] = runs["drafter_id"]
    runs["arm_key"] = arms["arm_key"].to_numpy()
    runs["arm"] = arms["arm"].to_numpy()
    runs["machine"] = [str(m) for m in arms["machine"]]
    timing = rounds.groupby("run_id")[["draft_ms", "verify_ms"]].sum().sum(axis=1)
    runs["timed"] = (~runs["replayed"]) & (runs["run_id"].map(timing).fillna(0).to_numpy() > 0)
    runs["drafter_id"] = runs["arm"]
    return TraceView(tokens=tokens, rounds=rounds, requests=requests, runs=runs)


@dataclass
class Attempt:
    """The value of one analysis, or why it could not be computed (``error``)."""

    value: object = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class TraceAnalysis:
    """Analyses of one trace set, computed on first use and cached.

    ``family``: the law fitted per arm (default: ``fit.primary_family`` of these traces, noted in ``notes`` where
    it is not ``fit.PRIMARY_FAMILY``). ``n_boot``: request-bootstrap replicates
    for the speedup / break-even intervals. ``seed``: every random choice (CV folds, bootstrap).
    ``ar_ms_per_token``: AR cost per token when the traces have no AR run (a documented calibration).
    """

    def __init__(self, traces, *, family: str | None = None, n_boot: int = 50, seed: int = 0,
                 ar_ms_per_token: float | None = None, compare_families=COMPARE_FAMILIES, n_folds: int = 5,
                 proposals: pd.DataFrame | None = None):
        self.traces = traces
        self.proposals = proposals  # replayed proposals (traces.proposals.read_proposals): LOCO depths "replayed"
        self.view = make_view(traces)
        self.notes: list[str] = []
        if family is None:  # the primary law these traces support (fit.primary_family)
            family = primary_family(self.view.tokens)
            note = fallback_note(family)
            if note:
                self.notes.append(note)
        self.family = family
        self.n_boot = int(n_boot)
        self.seed = int(seed)
        self.compare_families = tuple(compare_families)
        self.n_folds = int(n_folds)
        self._given_ar_ms = ar_ms_per_token
        self._cache: dict = {}
        if self.view.tokens.empty:
            raise ValueError("the traces hold no tokens: record some requests first")

    # ------------------------------------------------------------------ arms and data
    @property
    def runs(self) -> pd.DataFrame:
        return self.view.runs

    @property
    def arms(self) -> list[str]:
        """Drafting arms (AR excluded), in run order."""
        return list(dict.fromkeys(self.runs.loc[~self.runs["is_ar"], "arm"]))

    @property
    def ar_arms(self) -> list[str]:
        """AR baselines, one per model (``"AR"``, or ``"<model>/AR"`` where the traces hold several models)."""
        return list(dict.fromkeys(self.runs.loc[self.runs["is_ar"], "arm"]))

    @property
    def categories(self) -> list[str]:
        return sorted(self.view.tokens["category"].unique())

    def arm_view(self, arm: str) -> TraceView:
        ids = self.runs.loc[self.runs["arm"] == arm, "run_id"]
        if ids.empty:
            raise ValueError(f"no run for arm {arm!r}; arms: {self.arms + self.ar_arms}")
        return self.view.select_runs(ids)

    @property
    def has_ar(self) -> bool:
        return bool(self.runs["is_ar"].any())

    def model_of(self, arm: str) -> str:
        """The target model of ``arm`` (every run of an arm decodes with one model)."""
        return _model_name(self.runs.loc[self.runs["arm"] == arm, "arm_key"].iloc[0].model_id)

    def entropy_tokens(self) -> pd.DataFrame:
        """One row per (model, request, output position): the target entropy, its category and the model.
        Greedy output and its entropies depend on the target model, not on the drafter, so for each model
        the first run that holds a request is used."""
        tok = self.view.tokens[["run_id", "request_id", "category", "position", "target_entropy_nats"]]
        model = self.runs.set_index("run_id")["arm_key"].map(lambda key: _model_name(key.model_id))
        tok = tok.assign(model_id=tok["run_id"].map(model).to_numpy())
        first_run = tok.drop_duplicates(["model_id", "request_id"])[["model_id", "request_id", "run_id"]]
        return tok.merge(first_run, on=["model_id", "request_id", "run_id"]).reset_index(drop=True)

    # ------------------------------------------------------------------ cached analyses
    def _cached(self, key, compute: Callable):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def attempt(self, name: str, *args) -> Attempt:
        """``getattr(self, name)(*args)`` as an ``Attempt``: a ``ValueError`` becomes ``error``."""
        try:
            return Attempt(value=getattr(self, name)(*args))
        except ValueError as err:  # the law layer's "too little / wrong data" errors
            return Attempt(error=f"{name}({', '.join(map(str, args))}) not available: {err}")
        except Exception as err:  # numerical failures on degenerate data (e.g. as many parameters as cells)
            return Attempt(error=f"{name}({', '.join(map(str, args))}) failed: {type(err).__name__}: {err}")

    def law(self, arm: str):
        """The fitted law (``self.family``) of one arm."""
        return self._cached(("law", arm), lambda: fit_law(self.arm_view(arm), self.family))

    def block(self, arm: str):
        """Observed vs DP-predicted tokens per round per category (in-sample law)."""
        return self._cached(("block", arm), lambda: block_prediction(self.law(arm), self.arm_view(arm), drafter=arm))

    @property
    def loco_depths(self) -> tuple:
        """The LOCO drafted-depth modes this analysis reports: leak-free first, the replayed proposals where they
        were given, then the oracle."""
        return LOCO_REPORTED if self.proposals is None else ("training", "replayed", "oracle")

    def loco(self, arm: str, depths: str = "training"):
        """Leave-one-category-out transfer of the category-free law; ``depths="training"`` (leak-free: the
        held-out drafted depths predicted from the training categories), ``"replayed"`` (leak-free: the
        drafter's own proposal at every position, from ``proposals``) or ``"oracle"`` (its own observed
        depths), each with the depth-only control (``transfer.loco_transfer``)."""
        def compute():
            proposals = None
            if depths == "replayed":
                runs = set(self.arm_view(arm).runs["run_id"].astype(str))
                proposals = (None if self.proposals is None
                             else self.proposals.loc[self.proposals["run_id"].astype(str).isin(runs)])
                if proposals is None or set(proposals["run_id"].astype(str)) != runs:
                    raise ValueError(f"no replayed proposals for every run of arm {arm!r} (proposals.parquet beside "
                                     "run.json: bench/replayed_proposals.py --write)")
            return loco_transfer(self.arm_view(arm), self.family, drafter=arm, depths=depths, proposals=proposals)

        return self._cached(("loco", arm, depths), compute)

    def universality(self, arm: str):
        """P1 for one arm (``hypotheses.universality_test`` with ``cv=True``): the score and Wald statistics,
        p, and the share of the CV gain (over acceptance by depth only) that category terms add."""
        return self._cached(("p1", arm), lambda: universality_test(self.arm_view(arm), drafter=arm, cv=True,
                                                                   n_folds=self.n_folds, seed=self.seed))

    def category_share(self, arm: str) -> dict:
        """P1 and the category share of the CV gain for this analysis' law (``self.family``, the primary law by
        default): ``FittedLaw.universality`` (category rates and exponents added to the law; cluster-robust score
        test) and ``compare.category_share_of_gain`` (grouped ``n_folds``-fold CV by request)."""
        def compute():
            p1 = self.law(arm).universality()
            if not p1:
                raise ValueError(f"P1 does not apply to {self.family} on arm {arm!r} (a GLM family without category "
                                 "terms, fitted on 2+ categories of 5+ requests each)")
            rows = atrisk.at_risk_table(self.arm_view(arm), drafters=[arm])
            share = category_share_of_gain(rows, self.family, n_folds=self.n_folds, seed=self.seed)
            return {**p1, **share}

        return self._cached(("category_share", arm), compute)

    def universality_table(self) -> pd.DataFrame:
        """Per arm: P1 (score statistic, df, p; robust Wald chi-square and its p) and the CV gains per trial:
        the law over depth only, category terms over the law, and the category share of the total gain, for
        ``law_exp`` (``hypotheses.universality_test``) and, where this analysis' law is another family, for it too
        (``law_*`` columns, ``category_share``; NaN where it cannot run, the reason in ``attrs["notes"]``); arms
        where P1 cannot run are left out (raises if none can)."""
        rows, errors = [], []
        for arm in self.arms:
            p1 = self.attempt("universality", arm)
            if not p1.ok:
                errors.append(p1.error)
                continue
            v = p1.value.summary["value"]
            row = dict(arm=arm, score_statistic=v["score_statistic"], df=int(v["df"]), p_value=v["p_value"],
                       wald_statistic=v["wald_statistic"], p_wald_chi2=v["p_wald_chi2"],
                       cv_gain_law_vs_depth_only=v.get("cv_gain_law_vs_depth_only", np.nan),
                       cv_gain_cat_vs_law=v.get("cv_gain_cat_vs_law", np.nan),
                       cv_category_share=v.get("cv_category_share", np.nan),
                       requests=int(v["requests"]), categories=int(v["categories"]))
            if self.family != "law_exp":
                mine = self.attempt("category_share", arm)
                value = mine.value if mine.ok else {}
                if not mine.ok:
                    errors.append(mine.error)
                row.update(law_family=self.family, law_score_statistic=value.get("score_statistic", np.nan),
                           law_df=value.get("df", np.nan), law_p_value=value.get("p_value", np.nan),
                           law_cv_gain_vs_depth_only=value.get("cv_gain_law_vs_depth_only", np.nan),
                           law_cv_gain_cat=value.get("cv_gain_cat_vs_law", np.nan),
                           law_cv_category_share=value.get("cv_category_share", np.nan))
            rows.append(row)
        if not rows:
            raise ValueError("P1 could not run for any arm: " + "; ".join(errors))
        out = pd.DataFrame(rows)
        out.attrs["notes"] = errors
        return out

    def loco_accuracy(self) -> pd.DataFrame:
        """LOCO accuracy across categories per arm, drafted-depth mode (``depths``: ``training``, leak-free,
        ``replayed`` where proposals were given, and ``oracle``) and quantity (``LocoTransfer.accuracy``): mean
        accepted length per drafting round and tokens per round (depth-aware DP), the depth-only control's (same
        depths, no entropy) and the full-depth DP's; arms whose LOCO cannot run are left out."""
        def compute():
            frames = []
            for arm in self.arms:
                for depths in self.loco_depths:
                    loco = self.attempt("loco", arm, depths)
                    if loco.ok:
                        frames.append(loco.value.accuracy.rename_axis("quantity").reset_index()
                                      .assign(arm=arm, depths=depths))
            if not frames:
                raise ValueError("leave-one-category-out transfer could not run for any arm")
            out = pd.concat(frames, ignore_index=True)
            return out[["arm", "depths", *[c for c in out.columns if c not in ("arm", "depths")]]]

        return self._cached("loco_accuracy", compute)

    def comparison(self, arm: str):
        """Cross-validated comparison of law families (families that cannot be fitted here are left out,
        with a note: e.g. ``law0_cat`` needs 5 requests per category). The probe fits only ask whether a
        family can be fitted, and the comparison's own fits are non-robust: no cluster-robust errors
        (nor their ``SmallSampleWarning``) for intervals nobody sees."""
        def compute():
            rows = atrisk.at_risk_table(self.arm_view(arm), drafters=[arm])
            n_requests = rows["request_id"].nunique()
            if n_requests < 3:  # every training fold needs 2 requests (compare_laws)
                raise ValueError(f"the law comparison of arm {arm!r} cross-validates over folds of requests and "
                                 f"needs at least 3 requests (2 in every training fold); it has {n_requests}")
            families, dropped = [], []
            for fam in self.compare_families:
                try:
                    fit_law(rows, fam, cov_type="nonrobust")
                    families.append(fam)
                except Exception as err:  # not identified / degenerate here: leave it out, say why
                    dropped.append(f"{fam} ({err})")
            if not families:
                raise ValueError("no law family can be fitted to these traces")
            n_folds = min(self.n_folds, n_requests)
            try:
                result = compare_laws(rows, families, n_folds=n_folds, seed=self.seed)
            except Exception as err:  # a category family failed inside a training fold: leave them out
                kept = [f for f in families if not get_family(f).needs_categories]
                dropped += [f"{f} (in a CV fold: {err})" for f in families if f not in kept]
                if not kept:
                    raise
                result = compare_laws(rows, kept, n_folds=n_folds, seed=self.seed)
            result.notes.extend(f"left out: {d}" for d in dropped)
            return result

        return self._cached(("compare", arm), compute)

    def _timed_machines(self, arm: str) -> list[str]:
        """The machines ``arm``'s timed runs ran on; refuses an arm timed on several (its costs would pool)."""
        runs = self.runs
        timed = runs.loc[(runs["arm"] == arm) & runs["timed"]]
        if timed.empty:
            raise ValueError(f"arm {arm!r} has no timed run (its rounds were replayed offline, 0 ms): its speedup "
                             "needs an online run of that drafter")
        machines = list(dict.fromkeys(timed["machine"]))
        if len(machines) > 1:
            raise ValueError(f"arm {arm!r} was timed on {len(machines)} machines ({'; '.join(machines)}): one cost "
                             "model would pool them. Select one machine's runs with traces.filter(run_id=[...])")
        return machines

    def ar_ms_per_token(self, arm: str | None = None) -> float:
        """AR decode cost per token: given, or measured on the timed AR runs (decode ms / tokens after the
        prefill) of ``arm``'s model and machine (``arm=None``: the AR runs, if they share one machine)."""
        if self._given_ar_ms is not None:
            return float(self._given_ar_ms)
        req = self.view.requests.merge(self.runs[["run_id", "is_ar", "timed", "machine"]], on="run_id")
        ar = req.loc[req["is_ar"] & req["timed"]]
        if arm is not None:
            machines = self._timed_machines(arm)
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

    def cost_view(self, arm: str) -> TraceView:
        """Timed runs of ``arm`` (and of AR on the same model and machine, for the N = 0 end of the verify
        line), prefill rounds dropped."""
        runs = self.runs
        machines = self._timed_machines(arm)
        ids = (list(runs.loc[(runs["arm"] == arm) & runs["timed"], "run_id"])
               + list(runs.loc[runs["is_ar"] & runs["timed"] & runs["machine"].isin(machines), "run_id"]))
        view = self.view.select_runs(ids)
        prefill = (view.rounds["round_index"] == 0) & (view.rounds["tree_nodes"] == 0) & (view.rounds["verify_ms"] == 0)
        view.rounds = view.rounds.loc[~prefill].reset_index(drop=True)
        return view

    def cost_model(self, arm: str):
        """``arm``'s cost model (``cost.CostModel``) as ``predict`` prices with it: its timed runs and t_AR from the
        timed AR requests of its model and machine."""
        def compute():
            ar_requests = self.ar_requests(arm)
            return priced_cost_model(self.cost_view(arm), drafter=arm, ar_requests=ar_requests, clock="auto",
                                     ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm))[0]

        return self._cached(("cost_model", arm), compute)

    def ar_requests(self, arm: str) -> pd.DataFrame | None:
        """The timed AR requests on ``arm``'s model and machine (``request_id``, ``decode_ms`` (wall),
        ``decode_cpu_ms`` (CPU, NaN where not logged), ``decoded``), for ``when_drafting_pays`` to resample with
        the law on the cost model's clock; None where t_AR is given (``ar_ms_per_token``) or there is no such AR
        run."""
        if self._given_ar_ms is not None:
            return None
        machines = self._timed_machines(arm)
        req = self.view.requests.merge(self.runs[["run_id", "is_ar", "timed", "machine"]], on="run_id")
        ar = req.loc[req["is_ar"] & req["timed"] & req["machine"].isin(machines)]
        if ar.empty:
            return None
        if "decode_cpu_ms" not in ar:
            ar = ar.assign(decode_cpu_ms=np.nan)
        return ar.assign(decoded=(ar["new_tokens"] - 1).clip(lower=0))[
            ["request_id", "decode_ms", "decode_cpu_ms", "decoded"]]

    def machine_warnings(self, arm: str) -> list[str]:
        """Where the runs that price ``arm`` (its timed runs and the AR runs of its model and machine) record
        different ``device`` or ``cpu_count`` in run.json: one warning naming both (a cost measured on another
        machine prices nothing here). Empty when they agree or do not say."""
        runs = self.runs
        try:
            machines = self._timed_machines(arm)
        except ValueError:
            return []
        mine = runs.loc[(runs["arm"] == arm) & runs["timed"]]
        ar = runs.loc[runs["is_ar"] & runs["timed"] & runs["machine"].isin(machines)]
        out = []
        for key in ("device", "cpu_count"):
            if key not in runs:
                continue
            a = sorted({str(v) for v in mine[key] if _truthy(v)})
            b = sorted({str(v) for v in ar[key] if _truthy(v)})
            if a and b and a != b:
                out.append(f"{arm}: cost measurements from another machine: the arm's runs record {key} "
                           f"{', '.join(a)}, the AR runs {', '.join(b)}; predictions mix the two")
        return out

    def pays(self, arm: str):
        """``when_drafting_pays`` for one timed arm: speedup vs entropy, break-even, best shapes; its bootstrap
        resamples the law, the arm's cost measurements and the AR requests together (``ar_requests``)."""
        def compute():
            view = self.cost_view(arm)
            ar_requests = self.ar_requests(arm)
            for message in self.machine_warnings(arm):
                warnings.warn(message, stacklevel=2)
            return when_drafting_pays(view, drafter=arm, family=self.family,
                                      ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm),
                                      ar_requests=ar_requests, entropies=PAYS_ENTROPIES, n_boot=self.n_boot,
                                      seed=self.seed)

        return self._cached(("pays", arm), compute)

    def workload(self, arm: str, *, law=None, proposals: pd.DataFrame | None = None):
        """``workload.workload_breakeven`` for one timed arm: each of its requests priced on its own entropy
        sequence by the law (``law(arm)``, cluster-robust) and the cost model, the workload break-even on the
        request-mean-entropy scale, and, where the arm has paired AR requests, the same line through the measured
        per-request speedups (``request_speedups``) with the same bootstrap weights. ``law`` / ``proposals``: a
        law of this arm fitted elsewhere (e.g. ``law_exp_obs_ceil_drafttop`` on traces that recorded the drafter's
        confidence) and the drafter's replayed proposals over the arm's own requests (``proposals.parquet``), as
        ``workload_breakeven`` takes them (computed anew on every call: not cached)."""
        def compute():
            view = self.cost_view(arm)
            ar_requests = self.ar_requests(arm)
            measured = self.attempt("request_speedups", arm)
            mine = None
            if proposals is not None:
                runs = set(view.runs.loc[view.runs["arm"] == arm, "run_id"].astype(str))
                mine = proposals.loc[proposals["run_id"].astype(str).isin(runs)]
            return workload_breakeven(view, drafter=arm, law=self.law(arm) if law is None else law,
                                      ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm),
                                      ar_requests=ar_requests, measured=measured.value if measured.ok else None,
                                      proposals=mine, n_boot=self.n_boot, seed=self.seed)

        if law is not None or proposals is not None:
            return compute()
        return self._cached(("workload", arm), compute)

    def cost_error(self, arm: str, rounds_of: str | None = None) -> pd.DataFrame:
        """The cost model's own error on this arm, with no law in between: each category's recorded rounds priced
        by the arm's cost model (``workload.price_rounds`` on ``round_counts``) against its measured paired speedup
        (``speedup``). Per category: ``requests`` (paired), ``measured``, ``priced``, ``relative_error``;
        ``attrs["max_abs_error"]``: the largest |relative error| among categories with at least
        ``MIN_PAIRED_REQUESTS`` paired requests (NaN where none), the default error of a prediction from replayed
        rounds (``predict(rounds=)``). ``rounds_of``: another timed arm, whose recorded rounds (and measured
        speedups) are priced by ``arm``'s cost model instead: how well one arm's cost model prices another tree or
        budget of the drafter (``entropy-law predict --budgets``)."""
        source = arm if rounds_of is None else rounds_of

        def compute():
            measured = self.speedup(source).set_index("category")
            view = self.cost_view(arm)
            ar_requests = self.ar_requests(arm)
            counts = round_counts(self.cost_view(source), source)
            priced = price_rounds(view, counts, drafter=arm, ar_requests=ar_requests,
                                  ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm),
                                  n_boot=0, seed=self.seed).summary
            rows = [dict(category=c, requests=int(measured.loc[c, "requests"]),
                         measured=float(measured.loc[c, "speedup"]), priced=float(priced.loc[c, "predicted_speedup"]))
                    for c in measured.index if c in priced.index]
            out = pd.DataFrame(rows, columns=["category", "requests", "measured", "priced"])
            out["relative_error"] = out["priced"] / out["measured"] - 1
            rated = out.loc[(out["requests"] >= MIN_PAIRED_REQUESTS) & out["relative_error"].notna()]
            out.attrs["max_abs_error"] = float(rated["relative_error"].abs().max()) if len(rated) else float("nan")
            out.attrs["rated"] = len(rated)
            return out

        return self._cached(("cost_error", arm, source), compute)

    def same_drafter_arms(self, arm: str) -> list[str]:
        """The other drafting arms of ``arm``'s drafter (the recorded drafter id: another tree, budget or gate)."""
        drafter_of = dict(zip(self.runs["arm"], self.runs["recorded_drafter_id"]))
        return [a for a in self.arms if a != arm and drafter_of.get(a) == drafter_of.get(arm)]

    def cost_model_error(self, arm: str) -> tuple[float, str]:
        """``(error, note)``: how far ``arm``'s cost model is trusted, the widening of a verdict it prices: its own
        largest error on the arm's measured categories (``cost_error``), else, where that cannot be measured (no
        category with ``MIN_PAIRED_REQUESTS`` paired requests, e.g. the demo's 2), ``cost.UNMEASURED_COST_ERROR``:
        a verdict on the bootstrap interval of a few timed requests alone would claim +-1-2%."""
        err = self.attempt("cost_error", arm)
        measured = err.value.attrs["max_abs_error"] if err.ok else float("nan")
        if np.isfinite(measured):
            return measured, (f"the cost model's own error: its largest |relative error| on the arm's "
                              f"{err.value.attrs['rated']} measured categories priced from their recorded rounds, "
                              f"{measured:.1%}")
        why = err.error if not err.ok else f"no category of the arm has {MIN_PAIRED_REQUESTS} paired requests"
        return UNMEASURED_COST_ERROR, unmeasured_cost_note(why)

    def variant_error(self, arm: str) -> tuple[float, list[str]]:
        """How far ``arm``'s cost model can be trusted to price another tree or budget of its drafter, never timed
        (``entropy-law predict --budgets``): the larger of its own error (``cost_error(arm)``) and its errors pricing
        the recorded rounds of the drafter's other timed arms (``cost_error(arm, rounds_of=other)``), with a note
        saying which; NaN where none can be measured."""
        own = self.attempt("cost_error", arm)
        errors = {arm: own.value.attrs["max_abs_error"]} if own.ok else {}
        for other in self.same_drafter_arms(arm):
            got = self.attempt("cost_error", arm, other)
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

    def predict(self, arm: str, workload, *, transfer_error: float | None = None,
                proposals: pd.DataFrame | None = None, law=None, rounds: pd.DataFrame | None = None,
                bias: float = 0.0):
        """Will drafting pay on ``workload`` (a trace set this arm never decoded: e.g. an AR run of new prompts,
        ``entropy-law record --drafter ar``)? ``workload.predict_workload`` with this arm's law (``law(arm)``),
        drafted depths and cost model, on the workload's target entropies (its requests on the arm's model; each
        request from the first run that holds it). ``transfer_error``: the law's relative error on a category it
        was not fitted on, which widens the verdict's interval; default the largest leave-one-category-out
        |relative error| of tokens per round on this arm's own categories (``loco(arm)``, leak-free depths);
        ``transfer.UNMEASURED_TRANSFER_ERROR`` where that cannot be measured (said in the notes). Requests this arm
        also decoded are named in the notes (in-sample). ``proposals``: the arm's drafter replayed over the
        workload's outputs (``predict_workload``); the transfer error is then the leave-one-category-out error with
        replayed depths (``loco(arm, "replayed")``, which needs this analysis' ``proposals`` for the arm's own runs).
        ``law``: a law of this arm fitted elsewhere (e.g. on larger reference traces of the same drafter and
        target; then pass ``transfer_error`` measured there too), instead of ``law(arm)``. ``rounds``: the arm's
        rounds replayed over the workload (``jobs.reference.workload_rounds``, one row per request): they are priced
        by the cost model alone (``workload.price_rounds``, no law), and the default ``transfer_error`` is the cost
        model's own largest error on the arm's measured categories, or ``cost.UNMEASURED_COST_ERROR`` where that
        cannot be measured (``cost_model_error``, also for a ``transfer_error`` passed as NaN), said in the notes. ``bias``: the law's log
        residual of tokens per round (``workload.predict_workload``; e.g. ``transfer.calibrated_transfer``'s)."""
        if rounds is not None and (proposals is not None or law is not None or bias):
            raise ValueError("rounds= prices the replayed rounds with no law: drop proposals=, law= and bias=")
        model = self.model_of(arm)
        w_runs = workload.runs
        models = {_model_name(m) for m in w_runs["model_id"]} if "model_id" in w_runs else {"unknown-model"}
        if model not in models:
            raise ValueError(f"the workload was decoded by {', '.join(sorted(models))}, arm {arm!r} by {model}: a law "
                             "of one target predicts nothing for another; record the workload with that target")
        keep = w_runs.loc[w_runs["model_id"].map(_model_name) == model, "run_id"]
        tokens = workload.tokens.loc[workload.tokens["run_id"].isin(keep)]
        first = tokens.drop_duplicates("request_id")[["request_id", "run_id"]]
        tokens = tokens.merge(first, on=["request_id", "run_id"])
        if tokens.empty:
            raise ValueError("the workload holds no tokens on this model: record it first")
        sequences = sequences_of(tokens)
        notes = []
        if rounds is not None and (transfer_error is None or not np.isfinite(transfer_error)):  # NaN: none measured
            transfer_error, note = self.cost_model_error(arm)  # (variant_error's, predict --budgets)
            notes.append(note)
        if transfer_error is None:
            mode = "training" if proposals is None else "replayed"
            loco = self.attempt("loco", arm, mode)
            if loco.ok:
                acc = loco.value.accuracy.loc["tokens_per_round"]
                transfer_error = float(acc["max_abs_relative_error"])
                notes.append(f"transfer error: the largest leave-one-category-out |relative error| of tokens per "
                             f"round on the arm's {int(acc['categories'])} categories, {transfer_error:.1%} (mean "
                             f"{float(acc['mean_abs_relative_error']):.1%}; law {self.family}, leak-free depths"
                             + (", replayed proposals)" if proposals is not None else ")"))
            else:  # a verdict on the bootstrap interval alone would assume the law transfers without error
                transfer_error = UNMEASURED_TRANSFER_ERROR
                notes.append(f"transfer error not measured ({loco.error}): widened by {transfer_error:.0%}, the "
                             "largest leave-one-category-out error of tokens per round in this project's checks "
                             "(law.transfer.UNMEASURED_TRANSFER_ERROR); record the arm on at least 3 categories to "
                             "measure it")
        mine = set(self.arm_view(arm).requests["request_id"].astype(str))
        shared = sorted(set(sequences["request_id"].astype(str)) & mine)
        if shared:
            notes.append(f"{len(shared)} of the workload's {len(sequences)} requests were decoded by the arm itself "
                         f"(in-sample for its law and cost), e.g. {', '.join(shared[:3])}")
        view = self.cost_view(arm)
        ar_requests = self.ar_requests(arm)
        notes += self.machine_warnings(arm)  # costs measured on two machines price nothing here
        if rounds is not None:
            need = {"request_id"} - set(rounds.columns)
            if need:
                raise ValueError("rounds needs one row per request (jobs.reference.workload_rounds)")
            means = pd.DataFrame({"request_id": sequences["request_id"].astype(str),
                                  "mean_entropy_nats": [float(np.mean(e)) for e in sequences["entropy"]]})
            table = rounds.drop(columns=["mean_entropy_nats"], errors="ignore").astype({"request_id": str})
            table = table.merge(means, on="request_id", how="left")
            result = price_rounds(view, table, drafter=arm,
                                  ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm),
                                  ar_requests=ar_requests, transfer_error=transfer_error, n_boot=self.n_boot,
                                  seed=self.seed)
            result.notes = notes + result.notes
            return result
        result = predict_workload(view, sequences, drafter=arm, law=self.law(arm) if law is None else law,
                                  ar_ms_per_token=None if ar_requests is not None else self.ar_ms_per_token(arm),
                                  ar_requests=ar_requests, transfer_error=transfer_error, proposals=proposals,
                                  n_boot=self.n_boot, seed=self.seed, bias=bias)
        result.notes = notes + result.notes
        return result

    def paired_requests(self, arm: str) -> pd.DataFrame:
        """The arm's timed requests paired with the timed AR requests of the same model and machine, one row
        per (run of the arm, request): ``category``, ``decoded`` / ``ar_decoded`` (tokens after the prefill),
        ``ms`` / ``ar_ms`` (decode time of the rounds, on ``attrs["clock"]``), ``rounds`` (verify rounds after
        the prefill), ``verify_cost`` (their summed verify cost c(nodes + 1) in one-token forwards, from the
        run's verify-cost curve; c = 1 without one), ``mean_entropy_nats`` (of the request's output).

        The clock is the CPU clock (``requests.decode_cpu_ms``) where every paired request of both sides has
        it, else the wall clock (``decode_ms``); ``attrs["clock"]`` says which. Raises (saying why) where the
        arm has no timed run or no AR run of the same model and machine decoded its prompts."""
        def compute():
            req = self.view.requests.merge(self.runs[["run_id", "arm", "is_ar", "timed", "machine"]], on="run_id")
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
            rounds = self.view.rounds.loc[self.view.rounds["run_id"].isin(set(paired["run_id"]))
                                          & (self.view.rounds["round_index"] > 0)]
            curves = dict(zip(self.runs["run_id"], self.runs["verify_cost"])) if "verify_cost" in self.runs else {}
            rounds = rounds.assign(cost=[_verify_cost(curves.get(r), n + 1)
                                         for r, n in zip(rounds["run_id"], rounds["tree_nodes"])])
            per_round = rounds.groupby(["run_id", "request_id"], as_index=False).agg(
                rounds=("round_index", "size"), verify_cost=("cost", "sum"))
            entropy = self.view.tokens.groupby(["run_id", "request_id"], as_index=False, observed=True).agg(
                mean_entropy_nats=("target_entropy_nats", "mean"))
            out = paired.merge(per_round, on=["run_id", "request_id"], how="left").merge(
                entropy, on=["run_id", "request_id"], how="left")
            out = out.assign(ms=out["decode_cpu_ms"] if cpu else out["decode_ms"],
                             ar_ms=out["ar_cpu"] if cpu else out["ar_wall"])
            out = out[["run_id", "request_id", "category", "machine", "decoded", "ms", "ar_decoded", "ar_ms",
                       "rounds", "verify_cost", "mean_entropy_nats"]].reset_index(drop=True)
            out.attrs["clock"] = "cpu" if cpu else "wall"
            return out

        return self._cached(("paired", arm), compute)

    def request_speedups(self, arm: str) -> pd.DataFrame:
        """Per paired request of ``arm``: its measured speedup (AR ms per token / the arm's, on
        ``attrs["clock"]``) and its output's mean target entropy (``paired_requests``)."""
        paired = self.paired_requests(arm)
        ok = (paired["decoded"] > 0) & (paired["ar_decoded"] > 0) & (paired["ms"] > 0)
        out = paired.loc[ok].assign(speedup=(paired["ar_ms"] / paired["ar_decoded"])
                                    / (paired["ms"] / paired["decoded"]))
        out.attrs["clock"] = paired.attrs["clock"]
        return out.reset_index(drop=True)

    def timed_together(self, arm: str) -> tuple[bool | None, str]:
        """Whether ``arm``'s timed runs and the AR runs they are paired with were timed together: for every run
        of the arm, some timed AR run on its machine whose [start_time, end_time] window overlaps it by at least
        ``TOGETHER_OVERLAP`` of their union (``jobs.record.record_arms`` interleaves the arms of one recording:
        about 1). Runs recorded hours or days apart, or one resumed over a day while the other took minutes, are
        timed under different loads, and their ratio is no speedup. (None, why) where the runs do not say when
        they ran (imports, simulations): not checked."""
        runs = self.runs
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

    def speedup(self, arm: str) -> pd.DataFrame:
        """Measured decode speedup of one arm over AR per category, paired request by request with the timed AR
        runs of the same model and machine (``paired_requests``): (AR ms per token) / (arm ms per token) over
        the category's paired requests, tokens counted after the prefill, on the CPU clock where the traces
        carry it (``clock``: "cpu" or "wall"); ``lo`` / ``hi``: a 95% interval (``cost.paired_speedup_interval``:
        request bootstrap, widened to Student t with few requests and to the per-request spread pooled over the
        arm's categories);
        ``tokens_per_round`` and ``bound`` = tokens per round x c(1) / c(N + 1) (the physical bound: a round
        costs at least one forward over its verified tree; c from the run's verify-cost curve, else 1);
        ``verdict`` (``cost.speed_verdict``): "measured", "not measured reliably" (interval wider than +-15%
        or fewer than 5 paired requests, or the arm and its AR run timed apart: ``timed_together``) or "above the
        physical bound" — only "measured" is a result.
        ``requests``: the arm's paired (run, request) pairs."""
        def compute():
            paired = self.paired_requests(arm)
            together, _ = self.timed_together(arm)
            rng = np.random.default_rng(self.seed)
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

        return self._cached(("speedup", arm), compute)

    def measured_speedups(self) -> pd.DataFrame:
        """``speedup`` of every arm that has one, stacked; why the others have none is in ``attrs["notes"]``
        (raises with those reasons where no arm has one)."""
        def compute():
            frames, reasons = [], []
            for arm in self.arms:
                try:
                    frames.append(self.speedup(arm))
                except ValueError as err:
                    reasons.append(str(err))
                    continue
                together, why = self.timed_together(arm)
                if together is False:
                    reasons.append(why)
            if not frames:
                raise ValueError("no measured speedup: " + ("; ".join(reasons) or "no drafting arm"))
            out = pd.concat(frames, ignore_index=True)
            out.attrs["notes"] = reasons
            return out

        return self._cached("speedups", compute)

    def speedup_validation(self) -> pd.DataFrame:
        """The prediction checked against the measurement, per drafting arm and category, on the same requests.

        ``predicted`` = the law's DP tokens per round on these requests' entropy sequences
        (``predicted_tokens_per_round``) x t_AR / t_round(N), with t_AR and the round cost line from the arm's
        cost model (``pays(arm).cost``) at the mean verified nodes N of the category's rounds (the line is
        linear in N, so this is the mean predicted round cost); ``measured`` (``speedup``: paired, CPU clock
        where the traces carry it; ``lo`` / ``hi`` its interval, ``verdict`` whether it is a result);
        ``relative_error`` = predicted / measured - 1, ``within_10pct`` and ``inside_interval``;
        ``cost_only_predicted`` / ``cost_only_error``: the cost model alone, pricing the category's recorded rounds
        request by request (``cost_error``: ``workload.price_rounds``, the pricing of ``predict(rounds=)``): what
        is left of the error when the law's is taken out. ``status``:
        "compared", "no timings: predicted only" (replayed arm: no cost model either, so only tokens per round
        are predicted), or "no AR arm: predicted only" (the prediction needs t_AR: given, else NaN). Raises
        only where no arm has even a law prediction; ``attrs["notes"]`` holds the reasons."""
        def compute():
            results = self.results_table().set_index(["arm", "category"])
            rows, notes = [], []
            for arm in self.arms:
                timed = bool(self.runs.loc[self.runs["arm"] == arm, "timed"].any())
                measured = self.attempt("speedup", arm)
                pays = self.attempt("pays", arm) if timed else Attempt(error="no timings")
                if not measured.ok and measured.error not in notes:
                    notes.append(measured.error)
                if timed and not pays.ok:
                    notes.append(pays.error)
                status = ("compared" if measured.ok and pays.ok else "no timings: predicted only" if not timed
                          else "no AR arm: predicted only" if not self.has_ar else "measured only" if measured.ok
                          else "predicted only")
                nodes_of, priced = {}, {}
                if pays.ok:
                    view = self.cost_view(arm)
                    rounds = view.rounds.merge(view.runs[["run_id", "arm"]], on="run_id").merge(
                        view.requests[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
                    nodes_of = rounds.loc[rounds["arm"] == arm].groupby("category")["tree_nodes"].mean().to_dict()
                    cost_only = self.attempt("cost_error", arm)  # the recorded rounds, priced per request
                    if cost_only.ok:
                        priced = cost_only.value.set_index("category")["priced"].to_dict()
                    elif cost_only.error not in notes:
                        notes.append(cost_only.error)
                m = measured.value.set_index("category") if measured.ok else None
                for cat in self.categories:
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

        return self._cached("speedup_validation", compute)

    def speedup_crossing(self, arm: str) -> dict:
        """Where the measured per-request speedups of ``arm`` cross 1, against the predicted break-even entropy.

        A logistic regression (statsmodels ``Logit``) of "measured speedup > 1" on the request's mean target
        entropy (``request_speedups``); ``crossing_nats`` = the entropy where its probability is 0.5 (-b0 /
        b1), NaN where the fit cannot place it (all requests on one side, perfect separation, or a slope of the
        wrong sign: ``reason`` says which). ``breakeven`` / ``breakeven_low`` / ``breakeven_high``: the break-even
        entropy and its bootstrap interval (``pays``); ``inside``: whether the crossing lies in that interval
        (None where either is missing). The comparison on one scale: ``workload_breakeven`` / ``workload_low`` /
        ``workload_high`` (``workload``: the prediction on each request's own entropy sequence, where its
        log-speedup line on the mean entropy crosses 1), ``measured_line`` (the same line through the measured
        speedups, same bootstrap: ``measured_line_low`` / ``_high``), ``workload_inside`` (the measured line's
        crossing inside the workload break-even's interval) and both verdicts in words. The constant-entropy
        break-even is not on that scale: real requests of mean entropy H accept far shorter blocks than a
        sequence at H everywhere (``workload`` module doc)."""
        def compute():
            import statsmodels.api as sm

            req = self.request_speedups(arm)
            y = (req["speedup"] > 1).to_numpy(int)
            h = req["mean_entropy_nats"].to_numpy(float)
            out = dict(arm=arm, requests=len(req), clock=req.attrs["clock"], share_above_1=float(y.mean()),
                       crossing_nats=np.nan, slope=np.nan, reason="", breakeven=np.nan, breakeven_low=np.nan,
                       breakeven_high=np.nan, inside=None)
            if y.min() == y.max():
                out["reason"] = f"every request {'above' if y[0] else 'below'} 1: no crossing in the observed entropies"
            else:
                try:
                    with warnings.catch_warnings():  # separation shows as huge coefficients: checked below
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
            pays = self.attempt("pays", arm)
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
                       workload_agree=None,
                       workload_verdict="not computed", measured_line_verdict="not computed")
            work = self.attempt("workload", arm)
            if work.ok:
                w = work.value.summary
                out.update(workload_ok=True, workload_breakeven=float(w.loc["workload_breakeven_nats", "estimate"]),
                           workload_low=float(w.loc["workload_breakeven_nats", "ci_low"]),
                           workload_high=float(w.loc["workload_breakeven_nats", "ci_high"]),
                           workload_inside=work.value.inside, workload_agree=work.value.agree,
                           workload_verdict=work.value.verdict,
                           measured_line_verdict=work.value.measured_verdict)
                if "measured_crossing_nats" in w.index:
                    out.update(measured_line=float(w.loc["measured_crossing_nats", "estimate"]),
                               measured_line_low=float(w.loc["measured_crossing_nats", "ci_low"]),
                               measured_line_high=float(w.loc["measured_crossing_nats", "ci_high"]))
            else:
                out["workload_verdict"] = work.error
            return out

        return self._cached(("crossing", arm), compute)

    def crossing_table(self) -> pd.DataFrame:
        """``speedup_crossing`` of every arm with a measured speedup (raises where none has one)."""
        rows, errors = [], []
        for arm in self.arms:
            got = self.attempt("speedup_crossing", arm)
            if got.ok:
                rows.append(got.value)
            else:
                errors.append(got.error)
        if not rows:
            raise ValueError("no arm has measured per-request speedups: " + "; ".join(errors))
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ tables
    def results_table(self) -> pd.DataFrame:
        """Per arm and category: requests (run and request pairs), tokens, mean / median target entropy
        (nats, of the arm's model), mean accepted length per drafting round (tau), committed tokens per
        round, the law's DP prediction of tokens per round (in-sample; acceptance capped at each round's
        drafted depth), the LOCO predictions of tokens per round and of the mean accepted length per
        drafting round, and the measured decode speedup over AR of the same model and machine (if timed), with
        its verdict (``speedup_verdict``: only "measured" is a result; ``speedup``)."""
        def compute():
            ent = self.entropy_tokens()
            h = ent.groupby(["model_id", "category"])["target_entropy_nats"].agg(mean_entropy_nats="mean",
                                                                                  median_entropy_nats="median")
            rnd = self.view.rounds.merge(self.runs[["run_id", "arm"]], on="run_id")
            rnd = rnd.merge(self.view.requests[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
            decode = rnd.loc[rnd["round_index"] > 0]
            rows = []
            speed = self.attempt("measured_speedups")
            sp = speed.value if speed.ok else None
            for arm in self.arms + self.ar_arms:
                is_ar = arm in self.ar_arms
                model = self.model_of(arm)
                mine = decode.loc[decode["arm"] == arm]
                drafted = mine.loc[mine["tree_nodes"] > 0]
                block = self.attempt("block", arm) if not is_ar else Attempt(error="AR")
                loco = self.attempt("loco", arm) if not is_ar else Attempt(error="AR")
                for cat, part in mine.groupby("category"):
                    row = dict(arm=arm, category=cat, requests=len(part[["run_id", "request_id"]].drop_duplicates()),
                               tokens=int(part["committed"].sum()),
                               mean_entropy_nats=h.loc[(model, cat), "mean_entropy_nats"],
                               median_entropy_nats=h.loc[(model, cat), "median_entropy_nats"],
                               mean_accepted=float(drafted.loc[drafted["category"] == cat, "accepted"].mean())
                               if (drafted["category"] == cat).any() else np.nan,
                               committed_per_round=float(part["committed"].sum() / len(part)))
                    row["law_tokens_per_round"] = (float(block.value.summary.loc[cat, "dp_tokens_per_round"])
                                                   if block.ok and cat in block.value.summary.index else np.nan)
                    row["loco_tokens_per_round"] = (float(loco.value.summary.loc[cat, "predicted_tokens_per_round"])
                                                    if loco.ok and cat in loco.value.summary.index else np.nan)
                    row["loco_mean_accepted"] = (float(loco.value.summary.loc[cat, "predicted_mean_accepted"])
                                                 if loco.ok and cat in loco.value.summary.index else np.nan)
                    row["speedup_requests"] = 0
                    row["speedup_verdict"] = None
                    if is_ar and sp is not None:
                        row["speedup_vs_ar"] = 1.0
                        row["speedup_requests"] = int(row["requests"])
                        row["speedup_verdict"] = "the reference"
                    elif sp is not None and len(sp):
                        hit = sp.loc[(sp["arm"] == arm) & (sp["category"] == cat)]
                        row["speedup_vs_ar"] = float(hit["speedup"].iloc[0]) if len(hit) else np.nan
                        row["speedup_requests"] = int(hit["requests"].iloc[0]) if len(hit) else 0
                        row["speedup_verdict"] = hit["verdict"].iloc[0] if len(hit) else None
                    else:
                        row["speedup_vs_ar"] = np.nan
                    rows.append(row)
            return pd.DataFrame(rows)

        return self._cached("results", compute)

    def law_table(self) -> pd.DataFrame:
        """Per arm: the law's exponent k (and w, the exponent of 1 - p1, for a law in the target's top-1
        probability) and depth-1 rate lambda with their 95% intervals, the break-even entropy (bootstrap interval)
        where the arm is timed."""
        rows = []
        for arm in self.arms:
            law = self.attempt("law", arm)
            row = dict(arm=arm)
            if law.ok:
                d = law.value.derived
                for name, key in (("k", "k"), ("w", "w"), ("lambda_d1", f"lambda[d={law.value.depths[0]}]")):
                    if key in d.index:
                        row[name], row[f"{name}_low"], row[f"{name}_high"] = (float(d.loc[key, "estimate"]),
                                                                              float(d.loc[key, "ci_low"]),
                                                                              float(d.loc[key, "ci_high"]))
                # requests: the law's clusters (request ids: two runs of one arm on one prompt decode the same
                # greedy output, one cluster), what its intervals rest on; results_table counts every decode
                row["trials"], row["requests"] = law.value.n_rows, law.value.n_requests
            pays = self.attempt("pays", arm)
            if pays.ok:
                s = pays.value.summary.loc["breakeven_entropy_nats"]
                row["breakeven_nats"], row["breakeven_low"], row["breakeven_high"] = (
                    float(s["estimate"]), float(s["ci_low"]), float(s["ci_high"]))
                row["drafting_pays"] = pays.value.breakeven_verdict
            rows.append(row)
        return pd.DataFrame(rows)


def _model_name(model_id) -> str:
    return "unknown-model" if model_id is None else str(model_id)


def format_interval(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """``"0.81 [0.75, 0.88]"``; ``"n/a"`` for NaN; infinite values (break-even: "always pays") as ``inf``."""
    def one(v):
        return "inf" if v == np.inf else f"{{:.{digits}g}}".format(v)

    if estimate is None or np.isnan(estimate):
        return "n/a"
    if low is None or high is None or np.isnan(low) or np.isnan(high):
        return one(estimate)
    return f"{one(estimate)} [{one(low)}, {one(high)}]"


def _verify_cost(curve, n_tokens: int) -> float:
    """c(n) of a run's stored verify-cost curve (``{"sizes": [...], "costs": [...]}``, in one-token forwards;
    piecewise linear, extended by its end segments as ``decoding.gate.VerifyCost``); 1 without a curve."""
    if not isinstance(curve, dict) or not curve.get("sizes"):
        return 1.0
    sizes, costs = np.asarray(curve["sizes"], float), np.asarray(curve["costs"], float)
    if len(sizes) == 1:
        return float(costs[0])
    i = int(np.clip(np.searchsorted(sizes, n_tokens), 1, len(sizes) - 1))
    return float(costs[i - 1] + (costs[i] - costs[i - 1]) * (n_tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1]))

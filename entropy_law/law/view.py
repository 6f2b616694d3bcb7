"""One trace set as the law layer reads it (``TraceView``), each run labelled with its arm (``make_view``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from entropy_law.law.arms import run_arms


@dataclass
class TraceView:
    """The four tables as DataFrames; after ``make_view`` ``runs.drafter_id`` is the arm label."""

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
    return frame.astype({c: str for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)})


def truthy(value) -> bool:
    """A run.json flag or field that is set (not missing, not NaN)."""
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


def make_view(traces) -> TraceView:
    """A ``TraceView`` whose ``runs`` carry ``arm``, ``arm_key``, ``is_ar``, ``machine``, ``replayed`` and
    ``timed`` (real timings: replayed runs report 0 ms), with ``drafter_id`` set to the arm label."""
    tokens, rounds, requests = (_plain(traces.tokens), _plain(traces.rounds), _plain(traces.requests))
    runs = _plain(traces.runs).reset_index(drop=True)
    for col in ("drafter_id", "tree_policy"):
        if col not in runs:
            raise ValueError(f"traces.runs has no {col!r} column; every run needs drafter_id and tree_policy metadata")
    arms = run_arms(runs)
    runs["is_ar"] = arms["is_ar"].to_numpy()
    runs["replayed"] = [truthy(v) for v in runs["replayed"]] if "replayed" in runs else False
    runs["recorded_drafter_id"] = runs["drafter_id"]
    runs["arm_key"] = arms["arm_key"].to_numpy()
    runs["arm"] = arms["arm"].to_numpy()
    runs["machine"] = [str(m) for m in arms["machine"]]
    timing = rounds.groupby("run_id")[["draft_ms", "verify_ms"]].sum().sum(axis=1)
    runs["timed"] = (~runs["replayed"]) & (runs["run_id"].map(timing).fillna(0).to_numpy() > 0)
    runs["drafter_id"] = runs["arm"]
    return TraceView(tokens=tokens, rounds=rounds, requests=requests, runs=runs)


def model_name(model_id) -> str:
    """A run's model id as a label: ``"unknown-model"`` where the run does not say."""
    return "unknown-model" if model_id is None else str(model_id)


def entropy_tokens(view: TraceView) -> pd.DataFrame:
    """One row per (model, request, output position) of a ``make_view`` view: the target entropy, category and
    model, from each model's first run that holds the request (greedy output depends on the model alone)."""
    tok = view.tokens[["run_id", "request_id", "category", "position", "target_entropy_nats"]]
    model = view.runs.set_index("run_id")["arm_key"].map(lambda key: model_name(key.model_id))
    tok = tok.assign(model_id=tok["run_id"].map(model).to_numpy())
    first_run = tok.drop_duplicates(["model_id", "request_id"])[["model_id", "request_id", "run_id"]]
    return tok.merge(first_run, on=["model_id", "request_id", "run_id"]).reset_index(drop=True)

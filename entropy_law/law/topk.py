"""How far a law fitted on top-k entropy estimates can move: refits on the entropy's lower and upper bounds
(rows with an exact entropy keep it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.traces.topk import entropy_or_bound

BOUND_COLUMNS = {"estimate": "target_entropy_estimate_nats", "lower": "target_entropy_lower_nats",
                 "upper": "target_entropy_upper_nats"}


class _EntropyFrom:
    """``traces`` with ``target_entropy_nats`` filled from one bound column where it is null."""

    def __init__(self, traces, column: str):
        self._traces, self.tokens = traces, entropy_or_bound(traces.tokens, column)

    def __getattr__(self, name):
        return getattr(self._traces, name)


def entropy_sensitivity(traces, family: str = "law_exp", **fit_kwargs) -> pd.DataFrame:
    """Fit ``family`` (``fit_law`` with ``fit_kwargs``) on the entropy estimate and on its lower and upper bounds: per
    parameter ``estimate``, ``std_err``, ``ci_low``, ``ci_high``, the ``lower`` and ``upper`` fits, ``max_shift``,
    ``shift_in_se`` and ``within_ci``. Refuses traces without top-k rows or with rows without bounds."""
    from entropy_law.law.fit import fit_law

    tokens = traces.tokens
    if "target_entropy_estimate_nats" not in tokens.columns or not tokens["target_entropy_estimate_nats"].notna().any():
        raise ValueError("these traces hold no entropy from top-k log-probabilities (target_entropy_estimate_nats is "
                         "null everywhere): a sensitivity fit has no bounds to move between")
    from_topk = tokens["target_entropy_nats"].isna() & tokens["target_entropy_estimate_nats"].notna()
    unbounded = from_topk & (tokens["target_entropy_lower_nats"].isna() | tokens["target_entropy_upper_nats"].isna())
    if unbounded.any():
        requests = tokens.loc[unbounded, "request_id"].astype(str).unique()[:3].tolist()
        raise ValueError(f"{int(unbounded.sum())} token rows hold an estimate without bounds (a top-k the engine "
                         f"renormalised, e.g. requests {requests}; run.json engine_import.topk.renormalised): leave "
                         "those requests out (traces.filter) for a sensitivity fit")
    fits = {name: fit_law(_EntropyFrom(traces, column), family, **fit_kwargs) for name, column in BOUND_COLUMNS.items()}
    base = fits["estimate"].coefficients
    out = base[["estimate", "std_err", "ci_low", "ci_high"]].copy()
    for name in ("lower", "upper"):
        out[name] = fits[name].coefficients["estimate"].reindex(out.index)
    shift = np.maximum((out["lower"] - out["estimate"]).abs(), (out["upper"] - out["estimate"]).abs())
    out["max_shift"] = shift
    out["shift_in_se"] = shift / out["std_err"]
    out["within_ci"] = out[["lower", "upper"]].ge(out["ci_low"], axis=0).all(axis=1) & \
        out[["lower", "upper"]].le(out["ci_high"], axis=0).all(axis=1)
    return out


__all__ = ["BOUND_COLUMNS", "entropy_sensitivity"]

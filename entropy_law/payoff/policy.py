"""The law behind the per-round drafting policy: fitted from traces, exported as plain parameters.

``fit_policy`` fits the acceptance law on what a decoder knows before a round (``H_w``, the mean target entropy
over the last ``window`` committed positions) and tabulates ``a(H_w, d)`` on a log-spaced entropy grid; with
``context_match`` it holds one table per copyability level (``context_levels``). The drafter's cost comes from
``cost.fit_cost_model`` or is given. ``confidence_weight``, ``calibration_prior`` and ``calibration_half_life``
are stated choices, not fitted. The JSON-able result is read by ``decoding.policy.LawPolicy``. No torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from entropy_law.law.arms import run_checkpoints
from entropy_law.law.atrisk import at_risk_table
from entropy_law.payoff.cost import fit_cost_model, verify_curve
from entropy_law.law.fit import LawFamily, fit_law, get_family
from entropy_law.law.information import InfoSet, check_information, family_inputs
from entropy_law.traces.reader import checked_context_matches
# the longest suffix match the copyability input tells apart (longer ones count as this): the traces' cap
from entropy_law.traces.stats import CONTEXT_MATCH_MAX

POLICY_KIND = "entropy_law_policy"  # the decoder's LawPolicy checks these two
POLICY_VERSION = 1
DEFAULT_GRID = tuple(float(h) for h in np.geomspace(1e-3, 8.0, 40))
MIN_LEVEL_TRIALS = 200  # at-risk trials a copyability level needs to be fitted on its own


def window_entropy(tokens: pd.DataFrame, window: int) -> np.ndarray:
    """For every token row, the mean target entropy over the ``window`` output positions before its round's
    first committed position (what the decoder knows before drafting that round); NaN for the prefill round
    (no earlier position). ``tokens``: trace format v1 (``run_id``, ``request_id``, ``position``, ``depth``,
    ``target_entropy_nats``), every position of each request present."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = np.full(len(tokens), np.nan)
    keys = tokens["run_id"].astype(str) + "\x1f" + tokens["request_id"].astype(str)
    for _, index in tokens.groupby(keys, sort=False).indices.items():
        part = tokens.iloc[index]
        positions = part["position"].to_numpy(np.int64)
        n = int(positions.max()) + 1
        if len(np.unique(positions)) != n:
            raise ValueError("tokens of a request do not cover positions 0..n-1 once each; the traces are incomplete")
        h = np.empty(n)
        h[positions] = part["target_entropy_nats"].to_numpy(float)
        cumulative = np.concatenate([[0.0], np.cumsum(h)])
        start = positions - part["depth"].to_numpy(np.int64) + 1
        lo = np.maximum(start - window, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[index] = np.where(start > 0, (cumulative[start] - cumulative[lo]) / (start - lo), np.nan)
    return out


def fit_policy(traces, *, window: int = 4, family: str = "law_exp", drafter: str | None = None,
               draft_cost: float | None = None, confidence_weight: float = 0.5,
               entropy_grid=DEFAULT_GRID, max_depth: int | None = None,
               calibration_prior: float | None = 1.0, calibration_half_life: float | None = 16.0,
               context_match: pd.DataFrame | None = None, max_context_match: int = CONTEXT_MATCH_MAX,
               min_level_trials: int = MIN_LEVEL_TRIALS) -> dict:
    """Policy parameters from traces of one drafter arm (anything with ``.tokens``, ``.rounds``, ``.runs``).

    ``window``: positions averaged into ``H_w``. ``draft_cost``: the drafter's cost per drafting round in one-token
    forwards; None: ``draft_ms / ar_ms_per_token`` of ``cost.fit_cost_model`` on ``traces`` (needs timed drafter and AR
    runs; pass it for replayed runs). ``max_depth``: tabulate depths 1..max_depth (default: the deepest fitted).
    ``calibration_prior`` (> 0) / ``calibration_half_life`` (> 0): pseudo-drafts and half-life in rounds of the
    in-request calibration (``decoding.policy``); None turns each off.
    ``context_match``: rows ``run_id``, ``request_id``, ``position``, ``context_match``, or None. Returns a JSON-able
    dict (``save_policy``); a law that reads what a round's start does not know is refused.
    """
    info = _check_policy_options(family, confidence_weight, calibration_prior, calibration_half_life)
    source = traces  # the drafter's runs and the AR runs beside them: the draft cost's t_AR
    traces = _drafter_runs(traces, drafter)
    runs = traces.runs
    drafters = sorted(runs["drafter_id"].unique())
    if len(drafters) != 1:
        raise ValueError(f"the traces hold drafters {drafters}: a policy is for one drafter; pass drafter=")
    checkpoints = run_checkpoints(runs)
    if len(checkpoints) > 1:
        raise ValueError(f"the runs of drafter {drafters[0]!r} hold {len(checkpoints)} checkpoints (sha256 "
                         f"{', '.join(c[:12] for c in checkpoints)}): a policy is for one checkpoint; keep the runs of "
                         "one (traces.filter(run_id=...)), the law differs between them")
    tokens = traces.tokens.copy()
    tokens["target_entropy_nats"] = window_entropy(tokens, window)
    at_risk = tokens["role"].isin(("accepted", "correction"))
    if not at_risk.any():
        raise ValueError("the traces hold no drafted token at risk: record a drafting run of this drafter first")
    tokens = tokens.loc[at_risk | tokens["target_entropy_nats"].notna()]
    lagged = SimpleNamespace(tokens=tokens, rounds=traces.rounds, runs=runs)
    law = fit_law(lagged, family, depth="factor", cov_type="nonrobust", min_requests_per_category=1)
    depths = list(range(1, int(max(law.depths)) + 1 if max_depth is None else int(max_depth) + 1))
    fitted = [d for d in depths if d in law.depths]
    grid = np.asarray(entropy_grid, dtype=float)
    table = _tabulate(law, grid, depths)
    h_w = tokens.loc[at_risk[tokens.index], "target_entropy_nats"].to_numpy(float)
    notes = []
    if draft_cost is None:
        draft_cost = _draft_cost(source, drafters[0], notes)
    if not draft_cost >= 0:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost}")
    copyability = None
    if context_match is not None:
        copyability = _context_match_tables(lagged, context_match, family, grid, depths, max_context_match,
                                            min_level_trials)
        notes.append(f"copyability levels {copyability['levels']} (suffix-match length at the round start, longer "
                     f"than {max_context_match} counted as {max_context_match}; at-risk trials per level "
                     f"{copyability['trials']})")
    return {
        "kind": POLICY_KIND, "version": POLICY_VERSION, "drafter_id": drafters[0],
        "checkpoint_sha256": checkpoints[0] if checkpoints else None,
        "model_id": sorted(runs["model_id"].astype(str).unique()) if "model_id" in runs else None,
        "family": law.family.name, "window": int(window), "information_set": info.value,
        "entropy_grid": [round(float(h), 6) for h in grid], "depths": depths,
        "acceptance": _rounded(table),
        "confidence_weight": float(confidence_weight), "draft_cost": float(draft_cost),
        "calibration_prior": None if calibration_prior is None else float(calibration_prior),
        "calibration_half_life": None if calibration_half_life is None else float(calibration_half_life),
        "default_entropy": float(np.nanmedian(h_w)) if np.isfinite(h_w).any() else 1.0,
        "fitted_on": {"runs": sorted(runs["run_id"].astype(str)), "requests": int(law.n_requests),
                      "at_risk_trials": int(law.n_rows), "fitted_depths": fitted},
        "coefficients": _coefficients(law),
        **({"context_match": copyability} if copyability is not None else {}),
        "notes": notes,
    }


def _check_policy_options(family: str, confidence_weight: float, calibration_prior,
                          calibration_half_life) -> InfoSet:
    """The options checked; the information set the policy decides in (its law's root-only inputs must be known before
    drafting)."""
    check_information(InfoSet.BEFORE_DRAFTING, family_inputs(get_family(family), root_only=True),
                      what=f"the policy's law {family}")
    if not 0.0 <= confidence_weight <= 1.0:
        raise ValueError(f"confidence_weight must lie in [0, 1], got {confidence_weight}")
    if calibration_prior is not None and not calibration_prior > 0:
        raise ValueError(f"calibration_prior must be > 0 (pseudo-drafts) or None (no in-request calibration), "
                         f"got {calibration_prior}")
    if calibration_half_life is not None and not calibration_half_life > 0:
        raise ValueError(f"calibration_half_life must be > 0 (rounds) or None (evidence never fades), "
                         f"got {calibration_half_life}")
    return InfoSet.BEFORE_VERIFYING if confidence_weight > 0 else InfoSet.BEFORE_DRAFTING


def _drafter_runs(traces, drafter: str | None):
    """``traces`` (anything with ``.tokens``, ``.rounds``, ``.runs``), or only the runs of ``drafter``."""
    if drafter is None:
        return traces
    runs = traces.runs
    keep = runs.loc[runs["drafter_id"] == drafter, "run_id"]
    if keep.empty:
        raise ValueError(f"no runs of drafter {drafter!r}; drafters: {sorted(runs['drafter_id'].unique())}")
    return traces.filter(run_id=list(keep)) if hasattr(traces, "filter") else SimpleNamespace(
        tokens=traces.tokens.loc[traces.tokens["run_id"].isin(keep)],
        rounds=traces.rounds.loc[traces.rounds["run_id"].isin(keep)], runs=runs.loc[runs["run_id"].isin(keep)])


def _draft_cost(source, drafter: str, notes: list) -> float:
    """``draft_ms / ar_ms_per_token`` of the drafter's cost model on ``source``, said in ``notes``."""
    try:
        cost = fit_cost_model(source, drafter=drafter)
    except ValueError as err:
        raise ValueError(f"the drafter's cost cannot be estimated from these traces ({err}); pass draft_cost= "
                         "(drafter time per round over one one-token target forward)") from err
    notes.append(f"draft_cost = draft_ms / ar_ms_per_token = {cost.draft_ms:.3g} / {cost.ar_ms_per_token:.3g} "
                 f"({cost.ar_source})")
    return cost.draft_ms / cost.ar_ms_per_token


_SAME = object()  # borrow_policy: keep the target models the parameters were fitted on


def borrow_policy(params: dict, drafter_id: str | None, checkpoint_sha256: str | None = None, *,
                  model_id=_SAME) -> dict:
    """``params`` relabelled for another drafter or checkpoint (None: any), so that a decoder accepts them;
    ``model_id``: the target it may now run on (None: any; default: the ones it was fitted on). The origin is kept under
    ``borrowed_from``. A hybrid policy has each of its two laws relabelled."""
    if isinstance(params, dict) and params.get("kind") == HYBRID_POLICY_KIND:  # each of its two laws relabelled
        if drafter_id not in (None, params.get("drafter_id")):
            raise ValueError(f"the hybrid drafter's policy drives the hybrid drafter, not {drafter_id!r}: pass None")
        return {**params, "ngram": borrow_policy(params["ngram"], None, model_id=model_id),
                "block": borrow_policy(params["block"], None, checkpoint_sha256, model_id=model_id)}
    if not isinstance(params, dict) or params.get("kind") != POLICY_KIND:
        raise ValueError(f"not policy parameters (kind {POLICY_KIND!r}); make them with fit_policy")
    origin = {"drafter_id": params.get("drafter_id"), "checkpoint_sha256": params.get("checkpoint_sha256")}
    if params.get("model_id") is not None:
        origin["model_id"] = params["model_id"]
    models = params.get("model_id") if model_id is _SAME else (None if model_id is None else [str(model_id)])
    return {**params, "drafter_id": drafter_id, "checkpoint_sha256": checkpoint_sha256, "model_id": models,
            "borrowed_from": params.get("borrowed_from") or origin}


HYBRID_POLICY_KIND = "entropy_law_hybrid_policy"  # the decoder's HybridLawPolicy checks it


def hybrid_policy(ngram: dict, block: dict) -> dict:
    """The hybrid drafter's policy (``decoding.policy.HybridLawPolicy``) from the n-gram and block drafters' law
    policies; each round runs the drafter whose law promises the higher rate (or none)."""
    for route, params in (("ngram", ngram), ("block", block)):
        if not isinstance(params, dict) or params.get("kind") != POLICY_KIND:
            raise ValueError(f"the {route} drafter's parameters are not a law policy (kind {POLICY_KIND!r}): make "
                             "them with fit_policy on that drafter's traces")
    return {"kind": HYBRID_POLICY_KIND, "version": 1, "drafter_id": "hybrid", "ngram": ngram, "block": block}


def context_levels(lengths: np.ndarray, min_trials: int) -> list[int]:
    """The copyability levels fitted on their own: lengths with at least ``min_trials`` at-risk trials; a sparser length
    joins the level below it, a sparse lowest level the one above."""
    values, counts = np.unique(np.asarray(lengths, dtype=int), return_counts=True)
    if not len(values):
        raise ValueError("no at-risk trial to fit the copyability levels on")
    by_value = dict(zip(values.tolist(), counts.tolist()))
    levels = [int(values[0])] + [int(v) for v in values[1:] if by_value[int(v)] >= min_trials]
    while len(levels) > 1 and sum(c for v, c in by_value.items() if v < levels[1]) < min_trials:
        levels.pop(0)  # too few trials below the second level: the second one serves them too
    return levels


def level_index(levels: list[int], lengths) -> np.ndarray:
    """The index into ``levels`` of each length: the largest level not above it (else the first)."""
    return np.maximum(np.searchsorted(levels, np.asarray(lengths), side="right") - 1, 0)


def _context_match_tables(lagged, context_match: pd.DataFrame, family: str, grid: np.ndarray, depths: list,
                          max_length: int, min_level_trials: int) -> dict:
    """The ``context_match`` parameters: ``family`` plus a factor in the copyability level at each round's start, fitted
    on the at-risk trials of ``lagged`` and tabulated per level."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_context_match must be an int >= 1, got {max_length!r}")
    lengths = checked_context_matches(context_match, "context_match")
    # the at-risk rows' own copyability (per position, where the traces record it) is not the policy's input:
    # the policy reads the length at the round's start
    table = at_risk_table(lagged).drop(columns=["context_match", "log1p_copy", "copy_full"], errors="ignore")
    table["start"] = table["position"] - table["depth"] + 1
    keyed = lengths.rename(columns={"position": "start"})
    merged = table.assign(run_id=table["run_id"].astype(str), request_id=table["request_id"].astype(str)).merge(
        keyed, on=["run_id", "request_id", "start"], how="left", validate="many_to_one")
    missing = merged["context_match"].isna()
    if missing.any():
        example = merged.loc[missing, ["run_id", "request_id", "start"]].iloc[0].to_dict()
        raise ValueError(f"context_match lacks the start of {int(missing.sum())} at-risk trials (e.g. {example}): "
                         "give the lengths of every output position of the drafter's runs")
    level = merged["context_match"].clip(upper=max_length).astype(int).to_numpy()
    levels = context_levels(level, min_level_trials)
    merged["context_match"] = np.asarray(levels)[level_index(levels, level)]
    base = get_family(family)
    if base.link == "isotonic":
        raise ValueError(f"the copyability factor needs a GLM family, not {base.name}")
    with_context = LawFamily(f"{base.name}+context_match", f"{base.name} + a factor in the context's suffix-match "
                             "length at the round start", base.link, base.outcome,
                             f"{base.terms} + C(context_match)" if base.terms else "C(context_match)",
                             bin_columns=base.bin_columns, slope=base.slope,
                             extra_keys=(*base.extra_keys, "context_match"), means=base.means,
                             profile_eps=base.profile_eps)
    rows = merged.drop(columns=["start"])
    rows.attrs.update(table.attrs)  # the at-risk table's kind: fit_law aggregates it
    law = fit_law(rows, with_context, depth="factor", cov_type="nonrobust", min_requests_per_category=1)
    trials = merged["context_match"].value_counts()
    return {"max_length": int(max_length), "levels": [int(v) for v in levels],
            "acceptance": [_rounded(_tabulate(law, grid, depths, context_match=np.full(len(grid), v))) for v in levels],
            "trials": {str(v): int(trials.get(v, 0)) for v in levels}, "family": with_context.name,
            "coefficients": _coefficients(law)}


def _tabulate(law, grid: np.ndarray, depths: list, **covariates) -> np.ndarray:
    """``law``'s acceptance [entropies x depths] on ``grid``, clipped to [0, 1]; ``covariates``: its other inputs."""
    deepest = max(law.depths)
    columns = [law.predict_acceptance(grid, depth=d if d in law.depths else min(d, deepest), **covariates)
               for d in depths]
    return np.clip(np.nan_to_num(np.column_stack(columns), nan=0.0), 0.0, 1.0)


def _rounded(table: np.ndarray) -> list:
    return [[round(float(a), 6) for a in row] for row in table]


def _coefficients(law) -> dict:
    return ({str(k): float(v) for k, v in law.coefficients["estimate"].items()}
            if "estimate" in getattr(law, "coefficients", pd.DataFrame()) else {})


def save_policy(params: dict, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(params, indent=1))
    return path


def load_policy(path, *, hybrid: bool = False) -> dict:
    """Parameters written by ``save_policy``, else a clear error; ``hybrid``: accept the hybrid drafter's too."""
    path = Path(path)
    try:
        params = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read policy parameters from {path}: {err}; make them with fit_policy") from err
    kind = params.get("kind") if isinstance(params, dict) else None
    if kind == HYBRID_POLICY_KIND:
        if not hybrid:
            raise ValueError(f"{path} holds the hybrid drafter's policy (two laws, kind {HYBRID_POLICY_KIND!r}): only "
                             "a decoder of the hybrid drafter runs it (entropy-law record --drafter hybrid); give one "
                             "drafter's law policy here (entropy-law policy TRACES --drafter ARM)")
        hybrid_policy(params.get("ngram"), params.get("block"))  # both sides are law policies
        return params
    if kind != POLICY_KIND:
        raise ValueError(f"{path} holds no policy parameters (kind {POLICY_KIND!r}); make them with fit_policy")
    return params


def policy_arm_meta(arm_meta: dict, policy: dict, *, measured: dict | None = None, cost=None,
                    arm: str = "the arm") -> tuple[dict, str]:
    """A recorded arm's ``run.json`` with ``policy`` in place of its gate, for ``jobs.reference.workload_rounds`` to
    replay, and where its verify-cost curve came from: the parameters' curve, else ``measured``
    (``decoding.gate.measure_verify_cost(...).to_config()``), else the arm's stored cost-gate curve, else
    ``cost.verify_curve(cost)``."""
    if not isinstance(policy, dict) or policy.get("kind") != POLICY_KIND:
        raise ValueError(f"not policy parameters (kind {POLICY_KIND!r}); make them with fit_policy")
    if arm_meta.get("policy"):
        raise ValueError(f"{arm} already ran a law policy: replay it as recorded")
    if policy.get("drafter_id") != arm_meta.get("drafter_id"):
        raise ValueError(f"the policy is for drafter {policy.get('drafter_id')!r}, {arm} ran "
                         f"{arm_meta.get('drafter_id')!r}")
    arm_sha = (arm_meta.get("drafter_config") or {}).get("checkpoint_sha256")
    if policy.get("checkpoint_sha256") and arm_sha and policy["checkpoint_sha256"] != arm_sha:
        raise ValueError(f"the policy is for the checkpoint sha256:{policy['checkpoint_sha256'][:12]} of drafter "
                         f"{policy.get('drafter_id')!r}, {arm} ran sha256:{arm_sha[:12]}: fit one on runs of that "
                         "checkpoint, or relabel it knowingly (borrow_policy)")
    if policy.get("verify_cost") is not None:
        curve, whence = policy["verify_cost"], "the curve its parameters hold"
    elif measured is not None:
        curve, whence = measured, "this machine's verify-cost curve, measured now (as an online run measures it)"
    elif isinstance(arm_meta.get("verify_cost"), dict):
        curve, whence = arm_meta["verify_cost"], f"{arm}'s stored cost-gate curve"
    elif cost is not None:
        curve, whence = verify_curve(cost), f"{arm}'s verify line (cost.verify_curve)"
    else:
        raise ValueError(f"no verify-cost curve for the policy: its parameters and {arm} hold none; pass measured= "
                         "or the arm's cost model")
    return {**arm_meta, "gate": "cost", "verify_cost": curve, "policy": {**policy, "verify_cost": curve}}, whence

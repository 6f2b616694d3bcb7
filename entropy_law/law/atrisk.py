"""At-risk (person-period) layout of traces: one Bernoulli trial per (round, depth) on the greedy path.

``accepted`` rows are accepted, ``correction`` rows rejected at depth tau + 1, ``bonus`` rows never at risk. Also here:
the laws' covariates and their validation, and the aggregated form (counts per drafter x category x request x depth x
log-spaced covariate bin, with cell means) whose binomial fit equals the row-level fit on binned covariates. Input:
``.tokens`` and ``.runs`` (trace format v1); rows that pool two arms under one ``drafter_id`` are refused.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from entropy_law.law import arms
from entropy_law.traces.stats import CONTEXT_MATCH_MAX
from entropy_law.traces.topk import entropy_or_bound  # the top-k estimate where no exact entropy exists

EPS_NATS = 1e-3
EPS_PROB = 1e-3  # offset of log(1 - p + eps) for a top-1 probability, the drafter's or the target's (p = 1: log 0)
NEGATIVE_TOLERANCE = 1e-5  # fp32 round-off: entropies in [-1e-5, 0) are set to 0, below that is an error

KEY_COLUMNS = ("drafter_id", "category", "request_id", "depth")
# tokens columns a law's DP reads per position besides the entropy -> the ``LawFamily.means`` entry that needs it
POSITION_COLUMNS = {"context_match": "context_match", "target_top1_prob": "log_target_miss"}
COVARIATES = ("target_entropy_nats", "target_renyi2_nats", "target_top1_prob", "target_logit_gap")
NONNEGATIVE = ("target_entropy_nats", "target_renyi2_nats", "target_logit_gap")
DERIVED = ("log_entropy", "log_renyi2", "log_logit_gap", "cum_entropy_nats", "log1p_cum_entropy", "log_drafted_depth")
# decode-time covariates: known before the round's verification; an aggregate keeps their means only when asked
DECODE_TIME = ("lag_entropy_nats", "log_lag_entropy", "run_mean_entropy_nats", "log_run_mean_entropy",
               "log1p_position", "draft_entropy_nats", "log_draft_entropy", "draft_top1_prob", "log_draft_miss",
               "context_match", "log1p_copy", "copy_full", "log_target_miss")
DRAFT_STATS = ("draft_entropy_nats", "draft_top1_prob")  # the drafter's own statistics, where it logged them
KIND_ROWS = "at_risk_rows"
KIND_AGGREGATED = "at_risk_aggregated"


def _require_columns(frame: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing} (trace format v1); got {list(frame.columns)}")


def validate_covariates(frame: pd.DataFrame, columns: Sequence[str], *, on_invalid: str = "raise") -> pd.DataFrame:
    """Refuse NaN / infinite / negative covariates (``on_invalid="drop"`` drops those rows); values in
    [-1e-5, 0) of entropies and logit gaps are fp32 round-off and set to 0."""
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bad = np.zeros(len(frame), dtype=bool)
    reasons = []
    frame = frame.copy()
    for col in columns:
        values = frame[col].to_numpy(dtype=float, na_value=np.nan)
        nonfinite = ~np.isfinite(values)
        negative = np.zeros_like(nonfinite)
        if col in NONNEGATIVE:
            negative = values < -NEGATIVE_TOLERANCE
            frame[col] = np.where((values < 0) & ~negative, 0.0, values)
        if nonfinite.any() or negative.any():
            where = frame.loc[nonfinite | negative, "request_id"].unique()[:3].tolist()
            reasons.append(
                f"{col}: {int(nonfinite.sum())} NaN/inf and {int(negative.sum())} negative values (e.g. requests {where})"
            )
        bad |= nonfinite | negative
    if bad.any():
        if on_invalid == "raise":
            raise ValueError(
                "invalid covariates at at-risk positions: " + "; ".join(reasons)
                + ". Fix the traces, or pass on_invalid='drop' to drop those rows (their rounds stay in)."
            )
        frame = frame.loc[~bad].reset_index(drop=True)
    return frame


def sequences_of(tokens: pd.DataFrame) -> pd.DataFrame:
    """``transfer.entropy_sequences`` of these token rows, with each ``POSITION_COLUMNS`` array (None if null)."""
    tokens = entropy_or_bound(tokens)
    present = [c for c in POSITION_COLUMNS if c in tokens.columns]
    tokens = tokens[["run_id", "request_id", "category", "position", "target_entropy_nats", *present]]
    tokens = validate_covariates(tokens, ["target_entropy_nats"])
    tokens = tokens.sort_values(["run_id", "request_id", "position"])
    out = []
    for (run_id, request_id), group in tokens.groupby(["run_id", "request_id"], sort=False):
        pos = group["position"].to_numpy()
        if not np.array_equal(pos, np.arange(len(pos))):
            raise ValueError(f"request {request_id} of run {run_id}: output positions are not 0..T-1 without gaps")
        row = dict(run_id=run_id, request_id=request_id, category=group["category"].iloc[0],
                   entropy=group["target_entropy_nats"].to_numpy(dtype=float))
        for column in present:
            values = group[column].to_numpy(dtype=float, na_value=np.nan)
            row[column] = None if np.isnan(values).any() else values
        out.append(row)
    return pd.DataFrame(out)


def at_risk_table(traces, covariates: Sequence[str] = COVARIATES, *, eps: float = EPS_NATS, on_invalid: str = "raise",
                  drafters: Sequence[str] | None = None) -> pd.DataFrame:
    """Row-level at-risk table: one row per (run, request, round, depth) at risk.

    Columns: the keys, ``round_index``, ``position``, ``depth``, ``accepted`` / ``rejected``, the ``covariates`` and
    their logs, ``cum_entropy_nats``, ``drafted_depth`` (with ``traces.rounds``), the decode-time covariates and, where
    logged, the drafter's statistics and ``context_match``. ``drafters``: keep only these ids. Invalid covariates raise
    (``on_invalid="drop"`` drops them); a statistic null everywhere stays null and is named in ``attrs["unlogged"]``.
    """
    tokens, runs, table = _risk_rows(traces, covariates, drafters)
    arms.check_one_arm_per_drafter(runs, table["run_id"].unique())
    _refuse_unfittable_runs(runs, table)
    unlogged = tuple(c for c in covariates if c != "target_entropy_nats" and len(table) and table[c].isna().all())
    table = validate_covariates(table.reset_index(drop=True), [c for c in covariates if c not in unlogged],
                                on_invalid=on_invalid)
    table["accepted"] = (table["role"] == "accepted").astype(np.int8)
    table["rejected"] = (1 - table["accepted"]).astype(np.int8)
    table["depth"] = table["depth"].astype(np.int64)
    table = table.sort_values(["run_id", "request_id", "round_index", "depth"], ignore_index=True)
    table = _add_covariate_logs(table, tokens, covariates, eps)
    _add_drafted_depth(table, getattr(traces, "rounds", None))
    table.attrs.update(kind=KIND_ROWS, eps=eps, unlogged=unlogged)
    return table


def _risk_rows(traces, covariates, drafters) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The tokens (with entropy bounds), the runs and the at-risk rows joined with their drafter."""
    tokens, runs = entropy_or_bound(traces.tokens), traces.runs
    _require_columns(tokens, ("run_id", "request_id", "category", "round_index", "position", "depth", "role", *covariates),
                     "traces.tokens")
    _require_columns(runs, ("run_id", "drafter_id"), "traces.runs")
    unknown_roles = set(tokens["role"].unique()) - {"accepted", "correction", "bonus"}
    if unknown_roles:
        raise ValueError(f"traces.tokens has unknown roles {sorted(unknown_roles)}; expected accepted/correction/bonus")
    risk = tokens.loc[tokens["role"].isin(("accepted", "correction")),
                      ["run_id", "request_id", "category", "round_index", "position", "depth", "role", *covariates]]
    run_info = runs[["run_id", "drafter_id"] + (["tree_policy"] if "tree_policy" in runs else [])].drop_duplicates("run_id")
    table = risk.merge(run_info, on="run_id", how="left", validate="many_to_one")
    if table["drafter_id"].isna().any():
        missing = table.loc[table["drafter_id"].isna(), "run_id"].unique().tolist()
        raise ValueError(f"runs {missing} appear in traces.tokens but not in traces.runs; add them to .runs")
    if "tree_policy" not in table:
        table["tree_policy"] = "unknown"
    if drafters is not None:
        table = table.loc[table["drafter_id"].isin(list(drafters))]
    return tokens, runs, table


def _refuse_unfittable_runs(runs: pd.DataFrame, table: pd.DataFrame) -> None:
    """Raise on runs without per-position target entropies (GLANCE round logs, bare engine imports)."""
    if "target_stats_scope" in runs:  # imported GLANCE logs: target statistics at each round's root only
        root_only = runs.loc[runs["run_id"].isin(table["run_id"].unique()) & (runs["target_stats_scope"] == "round_root"),
                             "run_id"].astype(str).tolist()
        if root_only:
            raise ValueError(f"run(s) {root_only} hold the target entropy at each round's root only (an imported "
                             "GLANCE round log), not per position: this law cannot be fitted on them. Fit GLANCE's "
                             "law instead (entropy_law.glance.fit_glance(traces)), or compute per-position statistics")
    bare = [str(r) for r, info in zip(runs["run_id"], runs.get("engine_import", [None] * len(runs)))
            if isinstance(info, dict) and str(info.get("target_stats", "")).startswith("missing")]
    if bare and (not len(table) or table["run_id"].astype(str).isin(bare).any()):  # imports without entropies
        raise ValueError(f"run(s) {bare} hold no target entropies (engine imports); the import says: "
                         f"{runs.loc[runs['run_id'].astype(str) == bare[0], 'engine_import'].iloc[0]['target_stats']}")


def _add_covariate_logs(table: pd.DataFrame, tokens: pd.DataFrame, covariates, eps: float) -> pd.DataFrame:
    """The derived log covariates, sequence covariates and the drafter's own statistics."""
    if "target_entropy_nats" in covariates:
        h = table["target_entropy_nats"].to_numpy(dtype=float)
        table["log_entropy"] = np.log(h + eps)
        group = table.groupby(["run_id", "request_id", "round_index"], sort=False)["target_entropy_nats"]
        table["cum_entropy_nats"] = group.cumsum().to_numpy(dtype=float) - h
        table["log1p_cum_entropy"] = np.log1p(np.maximum(table["cum_entropy_nats"].to_numpy(), 0.0))
    if "target_renyi2_nats" in covariates:
        table["log_renyi2"] = np.log(table["target_renyi2_nats"].to_numpy(dtype=float) + eps)
    if "target_logit_gap" in covariates:
        table["log_logit_gap"] = np.log(table["target_logit_gap"].to_numpy(dtype=float) + eps)
    table = table.drop(columns="role")
    if "target_entropy_nats" in covariates:
        table = _add_sequence_covariates(table, tokens, eps)
    elif "target_top1_prob" in covariates:
        _add_target_miss(table)
    for column in DRAFT_STATS:  # null where the drafter logs none: families using them refuse then
        if column in tokens.columns:
            table[column] = risk_draft_column(tokens, table, column)
    _add_draft_logs(table, eps)
    if "context_match" in tokens.columns:
        table["context_match"] = risk_draft_column(tokens, table, "context_match")
        _add_copy_logs(table)
    return table


def _add_drafted_depth(table: pd.DataFrame, rounds) -> None:
    """The round's drafted depth D (known before verification) where ``traces.rounds`` holds it."""
    round_keys = ["run_id", "request_id", "round_index"]
    if isinstance(rounds, pd.DataFrame) and set(round_keys + ["tree_depth"]) <= set(rounds.columns):
        depth_of = rounds[round_keys + ["tree_depth"]].rename(columns={"tree_depth": "drafted_depth"})
        depth_of = depth_of.astype({"run_id": str, "request_id": str})
        keys = table[round_keys].astype({"run_id": str, "request_id": str})
        merged = keys.merge(depth_of, on=round_keys, how="left", validate="many_to_one")
        if merged["drafted_depth"].isna().any():
            raise ValueError("token rows at risk in rounds missing from traces.rounds; the traces are inconsistent")
        table["drafted_depth"] = merged["drafted_depth"].to_numpy(dtype=np.int64)
        table["log_drafted_depth"] = np.log(np.maximum(table["drafted_depth"].to_numpy(dtype=float), 1.0))


def sequence_covariates(entropy: np.ndarray, position: np.ndarray) -> dict:
    """Decode-time covariates at ``position`` of a request with entropies ``entropy``: ``lag_entropy_nats`` (H at
    position - 1, at 0 H), ``run_mean_entropy_nats`` (mean H over 0..position), ``log1p_position``."""
    h = np.asarray(entropy, dtype=float)
    p = np.asarray(position, dtype=np.int64)
    if h.size == 0:
        raise ValueError("sequence_covariates needs a non-empty entropy sequence")
    if p.size and (p.min() < 0 or p.max() >= h.size):
        raise ValueError(f"positions must lie in 0..{h.size - 1}")
    csum = np.cumsum(h)
    return {"lag_entropy_nats": h[np.maximum(p - 1, 0)], "run_mean_entropy_nats": csum[p] / (p + 1.0),
            "log1p_position": np.log1p(p.astype(float))}


def add_log_covariates(frame: pd.DataFrame, eps: float = EPS_NATS) -> pd.DataFrame:
    """The log columns of the decode-time covariates present in ``frame`` (in place; returns it)."""
    for raw, log in (("lag_entropy_nats", "log_lag_entropy"), ("run_mean_entropy_nats", "log_run_mean_entropy")):
        if raw in frame:
            frame[log] = np.log(np.maximum(frame[raw].to_numpy(dtype=float), 0.0) + eps)
    _add_draft_logs(frame, eps)
    if "target_top1_prob" in frame:
        _add_target_miss(frame)
    if "context_match" in frame:
        _add_copy_logs(frame)
    if "position" in frame and "log1p_position" not in frame:
        frame["log1p_position"] = np.log1p(frame["position"].to_numpy(dtype=float))
    return frame


def _add_draft_logs(frame: pd.DataFrame, eps: float) -> None:
    """``log_draft_entropy`` and ``log_draft_miss`` = log(1 - draft_top1_prob + EPS_PROB), in place."""
    if "draft_entropy_nats" in frame:
        frame["log_draft_entropy"] = np.log(np.maximum(frame["draft_entropy_nats"].to_numpy(dtype=float), 0.0) + eps)
    if "draft_top1_prob" in frame:
        miss = np.clip(1.0 - frame["draft_top1_prob"].to_numpy(dtype=float), 0.0, 1.0)
        frame["log_draft_miss"] = np.log(miss + EPS_PROB)


def _add_target_miss(frame: pd.DataFrame) -> None:
    """``target_miss_prob`` = 1 - target_top1_prob and ``log_target_miss`` = log(1 - p + EPS_PROB), in place."""
    miss = np.clip(1.0 - frame["target_top1_prob"].to_numpy(dtype=float), 0.0, 1.0)
    frame["target_miss_prob"] = miss
    frame["log_target_miss"] = np.log(miss + EPS_PROB)


def _add_copy_logs(frame: pd.DataFrame) -> None:
    """``log1p_copy`` = log(1 + min(match, CONTEXT_MATCH_MAX)) and ``copy_full``, in place; NaN stays NaN."""
    length = frame["context_match"].to_numpy(dtype=float, na_value=np.nan)
    if np.any(length < 0):
        raise ValueError("context_match holds negative lengths")
    frame["log1p_copy"] = np.log1p(np.minimum(length, CONTEXT_MATCH_MAX))
    frame["copy_full"] = np.where(np.isnan(length), np.nan, (length >= CONTEXT_MATCH_MAX).astype(float))


def _add_sequence_covariates(table: pd.DataFrame, tokens: pd.DataFrame, eps: float) -> pd.DataFrame:
    """``sequence_covariates`` of every at-risk row, from each request's full entropy sequence."""
    seq = tokens[["run_id", "request_id", "position", "target_entropy_nats"]]
    seq = seq.assign(_h=np.maximum(seq["target_entropy_nats"].to_numpy(dtype=float, na_value=np.nan), 0.0))
    seq = seq.sort_values(["run_id", "request_id", "position"], kind="stable")
    keys = ["run_id", "request_id"]
    grouped = seq.groupby(keys, sort=False, observed=True)["_h"]
    seq = seq.assign(_prev=grouped.shift(1), _csum=grouped.cumsum(),
                     _n=seq.groupby(keys, sort=False, observed=True).cumcount() + 1.0)
    seq["_prev"] = seq["_prev"].fillna(seq["_h"])  # position 0: no previous position, its own H
    look = seq[[*keys, "position", "_prev", "_csum", "_n"]].astype({"run_id": str, "request_id": str})
    left = table[[*keys, "position"]].astype({"run_id": str, "request_id": str})
    merged = left.merge(look, on=[*keys, "position"], how="left", validate="many_to_one")
    table["lag_entropy_nats"] = merged["_prev"].to_numpy(dtype=float)
    table["run_mean_entropy_nats"] = (merged["_csum"] / merged["_n"]).to_numpy(dtype=float)
    table["log1p_position"] = np.log1p(table["position"].to_numpy(dtype=float))
    return add_log_covariates(table, eps)


def risk_draft_column(tokens: pd.DataFrame, table: pd.DataFrame, column: str) -> np.ndarray:
    """The tokens table's ``column`` at each at-risk row (NaN where null)."""
    keys = ["run_id", "request_id", "round_index", "depth"]
    look = tokens[[*keys, column]].astype({"run_id": str, "request_id": str})
    look = look.drop_duplicates(keys)
    left = table[keys].astype({"run_id": str, "request_id": str})
    left["depth"] = left["depth"].astype(look["depth"].dtype)
    merged = left.merge(look, on=keys, how="left", validate="many_to_one")
    return merged[column].to_numpy(dtype=float, na_value=np.nan)


def log_bin(values: np.ndarray, *, eps: float = EPS_NATS, width_log10: float = 0.05) -> np.ndarray:
    """Bin index of ``log10(x + eps)`` in steps of ``width_log10`` (bin 0 starts at x = 0)."""
    x = np.asarray(values, dtype=float)
    return np.floor((np.log10(x + eps) - np.log10(eps)) / width_log10).astype(np.int64)


def _add_bins(frame: pd.DataFrame, source: pd.DataFrame, columns, eps: float, width_log10: float) -> list[str]:
    """``bin_<column>`` of each of ``source``'s ``columns`` added to ``frame`` (in place); returns the names."""
    for col in columns:
        frame[f"bin_{col}"] = log_bin(source[col].to_numpy(), eps=eps, width_log10=width_log10)
    return [f"bin_{col}" for col in columns]


def _group_sums(frame: pd.DataFrame, keys: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Sums of ``values`` per distinct ``keys``, sorted by them (mixed-radix codes and ``np.bincount``: fast)."""
    code = np.zeros(len(frame), dtype=np.int64)
    uniques = []
    for key in keys:
        codes, levels = pd.factorize(frame[key], sort=True)
        uniques.append(levels)
        code = code * len(levels) + codes
    cells, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    out = {key: frame[key].to_numpy()[first] for key in keys}
    for col in values:
        out[col] = np.bincount(inverse, weights=frame[col].to_numpy(dtype=float), minlength=len(cells))
    return pd.DataFrame(out)


def mean_columns(table: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    """Covariate columns whose within-cell means an aggregate keeps (``extra``: decode-time ones too)."""
    unknown = sorted(set(extra) - set(DECODE_TIME))
    if unknown:
        raise ValueError(f"unknown extra covariate means {unknown}; known: {list(DECODE_TIME)}")
    missing = [c for c in extra if c not in table.columns]
    if missing:
        raise ValueError(f"the at-risk table lacks {missing}: build it with at_risk_table from traces (target "
                         "entropies and positions; draft_entropy_nats / draft_top1_prob need a drafter that logs them)")
    return [c for c in (*COVARIATES, *DERIVED, *extra) if c in table.columns]


def aggregate_at_risk(table: pd.DataFrame, *, bin_columns: Sequence[str] = ("target_entropy_nats",),
                      width_log10: float = 0.05, eps: float = EPS_NATS, keys: Sequence[str] = KEY_COLUMNS,
                      extra_means: Sequence[str] = ()) -> pd.DataFrame:
    """Counts (``n_acc``, ``n_rej``, ``n``) per ``keys`` x log-spaced bins of ``bin_columns`` and every covariate's cell
    mean; its binomial GLM equals the row-level fit on ``binned_rows``."""
    _require_columns(table, (*keys, "accepted", *bin_columns), "the at-risk table")
    means = mean_columns(table, extra_means)
    frame = table[[*keys, "accepted", *means]].copy()
    bin_names = _add_bins(frame, table, bin_columns, eps, width_log10)
    frame["n_acc"] = frame.pop("accepted").astype(np.int64)
    frame["n"] = 1
    out = _cell_means(_group_sums(frame, [*keys, *bin_names], ["n_acc", "n", *means]), means)
    out["n_rej"] = out["n"] - out["n_acc"]
    out.attrs.update(kind=KIND_AGGREGATED, eps=eps, width_log10=width_log10, bin_columns=tuple(bin_columns),
                     keys=tuple(keys))
    if extra_means:
        out.attrs["extra_means"] = tuple(extra_means)
    return out


def combine_aggregates(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Merge aggregates of disjoint chunks of one at-risk table (count-weighted cell means)."""
    if not parts:
        raise ValueError("no aggregates to combine")
    attrs = dict(parts[0].attrs)
    keys = [*attrs["keys"], *[f"bin_{c}" for c in attrs["bin_columns"]]]
    means = mean_columns(parts[0], attrs.get("extra_means", ()))
    frame = pd.concat(parts, ignore_index=True)
    for col in means:
        frame[col] = frame[col] * frame["n"]
    out = _cell_means(_group_sums(frame, keys, ["n_acc", "n_rej", "n", *means]), means)
    out.attrs.update(attrs)
    return out


def _cell_means(out: pd.DataFrame, means) -> pd.DataFrame:
    """Summed counts rounded to integers and summed covariates divided by ``n`` (in place; returns it)."""
    for col in {"n_acc", "n_rej", "n"} & set(out.columns):
        out[col] = np.rint(out[col]).astype(np.int64)
    for col in means:
        out[col] = out[col] / out["n"]
    return out


def binned_rows(table: pd.DataFrame, aggregate: pd.DataFrame) -> pd.DataFrame:
    """The row-level table with each row's covariates replaced by its aggregated cell's means."""
    attrs = aggregate.attrs
    keys = list(attrs["keys"])
    frame = table.copy()
    bin_names = _add_bins(frame, table, attrs["bin_columns"], attrs["eps"], attrs["width_log10"])
    means = mean_columns(aggregate, attrs.get("extra_means", ()))
    merged = frame.drop(columns=means).merge(aggregate[[*keys, *bin_names, *means]], on=[*keys, *bin_names],
                                             how="left", validate="many_to_one")
    merged.attrs.update(table.attrs)
    return merged


def as_counts(table: pd.DataFrame) -> pd.DataFrame:
    """A count table (``n_acc``, ``n_rej``, ``n``) from an at-risk table, aggregated or row-level."""
    if "n_acc" in table.columns:
        return table
    _require_columns(table, ("accepted",), "the at-risk table")
    out = table.copy()
    out["n_acc"] = out["accepted"].astype(np.int64)
    out["n_rej"] = 1 - out["n_acc"]
    out["n"] = 1
    out.attrs.update(table.attrs)
    return out

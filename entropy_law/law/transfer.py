"""Block-level prediction and leave-one-category-out (LOCO) transfer.

The law-implied tokens per round by exact DP over each request's entropy sequence, acceptance capped at the
drafted depth (``blocks.expected_round_counts``; depth models ``depth_probabilities``, ``TrainingDepthModel``),
against the observed; and LOCO: fit without a category, predict its tokens per round and trial log-likelihood
beside a refit on it, with a depth-only control. One drafter's runs must be one arm; requests are counted per
(run, request). The ranking statistics live in ``hypotheses``. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np
import pandas as pd

from entropy_law.law import arms, atrisk
from entropy_law.law.blocks import expected_round_counts, iid_tokens_per_round
from entropy_law.law.compare import depth_rates
from entropy_law.law.atrisk import sequences_of
from entropy_law.law.fit import FittedLaw, LawFamily, fit_law, get_family, prepare_counts
from entropy_law.law.information import predictor_inputs, sets_allowing, sets_label
from entropy_law.law.results import Result
from entropy_law.law.stats import exact_spearman_p
from entropy_law.traces.stats import CONTEXT_MATCH_MAX


def single_drafter(traces, drafter: str | None) -> tuple[str, pd.DataFrame]:
    """The drafter to analyse and its draft runs' rounds; its runs must be one arm (``arms``)."""
    runs = traces.runs
    rounds = traces.rounds.merge(runs[["run_id", "drafter_id"]], on="run_id", how="left")
    drafting = rounds.loc[rounds["tree_nodes"] > 0, "drafter_id"].dropna().unique()
    if drafter is None:
        if len(drafting) != 1:
            raise ValueError(f"traces hold drafters {sorted(drafting)}: pass drafter= one of them")
        drafter = drafting[0]
    if drafter not in set(drafting):
        raise ValueError(f"drafter {drafter!r} has no drafting rounds; drafters: {sorted(drafting)}")
    mine = rounds.loc[rounds["drafter_id"] == drafter]
    arms.check_one_arm_per_drafter(runs, mine["run_id"].unique())
    return drafter, mine


def entropy_sequences(traces, drafter: str) -> pd.DataFrame:
    """One row per request of the drafter's runs (``sequences_of``): ``request_id``, ``category``, ``run_id``,
    ``entropy`` (array over positions 0..T-1). Raises on gaps, NaN or negative entropies."""
    runs = traces.runs.loc[traces.runs["drafter_id"] == drafter, "run_id"]
    return sequences_of(traces.tokens.loc[traces.tokens["run_id"].isin(runs)])


def sequence_context(law, rec) -> dict:
    """The per-position arrays (``LawFamily.position_columns``) of a ``sequences_of`` row, None where absent."""
    return {column: getattr(rec, column, None) for column in law.family.position_columns}


DEPTH_MODELS = ("observed", "category", "full")


def drafted_depths(traces, drafter: str) -> pd.DataFrame:
    """One row per round of ``drafter``'s runs: ``run_id``, ``request_id``, ``round_index``, ``start_position`` and
    ``drafted_depth``, the draft tokens on the committed path: ``tree_depth`` for chains; for trees tau where the round
    ended at a leaf (a ``bonus`` token), else the tree's depth (an upper bound)."""
    runs = traces.runs.loc[traces.runs["drafter_id"] == drafter, "run_id"]
    rounds = traces.rounds.loc[traces.rounds["run_id"].isin(runs),
                               ["run_id", "request_id", "round_index", "start_position", "tree_depth", "accepted"]]
    tokens = traces.tokens
    bonus = tokens.loc[tokens["run_id"].isin(runs) & (tokens["role"] == "bonus"), ["run_id", "request_id", "round_index"]]
    bonus = bonus.drop_duplicates().assign(_leaf=True)
    out = rounds.merge(bonus, on=["run_id", "request_id", "round_index"], how="left")
    leaf = out.pop("_leaf").fillna(False).astype(bool).to_numpy()
    depth = out["tree_depth"].to_numpy(dtype=np.int64)
    out["drafted_depth"] = np.where(leaf, np.minimum(out["accepted"].to_numpy(dtype=np.int64), depth), depth)
    return out.drop(columns=["tree_depth", "accepted"]).reset_index(drop=True)


DEPTH_ENTROPY_EDGES = (0.01, 0.1, 0.3, 1.0, 3.0)  # nats: bins of H at a round's first position
DEPTH_PRIOR_ROUNDS = 10.0  # a bin's depth distribution is shrunk towards the category's by this many rounds
# levels of the context's copyability at a round's first position: 0, 1, 2-3, 4-7, CONTEXT_MATCH_MAX (the cap)
DEPTH_COPY_EDGES = (1, 2, 4, CONTEXT_MATCH_MAX)


def entropy_bin(entropy, edges=DEPTH_ENTROPY_EDGES) -> np.ndarray:
    """The bin of ``edges`` each value falls in (0 .. len(edges))."""
    return np.searchsorted(np.asarray(edges, dtype=float), np.asarray(entropy, dtype=float), side="right")


def binned_depth_distribution(start_entropy, drafted_depth, drafts: int, *, edges=DEPTH_ENTROPY_EDGES,
                              prior_rounds: float = DEPTH_PRIOR_ROUNDS) -> np.ndarray:
    """``[len(edges) + 1, drafts + 1]``: share of rounds that drafted D = 0..``drafts`` per bin of ``start_entropy``
    (nats), each bin shrunk towards the pooled distribution by ``prior_rounds``."""
    d = np.asarray(drafted_depth, dtype=np.int64)
    if d.size == 0:
        raise ValueError("no rounds to estimate the drafted-depth distribution from")
    if d.max() > drafts:
        raise ValueError(f"drafted depth {d.max()} exceeds B - 1 = {drafts}")
    pooled = np.bincount(d, minlength=drafts + 1) / d.size
    n_bins = len(edges) + 1
    if n_bins == 1:
        return pooled[None, :]
    b = entropy_bin(np.asarray(start_entropy, dtype=float), edges)
    counts = np.zeros((n_bins, drafts + 1))
    np.add.at(counts, (b, d), 1.0)
    return (counts + prior_rounds * pooled) / (counts.sum(axis=1, keepdims=True) + prior_rounds)


def depth_distribution(depths: pd.DataFrame, drafts: int, *, edges=DEPTH_ENTROPY_EDGES,
                       prior_rounds: float = DEPTH_PRIOR_ROUNDS) -> np.ndarray:
    """``binned_depth_distribution`` of the rounds after position 0 (else all); ``edges=()``: one distribution."""
    later = depths.loc[depths["start_position"] > 0]
    if later.empty:
        later = depths
    return binned_depth_distribution(later["start_entropy"], later["drafted_depth"], drafts, edges=edges,
                                     prior_rounds=prior_rounds)


@dataclass(frozen=True)
class TrainingDepthModel:
    """The drafted depth D of a round predicted from what is known before it, fitted on other categories' rounds:
    ``first`` (the round at position 0) and ``later``, each ``[len(edges) + 1, drafts + 1]`` over bins of the round's
    start entropy; and ``copy`` (``[len(copy_edges) + 1, len(edges) + 1, drafts + 1]``) over the context's copyability
    levels there, each cell shrunk towards ``later``'s bin, where the training rounds hold ``start_context_match``."""

    first: np.ndarray
    later: np.ndarray
    edges: tuple = DEPTH_ENTROPY_EDGES
    copy: np.ndarray | None = None
    copy_edges: tuple = DEPTH_COPY_EDGES

    @classmethod
    def fit(cls, depths: pd.DataFrame, drafts: int, *, edges=DEPTH_ENTROPY_EDGES, copy_edges=DEPTH_COPY_EDGES,
            prior_rounds: float = DEPTH_PRIOR_ROUNDS) -> "TrainingDepthModel":
        """From ``drafted_depths`` rows with ``start_entropy`` and, for ``copy``, ``start_context_match``
        (``with_start_entropy``); ``copy`` is None where no round has it or ``copy_edges=()``."""
        at0 = depths.loc[depths["start_position"] == 0]
        later = depths.loc[depths["start_position"] > 0]
        later = depths if later.empty else later
        first = (binned_depth_distribution(at0["start_entropy"], at0["drafted_depth"], drafts, edges=edges,
                                           prior_rounds=prior_rounds) if len(at0) else None)
        rest = binned_depth_distribution(later["start_entropy"], later["drafted_depth"], drafts, edges=edges,
                                         prior_rounds=prior_rounds)
        copy = None
        if copy_edges and "start_context_match" in later:
            known = later.loc[later["start_context_match"].notna()]
            if len(known):
                c = entropy_bin(known["start_context_match"].to_numpy(dtype=float), copy_edges)
                e = np.minimum(entropy_bin(known["start_entropy"].to_numpy(dtype=float), edges), rest.shape[0] - 1)
                counts = np.zeros((len(copy_edges) + 1, rest.shape[0], drafts + 1))
                np.add.at(counts, (c, e, known["drafted_depth"].to_numpy(dtype=np.int64)), 1.0)
                copy = (counts + prior_rounds * rest[None]) / (counts.sum(axis=2, keepdims=True) + prior_rounds)
        return cls(first=rest if first is None else first, later=rest, edges=tuple(edges), copy=copy,
                   copy_edges=tuple(copy_edges))

    def probabilities(self, entropy, context_match=None) -> np.ndarray:
        """``[T, drafts + 1]``: P(D | entropy bin at t), with ``context_match`` and a ``copy`` table also given the
        copyability level at t; the first-round distribution at t = 0."""
        h = np.asarray(entropy, dtype=float)
        e = np.minimum(entropy_bin(h, self.edges), self.later.shape[0] - 1)
        if self.copy is not None and context_match is not None:
            m = np.asarray(context_match, dtype=float)
            if m.shape != h.shape or np.isnan(m).any():
                raise ValueError(f"context_match must hold one value per output position ({h.size}) without nulls")
            probs = self.copy[entropy_bin(m, self.copy_edges), e].copy()
        else:
            probs = self.later[e].copy()
        if h.size:
            probs[0] = self.first[min(int(e[0]), self.first.shape[0] - 1)]
        return probs


def depth_probabilities(length: int, drafts: int, mode: str, *, observed: pd.DataFrame | None = None,
                        distribution: np.ndarray | None = None, entropy=None,
                        edges=DEPTH_ENTROPY_EDGES) -> np.ndarray | None:
    """``[length, drafts + 1]``: P(D = 0..``drafts``) for a round starting at each position
    (``blocks.expected_round_counts``); None for ``mode="full"``. ``"observed"``: the request's observed depth where one
    of its rounds started (``observed`` rows), elsewhere ``distribution`` (per bin of ``edges`` of the position's
    ``entropy``); ``"category"``: ``distribution`` everywhere but position 0 (observed)."""
    if mode not in DEPTH_MODELS:
        raise ValueError(f"depths must be one of {DEPTH_MODELS}, got {mode!r}")
    if mode == "full":
        return None
    dist = np.atleast_2d(np.asarray(distribution, dtype=float))
    if dist.shape[0] == 1:
        probs = np.tile(dist[0], (length, 1))
    else:
        if entropy is None or len(entropy) < length:
            raise ValueError("an entropy-binned depth distribution needs the entropy at every position")
        probs = dist[entropy_bin(np.asarray(entropy, dtype=float)[:length], edges)]
    if observed is not None and len(observed):
        start = observed["start_position"].to_numpy(dtype=np.int64)
        depth = observed["drafted_depth"].to_numpy(dtype=np.int64)
        keep = (start < length) if mode == "observed" else (start == 0)
        probs[start[keep]] = 0.0
        probs[start[keep], depth[keep]] = 1.0
    return probs


def _block_size(rounds: pd.DataFrame) -> int:
    return int(rounds["tree_depth"].max()) + 1


def with_start_entropy(drafted: pd.DataFrame, sequences: pd.DataFrame) -> pd.DataFrame:
    """``drafted_depths`` rows with ``category``, ``start_entropy`` and, where known, ``start_context_match``."""
    entropy_of = {(r.run_id, r.request_id): np.asarray(r.entropy, dtype=float) for r in sequences.itertuples()}
    joined = drafted.merge(sequences[["run_id", "request_id", "category"]], on=["run_id", "request_id"], how="inner")
    keys = list(zip(zip(joined["run_id"], joined["request_id"]), joined["start_position"]))
    joined["start_entropy"] = [entropy_of[key][min(pos, len(entropy_of[key]) - 1)] for key, pos in keys]
    if "context_match" in sequences:  # the copyability before the round's first position (NaN: not recorded)
        match_of = {(r.run_id, r.request_id): r.context_match for r in sequences.itertuples()}
        joined["start_context_match"] = [np.nan if match_of[key] is None else
                                         float(match_of[key][min(pos, len(match_of[key]) - 1)]) for key, pos in keys]
    return joined


def proposal_arrays(proposals: pd.DataFrame, length: int, drafts: int, *,
                    where: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(depth [T], top1 [T, drafts])`` of one request from its replayed proposals (``traces.proposals``): the depth
    drafted in a round starting at each position (capped at ``drafts``; 0 at the prefill unless a row says otherwise)
    and its top-1 probability per depth (NaN: nothing drafted). Every start 1..T-1 must be there."""
    depth = np.zeros(length, dtype=np.int64)
    top1 = np.full((length, drafts), np.nan)
    start = proposals["start_position"].to_numpy(np.int64)
    inside = start < length
    start = start[inside]
    of = proposals["proposal_depth"].to_numpy(np.int64)[inside]
    d = proposals["depth"].to_numpy(np.int64)[inside]
    missing = np.setdiff1d(np.arange(1, length), start)
    if missing.size:
        raise ValueError(f"replayed proposals{where} lack {missing.size} of the {length - 1} round starts (first: "
                         f"position {missing[0]}); replay them for this run (bench/law.py proposals --write)")
    depth[start] = np.minimum(of, drafts)
    keep = (d >= 1) & (d <= drafts)
    top1[start[keep], d[keep] - 1] = proposals["top1_prob"].to_numpy(float)[inside][keep]
    return depth, top1


def replayed_arrays(proposals: pd.DataFrame, sequences: pd.DataFrame, drafts: int) -> dict:
    """``{(run_id, request_id): (depth probabilities [T, drafts + 1], top1 [T, drafts])}`` for every request of
    ``sequences`` from ``proposal_arrays``; a request without proposals is an error."""
    groups = proposals.astype({"run_id": str, "request_id": str}).groupby(["run_id", "request_id"], sort=False)
    out = {}
    for rec in sequences.itertuples():
        key = (str(rec.run_id), str(rec.request_id))
        if key not in groups.groups:
            raise ValueError(f"no replayed proposals for request {key[1]!r} of run {key[0]!r}; replay them "
                             "(bench/law.py proposals --write)")
        depth, top1 = proposal_arrays(groups.get_group(key), len(rec.entropy), drafts, where=f" of request {key[1]!r}")
        out[key] = (np.eye(drafts + 1)[depth], top1)
    return out


def predict_requests(law: FittedLaw, sequences: pd.DataFrame, B: int, *, drafter=None, depths: str = "full",
                     drafted: pd.DataFrame | None = None, depth_edges=DEPTH_ENTROPY_EDGES,
                     depth_model: TrainingDepthModel | None = None,
                     depth_only_acceptance: np.ndarray | None = None,
                     proposals: pd.DataFrame | None = None, shared: dict | None = None) -> pd.DataFrame:
    """Per request: T, DP-expected rounds and drafting rounds under the depth model ``depths`` (``depth_probabilities``;
    ``drafted`` for ``"observed"`` / ``"category"``; ``depth_model`` for ``"training"``; ``proposals`` for
    ``"replayed"``), the full-depth DP's rounds and the summed depth-1 acceptance. ``depth_only_acceptance``
    (``[drafts]``): the same DP for the depth-only control (``*_depth_only`` columns). ``attrs["info_sets"]``: the
    information sets that hold what it read. ``shared``: a dict kept between calls on the same ``sequences`` and
    ``proposals``, where the rows to predict are built once per law family."""
    _check_depth_inputs(law, depths, drafted, depth_model, proposals)
    drafts = int(B) - 1
    shared = {} if shared is None else shared
    if shared.get("key") != (law.family, depths, drafts):  # the rows are those of every law of the family
        replayed = replayed_arrays(proposals, sequences, drafts) if depths == "replayed" else {}
        frames, shapes = [], []
        for rec in sequences.itertuples():
            top1 = replayed[(str(rec.run_id), str(rec.request_id))][1] if replayed else None
            frame, shape = law.sequence_frame(np.asarray(rec.entropy, dtype=float), drafts,
                                              **sequence_context(law, rec),
                                              draft_top1=top1 if law.family.needs_draft_stats else None)
            frame["category"] = rec.category
            frames.append(frame)
            depth_1 = frame["depth"].to_numpy() == 1  # depth 1 of a full round at every position
            if "drafted_depth" in frame:
                depth_1 &= frame["drafted_depth"].to_numpy() == drafts
            shapes.append((shape, depth_1))
        if not frames:
            raise ValueError("no request sequences to predict")
        shared.update(key=(law.family, depths, drafts), replayed=replayed, shapes=shapes,
                      data=pd.concat(frames, ignore_index=True))
    replayed, data, shapes = shared["replayed"], shared["data"], shared["shapes"]
    accept = law.predict_frame(data if drafter is None else data.assign(drafter_id=drafter))
    by_request, by_category = {}, {}
    if depths in ("observed", "category"):
        joined = with_start_entropy(drafted, sequences)
        by_request = {key: part for key, part in joined.groupby(["run_id", "request_id"], sort=False)}
        by_category = {cat: depth_distribution(part, drafts, edges=depth_edges)
                       for cat, part in joined.groupby("category")}
    rows = []
    start = 0
    for rec, (shape, depth_1) in zip(sequences.itertuples(), shapes):
        n = len(rec.entropy)
        rows_accept = np.asarray(accept[start : start + depth_1.size])
        start += depth_1.size
        a = law.shape_acceptance(rows_accept, shape)
        a1 = rows_accept[depth_1]
        full_rounds, _ = expected_round_counts(a)
        if depths == "full":
            probs = None
            rounds, drafting = full_rounds, full_rounds
        else:
            if depths == "training":
                probs = depth_model.probabilities(rec.entropy, getattr(rec, "context_match", None))
            elif depths == "replayed":
                probs = replayed[(str(rec.run_id), str(rec.request_id))][0]
            else:
                probs = depth_probabilities(n, drafts, depths, observed=by_request.get((rec.run_id, rec.request_id)),
                                            distribution=by_category[rec.category], entropy=rec.entropy,
                                            edges=depth_edges)
            rounds, drafting = expected_round_counts(a, probs)
        row = dict(request_id=rec.request_id, category=rec.category, run_id=rec.run_id, tokens=n,
                   predicted_rounds=rounds, predicted_drafting_rounds=drafting,
                   predicted_rounds_full_depth=full_rounds, sum_acceptance_d1=float(a1.sum()))
        if depth_only_acceptance is not None:  # the control: acceptance by depth only, same depth model, same DP
            control = np.tile(np.asarray(depth_only_acceptance, dtype=float)[:drafts], (n, 1))
            row["predicted_rounds_depth_only"], row["predicted_drafting_rounds_depth_only"] = (
                expected_round_counts(control, probs))
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["info_sets"] = sets_allowing(predictor_inputs(law.family, depths))
    return out


def _check_depth_inputs(law: FittedLaw, depths: str, drafted, depth_model, proposals) -> None:
    """Raise where the depth model lacks its input or the law needs replayed proposals."""
    if depths not in DEPTH_MODELS + ("training", "replayed"):
        raise ValueError(f"depths must be one of {DEPTH_MODELS + ('training', 'replayed')}, got {depths!r}")
    if depths in ("observed", "category") and drafted is None:
        raise ValueError(f"depths={depths!r} needs the drafted depths of the requests' rounds (drafted_depths)")
    if depths == "training" and depth_model is None:
        raise ValueError("depths='training' needs a depth_model (TrainingDepthModel.fit on other requests' rounds)")
    if depths == "replayed" and proposals is None:
        raise ValueError("depths='replayed' needs the drafter's replayed proposals (traces.proposals.read_proposals; "
                         "bench/law.py proposals --write makes them)")
    if law.family.needs_draft_stats and depths != "replayed":
        raise ValueError(f"{law.family.name} predicts from the drafter's top-1 probability at every round start: "
                         "use depths='replayed' with replayed proposals")


@dataclass
class BlockPrediction(Result):
    """Observed vs predicted tokens per round per category: exact DP and i.i.d. plug-in."""

    summary: pd.DataFrame
    per_request: pd.DataFrame
    block_size: int
    depths: str = "full"
    notes: list = field(default_factory=list)
    info_sets: list = field(default_factory=list)  # the information sets that hold what the prediction read

    @property
    def title(self) -> str:
        return (f"tokens per round, observed vs law-predicted (B = {self.block_size}, drafted depths: {self.depths}; "
                f"{sets_label(self.info_sets)})")


def _block_summary(pred: pd.DataFrame, observed: pd.DataFrame, drafts: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    per_req = pred.merge(observed, on=["run_id", "request_id"], how="inner", validate="one_to_one")
    g = per_req.groupby("category")
    tokens = g["tokens"].sum()
    summary = pd.DataFrame({
        "requests": g.size(),
        "observed_tokens_per_round": tokens / g["observed_rounds"].sum(),
        "dp_tokens_per_round": tokens / g["predicted_rounds"].sum(),
    })
    summary["dp_relative_error"] = summary["dp_tokens_per_round"] / summary["observed_tokens_per_round"] - 1
    summary["dp_full_depth_tokens_per_round"] = tokens / g["predicted_rounds_full_depth"].sum()
    summary["dp_full_depth_relative_error"] = (summary["dp_full_depth_tokens_per_round"]
                                               / summary["observed_tokens_per_round"] - 1)
    # accepted drafts per drafting round: (committed tokens - rounds) / rounds that drafted, both sides
    summary["observed_mean_accepted"] = (tokens - g["observed_rounds"].sum()) / g["observed_drafting_rounds"].sum()
    summary["dp_mean_accepted"] = (tokens - g["predicted_rounds"].sum()) / g["predicted_drafting_rounds"].sum()
    summary["dp_mean_accepted_relative_error"] = summary["dp_mean_accepted"] / summary["observed_mean_accepted"] - 1
    if "predicted_rounds_depth_only" in per_req:  # the depth-only control (no entropy), same depth model and DP
        summary["depth_only_tokens_per_round"] = tokens / g["predicted_rounds_depth_only"].sum()
        summary["depth_only_mean_accepted"] = ((tokens - g["predicted_rounds_depth_only"].sum())
                                               / g["predicted_drafting_rounds_depth_only"].sum())
    # three i.i.d. plug-ins of a "category-mean acceptance" (see docs/law.md, block-level prediction)
    plugins = {
        "round_start": g["observed_first_accepted"].sum() / g["observed_drafting_rounds"].sum(),
        "at_risk": g["observed_accepted_sum"].sum() / g["observed_at_risk"].sum(),
        "position": g["sum_acceptance_d1"].sum() / g["tokens"].sum(),
    }
    for name, alpha in plugins.items():
        summary[f"alpha_{name}"] = alpha
        summary[f"iid_{name}_tokens_per_round"] = iid_tokens_per_round(alpha.to_numpy(), drafts)
        summary[f"iid_{name}_relative_error"] = (summary[f"iid_{name}_tokens_per_round"]
                                                 / summary["observed_tokens_per_round"] - 1)
    return summary, per_req


def _observed_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    frame = rounds.assign(_first=(rounds["accepted"] >= 1).astype(int), _drafting=(rounds["tree_depth"] > 0).astype(int),
                          _at_risk=rounds["accepted"] + (rounds["accepted"] < rounds["tree_depth"]))
    return frame.groupby(["run_id", "request_id"], as_index=False).agg(
        observed_rounds=("round_index", "size"), observed_tokens=("committed", "sum"),
        observed_drafting_rounds=("_drafting", "sum"),
        observed_first_accepted=("_first", "sum"), observed_accepted_sum=("accepted", "sum"),
        observed_at_risk=("_at_risk", "sum"))


DEPTH_NOTES = {
    "observed": "drafted depths: the observed depth where a round started, elsewhere the category's depth "
                "distribution given the entropy bin at the round start (rounds after position 0); acceptance capped "
                "at the drafted depth",
    "category": "drafted depths: the category's depth distribution given the entropy bin at the round start (rounds "
                "after position 0) at every round start but the first (observed); acceptance capped at the drafted depth",
    "full": "drafted depths: every round drafts the full block (B - 1)",
    "training": "drafted depths (leak-free): predicted by a depth model fitted on the training categories only, "
                "P(D | entropy bin at the round start, first round or later, and the context's copyability there "
                "where the traces hold it), pooled over their rounds; nothing of the held-out category is used but "
                "its entropy and copyability sequences (not its drafted depths, not its tau)",
    "replayed": "drafted depths (leak-free): the drafter's own proposal replayed offline at every output position of "
                "the held-out requests (their prompt and greedy output only: no round's outcome, not tau); a law in "
                "the drafter's top-1 probability takes it from the same replay",
    "oracle": "drafted depths (oracle, NOT leak-free): the held-out category's own observed depth where a round "
              "started (for trees tau where a round ended at a leaf), elsewhere its own entropy-binned depth "
              "distribution",
}

LOCO_DEPTH_MODELS = ("training", "replayed", "oracle", "category", "full")  # "observed" is accepted as "oracle"
# the widening of a verdict whose law's transfer error cannot be measured on its own traces (fewer than 3
# categories): the largest LOCO |relative error| of tokens per round in docs/law.md's checks, rounded up
UNMEASURED_TRANSFER_ERROR = 0.44


def block_prediction(law: FittedLaw, traces, *, drafter: str | None = None, B: int | None = None,
                     depths: str = "observed", depth_edges=DEPTH_ENTROPY_EDGES,
                     proposals: pd.DataFrame | None = None) -> BlockPrediction:
    """Observed vs predicted tokens per round per category for ``drafter``'s runs (in-sample law).

    ``depths``: the DP's drafted-depth model (``depth_probabilities``): ``"observed"``, ``"category"``, ``"full"`` or
    ``"replayed"`` (with ``proposals``); ``depth_edges``: entropy bins of the category's depth distribution (``()``:
    one). The full-depth DP is always reported too (``dp_full_depth_*``).
    """
    drafter, rounds = single_drafter(traces, drafter)
    B = B or _block_size(rounds)
    seqs = entropy_sequences(traces, drafter)
    drafted = drafted_depths(traces, drafter) if depths not in ("full", "replayed") else None
    pred = predict_requests(law, seqs, B, drafter=drafter if law.family.needs_drafters else None, depths=depths,
                            drafted=drafted, depth_edges=depth_edges, proposals=proposals)
    summary, per_req = _block_summary(pred, _observed_rounds(rounds), B - 1)
    return BlockPrediction(summary=summary, per_request=per_req, block_size=B, depths=depths,
                           info_sets=pred.attrs["info_sets"], notes=[DEPTH_NOTES[depths],
                                  "mean_accepted = (committed tokens - rounds) / drafting rounds (tree_depth > 0)",
                                  "iid_round_start: alpha = observed share of drafting rounds whose first draft is "
                                  "accepted; iid_at_risk: alpha = accepted / at-risk trials (rounds table); "
                                  "iid_position: alpha = the law's depth-1 acceptance averaged over all output positions"])


@dataclass
class LocoTransfer(Result):
    """Leave-one-category-out: predicted vs observed per held-out category; ``accuracy``: across
    categories, per quantity (tokens per round, mean accepted length per drafting round)."""

    summary: pd.DataFrame
    family: str
    block_size: int
    depths: str = "full"
    notes: list = field(default_factory=list)
    info_sets: list = field(default_factory=list)  # the information sets that hold what the predictions read
    # ``rerun(without=(c,), ...)``: the same run on the other categories only (``calibrated_transfer``)
    rerun: object = field(default=None, repr=False, compare=False)

    @property
    def title(self) -> str:
        return (f"leave-one-category-out transfer of {self.family} (B = {self.block_size}, "
                f"drafted depths: {self.depths}; {sets_label(self.info_sets)})")

    @property
    def accuracy(self) -> pd.DataFrame:
        """Per quantity: mean, mean absolute and largest absolute relative error over the held-out categories, Spearman
        rho of predicted vs observed and its exact one-sided permutation p (NaN beyond 9)."""
        s = self.summary
        pairs = {"tokens_per_round": ("predicted_tokens_per_round", "observed_tokens_per_round"),
                 "mean_accepted": ("predicted_mean_accepted", "observed_mean_accepted"),
                 "tokens_per_round_full_depth": ("predicted_tokens_per_round_full_depth", "observed_tokens_per_round"),
                 "tokens_per_round_depth_only": ("depth_only_tokens_per_round", "observed_tokens_per_round"),
                 "mean_accepted_depth_only": ("depth_only_mean_accepted", "observed_mean_accepted")}
        rows = {}
        for name, (pred, obs) in pairs.items():
            if pred not in s:
                continue
            rel = s[pred] / s[obs] - 1
            rho, p = exact_spearman_p(s[pred], s[obs])  # p: NaN beyond 9 categories
            rows[name] = dict(categories=len(s), mean_relative_error=float(rel.mean()),
                              mean_abs_relative_error=float(rel.abs().mean()), max_abs_relative_error=float(rel.abs().max()),
                              spearman_rho=rho, p_permutation=p)
        return pd.DataFrame.from_dict(rows, orient="index")

    def _text(self, decimals: int = 4) -> str:
        with pd.option_context("display.max_columns", 50, "display.width", 160):
            extra = "\naccuracy across categories:\n" + self.accuracy.round(decimals).to_string()
        return super()._text(decimals) + extra


class LocoInputs(NamedTuple):
    family: LawFamily
    drafter: str
    rounds: pd.DataFrame
    B: int
    rows: pd.DataFrame  # at-risk rows of the drafter
    counts: pd.DataFrame  # the family's count table of those rows
    categories: list
    seqs: pd.DataFrame  # entropy sequences of the drafter's requests


def loco_inputs(traces, family, *, drafter: str | None, B: int | None, eps: float, min_categories: int,
                what: str = "LOCO transfer"):
    """The category-free family, the drafter and its rounds, B, the at-risk rows and counts, their categories (at least
    ``min_categories``) and the drafter's entropy sequences."""
    fam = get_family(family)
    if fam.uses_category:
        raise ValueError(f"{fam.name} has category terms and cannot predict an unseen category; use a category-free law")
    drafter, rounds = single_drafter(traces, drafter)
    B = B or _block_size(rounds)
    rows = atrisk.at_risk_table(traces, eps=eps, drafters=[drafter])
    counts = prepare_counts(rows, fam, eps=eps)
    categories = sorted(counts["category"].unique())
    if len(categories) < min_categories:
        raise ValueError(f"{what} needs at least {min_categories} categories; the traces hold {categories}")
    return LocoInputs(fam, drafter, rounds, B, rows, counts, categories, entropy_sequences(traces, drafter))


def _log_residuals(summary: pd.DataFrame) -> np.ndarray:
    return np.log(summary["observed_tokens_per_round"].to_numpy(float)
                  / summary["predicted_tokens_per_round"].to_numpy(float))


def calibrated_transfer(loco: "LocoTransfer") -> tuple[float, float, pd.DataFrame]:
    """``(b, transfer_error, table)`` from a ``loco_transfer`` run: ``b`` the mean over held-out categories of
    log(observed / predicted tokens per round); ``table`` per category c the prediction scaled by e^b_-c, where b_-c
    comes from laws fitted without c (``loco.rerun(without=(c,))``), and its relative error; ``transfer_error`` the
    largest |error|. With fewer than 3 categories ``b`` is 0 and the error the uncalibrated one."""
    s = loco.summary
    ratio = _log_residuals(s)
    table = pd.DataFrame({"category": s.index.to_numpy(), "observed_tokens_per_round":
                          s["observed_tokens_per_round"].to_numpy(float), "predicted_tokens_per_round":
                          s["predicted_tokens_per_round"].to_numpy(float)})
    k = len(ratio)
    if k < 3 or not np.all(np.isfinite(ratio)):
        table["calibrated_tokens_per_round"] = table["predicted_tokens_per_round"]
        table["relative_error"] = table["calibrated_tokens_per_round"] / table["observed_tokens_per_round"] - 1
        return 0.0, float(table["relative_error"].abs().max()), table
    if loco.rerun is None:
        raise ValueError("calibrated_transfer refits without each category: give it a loco_transfer result")
    others = np.array([_log_residuals(loco.rerun(without=(c,), min_categories=2, logliks=False).summary).mean()
                       for c in table["category"]])  # b_-c, from laws that never saw c
    table["calibrated_tokens_per_round"] = table["predicted_tokens_per_round"] * np.exp(others)
    table["relative_error"] = table["calibrated_tokens_per_round"] / table["observed_tokens_per_round"] - 1
    return float(ratio.mean()), float(table["relative_error"].abs().max()), table


def loco_transfer(traces, family: str = "law_exp", *, drafter: str | None = None, B: int | None = None,
                  eps: float = atrisk.EPS_NATS, min_categories: int = 3, depths: str = "training",
                  depth_edges=DEPTH_ENTROPY_EDGES, depth_copy_edges=DEPTH_COPY_EDGES,
                  proposals: pd.DataFrame | None = None, without=(), logliks: bool = True,
                  **fit_options) -> LocoTransfer:
    """Fit ``family`` (category-free) without each category in turn and predict that category.

    Columns: observed and predicted tokens per round and mean accepted length per drafting round with their relative
    errors, the full-depth DP's and the depth-only control's predictions (``depth_only_*``), and held-out
    log-likelihoods per trial under the LOCO law, a refit and a depth-only null, with ``transfer_ratio`` = (LL_null -
    LL_loco) / (LL_null - LL_refit).

    ``depths``: ``"training"`` (leak-free: a ``TrainingDepthModel`` on the training categories with bins ``depth_edges``
    and ``depth_copy_edges``), ``"replayed"`` (leak-free, needs ``proposals``), ``"oracle"`` (= ``"observed"``: the
    category's own depths), ``"category"``, ``"full"``. ``without``: categories left out of everything;
    ``logliks=False``: no held-out log-likelihoods. Laws are fitted ``cov_type="nonrobust"`` unless ``fit_options`` says
    otherwise.
    """
    if depths == "observed":
        depths = "oracle"
    if depths not in LOCO_DEPTH_MODELS:
        raise ValueError(f"depths must be one of {LOCO_DEPTH_MODELS}, got {depths!r}")
    inputs = loco_inputs(traces, family, drafter=drafter, B=B, eps=eps, min_categories=min_categories)
    drafted = drafted_depths(traces, inputs.drafter) if depths != "full" else None
    run = partial(_loco_run, inputs, drafted, depths=depths, depth_edges=depth_edges,
                  depth_copy_edges=depth_copy_edges, proposals=proposals, memo={}, **fit_options)
    return run(without=without, min_categories=min_categories, logliks=logliks, rerun=run)


def _loco_run(inputs: "LocoInputs", drafted, *, depths, depth_edges, depth_copy_edges, proposals, memo: dict,
              without=(), min_categories: int = 3, logliks: bool = True, rerun=None, **fit_options) -> LocoTransfer:
    """``loco_transfer`` on inputs read once, ``without`` categories left out of everything. ``memo``, kept across
    reruns: each law by the categories it was fitted without, each category's rows to predict."""
    fam, _, rounds, B, _, counts, categories, seqs = inputs
    if without:
        counts, seqs = counts.loc[~counts["category"].isin(without)], seqs.loc[~seqs["category"].isin(without)]
        categories = [c for c in categories if c not in without]
        if len(categories) < min_categories:
            raise ValueError(f"LOCO transfer needs at least {min_categories} categories; the traces hold {categories}")
    dp_depths = "observed" if depths == "oracle" else depths
    fit_options = {"cov_type": "nonrobust", **fit_options}
    drafts = B - 1
    drafted_h = with_start_entropy(drafted, seqs) if depths == "training" else None
    observed = _observed_rounds(rounds)
    out = []
    for cat in categories:
        train, test = counts.loc[counts["category"] != cat], counts.loc[counts["category"] == cat]
        left_out = frozenset((*without, cat))  # rerun(without=(a,)) fold b fits the law of rerun((b,)) fold a
        loco = memo[left_out] if left_out in memo else memo.setdefault(left_out, fit_law(train, fam, **fit_options))
        held_out = _held_out_logliks(loco, fit_law(test, fam, **fit_options), test) if logliks else {}
        model = (TrainingDepthModel.fit(drafted_h.loc[drafted_h["category"] != cat], drafts, edges=depth_edges,
                                        copy_edges=depth_copy_edges) if depths == "training" else None)
        pred = predict_requests(loco, seqs.loc[seqs["category"] == cat], B, depths=dp_depths,
                                drafted=None if depths in ("training", "replayed") else drafted,
                                depth_edges=depth_edges, depth_model=model, proposals=proposals,
                                depth_only_acceptance=depth_only_acceptance(train, drafts),
                                shared=memo.setdefault(("rows", cat), {}))
        summary, _ = _block_summary(pred, observed, drafts)
        out.append({**_loco_row(cat, summary.iloc[0]), **held_out})
    summary = pd.DataFrame(out).set_index("category")
    return LocoTransfer(summary=summary, family=fam.name, block_size=B, depths=depths, rerun=rerun,
                        info_sets=sets_allowing(predictor_inputs(fam, depths)), notes=[DEPTH_NOTES[depths],
                               "depth_only_*: control with acceptance per depth pooled over the training categories "
                               "(no entropy), the same drafted-depth model and the same DP",
                               "mean_accepted = (committed tokens - rounds) / drafting rounds (tree_depth > 0), "
                               "observed and DP-expected alike"])


def _held_out_logliks(loco: FittedLaw, refit: FittedLaw, test: pd.DataFrame) -> dict:
    """Held-out log-likelihood per trial under the LOCO law, the refit and a depth-only null."""
    null = test.groupby("depth")[["n_acc", "n"]].sum()
    p_null = test["depth"].map(null["n_acc"] / null["n"]).to_numpy().clip(1e-12, 1 - 1e-12)
    ll_null = float((test["n_acc"] * np.log(p_null) + test["n_rej"] * np.log1p(-p_null)).sum())
    ll_loco, ll_refit = float(loco.log_likelihood(test).sum()), float(refit.log_likelihood(test).sum())
    n = float(test["n"].sum())
    return dict(loglik_loco=ll_loco / n, loglik_refit=ll_refit / n, loglik_null=ll_null / n,
                transfer_ratio=(ll_null - ll_loco) / (ll_null - ll_refit) if ll_refit > ll_null else np.nan)


def _loco_row(cat, first: pd.Series) -> dict:
    """The held-out category's observed and predicted tokens per round and mean accepted length."""
    return dict(category=cat, requests=int(first["requests"]),
                observed_tokens_per_round=first["observed_tokens_per_round"],
                predicted_tokens_per_round=first["dp_tokens_per_round"],
                relative_error=first["dp_relative_error"],
                predicted_tokens_per_round_full_depth=first["dp_full_depth_tokens_per_round"],
                relative_error_full_depth=first["dp_full_depth_relative_error"],
                depth_only_tokens_per_round=first["depth_only_tokens_per_round"],
                relative_error_depth_only=(first["depth_only_tokens_per_round"]
                                           / first["observed_tokens_per_round"] - 1),
                observed_mean_accepted=first["observed_mean_accepted"],
                predicted_mean_accepted=first["dp_mean_accepted"],
                mean_accepted_relative_error=first["dp_mean_accepted_relative_error"],
                depth_only_mean_accepted=first["depth_only_mean_accepted"])


def depth_only_acceptance(counts: pd.DataFrame, drafts: int) -> np.ndarray:
    """``[drafts]``: accepted / at-risk trials per depth over ``counts``; a depth without trials reuses the deepest
    depth with trials."""
    if not (counts["n"] > 0).any():
        raise ValueError("no at-risk trials for the depth-only control")
    return depth_rates(counts, np.arange(1, drafts + 1))

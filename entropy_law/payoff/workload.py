"""When drafting pays on a workload: the break-even on the scale of a request's mean target entropy.

Each request is priced on its own entropy sequence h_0..h_{T-1}, not at a constant entropy (``cost.breakeven_entropy``
answers that other question; the two must not be compared). With P(D | t) from the arm's rounds, n(D) its mean draft
nodes at depth D and P(tau = k | t) from the law, the DP gives expected rounds R, draft nodes M and drafting rounds G:

    R(t) = 1 + sum_k P(tau = k | t) R(t + k + 1),  M(t) = sum_D P(D | t) n(D) + sum_k P(tau = k | t) M(t + k + 1)

(G as M with P(D > 0 | t)); E[decode cost] = v0 R + (draft + overhead) G + no_draft (R - G) + v1 M, and the predicted
speedup is (T - 1) t_AR / E[cost]. The break-even, its measured twin and their request-bootstrap intervals:
``docs/law.md``, "When drafting pays on a workload". Not known here: prefill (decode speedup only). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import norm

from entropy_law.law import atrisk
from entropy_law.law.blocks import tau_distribution
from entropy_law.law.bootstrap import percentile_interval, poisson_weights
from entropy_law.payoff.cost import CostModel, _ar_ms, _cost_model, _machine_rounds, policy_skipped, priced_cost_model
from entropy_law.law.fit import FittedLaw, fit_law, get_family
from entropy_law.law.information import InfoSet, check_information, predictor_inputs
from entropy_law.payoff.predict import _acceptance, _designs, parameter_draws
from entropy_law.law.results import Result
from entropy_law.law.stats import FEW_REQUESTS, warn_if_few_requests
from entropy_law.law.transfer import (TrainingDepthModel, drafted_depths, entropy_sequences, replayed_arrays,
                                      sequence_context, single_drafter, with_start_entropy)


def decode_moments(p_tau: np.ndarray, round_rewards: np.ndarray, start: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(expected rounds, expected rewards) to decode positions ``start``..T-1, for K laws at once.

    ``p_tau``: ``[K, T, W]``, P(tau = k | round starts at t) for each of K acceptance draws (``tau_distribution``);
    ``round_rewards``: ``[T, J]``, J expected quantities of one round starting at t, each summed over the rounds,
    V(t) = r(t) + sum_k P(tau = k | t) V(t + k + 1). Returns ``[K]`` rounds and ``[K, J]`` sums (zeros when
    ``start >= T``)."""
    p = np.asarray(p_tau, dtype=float)
    k, length, width = p.shape
    rewards = np.asarray(round_rewards, dtype=float).reshape(length, -1)
    j = rewards.shape[1]
    rounds = np.zeros((k, length + width + 1))
    sums = np.zeros((k, length + width + 1, j))
    for t in range(length - 1, start - 1, -1):
        pt = p[:, t, :]
        rounds[:, t] = 1.0 + np.einsum("kw,kw->k", pt, rounds[:, t + 1 : t + width + 1])
        sums[:, t] = rewards[t] + np.einsum("kw,kwj->kj", pt, sums[:, t + 1 : t + width + 1])
    if start >= length:
        return np.zeros(k), np.zeros((k, j))
    return rounds[:, start], sums[:, start]


def log_speedup_crossing(mean_entropy: np.ndarray, speedup: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    """(crossing, intercept, slope) of the weighted least-squares line log(speedup) = b0 + b1 H, crossing where it is
    0. ``inf``: it pays at every entropy (b1 >= 0, b0 > 0); 0: at none (below 0 from H = 0 on); NaN: fewer than two
    distinct entropies with weight, or a line rising from below 0 (no break-even)."""
    h = np.asarray(mean_entropy, dtype=float)
    y = np.log(np.asarray(speedup, dtype=float))
    w = np.asarray(weights, dtype=float)
    keep = (w > 0) & np.isfinite(h) & np.isfinite(y)
    if len(np.unique(h[keep])) < 2:
        return float("nan"), float("nan"), float("nan")
    sw = np.sqrt(w[keep])
    x = np.column_stack([np.ones(keep.sum()), h[keep]])
    (b0, b1), *_ = np.linalg.lstsq(x * sw[:, None], y[keep] * sw, rcond=None)
    if b1 < 0:
        return float(max(-b0 / b1, 0.0)), float(b0), float(b1)
    return (float("inf") if b0 > 0 else float("nan")), float(b0), float(b1)


SUMMARY_ROWS = ("workload_breakeven_nats", "measured_crossing_nats", "predicted_slope", "measured_slope",
                "predicted_intercept", "measured_intercept", "predicted_share_paying", "measured_share_paying")


@dataclass
class WorkloadBreakeven(Result):
    """Per request the predicted (and measured) decode speedup against its mean entropy, and where the two
    log-speedup lines cross 1. ``summary``: per quantity (``SUMMARY_ROWS``) the estimate, interval and requests;
    ``requests``: per request ``tokens``, ``mean_entropy_nats``, ``predicted_rounds``, ``predicted_speedup``,
    ``measured_speedup`` (NaN: not measured); ``replicates``: one row per bootstrap replicate."""

    drafter_id: str
    summary: pd.DataFrame
    requests: pd.DataFrame
    replicates: pd.DataFrame
    cost: CostModel
    family: str
    notes: list = field(default_factory=list)
    # per category (and "all"), as WorkloadPrediction.summary (category_summary), the requests fixed and the
    # interval widened by the cost run-to-run spread only (not by a transfer error)
    categories: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def title(self) -> str:
        return (f"when drafting pays on a workload: {self.drafter_id} ({self.family}, request mean entropy; "
                f"information: {InfoSet.WORKLOAD.label})")

    @property
    def observed_entropy(self) -> tuple[float, float]:
        """The lowest and highest request mean entropy (nats)."""
        h = self.requests["mean_entropy_nats"].to_numpy(float)
        return float(h.min()), float(h.max())

    def _verdict(self, row: str, what: str) -> str:
        r = self.summary.loc[row]
        lo_h, hi_h = self.observed_entropy
        estimate, low, high = float(r["estimate"]), float(r["ci_low"]), float(r["ci_high"])
        if np.isnan(estimate):
            return f"has no break-even: the {what} speedup does not fall with the request's mean entropy"
        if estimate >= hi_h:
            return f"pays on every observed workload (request mean entropy up to {hi_h:.2f} nats)"
        if estimate <= lo_h:
            return f"never pays on an observed workload (request mean entropy from {lo_h:.2f} nats)"
        interval = f" [{low:.2f}, {high:.2f}]" if np.isfinite(low) and np.isfinite(high) else ""
        return (f"pays on requests of mean entropy below {estimate:.2f}{interval} nats (observed {lo_h:.2f} to "
                f"{hi_h:.2f})")

    @property
    def verdict(self) -> str:
        """The predicted answer in words, on the request-mean-entropy scale (only inside the observed range)."""
        return self._verdict("workload_breakeven_nats", "predicted")

    @property
    def measured_verdict(self) -> str:
        if "measured_crossing_nats" not in self.summary.index:
            return "not measured"
        n = int(self.summary.loc["measured_crossing_nats", "n_requests"])
        if n < FEW_REQUESTS:
            return f"not measured reliably ({n} paired requests, fewer than {FEW_REQUESTS})"
        return self._verdict("measured_crossing_nats", "measured")

    @property
    def _measured_line_ok(self) -> bool:
        s = self.summary
        return "measured_crossing_nats" in s.index and s.loc["measured_crossing_nats", "n_requests"] >= FEW_REQUESTS

    @property
    def inside(self) -> bool | None:
        """Whether the measured crossing lies inside the workload break-even's interval (None where either is
        missing or the measured line rests on fewer than ``FEW_REQUESTS`` paired requests)."""
        s = self.summary
        if not self._measured_line_ok:
            return None
        m, low, high = (float(s.loc["measured_crossing_nats", "estimate"]),
                        float(s.loc["workload_breakeven_nats", "ci_low"]),
                        float(s.loc["workload_breakeven_nats", "ci_high"]))
        if np.isnan(m) or np.isnan(low) or np.isnan(high):
            return None
        return bool(low <= m <= high)

    @property
    def agree(self) -> bool | None:
        """Whether both verdicts say the same: both crossings beyond the same end of the observed request mean
        entropies, or the measured one inside the predicted interval. None where not measured."""
        if not self._measured_line_ok:
            return None
        lo_h, hi_h = self.observed_entropy
        p = float(self.summary.loc["workload_breakeven_nats", "estimate"])
        m = float(self.summary.loc["measured_crossing_nats", "estimate"])
        if np.isnan(p) or np.isnan(m):
            return bool(np.isnan(p) and np.isnan(m))
        if (p >= hi_h and m >= hi_h) or (p <= lo_h and m <= lo_h):
            return True
        return bool(self.inside)


def _tau_by_draw(acceptance: np.ndarray, shape: tuple, probs: np.ndarray) -> np.ndarray:
    """``[K, T, W]`` P(tau = k | t) for the K columns of ``acceptance``, the draws stacked in one call."""
    dims, flat = shape
    k = acceptance.shape[1]
    if flat is None:  # [T, D] per draw
        length, depth = dims
        stacked = acceptance.T.reshape(k * length, depth)
    else:  # [D, T, D] per draw, rows only at ``flat``
        depth, length, _ = dims
        full = np.ones((k, int(np.prod(dims))))
        full[:, flat] = acceptance.T
        stacked = full.reshape(k, depth, length, depth).transpose(1, 0, 2, 3).reshape(depth, k * length, depth)
    p_tau = tau_distribution(stacked, np.tile(probs, (k, 1)))
    return p_tau.reshape(k, length, -1)


def _price_sequences(law: FittedLaw, entropies, drafts: int, depth_model: TrainingDepthModel | None,
                     n_of_depth: np.ndarray, thetas: np.ndarray, replayed: list | None = None,
                     contexts: list | None = None,
                     copyability: list | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The module doc's DP per sequence and row of ``thetas``: ``[requests, K]`` expected rounds, nodes, drafting
    rounds. Per sequence: ``replayed`` (``transfer.replayed_arrays``, replaces ``depth_model``), ``contexts``
    (``transfer.sequence_context``), ``copyability`` (for ``depth_model``)."""
    built = []  # per sequence: drafted-depth probabilities, rows to predict (one design for all), their shape
    for i, h in enumerate(entropies):
        h = np.asarray(h, dtype=float)
        probs, top1 = replayed[i] if replayed is not None else (
            depth_model.probabilities(h, None if copyability is None else copyability[i]), None)
        built.append((probs, *law.sequence_frame(h, drafts, draft_top1=top1 if law.family.needs_draft_stats else None,
                                                 **({} if contexts is None else contexts[i]))))
    rounds_k, nodes_k, drafting_k = [], [], []
    for (probs, _, shape), x in zip(built, _designs(law, [b[1] for b in built])):
        p_tau = _tau_by_draw(_acceptance(law, x, thetas.T), shape, probs)
        r, sums = decode_moments(p_tau, np.column_stack([probs @ n_of_depth, 1.0 - probs[:, 0]]))
        rounds_k.append(r)
        nodes_k.append(sums[:, 0])
        drafting_k.append(sums[:, 1])
    return np.array(rounds_k), np.array(nodes_k), np.array(drafting_k)


def _priced_requests(traces, drafter: str, law: FittedLaw, arm_seqs: pd.DataFrame, seqs: pd.DataFrame, drafts: int,
                     proposals: pd.DataFrame | None, n_boot: int, seed: int):
    """n(D), replayed arrays, the ``[requests, 1 + n_boot]`` DP results, tokens, mean entropies and the depth
    source's note for ``seqs``, the depth model fitted on the arm's requests ``arm_seqs``."""
    depth_rows = with_start_entropy(drafted_depths(traces, drafter), arm_seqs)
    depth_model = TrainingDepthModel.fit(depth_rows, drafts)
    # n(D), D = 0..drafts: mean draft nodes of the rounds that drafted D (0 at D = 0; the overall mean if none)
    joined = depth_rows.merge(traces.rounds[["run_id", "request_id", "round_index", "tree_nodes"]],
                              on=["run_id", "request_id", "round_index"], how="inner")
    drafting = joined.loc[joined["drafted_depth"] > 0]
    fill = float(drafting["tree_nodes"].mean()) if len(drafting) else 0.0
    per_depth = drafting.groupby("drafted_depth")["tree_nodes"].mean()
    n_of_depth = np.array([0.0] + [float(per_depth.get(d, fill)) for d in range(1, drafts + 1)])
    draws = parameter_draws(law, n_boot, seed) if n_boot else np.empty((0, len(law.result.params)))
    thetas = np.vstack([np.asarray(law.result.params, dtype=float)[None, :], draws])  # row 0: the estimate
    replayed = None
    if proposals is not None:
        arrays = replayed_arrays(proposals, seqs, drafts)
        replayed = [arrays[(str(r.run_id), str(r.request_id))] for r in seqs.itertuples()]
    contexts = [sequence_context(law, r) for r in seqs.itertuples()]
    copyability = [getattr(r, "context_match", None) for r in seqs.itertuples()]
    priced = _price_sequences(law, seqs["entropy"], drafts, depth_model, n_of_depth, thetas, replayed, contexts,
                              copyability)
    tokens = np.array([len(e) - 1 for e in seqs["entropy"]], dtype=float)
    mean_h = np.array([float(np.mean(e)) for e in seqs["entropy"]])
    source = ("from the drafter's replayed proposal at every position" if replayed is not None else
              _depth_source(depth_model, copyability))
    return n_of_depth, replayed, priced, tokens, mean_h, source


def _depth_source(depth_model: TrainingDepthModel, copyability: list) -> str:
    """The notes' words for where the drafted depths came from, and which side lacks the copyability."""
    known = sum(c is not None for c in copyability)
    hint = ("record with the prompts' token ids, or attach it from the prompts: entropy-law predict --context-match, "
            "jobs.reference.attach_context_matches")
    if depth_model.copy is None:
        return f"from the arm's rounds (entropy-binned only: the arm's runs hold no context's copyability; {hint})"
    if known == 0:
        return f"from the arm's rounds (entropy-binned only: the workload holds no context's copyability; {hint})"
    return (f"from the arm's rounds (entropy-binned, and by the context's copyability at the round start for {known} "
            f"of {len(copyability)} requests" + ("" if known == len(copyability) else "; entropy only for the rest")
            + ")")


def _reweighted_costs(traces, drafter: str, ids, ar_table, ar_ms_per_token, clock: str, replicates: int, rng,
                      weight_sets=None):
    """Per replicate j: (j, Poisson weights of ``ids`` or the next of ``weight_sets``, the refitted cost model or
    None)."""
    sets = weight_sets if weight_sets is not None else (poisson_weights(ids, rng) for _ in range(replicates))
    try:  # the same rounds for every replicate (they do not depend on the weights): built once
        machine_rounds = _machine_rounds(traces, drafter, clock)
    except ValueError:  # then no replicate can be refitted: each is None, as a failed refit is
        machine_rounds = None
    for j, weights in enumerate(sets, start=1):
        try:
            ar_b = ar_ms_per_token if ar_table is None else _ar_ms(ar_table, weights)
            cost_b = None if machine_rounds is None else _cost_model(machine_rounds, traces.runs, ar_b, weights)
        except ValueError:
            cost_b = None
        yield j, weights, cost_b


COST_BLOCKS, MIN_BLOCK_REQUESTS = 4, 2  # consecutive blocks of the arm's requests, and the fewest requests per block


def cost_spread(traces, drafter: str, price, boot, *, ar_table=None, ar_ms_per_token=None, clock: str = "auto",
                blocks: int = COST_BLOCKS) -> tuple[np.ndarray, str]:
    """The cost model's run-to-run spread, measured inside one run (method: docs/demo.md): per predicted speedup of
    ``price(cost)`` (a list, e.g. per category) the SD on the log scale it adds to the bootstrap's interval, from the
    cost model refitted on ``blocks`` consecutive blocks of the arm's requests, less their sampling noise (``boot``:
    [replicates, entries] bootstrap speedups priced with the cost model alone). Returns (tau per entry, a note); NaN
    (no widening, the note says why) below ``MIN_BLOCK_REQUESTS`` per block or 2 replicates, or if a block fails."""
    ids = pd.unique(single_drafter(traces, drafter)[1]["request_id"])
    why = (f"{len(ids)} requests, fewer than {blocks} blocks of {MIN_BLOCK_REQUESTS}"
           if len(ids) < blocks * MIN_BLOCK_REQUESTS else "fewer than 2 bootstrap replicates" if len(boot) < 2 else "")
    if not why:
        weights = [pd.Series(1.0, index=block) for block in np.array_split(ids, blocks)]
        costs = [c for *_, c in _reweighted_costs(traces, drafter, ids, ar_table, ar_ms_per_token, clock, blocks,
                                                  None, weights)]
        why = "a block's cost model could not be fitted" if any(c is None for c in costs) else ""
    if why:
        return np.nan, f"cost run-to-run spread not measured ({why}): intervals not widened"
    between = np.var(np.log([price(c) for c in costs]), axis=0, ddof=1)
    tau = np.sqrt(np.clip(between - blocks * np.var(np.log(boot), axis=0, ddof=1), 0.0, None))
    return tau, (f"cost run-to-run spread (SD of the log speedup, up to ±{np.nanmax(tau):.1%}): {blocks} consecutive "
                 f"blocks of the arm's {len(ids)} requests each refit the cost model; their spread beyond their own "
                 "sampling noise widens the interval (log scale, variances added)")


def _widened(estimate: float, low: float, high: float, extra: float) -> tuple[float, float]:
    """``[low, high]`` with each side's log distance d from ``estimate`` made sqrt(d2 + extra2); unchanged where
    ``extra`` is 0 or NaN."""
    if not (extra > 0 and estimate > 0):
        return low, high
    e = np.log(estimate)
    return (float(np.exp(e - np.hypot(max(e - np.log(low), 0.0), extra))),
            float(np.exp(e + np.hypot(max(np.log(high) - e, 0.0), extra))))


def decode_cost_ms(c: CostModel, rounds, drafting, nodes, skipped=0.0):
    """Expected decode cost (ms) of a request with these expected rounds, drafting rounds and draft nodes (module
    doc); the ``skipped`` rounds, where a law policy did not call the drafter, cost ``c.skip_round_ms`` + v0."""
    idle = c.no_draft_ms if np.isfinite(c.no_draft_ms) else c.draft_ms + c.overhead_ms
    skipped = np.asarray(skipped, dtype=float)
    return (c.verify_intercept_ms * rounds + (c.draft_ms + c.overhead_ms) * drafting
            + idle * (np.asarray(rounds) - np.asarray(drafting) - skipped) + c.skip_round_ms * skipped
            + c.verify_per_node_ms * nodes)


def _one_drafter_family(name: str, proposals, whose: str):
    """The law family ``name``, refused where it needs a category or drafter argument or reads more than the
    workload information set holds with the drafted depths it gets (``law.information.predictor_inputs``)."""
    fam = get_family(name)
    if fam.needs_categories or fam.needs_drafters or fam.uses_category:
        raise ValueError(f"{fam.name} needs a category or drafter argument; use a one-drafter, category-free law")
    depths = "training" if proposals is None else "replayed"
    hint = (f"; or pass the {whose} replayed proposals (proposals=), which give the drafter's confidence"
            if fam.needs_draft_stats and proposals is None else "")
    try:
        check_information(InfoSet.WORKLOAD, predictor_inputs(fam, depths), what=f"{fam.name} with {depths} depths")
    except ValueError as err:
        raise ValueError(f"{err}{hint}") from None
    return fam


def workload_breakeven(
    traces,
    *,
    drafter: str | None = None,
    family: str = "law_exp",
    law: FittedLaw | None = None,
    ar_ms_per_token: float | None = None,
    ar_requests: pd.DataFrame | None = None,
    measured: pd.DataFrame | None = None,
    clock: str = "auto",
    proposals: pd.DataFrame | None = None,
    n_boot: int = 100,
    seed: int = 0,
    level: float = 0.95,
    eps: float = atrisk.EPS_NATS,
) -> WorkloadBreakeven:
    """Predicted decode speedup of every request of ``drafter`` in ``traces`` on its own entropy sequence, and
    the workload break-even: where the log-speedup line on the request's mean entropy crosses 1 (module doc).

    ``law``: a fitted one-drafter, category-free law with cluster-robust covariance (default: ``family`` fitted
    here). ``ar_ms_per_token`` / ``ar_requests`` / ``clock``: the AR cost, as ``cost.when_drafting_pays``.
    ``measured``: per request ``run_id``, ``request_id``, ``speedup`` (and ``decoded``, the tokens it weighs
    with; default the predicted side's), e.g. ``TraceAnalysis.request_speedups``; their crossing is then computed
    with the same estimator and the same bootstrap weights. ``proposals``: the drafter's replayed proposal at every
    output position of the arm's requests (``traces.proposals`` rows): the drafted depths are then those instead of
    the in-sample depth model's, and a law in the drafter's confidence (``law_exp_obs_ceil_drafttop``) can be used."""
    fam = _one_drafter_family(family if law is None else law.family.name, proposals, "arm's")
    drafter, rounds = single_drafter(traces, drafter)
    cost, ar_table = priced_cost_model(traces, drafter=drafter, ar_ms_per_token=ar_ms_per_token,
                                       ar_requests=ar_requests, clock=clock)
    clock = cost.clock
    if law is None:
        law = _fit(traces, fam.name, drafter, eps)
    priced = _priced_workload(traces, drafter, law, rounds, proposals, n_boot, seed)
    requests = priced.seqs[["run_id", "request_id", "category"]].assign(
        tokens=priced.tokens.astype(int), mean_entropy_nats=priced.mean_h, predicted_rounds=priced.rounds_k[:, 0],
        predicted_speedup=priced.speedups(cost, 0))
    m_speed, m_weight = _with_measured(requests, measured, priced.tokens)
    groups = category_groups(priced.seqs)
    n_measured = 0 if m_speed is None else int(requests.loc[np.isfinite(m_speed), "request_id"].nunique())
    ids = requests["request_id"].to_numpy()
    n_requests = int(pd.Series(ids).nunique())
    few = warn_if_few_requests(n_requests, "the workload break-even intervals")
    estimate = _line_statistics(priced, cost, 0, np.ones(len(requests)), m_speed, m_weight)
    reps, category_reps, cost_only, failed = _breakeven_replicates(traces, drafter, priced, groups, ids, ar_table,
                                                                   ar_ms_per_token, clock, m_speed, m_weight, seed)
    replicates = pd.DataFrame(reps)
    spread, spread_note = cost_spread(traces, drafter, lambda c: priced.category_speedups(groups, c, 0), cost_only,
                                      ar_table=ar_table, ar_ms_per_token=ar_ms_per_token, clock=clock)
    categories = category_summary(groups, priced.category_speedups(groups, cost, 0), category_reps, priced.tokens,
                                  priced.mean_h, priced.rounds_k[:, 0], float("nan"), level, spread)
    rows = [r for r in SUMMARY_ROWS if r in estimate]
    # NaN: no break-even in that replicate (skipped; counted in the notes)
    ci_low, ci_high = percentile_interval(replicates.reindex(columns=rows).astype(float), level)
    summary = pd.DataFrame(index=pd.Index(rows), columns=["estimate", "ci_low", "ci_high", "n_requests"], dtype=float)
    for r in rows:
        summary.loc[r] = [estimate[r], ci_low[r], ci_high[r], n_measured if r.startswith("measured") else n_requests]
    no_line = int(replicates["workload_breakeven_nats"].isna().sum()) if len(replicates) else 0
    notes = [*([few] if few else []),
             f"{level:.0%} percentile intervals from {len(reps)} replicates over {n_requests} requests (seed {seed}, "
             f"{failed} failed, {no_line} without a falling predicted line): each draws Poisson request weights "
             "(refitting the cost model, t_AR and both lines) and one set of the law's coefficients from their "
             "cluster-robust normal approximation",
             f"per request: the law's DP over its own entropy sequence, drafted depths {priced.depth_source} "
             f"(in-sample), nodes per drafted depth {np.round(priced.n_of_depth, 1).tolist()}; "
             f"{cost.clock} clock, t_AR {cost.ar_ms_per_token:.1f} ms ({cost.ar_source})",
             "crossing = where the token-weighted least-squares line of log speedup on the request's mean entropy "
             "crosses 0; inf = above 1 at every entropy", f"per category: {spread_note}"]
    return WorkloadBreakeven(drafter_id=drafter, summary=summary, requests=requests, replicates=replicates, cost=cost,
                             family=law.family.name, notes=notes, categories=categories)


@dataclass
class _PricedWorkload:
    """Every request of an arm priced by the law; ``*_k``: per draw of its coefficients (column 0: the estimate)."""

    seqs: pd.DataFrame
    tokens: np.ndarray
    mean_h: np.ndarray
    rounds_k: np.ndarray
    nodes_k: np.ndarray
    drafting_k: np.ndarray
    n_of_depth: np.ndarray
    depth_source: str

    def category_speedups(self, groups, c: CostModel, j: int) -> list[float]:
        return category_speedups(groups, c, self.tokens, self.rounds_k[:, j], self.drafting_k[:, j], self.nodes_k[:, j])

    def speedups(self, c: CostModel, j: int) -> np.ndarray:
        return self.tokens * c.ar_ms_per_token / decode_cost_ms(c, self.rounds_k[:, j], self.drafting_k[:, j],
                                                                self.nodes_k[:, j])


def _priced_workload(traces, drafter: str, law, rounds: pd.DataFrame, proposals, n_boot: int,
                     seed: int) -> _PricedWorkload:
    """The arm's requests that decoded a token after the prefill, priced by ``law`` (``_priced_requests``)."""
    drafts = int(rounds["tree_depth"].max())
    if drafts < 1:
        raise ValueError(f"drafter {drafter!r} never drafted: no workload break-even")
    seqs = entropy_sequences(traces, drafter)
    seqs = seqs.loc[[len(e) >= 2 for e in seqs["entropy"]]].reset_index(drop=True)
    if seqs.empty:
        raise ValueError(f"drafter {drafter!r}: no request decoded a token after the prefill")
    n_of_depth, replayed, (rounds_k, nodes_k, drafting_k), tokens, mean_h, depth_source = _priced_requests(
        traces, drafter, law, seqs, seqs, drafts, proposals, n_boot, seed)
    return _PricedWorkload(seqs=seqs, tokens=tokens, mean_h=mean_h, rounds_k=rounds_k, nodes_k=nodes_k,
                           drafting_k=drafting_k, n_of_depth=n_of_depth, depth_source=depth_source)


def _with_measured(requests: pd.DataFrame, measured: pd.DataFrame | None, tokens: np.ndarray):
    """Adds ``measured_speedup`` to ``requests``; returns the measured line's ``(speedups, weights)`` or Nones."""
    if measured is None:
        requests["measured_speedup"] = np.nan
        return None, None
    need = {"run_id", "request_id", "speedup"} - set(measured.columns)
    if need:
        raise ValueError(f"measured needs columns run_id, request_id, speedup; missing {sorted(need)}")
    cols = ["run_id", "request_id", "speedup"] + (["decoded"] if "decoded" in measured else [])
    joined = requests[["run_id", "request_id"]].merge(measured[cols], on=["run_id", "request_id"], how="left")
    m_speed = joined["speedup"].to_numpy(float)
    requests["measured_speedup"] = m_speed
    return (m_speed if np.isfinite(m_speed).any() else None,
            joined["decoded"].to_numpy(float) if "decoded" in joined else tokens)


def _line_statistics(priced: _PricedWorkload, c: CostModel, j: int, w: np.ndarray, m_speed, m_weight) -> dict:
    """Crossing, slope, intercept and share paying of the predicted (and measured) line at ``c``, ``j``, ``w``."""
    s = priced.speedups(c, j)
    crossing, b0, slope = log_speedup_crossing(priced.mean_h, s, w * priced.tokens)
    out = dict(workload_breakeven_nats=crossing, predicted_slope=slope, predicted_intercept=b0,
               predicted_share_paying=float(np.sum(w * (s > 1)) / np.sum(w)) if np.sum(w) > 0 else np.nan)
    if m_speed is not None:
        ok = np.isfinite(m_speed)
        out["measured_crossing_nats"], b0, out["measured_slope"] = log_speedup_crossing(
            priced.mean_h, np.where(ok, m_speed, 1.0), np.where(ok, w * m_weight, 0.0))
        out["measured_intercept"] = b0
        out["measured_share_paying"] = (float(np.sum((w * ok) * (m_speed > 1)) / np.sum(w * ok))
                                        if np.sum(w * ok) > 0 else np.nan)
    return out


def _breakeven_replicates(traces, drafter: str, priced: _PricedWorkload, groups, ids: np.ndarray, ar_table,
                          ar_ms_per_token, clock: str, m_speed, m_weight, seed: int):
    """Per replicate: line statistics, category speedups, the same at the law's estimate; and the failures."""
    rng = np.random.default_rng(seed)
    reps, category_reps, cost_only, failed = [], [], [], 0
    all_ids = list(ids) + ([] if ar_table is None else list(ar_table["request_id"]))
    for j, weights, cost_b in _reweighted_costs(traces, drafter, all_ids, ar_table, ar_ms_per_token, clock,
                                                 priced.rounds_k.shape[1] - 1, rng):
        try:
            if cost_b is None:
                raise ValueError("the cost model could not be refitted")
            reps.append(_line_statistics(priced, cost_b, j, pd.Series(ids).map(weights).fillna(0).to_numpy(float),
                                         m_speed, m_weight))
            category_reps.append(priced.category_speedups(groups, cost_b, j))
            cost_only.append(priced.category_speedups(groups, cost_b, 0))
        except ValueError:
            failed += 1
    return reps, category_reps, cost_only, failed


def _fit(traces, family: str, drafter: str, eps: float) -> FittedLaw:
    from entropy_law.law.fit import prepare_counts

    rows = atrisk.at_risk_table(traces, eps=eps, drafters=[drafter])
    return fit_law(prepare_counts(rows, get_family(family), eps=eps), family, cov_type="cluster")


# the law in the drafter's confidence, for a workload priced with the drafter's replayed proposals
REPLAYED_FAMILY = "law_exp_obs_ceil_drafttop"
# the same plus the copyability and the target's top-1 probability, where the traces hold them (docs/law.md)
REPLAYED_COPY_FAMILY = "law_exp_obs_ceil_drafttop_top1_copy"
REPLAYED_COPY_FALLBACK = "law_exp_obs_ceil_drafttop_copy"  # copyability, but no target top-1 probability


def replayed_family(*token_tables: pd.DataFrame) -> str:
    """The law that prices replayed proposals for traces with these tokens tables: ``REPLAYED_COPY_FAMILY`` where
    all hold ``context_match`` and ``target_top1_prob`` everywhere, ``REPLAYED_COPY_FALLBACK`` with the former only,
    else ``REPLAYED_FAMILY`` (the rule of ``docs/law.md``)."""

    def full(table, column):
        return column in table and len(table) > 0 and not table[column].isna().any()

    if not all(full(t, "context_match") for t in token_tables):
        return REPLAYED_FAMILY
    return REPLAYED_COPY_FAMILY if all(full(t, "target_top1_prob") for t in token_tables) else REPLAYED_COPY_FALLBACK


# a predicted verdict, per category of a workload (``WorkloadPrediction``)
PAYS, DOES_NOT_PAY, UNCLEAR = "pays", "does not pay", "unclear"


@dataclass
class WorkloadPrediction(Result):
    """Will drafting pay on a workload the arm never decoded? Per category of the workload (and ``all``):
    ``requests``, ``tokens`` (decoded after the prefill), ``mean_entropy_nats``, ``predicted_tokens_per_round``,
    ``predicted_speedup`` with its ``ci_low`` / ``ci_high`` (widened by ``cost_spread``), ``low`` / ``high`` (also by
    ``transfer_error``) and ``verdict`` (``predicted_verdict``). ``requests_table``: the same per request."""

    drafter_id: str
    summary: pd.DataFrame
    requests_table: pd.DataFrame
    cost: CostModel
    family: str
    transfer_error: float
    notes: list = field(default_factory=list)
    replayed: bool = False  # priced with the drafter's replayed proposals

    @property
    def title(self) -> str:
        if self.family == EXACT_REPLAY:
            return (f"will drafting pay on this workload? {self.drafter_id}, from its rounds replayed over the workload "
                    "(a cost-model validation, no law: information after verifying)")
        return (f"will drafting pay on this workload? {self.drafter_id} ({self.family}), from its target entropies"
                + (" and the drafter's replayed proposals" if self.replayed else "")
                + f" (information: {InfoSet.WORKLOAD.label})")

    def answer(self) -> str:
        """One line per category, the verdict first."""
        lines = []
        for category, r in self.summary.iterrows():
            what = "the cost model's error" if self.family == EXACT_REPLAY else "the transfer error"
            band = (f"; with {what} [{r['low']:.2f}, {r['high']:.2f}]" if np.isfinite(self.transfer_error) else "")
            lines.append(f"{category:<16} {r['verdict']:<13} predicted {r['predicted_speedup']:.2f}x "
                         f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]{band}; {spread_text(r['cost_spread'])}; "
                         f"tokens/round {r['predicted_tokens_per_round']:.2f}, {int(r['requests'])} requests, mean "
                         f"entropy {r['mean_entropy_nats']:.2f} nats")
        return "\n".join(lines)


def spread_text(spread: float) -> str:
    """The cost run-to-run spread (``cost_spread``) as printed beside a predicted interval."""
    return "cost run-to-run spread " + (f"±{spread:.1%}" if np.isfinite(spread) else "not measured")


def category_groups(seqs: pd.DataFrame) -> list[tuple[str, np.ndarray]]:
    """``(name, mask)`` per category of ``seqs`` (sorted), then ``("all", every request)``."""
    cats = seqs["category"].astype(str)
    return [*((str(c), (cats == c).to_numpy()) for c in sorted(cats.unique())), ("all", np.ones(len(seqs), dtype=bool))]


def category_speedups(groups, cost: CostModel, tokens: np.ndarray, rounds: np.ndarray, drafting: np.ndarray,
                      nodes: np.ndarray, skipped=0.0) -> list[float]:
    """Per group of ``category_groups``: its tokens x t_AR over its requests' summed expected decode cost."""
    ms = decode_cost_ms(cost, rounds, drafting, nodes, skipped)
    return [float(tokens[m].sum() * cost.ar_ms_per_token / ms[m].sum()) for _, m in groups]


def category_summary(groups, estimate: list[float], reps: list[list[float]], tokens: np.ndarray, mean_h: np.ndarray,
                     rounds: np.ndarray, transfer_error: float, level: float, spread=None) -> pd.DataFrame:
    """Per group of ``category_groups`` (index ``category``): ``requests``, ``tokens``, ``mean_entropy_nats``,
    ``predicted_tokens_per_round``, ``predicted_speedup`` (``estimate``), ``ci_low`` / ``ci_high`` (the ``level``
    percentile interval of ``reps`` widened by ``spread``, ``cost_spread`` per group), ``low`` / ``high`` (also by
    ``transfer_error``; NaN: not) and the ``verdict`` (``predicted_verdict``)."""
    names = [name for name, _ in groups]
    ci_low, ci_high = percentile_interval(pd.DataFrame(reps, columns=names, dtype=float), level)
    band = 0.0 if np.isnan(transfer_error) else float(transfer_error)
    spread = np.broadcast_to(np.nan if spread is None else spread, len(groups))
    rows = []
    for k, (name, m) in enumerate(groups):
        ci = _widened(estimate[k], float(ci_low[name]), float(ci_high[name]), norm.ppf(0.5 + level / 2) * spread[k])
        low, high = ci[0] * (1 - band), ci[1] * (1 + band)
        rows.append(dict(category=name, requests=int(m.sum()), tokens=int(tokens[m].sum()),
                         mean_entropy_nats=float(np.average(mean_h[m], weights=tokens[m])),
                         predicted_tokens_per_round=float(tokens[m].sum() / rounds[m].sum()),
                         predicted_speedup=estimate[k], ci_low=ci[0], ci_high=ci[1], cost_spread=float(spread[k]),
                         low=low, high=high, verdict=predicted_verdict(low, high)))
    return pd.DataFrame(rows).set_index("category")


def _priced_summary(traces, drafter: str, cost: CostModel, ar_table, ar_ms_per_token, arm_ids, seqs: pd.DataFrame,
                    tokens: np.ndarray, mean_h: np.ndarray, rounds_k: np.ndarray, nodes_k: np.ndarray,
                    drafting_k: np.ndarray, transfer_error: float, seed: int, level: float, skipped=0.0):
    """Per category (``category_summary``) and per request, the speedup from ``[requests, K]`` DP results (column 0
    the estimate). Returns (summary, requests, (replicates, failed, the spread's note))."""
    groups = category_groups(seqs)

    def speedups_at(c: CostModel, j: int) -> list[float]:
        return category_speedups(groups, c, tokens, rounds_k[:, j], drafting_k[:, j], nodes_k[:, j], skipped)

    estimate = speedups_at(cost, 0)
    rng = np.random.default_rng(seed)
    reps, cost_only, failed = [], [], 0
    for j, _, cost_b in _reweighted_costs(traces, drafter, arm_ids, ar_table, ar_ms_per_token, cost.clock,
                                          rounds_k.shape[1] - 1, rng):
        if cost_b is None:
            failed += 1
        else:
            reps.append(speedups_at(cost_b, j))
            cost_only.append(speedups_at(cost_b, 0))
    spread, spread_note = cost_spread(traces, drafter, lambda c: speedups_at(c, 0), cost_only, ar_table=ar_table,
                                      ar_ms_per_token=ar_ms_per_token, clock=cost.clock)
    summary = category_summary(groups, estimate, reps, tokens, mean_h, rounds_k[:, 0], transfer_error, level, spread)
    requests = seqs[["run_id", "request_id", "category"]].assign(
        tokens=tokens.astype(int), mean_entropy_nats=mean_h, predicted_rounds=rounds_k[:, 0],
        predicted_tokens_per_round=tokens / rounds_k[:, 0],
        predicted_speedup=tokens * cost.ar_ms_per_token / decode_cost_ms(cost, rounds_k[:, 0], drafting_k[:, 0],
                                                                         nodes_k[:, 0], skipped))
    return summary, requests, (len(reps), failed, spread_note)


def verdict_right(verdict: str, lo: float, hi: float) -> bool | None:
    """Whether a predicted verdict agrees with a measured speedup's interval [``lo``, ``hi``] on the side of 1;
    None where the verdict is ``UNCLEAR`` or the interval covers 1 or is missing."""
    if verdict not in (PAYS, DOES_NOT_PAY) or not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    if lo > 1.0:
        return verdict == PAYS
    if hi < 1.0:
        return verdict == DOES_NOT_PAY
    return None


def predicted_verdict(low: float, high: float) -> str:
    """``PAYS`` where the whole interval lies above 1, ``DOES_NOT_PAY`` where it lies below, else ``UNCLEAR``."""
    if np.isfinite(low) and low > 1.0:
        return PAYS
    if np.isfinite(high) and high < 1.0:
        return DOES_NOT_PAY
    return UNCLEAR


def predict_workload(
    traces,
    sequences: pd.DataFrame,
    *,
    drafter: str | None = None,
    family: str = "law_exp",
    law: FittedLaw | None = None,
    ar_ms_per_token: float | None = None,
    ar_requests: pd.DataFrame | None = None,
    clock: str = "auto",
    transfer_error: float = float("nan"),
    proposals: pd.DataFrame | None = None,
    n_boot: int = 100,
    seed: int = 0,
    level: float = 0.95,
    eps: float = atrisk.EPS_NATS,
    bias: float = 0.0,
) -> WorkloadPrediction:
    """Predicted decode speedup of ``drafter`` (its law, drafted depths and cost model, all from ``traces``) on a
    workload it never decoded, from its target entropies: ``sequences``, one row per request with ``run_id``,
    ``request_id``, ``category`` and ``entropy`` (output positions 0..T-1, ``transfer.sequences_of``), e.g. an AR run.

    Priced as ``workload_breakeven`` (``docs/law.md``, "A workload no drafter has decoded"); the interval (``level``,
    ``n_boot`` replicates) resamples the arm's and the AR requests. ``transfer_error`` (e.g. the largest LOCO
    |relative error| of tokens per round) widens it for the verdict (``low``, ``high``; NaN: not measured).
    ``proposals``: the drafter's replayed proposal at every output position of the workload's requests
    (``traces.proposals`` rows), used as in ``workload_breakeven``."""
    fam = _one_drafter_family(family if law is None else law.family.name, proposals, "workload's")
    need = {"run_id", "request_id", "category", "entropy"} - set(getattr(sequences, "columns", ()))
    if need:
        raise ValueError(f"sequences needs columns run_id, request_id, category, entropy; missing {sorted(need)}")
    if not (np.isnan(transfer_error) or transfer_error >= 0):
        raise ValueError(f"transfer_error must be >= 0 (a relative error) or NaN, got {transfer_error}")
    drafter, rounds = single_drafter(traces, drafter)
    cost, ar_table = priced_cost_model(traces, drafter=drafter, ar_ms_per_token=ar_ms_per_token,
                                       ar_requests=ar_requests, clock=clock)
    if law is None:
        law = _fit(traces, fam.name, drafter, eps)
    drafts = int(rounds["tree_depth"].max())
    if drafts < 1:
        raise ValueError(f"drafter {drafter!r} never drafted: nothing to predict")
    seqs, short = _workload_requests(sequences)
    arm_seqs = entropy_sequences(traces, drafter)
    arm_seqs = arm_seqs.loc[[len(e) >= 2 for e in arm_seqs["entropy"]]].reset_index(drop=True)
    n_of_depth, replayed, (rounds_k, nodes_k, drafting_k), tokens, mean_h, depth_source = _priced_requests(
        traces, drafter, law, arm_seqs, seqs, drafts, proposals, n_boot, seed)
    if not np.isfinite(bias):
        raise ValueError(f"bias must be finite (log tokens per round), got {bias}")
    if bias:  # tokens per round x e^bias: fewer rounds of the same make-up (drafting share, nodes per round)
        rounds_k, nodes_k, drafting_k = (a * float(np.exp(-bias)) for a in (rounds_k, nodes_k, drafting_k))
    arm_ids = list(arm_seqs["request_id"]) + ([] if ar_table is None else list(ar_table["request_id"]))
    summary, requests, (n_reps, failed, spread_note) = _priced_summary(
        traces, drafter, cost, ar_table, ar_ms_per_token, arm_ids, seqs, tokens, mean_h, rounds_k, nodes_k,
        drafting_k, transfer_error, seed, level)
    notes = _prediction_notes(level, n_reps, failed, seed, len(arm_seqs), transfer_error, depth_source, n_of_depth,
                              cost, bias, short) + [spread_note]
    return WorkloadPrediction(drafter_id=drafter, summary=summary, requests_table=requests, cost=cost,
                              family=law.family.name, transfer_error=float(transfer_error), notes=notes,
                              replayed=replayed is not None)


def _workload_requests(sequences: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """``(the workload's requests that decoded a token after the prefill, which were left out)``, checked."""
    seqs = sequences.reset_index(drop=True)
    short = np.array([len(e) < 2 for e in seqs["entropy"]], dtype=bool)
    seqs = seqs.loc[~short].reset_index(drop=True)
    if seqs.empty:
        raise ValueError("the workload has no request with a token decoded after the prefill: nothing to predict")
    for rec in seqs.itertuples():
        h = np.asarray(rec.entropy, dtype=float)
        if not np.all(np.isfinite(h)) or np.any(h < 0):
            raise ValueError(f"request {rec.request_id} of the workload: target entropies must be finite and >= 0")
    return seqs, short


def _prediction_notes(level, n_reps, failed, seed, n_arm, transfer_error, depth_source, n_of_depth, cost, bias,
                      short) -> list:
    """What ``predict_workload``'s interval, verdict band and pricing rest on, in words."""
    band = 0.0 if np.isnan(transfer_error) else float(transfer_error)
    notes = [f"{level:.0%} percentile intervals from {n_reps} replicates ({failed} failed; seed {seed}): each "
             f"draws Poisson weights for the arm's {n_arm} requests and the AR requests (refitting the cost "
             "model and t_AR) and one set of the law's coefficients; the workload's requests are not resampled",
             (f"low / high: that interval widened by the law's transfer error {band:.1%} (a category the law was not "
              "fitted on); the verdict needs all of it on one side of 1" if not np.isnan(transfer_error) else
              "the law's error on a category it was not fitted on is not measured here (transfer_error NaN): the "
              "verdict rests on the interval of its coefficients and the cost alone, which is too narrow for a new "
              "category; measure it with leave-one-category-out on the arm (TraceAnalysis.loco)"),
             f"per request: the law's DP over its target entropies, drafted depths {depth_source}"
             + f", nodes per drafted depth {np.round(n_of_depth, 1).tolist()}; {cost.clock} clock, "
             f"t_AR {cost.ar_ms_per_token:.1f} ms ({cost.ar_source}); decode only (no prefill)"]
    if bias:
        notes.append(f"the law's tokens per round scaled by e^b = {np.exp(bias):.3f} (b = {bias:+.3f}: its mean log "
                     "residual on the categories it was fitted on, each predicted without it; the DP over-predicts: "
                     "rounds are not independent given the covariates)")
    if short.any():
        notes.append(f"{int(short.sum())} request(s) of the workload decoded no token after the prefill: left out")
    return notes


# WorkloadPrediction.family of a workload priced from its replayed rounds (no law)
EXACT_REPLAY = "replayed rounds (no law)"
ROUND_COUNT_COLUMNS = ("run_id", "request_id", "category", "tokens", "rounds", "drafting_rounds", "nodes")


def price_rounds(
    traces,
    rounds: pd.DataFrame,
    *,
    drafter: str | None = None,
    ar_ms_per_token: float | None = None,
    ar_requests: pd.DataFrame | None = None,
    clock: str = "auto",
    transfer_error: float = float("nan"),
    n_boot: int = 100,
    seed: int = 0,
    level: float = 0.95,
) -> WorkloadPrediction:
    """Predicted decode speedup of ``drafter`` on a workload whose rounds are known (the arm's rounds replayed over
    its greedy outputs, ``jobs.reference.workload_rounds``; no law), priced by the arm's cost model from ``traces``.

    ``rounds``: one row per request with ``run_id``, ``request_id``, ``category``, ``tokens`` (decoded after the
    prefill), ``rounds`` (verify rounds after the prefill), ``drafting_rounds`` (of them, those that verified a
    draft) and ``nodes`` (draft nodes verified in all), optionally ``mean_entropy_nats`` and ``skipped_rounds``
    (a law policy did not call the drafter). The interval: ``n_boot`` replicates of the cost model and t_AR;
    ``transfer_error`` (the cost model's own relative error, e.g. ``cost_only_error``) widens it for the verdict."""
    need = set(ROUND_COUNT_COLUMNS) - set(getattr(rounds, "columns", ()))
    if need:
        raise ValueError(f"rounds needs one row per request with columns {', '.join(ROUND_COUNT_COLUMNS)}; missing "
                         f"{sorted(need)}")
    if not (np.isnan(transfer_error) or transfer_error >= 0):
        raise ValueError(f"transfer_error must be >= 0 (a relative error) or NaN, got {transfer_error}")
    table, skipped = _checked_round_counts(rounds)
    short = (table["tokens"] < 1).to_numpy()
    table, skipped = table.loc[~short].reset_index(drop=True), skipped[~short]
    if table.empty:
        raise ValueError("the workload has no request with a token decoded after the prefill: nothing to predict")
    drafter, _ = single_drafter(traces, drafter)
    cost, ar_table = priced_cost_model(traces, drafter=drafter, ar_ms_per_token=ar_ms_per_token,
                                       ar_requests=ar_requests, clock=clock)
    arm_seqs = entropy_sequences(traces, drafter)
    arm_ids = list(arm_seqs["request_id"]) + ([] if ar_table is None else list(ar_table["request_id"]))
    k = int(n_boot) + 1  # the counts are known: every replicate prices the same rounds with another cost model
    rounds_k, drafting_k, nodes_k = (np.repeat(table[c].to_numpy(float)[:, None], k, axis=1)
                                     for c in ("rounds", "drafting_rounds", "nodes"))
    mean_h = (table["mean_entropy_nats"].to_numpy(float) if "mean_entropy_nats" in table
              else np.full(len(table), np.nan))
    summary, requests, (n_reps, failed, spread_note) = _priced_summary(
        traces, drafter, cost, ar_table, ar_ms_per_token, arm_ids, table, table["tokens"].to_numpy(float), mean_h,
        rounds_k, nodes_k, drafting_k, transfer_error, seed, level, skipped)
    band = 0.0 if np.isnan(transfer_error) else float(transfer_error)
    notes = [f"{level:.0%} percentile intervals from {n_reps} replicates ({failed} failed; seed {seed}) of the cost "
             f"model and t_AR (Poisson weights for the arm's {len(arm_seqs)} requests and the AR requests); the "
             "workload's rounds are known, not resampled",
             (f"low / high: that interval widened by the cost model's own error {band:.1%}; the verdict needs all of "
              "it on one side of 1" if not np.isnan(transfer_error) else
              "the cost model's own error is not measured here (transfer_error NaN): the verdict rests on the "
              "interval of its measurements alone"),
             f"per request: its replayed rounds (no law), {cost.clock} clock, t_AR {cost.ar_ms_per_token:.1f} ms "
             f"({cost.ar_source}); decode only (no prefill)", spread_note]
    if skipped.any():
        how = ("as measured on the arm's own skipped rounds" if np.isfinite(cost.skip_ms)
               else "an AR step, t_AR: the arm never skipped a round")
        notes.append(f"{int(skipped.sum())} of {int(table['rounds'].sum())} rounds: the law policy did not call the "
                     f"drafter; each priced at {cost.verify_intercept_ms + cost.skip_round_ms:.1f} ms ({how})")
    if short.any():
        notes.append(f"{int(short.sum())} request(s) of the workload decoded no token after the prefill: left out")
    return WorkloadPrediction(drafter_id=drafter, summary=summary, requests_table=requests, cost=cost,
                              family=EXACT_REPLAY, transfer_error=float(transfer_error), notes=notes, replayed=True)


def _checked_round_counts(rounds: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """``(the round counts, the skipped rounds per request)`` of ``price_rounds``' ``rounds``, checked."""
    table = rounds.reset_index(drop=True)
    counts = table[["tokens", "rounds", "drafting_rounds", "nodes"]].to_numpy(float)
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("rounds: tokens, rounds, drafting_rounds and nodes must be finite and >= 0")
    bad = (table["drafting_rounds"] > table["rounds"]) | (table["rounds"] > table["tokens"])
    if bad.any():
        r = table.loc[bad].iloc[0]
        raise ValueError(f"request {r['request_id']}: {int(r['drafting_rounds'])} drafting rounds of "
                         f"{int(r['rounds'])} rounds for {int(r['tokens'])} tokens: every round commits a token and "
                         "drafting rounds are rounds")
    skipped = table["skipped_rounds"].to_numpy(float) if "skipped_rounds" in table else np.zeros(len(table))
    if not np.all(np.isfinite(skipped)) or np.any(skipped < 0) or np.any(
            skipped > table["rounds"].to_numpy(float) - table["drafting_rounds"].to_numpy(float)):
        raise ValueError("rounds: skipped_rounds must be finite, >= 0 and at most the rounds that drafted nothing "
                         "(rounds - drafting_rounds)")
    return table, skipped


def count_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per (``run_id``, ``request_id``) of a rounds table (trace columns): ``tokens``, ``rounds``,
    ``drafting_rounds``, ``nodes``, ``accepted`` and ``skipped_rounds`` (a law policy did not call the drafter)
    after the prefill (round 0), as the measured speedup counts them."""
    rounds = rounds.loc[rounds["round_index"] > 0]
    return rounds.assign(_drafting=(rounds["tree_nodes"] > 0).astype(int), _skipped=policy_skipped(rounds).astype(int)
                         ).groupby(["run_id", "request_id"], sort=False).agg(
        tokens=("committed", "sum"), rounds=("round_index", "size"), drafting_rounds=("_drafting", "sum"),
        nodes=("tree_nodes", "sum"), accepted=("accepted", "sum"), skipped_rounds=("_skipped", "sum")).reset_index()


def round_counts(traces, drafter: str | None = None) -> pd.DataFrame:
    """One row per request of ``drafter``'s runs (``ROUND_COUNT_COLUMNS``, ``accepted``, ``skipped_rounds``,
    ``mean_entropy_nats``): the counts ``price_rounds`` prices, from the recorded rounds."""
    drafter, _ = single_drafter(traces, drafter)
    runs = traces.runs.loc[traces.runs["drafter_id"] == drafter, "run_id"]
    counts = count_rounds(traces.rounds.loc[traces.rounds["run_id"].isin(runs)])
    tokens = traces.tokens.loc[traces.tokens["run_id"].isin(runs)]
    entropy = tokens.groupby(["run_id", "request_id"], sort=False)["target_entropy_nats"].mean()
    out = counts.merge(entropy.rename("mean_entropy_nats").reset_index(), on=["run_id", "request_id"], how="left")
    categories = traces.requests[["run_id", "request_id", "category"]].drop_duplicates(["run_id", "request_id"])
    out = out.merge(categories, on=["run_id", "request_id"], how="left")
    return out[list(ROUND_COUNT_COLUMNS) + ["accepted", "skipped_rounds", "mean_entropy_nats"]]


def choose_arms(predictions: dict) -> pd.DataFrame:
    """Per category of the workload (and ``all``), what to run, from ``{arm: WorkloadPrediction}``: the arm whose
    verdict is ``PAYS`` with the highest predicted speedup, else AR (the choice that cannot lose). Columns
    ``category``, ``choice`` (an arm, or ``"AR"``), ``predicted_speedup`` / ``low`` / ``high`` of the chosen arm (1
    for AR), ``why`` (also naming paying arms predicted inside the chosen one's interval)."""
    if not predictions:
        raise ValueError("choose_arms needs at least one arm's WorkloadPrediction")
    categories = list(dict.fromkeys(c for p in predictions.values() for c in p.summary.index))
    rows = []
    for category in categories:
        rows_of = {arm: p.summary.loc[category] for arm, p in predictions.items() if category in p.summary.index}
        paying = {arm: r for arm, r in rows_of.items() if r["verdict"] == PAYS}
        if paying:
            arm, r = max(paying.items(), key=lambda kv: float(kv[1]["predicted_speedup"]))
            others = sorted(set(paying) - {arm})
            # a paying arm predicted inside the chosen one's widened interval: the predictions cannot rank the two
            close = [a for a in others if float(paying[a]["predicted_speedup"]) >= float(r["low"])]
            why = "pays, the highest predicted speedup" + (f" (also pays: {', '.join(others)})" if others else "")
            if close:
                why += f"; not told apart from {', '.join(close)} (predicted inside its interval): any of them will do"
            rows.append(dict(category=category, choice=arm, predicted_speedup=float(r["predicted_speedup"]),
                             low=float(r["low"]), high=float(r["high"]), why=why))
            continue
        unclear = sorted(arm for arm, r in rows_of.items() if r["verdict"] == UNCLEAR)
        why = ("no arm pays: every one is predicted below 1" if not unclear else
               f"no arm is predicted to pay for sure (unclear: {', '.join(unclear)}): AR cannot lose")
        rows.append(dict(category=category, choice="AR", predicted_speedup=1.0, low=1.0, high=1.0, why=why))
    return pd.DataFrame(rows)

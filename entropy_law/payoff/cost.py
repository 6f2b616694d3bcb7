"""When drafting pays: a cost model from measured round timings combined with a fitted law.

t_round(N) = t_draft + t_verify(N) + t_overhead: the drafter's mean costs and a least-squares verify line
v0 + v1 N over the rounds of one arm on one machine (the CPU clock where every request logs it); t_AR given or
from AR rounds. S(H) = (1 + E[tau | H, D]) t_AR / t_round(N) at constant entropy (``docs/law.md``) gives the
speedup curve, the break-even entropy and the best block size / tree budget, each with a request-bootstrap
interval. Assumed, not checked: constant-H sequences, depths up to the deepest observed. Decode speedup only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats
from scipy.optimize import brentq

from entropy_law.law import arms, atrisk
from entropy_law.law.bootstrap import percentile_interval, poisson_weights, reweight_counts
from entropy_law.law.fit import FittedLaw, fit_law, get_family, prepare_counts
from entropy_law.law.results import Result
from entropy_law.law.stats import warn_if_few_requests

DEFAULT_ENTROPIES = (0.01, 0.03, 0.1, 0.3, 0.5, 1.0, 2.0, 3.0)

# when a measured speedup is a result of a bench (``speed_verdict``: jobs.speed, bench/, docs/results.md), a stricter
# rule than whether the demo's summary and the report print a category verdict (jobs.report.category_verdict)
RELIABLE_HALF_WIDTH = 0.15  # an interval wider than +-15% of the estimate: "not measured reliably"
BOUND_SLACK = 0.05  # timing noise allowed above the physical bound before a speedup is flagged
MIN_PAIRED_REQUESTS = 5  # fewer paired prompts: "not measured reliably" whatever the interval
# the widening of a verdict priced by a cost model whose own error cannot be measured on its traces: the largest
# |error| per category of a cost model pricing categories it never timed (docs/law.md), rounded up
UNMEASURED_COST_ERROR = 0.12

MEASURED, UNRELIABLE, ABOVE_BOUND = "measured", "not measured reliably", "above the physical bound"


def unmeasured_cost_note(why: str | None = None) -> str:
    """The note of a verdict widened by ``UNMEASURED_COST_ERROR`` (``why``: why its own error was not measured)."""
    return (f"the cost model's own error not measured{f' ({why})' if why else ''}: widened by "
            f"{UNMEASURED_COST_ERROR:.0%}, the largest error of a cost model pricing replayed rounds of categories it "
            "never timed in this project's checks (payoff.cost.UNMEASURED_COST_ERROR); time at least "
            f"{MIN_PAIRED_REQUESTS} requests per category beside AR to measure it on your machine")


def speed_verdict(speedup: float, low: float, high: float, bound: float, requests: int,
                  min_requests: int = MIN_PAIRED_REQUESTS) -> str:
    """Whether a measured speedup may be printed: ``ABOVE_BOUND`` above the physical bound (NaN: unchecked) by more
    than ``BOUND_SLACK``; ``UNRELIABLE`` with its interval missing or wider than +-``RELIABLE_HALF_WIDTH``, or
    fewer than ``min_requests`` paired requests; else ``MEASURED``."""
    if np.isfinite(bound) and speedup > bound * (1 + BOUND_SLACK):
        return ABOVE_BOUND
    if not (np.isfinite(low) and np.isfinite(high)) or requests < min_requests:
        return UNRELIABLE
    return MEASURED if max(speedup - low, high - speedup) <= RELIABLE_HALF_WIDTH * speedup else UNRELIABLE


def paired_speedup(ref_time, ref_tokens, arm_time, arm_tokens):
    """S = (sum ref_time / sum ref_tokens) / (sum arm_time / sum arm_tokens), the sums over the last axis (one entry
    per request, paired by position; leading axes: resamples)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (ref_time.sum(-1) / ref_tokens.sum(-1)) / (arm_time.sum(-1) / arm_tokens.sum(-1))


def pooled_log_speedup_sd(ref_time, ref_tokens, arm_time, arm_tokens, groups) -> tuple[float, int]:
    """``(SD, df)``: the per-request log speedups' spread around their group's mean, pooled over ``groups`` (one label
    per request) as one-way ANOVA does, for ``paired_speedup_interval``; df = requests - groups, (nan, 0) if < 1."""
    ref_time, ref_tokens, arm_time, arm_tokens = (np.asarray(x, dtype=float) for x in
                                                  (ref_time, ref_tokens, arm_time, arm_tokens))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log((ref_time / ref_tokens) / (arm_time / arm_tokens))
    frame = pd.DataFrame({"x": x, "group": np.asarray(groups)}).loc[np.isfinite(x)]
    df = len(frame) - frame["group"].nunique()
    if df < 1:
        return float("nan"), 0
    residual = frame["x"] - frame.groupby("group")["x"].transform("mean")
    return float(np.sqrt((residual ** 2).sum() / df)), int(df)


def paired_speedup_interval(ref_time, ref_tokens, arm_time, arm_tokens, *, rng: np.random.Generator,
                            n_boot: int = 2000, level: float = 0.95,
                            pooled: tuple[float, int] | None = None) -> tuple[float, float]:
    """``level`` interval of the paired speedup S (``paired_speedup``) over requests; (NaN, NaN) below 2 requests:
    the request bootstrap's percentile interval, widened to the studentized exp(log S +- t(n - 1) x SE) (SE: the
    jackknife's) where narrower: with few requests a percentile bootstrap covers far less than ``level``.
    ``pooled``: ``(SD, df)`` of ``pooled_log_speedup_sd``; below ``MIN_PAIRED_REQUESTS`` requests the interval is
    also widened to exp(log S +- t(df) x SD / sqrt(n_eff)), n_eff = (sum w)^2 / sum w^2, w the arm's tokens per
    request. Each widening only widens."""
    ref_time, ref_tokens, arm_time, arm_tokens = (np.asarray(x, dtype=float) for x in
                                                  (ref_time, ref_tokens, arm_time, arm_tokens))
    n = len(ref_time)
    if n < 2:
        return float("nan"), float("nan")

    draws = rng.integers(0, n, size=(int(n_boot), n))
    boot = paired_speedup(ref_time[draws], ref_tokens[draws], arm_time[draws], arm_tokens[draws])
    tail = 100 * (1 - level) / 2
    lo, hi = (np.nanpercentile(boot, [tail, 100 - tail]) if np.isfinite(boot).any() else (np.nan, np.nan))
    keep = ~np.eye(n, dtype=bool)  # row i: every request but i
    jack = np.log(paired_speedup(*(np.where(keep, x, 0.0) for x in (ref_time, ref_tokens, arm_time, arm_tokens))))
    estimate = paired_speedup(ref_time, ref_tokens, arm_time, arm_tokens)
    if np.isfinite(jack).all() and np.isfinite(estimate) and estimate > 0:
        se = math.sqrt((n - 1) / n * np.sum((jack - jack.mean()) ** 2))
        half = float(scipy_stats.t.ppf(1 - (1 - level) / 2, n - 1)) * se
        lo, hi = np.fmin(lo, estimate * math.exp(-half)), np.fmax(hi, estimate * math.exp(half))  # fmin: NaN-blind
    if (pooled is not None and n < MIN_PAIRED_REQUESTS and pooled[1] >= 1 and np.isfinite(pooled[0])
            and np.isfinite(estimate) and estimate > 0):
        n_eff = float(arm_tokens.sum() ** 2 / np.sum(arm_tokens ** 2)) if np.sum(arm_tokens ** 2) > 0 else float(n)
        half = float(scipy_stats.t.ppf(1 - (1 - level) / 2, pooled[1])) * pooled[0] / math.sqrt(n_eff)
        lo, hi = np.fmin(lo, estimate * math.exp(-half)), np.fmax(hi, estimate * math.exp(half))
    return float(lo), float(hi)


@dataclass
class CostModel(Result):
    """Measured costs (ms) of one drafter's rounds and of autoregressive decoding."""

    drafter_id: str
    ar_ms_per_token: float
    draft_ms: float
    overhead_ms: float
    verify_intercept_ms: float
    verify_per_node_ms: float
    depth: int  # deepest draft depth observed for the drafter: the arm's chain depth D
    nodes: int  # most draft nodes verified in one round: D for a chain, the tree budget N for a tree
    ar_source: str
    notes: list = field(default_factory=list)
    clock: str = "wall"  # "cpu": round timings priced by the CPU clock (``cpu_scaled_timings``); "wall": as logged
    no_draft_ms: float = float("nan")  # draft + overhead of the drafter's rounds that drafted nothing (NaN: none)
    skip_ms: float = float("nan")

    @property
    def title(self) -> str:
        return f"cost model for {self.drafter_id} ({self.clock} clock; t_AR {self.ar_source})"

    @property
    def summary(self) -> pd.DataFrame:
        values = {k: getattr(self, k) for k in ("ar_ms_per_token", "draft_ms", "overhead_ms", "verify_intercept_ms",
                                                 "verify_per_node_ms", "depth", "nodes", "no_draft_ms", "skip_ms")}
        values["round_ms_at_observed_nodes"] = self.round_ms(self.nodes)
        return pd.DataFrame({"value": pd.Series(values, dtype=float)})

    def round_ms(self, nodes) -> np.ndarray:
        return self.draft_ms + self.overhead_ms + self.verify_intercept_ms + self.verify_per_node_ms * np.asarray(nodes)

    @property
    def skip_round_ms(self) -> float:
        """Draft + overhead (ms) of a round in which a law policy did not call the drafter: as measured (``skip_ms``,
        the rounds with ``policy_drafted`` False), else t_AR - v0, so the round costs an AR step."""
        return self.skip_ms if np.isfinite(self.skip_ms) else self.ar_ms_per_token - self.verify_intercept_ms


def verify_curve(cost: CostModel, sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32)) -> dict:
    """The cost model's verify line as a verify-cost curve (``decoding.gate.VerifyCost.from_config`` reads it):
    c(n) = (v0 + v1 (n - 1)) / v0 for a forward over n tokens, c(1) = 1."""
    v0, v1 = cost.verify_intercept_ms, cost.verify_per_node_ms
    if not (v0 > 0 and np.isfinite(v1)):
        raise ValueError(f"{cost.title}: verify line v0 = {v0:.3g} ms, v1 = {v1:.3g} ms/node gives no cost curve "
                         "(v0 must be > 0): measure one (decoding.gate.measure_verify_cost)")
    costs = [max((v0 + v1 * (int(n) - 1)) / v0, 1e-6) for n in sizes]
    return {"sizes": [int(n) for n in sizes], "costs": [round(c, 6) for c in costs]}


def _weighted_mean(values: np.ndarray, w: np.ndarray) -> float:
    return float(np.sum(values * w) / np.sum(w))


TIMING_COLUMNS = ("draft_ms", "verify_ms", "overhead_ms")


def cpu_wall_factors(rounds: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame | None:
    """Per request (``run_id``, ``request_id``, ``factor``): its ``decode_cpu_ms`` over the wall time of its rounds
    (the sum of their ``TIMING_COLUMNS``); ``None`` where any request lacks a positive CPU or wall time."""
    keys = ["run_id", "request_id"]
    if "decode_cpu_ms" not in requests.columns or rounds.empty:
        return None
    cpu = requests[[*keys, "decode_cpu_ms"]].astype({"run_id": str, "request_id": str})
    total = rounds[list(TIMING_COLUMNS)].sum(axis=1).groupby(
        [rounds["run_id"].astype(str), rounds["request_id"].astype(str)]).sum().rename("wall_total").reset_index()
    total = total.merge(cpu, on=keys, how="left")
    cpu_ms = total["decode_cpu_ms"].to_numpy(dtype=float, na_value=np.nan)
    wall = total["wall_total"].to_numpy(float)
    if not (np.isfinite(cpu_ms).all() and (cpu_ms > 0).all() and (wall > 0).all()):
        return None
    return total[keys].assign(factor=cpu_ms / wall)


def cpu_scaled_timings(rounds: pd.DataFrame, requests: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``(rounds, clock)``: each round's ``TIMING_COLUMNS`` scaled by its request's CPU / wall ratio
    (``cpu_wall_factors``), clock ``"cpu"``; as logged, clock ``"wall"``, where any request lacks ``decode_cpu_ms``."""
    out = rounds.copy()
    factors = cpu_wall_factors(out, requests)
    if factors is None:
        return out, "wall"
    keys = ["run_id", "request_id"]
    factor = out[keys].astype(str).merge(factors, on=keys, how="left")["factor"].to_numpy(float)
    for col in TIMING_COLUMNS:
        out[col] = out[col].to_numpy(float) * factor
    return out, "cpu"


def policy_skipped(rounds: pd.DataFrame) -> np.ndarray:
    """Per round: True where a law policy decided not to call the drafter (``policy_drafted`` False)."""
    if "policy_drafted" not in rounds.columns:
        return np.zeros(len(rounds), dtype=bool)
    return rounds["policy_drafted"].eq(False).fillna(False).to_numpy(bool)


def fit_cost_model(traces, *, drafter: str | None = None, ar_ms_per_token: float | None = None,
                   request_weights: pd.Series | None = None, clock: str = "auto") -> CostModel:
    """Costs from the rounds (``draft_ms``, ``verify_ms``, ``overhead_ms`` vs ``tree_nodes``) of one arm timed on one
    machine, the verify line and AR cost from that machine's rounds only. ``request_weights``: a bootstrap weight
    per request id. ``clock``: ``"auto"`` (CPU where every request has ``decode_cpu_ms``, else wall), ``"wall"``,
    ``"cpu"`` (or an error)."""
    if clock not in ("auto", "cpu", "wall"):
        raise ValueError(f"clock must be 'auto', 'cpu' or 'wall', got {clock!r}")
    return _cost_model(_machine_rounds(traces, drafter, clock), traces.runs, ar_ms_per_token, request_weights)


def _cost_model(machine_rounds: tuple, runs: pd.DataFrame, ar_ms_per_token, request_weights) -> CostModel:
    drafter, rounds, machine, used_clock = machine_rounds  # (a bootstrap computes them once for all its replicates)
    w_all = (np.ones(len(rounds)) if request_weights is None
             else rounds["request_id"].map(request_weights).fillna(0).to_numpy(float))
    mine = ((rounds["tree_nodes"] > 0) & (rounds["drafter_id"] == drafter)).to_numpy()
    notes = []
    w = w_all[mine]
    prefill = ((rounds["round_index"] == 0) & (rounds["verify_ms"] == 0)).to_numpy()
    skipped = policy_skipped(rounds) & (rounds["drafter_id"] == drafter).to_numpy() & (w_all > 0) & ~prefill
    idle = ((rounds["tree_nodes"] == 0) & (rounds["drafter_id"] == drafter)).to_numpy() & (w_all > 0) & ~prefill
    idle &= ~skipped

    def idle_mean(rows):
        return (_weighted_mean((rounds.loc[rows, "draft_ms"] + rounds.loc[rows, "overhead_ms"]).to_numpy(float),
                               w_all[rows]) if rows.any() else float("nan"))
    no_draft, skip = idle_mean(idle), idle_mean(skipped)
    keep = w_all > 0
    v0, v1 = _verify_line(rounds, w_all, keep, notes)
    ar_ms, source = _ar_cost(rounds, runs, w_all, keep, ar_ms_per_token, machine)
    return CostModel(drafter_id=drafter, ar_ms_per_token=ar_ms,
                     draft_ms=_weighted_mean(rounds.loc[mine, "draft_ms"].to_numpy(float), w),
                     overhead_ms=_weighted_mean(rounds.loc[mine, "overhead_ms"].to_numpy(float), w),
                     verify_intercept_ms=v0, verify_per_node_ms=v1,
                     depth=int(rounds.loc[mine, "tree_depth"].max()),
                     nodes=int(rounds.loc[mine, "tree_nodes"].max()), ar_source=source, notes=notes,
                     clock=used_clock, no_draft_ms=no_draft, skip_ms=skip)


def _machine_rounds(traces, drafter: str | None, clock: str) -> tuple[str, pd.DataFrame, str, str]:
    """``(drafter, rounds, machine, clock)``: every run's rounds on the drafter's (one) machine, on ``clock``."""
    runs = traces.runs
    rounds = traces.rounds.merge(runs[["run_id", "drafter_id"]], on="run_id", how="left")
    drafting = rounds["tree_nodes"] > 0
    drafters = sorted(rounds.loc[drafting, "drafter_id"].dropna().unique())
    if drafter is None:
        if len(drafters) != 1:
            raise ValueError(f"traces hold drafters {drafters}: pass drafter=")
        drafter = drafters[0]
    mine_runs = rounds.loc[drafting & (rounds["drafter_id"] == drafter), "run_id"].unique()
    if not len(mine_runs):
        raise ValueError(f"no drafting rounds for drafter {drafter!r}; drafters: {drafters}")
    arms.check_one_arm_per_drafter(runs, mine_runs)
    machine_of = dict(zip(runs["run_id"].astype(str), (str(m) for m in arms.machines(runs))))
    machines = sorted({machine_of[str(r)] for r in mine_runs})
    if len(machines) > 1:
        raise ValueError(f"drafter {drafter!r} was timed on {len(machines)} machines ({'; '.join(machines)}): one "
                         "cost model would pool them. Select one machine's runs with traces.filter(run_id=[...])")
    same_machine = rounds["run_id"].astype(str).map(machine_of).eq(machines[0]).to_numpy()
    rounds = rounds.loc[same_machine].reset_index(drop=True)
    used_clock = "wall"
    if clock != "wall":
        rounds, used_clock = cpu_scaled_timings(rounds, traces.requests)
        if clock == "cpu" and used_clock != "cpu":
            raise ValueError(f"clock='cpu': some requests on {machines[0]} have no decode_cpu_ms (traces recorded "
                             "before the CPU clock was logged, or imported); use clock='wall' or re-record")
    for col in TIMING_COLUMNS:
        v = rounds[col].to_numpy(float)
        if np.any(~np.isfinite(v)) or np.any(v < 0):
            raise ValueError(f"rounds.{col} has NaN or negative timings; fix the traces")
    return drafter, rounds, machines[0], used_clock


def _verify_line(rounds: pd.DataFrame, w_all: np.ndarray, keep: np.ndarray, notes: list) -> tuple[float, float]:
    """``(v0, v1)``: weighted least squares of verify time on draft nodes; constant (noted) with one node count."""
    nodes_all = rounds["tree_nodes"].to_numpy(float)
    verify_all = rounds["verify_ms"].to_numpy(float)
    if len(np.unique(nodes_all[keep])) >= 2:
        x = np.column_stack([np.ones(keep.sum()), nodes_all[keep]])
        sw = np.sqrt(w_all[keep])
        coef, *_ = np.linalg.lstsq(x * sw[:, None], verify_all[keep] * sw, rcond=None)
        return float(coef[0]), float(coef[1])
    notes.append(f"one node count observed ({nodes_all[keep][0]:.0f}): verify cost taken as constant in N")
    return _weighted_mean(verify_all[keep], w_all[keep]), 0.0


def _ar_cost(rounds: pd.DataFrame, runs: pd.DataFrame, w_all: np.ndarray, keep: np.ndarray, ar_ms_per_token,
             machine: str) -> tuple[float, str]:
    """``(t_AR, where it comes from)``: given, or the time per committed token of the machine's AR runs' rounds."""
    if ar_ms_per_token is None:
        tree = rounds["run_id"].map(dict(zip(runs["run_id"], runs["tree_policy"]))) if "tree_policy" in runs else None
        ar_run = np.array([arms.is_ar_run(d, t) for d, t in zip(
            rounds["drafter_id"], tree if tree is not None else [None] * len(rounds))], dtype=bool)
        ar = (rounds["tree_nodes"] == 0).to_numpy() & keep & ar_run
        if not ar.any():
            raise ValueError(f"no autoregressive rounds (tree_nodes == 0) of {machine} to estimate the AR cost per "
                             "token: pass ar_ms_per_token= (a greedy run of the same target on the same machine)")
        total = rounds.loc[ar, ["draft_ms", "verify_ms", "overhead_ms"]].sum(axis=1).to_numpy(float)
        return (float(np.sum(total * w_all[ar]) / np.sum(rounds.loc[ar, "committed"].to_numpy(float) * w_all[ar])),
                f"estimated from {int(ar.sum())} autoregressive rounds")
    if not ar_ms_per_token > 0:
        raise ValueError("ar_ms_per_token must be positive")
    return float(ar_ms_per_token), "given"


def speedup_at_entropy(law: FittedLaw, cost: CostModel, entropy_nats, *, depth: int | None = None,
                       nodes: int | None = None) -> np.ndarray:
    """Predicted decode speedup at constant target entropy (vectorised over ``entropy_nats``)."""
    depth = depth or cost.depth
    nodes = nodes if nodes is not None else cost.nodes
    h = np.atleast_1d(np.asarray(entropy_nats, dtype=float))
    tau = law.predict_block_length(np.repeat(h[:, None], depth, axis=1), depth + 1)
    return (1.0 + tau) * cost.ar_ms_per_token / cost.round_ms(nodes)


BREAKEVEN_BOUNDS = (1e-4, 20.0)  # nats: where breakeven_entropy searches
CROSSING_GRID = 97  # log-spaced entropies at which speedup_crossings looks for the speedup crossing 1


def breakeven_entropy(law: FittedLaw, cost: CostModel, *, depth=None, nodes=None, bounds=BREAKEVEN_BOUNDS) -> float:
    """Entropy (nats) where the predicted speedup is 1; 0 if drafting never pays, inf if it always pays inside
    ``bounds`` (judged at the ends)."""
    def f(x):
        return float(speedup_at_entropy(law, cost, np.exp(x), depth=depth, nodes=nodes)[0]) - 1.0

    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    if f(lo) < 0:
        return 0.0
    if f(hi) > 0:
        return float("inf")
    return float(np.exp(brentq(f, lo, hi, xtol=1e-6)))


def speedup_crossings(law: FittedLaw, cost: CostModel, *, bounds=BREAKEVEN_BOUNDS, n: int = CROSSING_GRID,
                      depth=None, nodes=None) -> tuple:
    """The entropies (nats, on ``n`` log-spaced points in ``bounds``) at which the predicted speedup crosses 1;
    several: no single break-even entropy describes where drafting pays."""
    h = np.geomspace(bounds[0], bounds[1], n)
    above = speedup_at_entropy(law, cost, h, depth=depth, nodes=nodes) > 1.0
    change = np.flatnonzero(above[:-1] != above[1:])
    return tuple(float(np.sqrt(h[i] * h[i + 1])) for i in change)


@dataclass
class DraftingPays(Result):
    """Speedup vs entropy, break-even entropy and best shapes: per quantity the estimate, the bootstrap's
    percentile interval and ``n_requests``; ``law``: the law behind the estimates."""

    summary: pd.DataFrame
    law: FittedLaw
    cost: CostModel
    replicates: pd.DataFrame
    notes: list = field(default_factory=list)
    observed_entropy: tuple = (float("nan"), float("nan"))  # 1% and 99% quantiles of the at-risk entropies
    crossings: tuple = ()  # entropies where the estimate's speedup crosses 1 (``speedup_crossings``); () = unchecked

    @property
    def breakeven_verdict(self) -> str:
        """The answer in words: the break-even entropy only where it lies inside the observed entropies."""
        row = self.summary.loc["breakeven_entropy_nats"]
        lo_h, hi_h = self.observed_entropy
        if len(self.crossings) > 1:
            near = ", ".join(f"{h:.2g}" for h in self.crossings)
            return (f"no single break-even entropy: the predicted speedup crosses 1 near {near} nats (observed "
                    f"{lo_h:.2g} to {hi_h:.2f}); see the speedup per entropy")
        estimate, low, high = float(row["estimate"]), float(row["ci_low"]), float(row["ci_high"])
        if estimate >= hi_h:
            return f"pays at every observed entropy (up to {hi_h:.2f} nats)"
        if estimate <= lo_h:
            return f"never pays at an observed entropy (from {lo_h:.2g} nats)"
        interval = (f" [{low:.2f}, {'∞' if high == np.inf else f'{high:.2f}'}]"
                    if not (np.isnan(low) or np.isnan(high)) else "")
        return f"pays below {estimate:.2f}{interval} nats (observed {lo_h:.2g} to {hi_h:.2f})"

    @property
    def title(self) -> str:
        return f"when drafting pays: {self.cost.drafter_id} ({self.law.family.name}, decode speedup)"

    def plot(self, ax=None):
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        rows = self.summary.loc[self.summary.index.str.startswith("speedup[H=")]
        h = rows.index.str.extract(r"H=([0-9.e-]+)")[0].astype(float).to_numpy()
        ax.plot(h, rows["estimate"], marker="o")
        ax.fill_between(h, rows["ci_low"], rows["ci_high"], alpha=0.3)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("target entropy H (nats)")
        ax.set_ylabel("predicted decode speedup")
        return ax


def _statistics(law, cost, entropies, shapes, label) -> dict:
    out = {f"speedup[H={h:g}]": s for h, s in zip(entropies, speedup_at_entropy(law, cost, entropies))}
    out["breakeven_entropy_nats"] = breakeven_entropy(law, cost)
    depth_max = max(d for d, _ in shapes)
    h = np.asarray(entropies, dtype=float)
    a = law.predict_acceptance(np.repeat(h[:, None], depth_max, axis=1), np.arange(1, depth_max + 1)[None, :])
    tau_by_depth = np.cumsum(np.cumprod(a, axis=1), axis=1)  # [H, D]
    for i, value in enumerate(h):
        speeds = [(1 + tau_by_depth[i, d - 1]) * cost.ar_ms_per_token / cost.round_ms(n) for d, n in shapes]
        d, n = shapes[int(np.argmax(speeds))]
        out[f"{label}[H={value:g}]"] = d + 1 if label == "best_block_size" else n
    return out


def when_drafting_pays(traces, *, drafter: str | None = None, family: str = "law_exp",
                       entropies: Sequence[float] = DEFAULT_ENTROPIES, ar_ms_per_token: float | None = None,
                       ar_requests: pd.DataFrame | None = None, clock: str = "auto", n_boot: int = 100,
                       seed: int = 0, level: float = 0.95, eps: float = atrisk.EPS_NATS) -> DraftingPays:
    """Fit the law (one drafter) and the cost model; predict speedup vs entropy, the break-even entropy and the best
    block size / tree budget per entropy, with request-bootstrap intervals (below ``stats.FEW_REQUESTS`` requests:
    a warning). ``ar_requests``: the AR baseline's timed requests (``request_id``, ``decode_ms``, ``decoded``, same
    prompts, resampled with the arm's), else ``ar_ms_per_token`` or the AR rounds; ``clock``: as ``fit_cost_model``."""
    fam = get_family(family)
    if fam.needs_categories or fam.needs_drafters:
        raise ValueError(f"{family} needs a category/drafter argument; use a one-drafter, category-free law")
    ar_source_given = ar_ms_per_token is not None
    cost, ar_table = priced_cost_model(traces, drafter=drafter, ar_ms_per_token=ar_ms_per_token,
                                       ar_requests=ar_requests, clock=clock)
    clock = cost.clock  # the bootstrap's refits and the AR requests stay on this clock
    drafter = cost.drafter_id
    rows = atrisk.at_risk_table(traces, eps=eps, drafters=[drafter])
    counts = prepare_counts(rows, fam, eps=eps)
    n_requests = int(counts["request_id"].nunique())
    few = warn_if_few_requests(n_requests, "the request-bootstrap intervals")
    law = fit_law(counts, fam, cov_type="nonrobust")
    entropies = [float(h) for h in entropies]
    is_tree, ratio = cost.nodes > cost.depth, cost.nodes / cost.depth
    shapes = [(d, max(d, int(round(ratio * d))) if is_tree else d) for d in range(1, cost.depth + 1)]
    label = "best_tree_budget" if is_tree else "best_block_size"
    estimate = _statistics(law, cost, entropies, shapes, label)
    reps, failed = _pays_replicates(traces, drafter, counts, fam, law, ar_table, ar_ms_per_token, clock,
                                    (entropies, shapes, label), n_boot, seed)
    replicates = pd.DataFrame(reps)
    ci_low, ci_high = percentile_interval(replicates, level)  # inf (pays up to 20 nats): the nearest replicate
    summary = pd.DataFrame({"estimate": pd.Series(estimate, dtype=float), "ci_low": ci_low,
                            "ci_high": ci_high, "n_requests": n_requests})
    observed_range = tuple(float(q) for q in np.quantile(rows["target_entropy_nats"].to_numpy(float), [0.01, 0.99]))
    notes = [*cost.notes, *([few] if few else []),
             f"{level:.0%} percentile intervals from {len(reps)} request-bootstrap replicates over {n_requests} "
             f"requests (seed {seed}, {failed} failed); each replicate refits the law and the cost measurements "
             + ("(verify line, draft, overhead, AR cost per token from the AR run's requests)"
                if ar_table is not None else
                "(verify line, draft, overhead; the AR cost per token " + ("held fixed: given)" if ar_source_given
                                                                         else "from the weighted AR rounds)")),
             f"speedups at constant entropy; best shapes searched up to the observed depth {cost.depth}; breakeven "
             "0 = never pays, inf = always pays in [1e-4, 20] nats"]
    if is_tree:
        notes.append(f"tree budgets keep the observed nodes-per-depth ratio {ratio:.2f}")
    crossings = speedup_crossings(law, cost)
    if len(crossings) > 1:
        notes.append(f"the estimate's speedup crosses 1 at {len(crossings)} entropies in {list(BREAKEVEN_BOUNDS)} "
                     "nats (near " + ", ".join(f"{h:.2g}" for h in crossings)
                     + "): the break-even entropy is only one of them")
    return DraftingPays(summary=summary, law=law, cost=cost, replicates=replicates, notes=notes,
                        observed_entropy=observed_range, crossings=crossings)


def _pays_replicates(traces, drafter: str, counts: pd.DataFrame, fam, law, ar_table, ar_ms_per_token, clock: str,
                     grid: tuple, n_boot: int, seed: int) -> tuple[list, int]:
    """``(statistics per replicate, failures)``: Poisson weights per request; each refits law, t_AR and costs."""
    rng = np.random.default_rng(seed)
    reps, failed = [], 0
    start = law.result.params.to_numpy() if law.result is not None else None
    ids = list(counts["request_id"]) + ([] if ar_table is None else list(ar_table["request_id"]))
    machine_rounds = _machine_rounds(traces, drafter, clock)  # the same rounds for every replicate
    for _ in range(n_boot):
        weights = poisson_weights(ids, rng)
        try:
            law_b = fit_law(reweight_counts(counts, weights), fam, cov_type="nonrobust", start_params=start)
            ar_b = ar_ms_per_token if ar_table is None else _ar_ms(ar_table, weights)
            cost_b = _cost_model(machine_rounds, traces.runs, ar_b, weights)
            reps.append(_statistics(law_b, cost_b, *grid))
        except ValueError:
            failed += 1
    return reps, failed


def priced_cost_model(traces, *, drafter: str | None, ar_ms_per_token: float | None,
                      ar_requests: pd.DataFrame | None, clock: str) -> tuple[CostModel, pd.DataFrame | None]:
    """The cost model of ``drafter`` with t_AR from the timed AR requests where given (on its clock), else
    ``ar_ms_per_token`` or the AR rounds; and that AR table (None without it), for a bootstrap to reweigh."""
    cost = fit_cost_model(traces, drafter=drafter, ar_ms_per_token=1.0 if ar_requests is not None else ar_ms_per_token,
                          clock=clock)
    ar_table = _ar_table(ar_requests, cost.clock)
    if ar_table is not None:
        cost.ar_ms_per_token = _ar_ms(ar_table, None)
        cost.ar_source = f"{len(ar_table)} timed AR requests, {cost.clock} clock"
    return cost, ar_table


def _ar_table(ar_requests: pd.DataFrame | None, clock: str = "wall") -> pd.DataFrame | None:
    """The AR requests' (request_id, decode_ms, decoded), checked, their time on ``clock``; None when not given."""
    if ar_requests is None:
        return None
    column = "decode_cpu_ms" if clock == "cpu" else "decode_ms"
    missing = {"request_id", column, "decoded"} - set(ar_requests.columns)
    if missing:
        raise ValueError(f"ar_requests needs columns request_id, {column}, decoded (the cost model is on the {clock} "
                         f"clock); missing {sorted(missing)}")
    table = ar_requests[["request_id", column, "decoded"]].rename(columns={column: "decode_ms"}).reset_index(drop=True)
    ms, n = table["decode_ms"].to_numpy(float), table["decoded"].to_numpy(float)
    if not len(table) or not np.all(np.isfinite(ms)) or np.any(ms < 0) or n.sum() <= 0:
        raise ValueError("ar_requests must hold timed AR requests (finite decode_ms >= 0, tokens decoded > 0)")
    return table


def _ar_ms(table: pd.DataFrame, weights: pd.Series | None) -> float:
    """AR ms per token of ``table`` (total time / total tokens), each request weighted by ``weights``."""
    w = np.ones(len(table)) if weights is None else table["request_id"].map(weights).fillna(0).to_numpy(float)
    tokens = float(np.sum(w * table["decoded"].to_numpy(float)))
    if tokens <= 0:
        raise ValueError("the replicate holds no AR tokens")
    return float(np.sum(w * table["decode_ms"].to_numpy(float)) / tokens)

"""Simulated traces (format v1 columns) drawn from a known entropy law, for tests and power studies.

Bursty entropy sequences (a two-state Markov regime); depth d accepted at entropy H with probability
exp(-lambda_d s_drafter exp(c_category) (H + eps)^k_drafter); timings from a toy cost model (``SimCosts``). No torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from entropy_law.law.atrisk import EPS_NATS
from entropy_law.traces.schema import added_columns
from entropy_law.traces.stats import CONTEXT_MATCH_MAX


@dataclass(frozen=True)
class CategoryProfile:
    """A category's target entropy along the output: the low state's stationary share and mean run length,
    median H (nats) and log-spread per state, and the AR(1) coefficient of log H in the high state."""

    low_share: float = 0.55
    mean_low_run: float = 4.0
    low_median_nats: float = 0.01
    low_sigma: float = 1.2
    high_median_nats: float = 1.0
    high_sigma: float = 0.7
    high_ar: float = 0.5


DEFAULT_CATEGORIES: dict[str, CategoryProfile] = {
    "translation": CategoryProfile(low_share=0.45, mean_low_run=3.0, high_median_nats=1.2),
    "summarization": CategoryProfile(low_share=0.55, mean_low_run=4.0, high_median_nats=1.0),
    "qa": CategoryProfile(low_share=0.50, mean_low_run=3.5, high_median_nats=1.1),
    "math_reasoning": CategoryProfile(low_share=0.70, mean_low_run=8.0, high_median_nats=0.8),
    "rag": CategoryProfile(low_share=0.60, mean_low_run=5.0, high_median_nats=0.9),
}


@dataclass(frozen=True)
class TreeSpec:
    """A simulated tree drafter: levels, nodes (cost), rate multiplier (< 1: accepts more), ``k`` (None: the block's).
    """

    depth: int = 6
    nodes: int = 24
    lambda_scale: float = 0.6
    k: float | None = None
    drafter_id: str = "sim-tree"


@dataclass(frozen=True)
class DepthSpec:
    """A drafted depth per round for the block drafter: P(D = j | t) is proportional to
    ``probs[j] * exp(-entropy_coupling * j * H_t + copy_coupling * j * (m_t / 8 - 1/2))``, H_t and m_t the entropy
    and copyability at the round's first position. ``rate_exponent`` gamma: rejection rate x D^gamma."""

    probs: tuple = (0.25, 0.15, 0.15, 0.1, 0.1, 0.05, 0.05, 0.15)
    entropy_coupling: float = 0.0
    rate_exponent: float = 0.0
    copy_coupling: float = 0.0

    def sample(self, h_first: np.ndarray, rng: np.random.Generator, m_first: np.ndarray | None = None) -> np.ndarray:
        """One drafted depth per round from its first position's entropy (and copyability)."""
        base = np.asarray(self.probs, dtype=float)
        if base.ndim != 1 or np.any(base < 0) or base.sum() <= 0:
            raise ValueError("DepthSpec.probs must be non-negative weights for D = 0..B-1")
        j = np.arange(base.size)
        tilt = -self.entropy_coupling * np.asarray(h_first, float)[:, None]
        if self.copy_coupling:
            if m_first is None:
                raise ValueError("DepthSpec.copy_coupling needs the copyability at each round's first position")
            tilt = tilt + self.copy_coupling * (np.asarray(m_first, float)[:, None] / CONTEXT_MATCH_MAX - 0.5)
        w = base[None, :] * np.exp(tilt * j[None, :])
        cdf = np.cumsum(w, axis=1)
        u = rng.random(len(cdf)) * cdf[:, -1]
        return np.minimum((cdf < u[:, None]).sum(axis=1), base.size - 1).astype(np.int64)


COPY_STAY = 0.85  # the chance the simulated copyability keeps its level from one position to the next


def simulate_copyability(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """``[requests, positions]`` copyability 0..CONTEXT_MATCH_MAX; each keeps the last with probability COPY_STAY."""
    n, length = shape
    fresh = rng.integers(0, CONTEXT_MATCH_MAX + 1, size=(n, length))
    keep = rng.random((n, length)) < COPY_STAY
    keep[:, 0] = False
    out = fresh.copy()
    for t in range(1, length):
        out[:, t] = np.where(keep[:, t], out[:, t - 1], fresh[:, t])
    return out


@dataclass(frozen=True)
class SimCosts:
    """Toy per-round costs (ms): verify = ar_ms * (verify_base + verify_per_node * nodes)."""

    ar_ms: float = 40.0
    draft_ms: float = 6.0
    verify_base: float = 1.05
    verify_per_node: float = 0.01
    overhead_ms: float = 1.5
    noise_sigma: float = 0.05


@dataclass
class SimulatedTraces:
    """The three v1 tables, one row per run (``runs``), the law's parameters (``truth``) and each request's
    entropy sequence (``entropy``: request id -> array, shared by all drafters)."""

    tokens: pd.DataFrame
    rounds: pd.DataFrame
    requests: pd.DataFrame
    runs: pd.DataFrame
    truth: dict = field(default_factory=dict)
    entropy: dict = field(default_factory=dict)

    def true_acceptance(self, entropy_nats, depth, category, drafter_id=None) -> np.ndarray:
        """The law the data were drawn from, evaluated at (H, depth, category, drafter)."""
        t = self.truth
        drafter_id = drafter_id or t["block_drafter_id"]
        spec = t["drafters"][drafter_id]
        lam = np.asarray(t["lambda_d"], dtype=float)[np.asarray(depth, dtype=int) - 1]
        rate = lam * spec["lambda_scale"] * np.exp(t["category_effects"].get(category, 0.0))
        return np.exp(-rate * (np.asarray(entropy_nats, dtype=float) + t["eps"]) ** spec["k"])


_VOCAB_SIZES = np.array([8, 32, 128, 512, 2048, 8192, 49152])


@functools.lru_cache(maxsize=1)
def _zipf_tables():
    """Shannon H, Rényi-2, p1, p2 of Zipf(s) over V tokens, for a grid of s and each V."""
    s_grid = np.concatenate([np.linspace(0.0, 3.0, 121)[:-1], np.geomspace(3.0, 60.0, 200)])
    tables = []
    for vocab in _VOCAB_SIZES:
        log_rank = np.log(np.arange(1, vocab + 1, dtype=float))
        shannon, renyi2, p1, p2 = [], [], [], []
        for s in s_grid:
            logits = -s * log_rank
            logp = logits - np.logaddexp.reduce(logits)
            p = np.exp(logp)
            shannon.append(float(-(p * logp).sum()))
            renyi2.append(float(-np.log((p * p).sum())))
            p1.append(float(p[0]))
            p2.append(float(p[1]))
        tables.append(dict(h=np.maximum(np.array(shannon), 0.0), h2=np.array(renyi2), p1=np.array(p1), p2=np.array(p2)))
    return s_grid, tables


def distribution_summary(entropy_nats: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    """Rényi-2, top-1/top-2 probability and logit gap of a Zipf law with Shannon entropy H (random vocabulary)."""
    s_grid, tables = _zipf_tables()
    h = np.asarray(entropy_nats, dtype=float)
    out = {name: np.empty_like(h) for name in ("renyi2", "p1", "p2", "gap")}
    max_h = np.log(_VOCAB_SIZES) - 0.05
    first_ok = np.searchsorted(max_h, h, side="right")
    if np.any(first_ok >= len(_VOCAB_SIZES)):
        raise ValueError(f"entropy above ln(49152) - 0.05 = {max_h[-1]:.2f} nats cannot be simulated")
    choice = first_ok + np.floor(rng.random(h.size) * (len(_VOCAB_SIZES) - first_ok)).astype(int)
    for v_index, table in enumerate(tables):
        sel = choice == v_index
        if not sel.any():
            continue
        s = np.interp(h[sel], table["h"][::-1], s_grid[::-1])
        out["renyi2"][sel] = np.minimum(np.interp(s, s_grid, table["h2"]), h[sel])
        out["p1"][sel] = np.interp(s, s_grid, table["p1"])
        out["p2"][sel] = np.interp(s, s_grid, table["p2"])
        out["gap"][sel] = s * np.log(2.0)
    out["p1"] = np.maximum(out["p1"], np.exp(-out["renyi2"]))
    return pd.DataFrame({"target_renyi2_nats": out["renyi2"], "target_top1_prob": out["p1"],
                         "target_top2_prob": np.minimum(out["p2"], 1.0 - out["p1"]), "target_logit_gap": out["gap"]})


def simulate_entropy_sequences(profile: CategoryProfile, n_requests: int, length: int,
                               rng: np.random.Generator) -> np.ndarray:
    """``[n_requests, length]`` bursty entropy sequences (nats) from a two-state Markov regime."""
    if not 0.0 < profile.low_share < 1.0:
        raise ValueError(f"low_share must be in (0, 1), got {profile.low_share}")
    stay_low = 1.0 - 1.0 / max(profile.mean_low_run, 1.0 + 1e-9)
    leave_low = 1.0 - stay_low
    enter_low = profile.low_share * leave_low / (1.0 - profile.low_share)
    if enter_low > 1.0:
        raise ValueError("low_share too high for mean_low_run: the high state cannot be that short")
    low = np.empty((n_requests, length), dtype=bool)
    low[:, 0] = rng.random(n_requests) < profile.low_share
    u = rng.random((n_requests, length))
    for t in range(1, length):
        low[:, t] = np.where(low[:, t - 1], u[:, t] < stay_low, u[:, t] < enter_low)
    # AR(1) on log H in the high state (stationary variance high_sigma^2)
    z = np.empty((n_requests, length))
    z[:, 0] = rng.standard_normal(n_requests)
    innov = rng.standard_normal((n_requests, length)) * np.sqrt(1.0 - profile.high_ar**2)
    for t in range(1, length):
        z[:, t] = profile.high_ar * z[:, t - 1] + innov[:, t]
    high_h = profile.high_median_nats * np.exp(profile.high_sigma * z)
    low_h = profile.low_median_nats * np.exp(profile.low_sigma * rng.standard_normal((n_requests, length)))
    return np.clip(np.where(low, low_h, high_h), 1e-7, 10.0)


def _simulate_run(*, run_id, entropy, lengths, categories_of, request_ids, accept_fn, depth, nodes, block_size, costs, rng,
                  depth_spec: DepthSpec | None = None, copyability: np.ndarray | None = None):
    """The (tokens, rounds) DataFrames of one run: one round of every unfinished request at a time.
    ``depth_spec``: a drafted depth per round (at most ``depth``); ``copyability``: as ``entropy``, or None."""
    n_req = entropy.shape[0]
    pos = np.zeros(n_req, dtype=np.int64)
    round_index = np.zeros(n_req, dtype=np.int64)
    tok_parts, round_parts = [], []
    while True:
        active = np.flatnonzero(pos < lengths)
        if active.size == 0:
            break
        tok, rnd, committed = _simulate_round(active, pos, round_index, entropy=entropy, lengths=lengths,
                                              accept_fn=accept_fn, depth=depth, nodes=nodes, block_size=block_size,
                                              costs=costs, rng=rng, depth_spec=depth_spec, copyability=copyability)
        tok_parts.append(tok)
        round_parts.append(rnd)
        pos[active] += committed
        round_index[active] += 1
    tokens = pd.concat(tok_parts, ignore_index=True).sort_values(["request_row", "position"], ignore_index=True)
    rounds = pd.concat(round_parts, ignore_index=True).sort_values(["request_row", "round_index"], ignore_index=True)
    for frame in (tokens, rounds):
        frame.insert(0, "run_id", run_id)
        frame.insert(1, "request_id", request_ids[frame["request_row"].to_numpy()])
    tokens.insert(2, "category", categories_of[tokens["request_row"].to_numpy()])
    _add_token_columns(tokens, entropy, copyability, rng)
    rounds["context_len"] = (100 + rounds["start_position"]).astype(np.int32)
    return tokens.drop(columns="request_row"), rounds.drop(columns="request_row")


def _simulate_round(active, pos, round_index, *, entropy, lengths, accept_fn, depth, nodes, block_size, costs, rng,
                    depth_spec, copyability):
    """One round of each request in ``active``: (token rows, round rows, tokens each request committed)."""
    total_len = entropy.shape[1]
    d_idx = np.arange(depth)
    p = pos[active]
    variable = depth_spec is not None and depth > 0
    if variable:
        drafted = np.minimum(depth_spec.sample(entropy[active, p], rng,
                                               None if copyability is None else copyability[active, p]), depth)
        round_nodes = drafted
    else:
        drafted = np.full(active.size, depth, dtype=np.int64)
        round_nodes = np.full(active.size, nodes, dtype=np.int64)
    if depth > 0:
        cols = np.minimum(p[:, None] + d_idx[None, :], total_len - 1)
        h_block = entropy[active[:, None], cols]
        a = accept_fn(h_block, d_idx[None, :] + 1, active)
        if variable and depth_spec.rate_exponent != 0.0:
            a = a ** (np.maximum(drafted, 1)[:, None] ** depth_spec.rate_exponent)
        ok = rng.random(a.shape) < a
        tau = np.where(ok.all(axis=1), depth, np.argmin(ok, axis=1))
    else:
        tau = np.zeros(active.size, dtype=np.int64)
    tau = np.minimum(tau, drafted)
    committed = np.minimum(tau + 1, lengths[active] - p)
    n_tok = committed.sum()
    rows = np.repeat(np.arange(active.size), committed)
    depth_of = np.arange(n_tok) - np.repeat(np.cumsum(committed) - committed, committed) + 1
    req_of = active[rows]
    position = pos[req_of] + depth_of - 1
    role = np.where(depth_of <= tau[rows], "accepted", np.where(tau[rows] < drafted[rows], "correction", "bonus"))
    tokens = pd.DataFrame({"request_row": req_of, "round_index": round_index[req_of].astype(np.int32),
                           "position": position.astype(np.int32), "depth": depth_of.astype(np.int16), "role": role})
    noise = np.exp(costs.noise_sigma * rng.standard_normal((3, active.size)))
    drafts = drafted > 0
    verify = np.where(drafts, costs.ar_ms * (costs.verify_base + costs.verify_per_node * round_nodes), costs.ar_ms)
    rounds = pd.DataFrame({
        "request_row": active, "round_index": round_index[active].astype(np.int32),
        "start_position": p.astype(np.int32), "block_size": np.int16(block_size),
        "tree_nodes": np.where(drafts, round_nodes, 0).astype(np.int32), "tree_depth": drafted.astype(np.int16),
        "accepted": tau.astype(np.int16), "committed": committed.astype(np.int16),
        "draft_ms": np.where(drafts, costs.draft_ms * noise[0], 0.0).astype(np.float32),
        "verify_ms": (verify * noise[1]).astype(np.float32),
        "overhead_ms": np.where(drafts, costs.overhead_ms * noise[2], 0.1 * noise[2]).astype(np.float32)})
    return tokens, rounds, committed


def _add_token_columns(tokens: pd.DataFrame, entropy: np.ndarray, copyability, rng) -> None:
    """Add in place the per-token columns a decoder logs (token id, target and drafter statistics, copyability)."""
    rows = tokens["request_row"].to_numpy()
    h = entropy[rows, tokens["position"].to_numpy()]
    tokens["token_id"] = rng.integers(3, 49152, size=len(tokens)).astype(np.int32)
    tokens["target_entropy_nats"] = h.astype(np.float32)
    if copyability is not None:
        tokens["context_match"] = pd.array(copyability[rows, tokens["position"].to_numpy()], dtype="Int16")
    summary = distribution_summary(h, rng)
    for col in summary:
        tokens[col] = summary[col].to_numpy(dtype=np.float32)
    role = tokens["role"].to_numpy()
    is_bonus = role == "bonus"
    draft_prob = np.where(role == "accepted", rng.uniform(0.3, 1.0, len(tokens)), rng.uniform(0.0, 0.3, len(tokens)))
    tokens["draft_prob"] = pd.array(np.where(is_bonus, np.nan, draft_prob).astype(np.float32), dtype="Float32")
    tokens["draft_rank"] = pd.array(np.where(role == "accepted", 0, -1), dtype="Int32")
    tokens.loc[is_bonus, "draft_rank"] = pd.NA
    draft_entropy = np.where(is_bonus, np.nan, h * rng.uniform(0.5, 1.5, len(tokens)))
    tokens["draft_entropy_nats"] = pd.array(draft_entropy.astype(np.float32), dtype="Float32")


def simulate_traces(*, seed: int, n_requests_per_category: int = 40,
                    categories: Sequence[str] | Mapping[str, CategoryProfile] | None = None,
                    lambda_d: float | Sequence[float] = 1.0, k: float = 0.8,
                    category_effects: Mapping[str, float] | None = None, block_size: int = 8,
                    tree: TreeSpec | Mapping | None = None, block_depths: DepthSpec | Mapping | None = None,
                    tokens_per_request: tuple[int, int] = (100, 200), include_block: bool = True,
                    include_ar: bool = False, eps: float = EPS_NATS, costs: SimCosts = SimCosts()) -> SimulatedTraces:
    """Draw traces from ``a = exp(-lambda_d exp(c_cat) (H + eps)^k)``, every draw from ``seed``.

    ``categories``: names or name -> ``CategoryProfile``. ``lambda_d``: one rate or one per depth. ``category_effects``:
    log-rate shift per category. ``block_depths``: a ``DepthSpec`` (else full blocks); ``tree``: also a tree drafter;
    ``include_ar``: also an AR run. Output lengths uniform in ``tokens_per_request``.
    """
    rng = np.random.default_rng(seed)
    profiles, category_effects = _checked_profiles(categories, category_effects, n_requests_per_category, block_size)
    if isinstance(tree, Mapping):
        tree = TreeSpec(**tree)
    if isinstance(block_depths, Mapping):
        block_depths = DepthSpec(**block_depths)
    if block_depths is not None and len(block_depths.probs) != block_size:
        raise ValueError(f"block_depths.probs needs {block_size} weights (D = 0..B-1), got {len(block_depths.probs)}")
    drafters = _drafter_specs(include_block, tree, block_size, k, block_depths)
    max_depth = max(spec["depth"] for spec in drafters.values())
    lam = _depth_rates(lambda_d, k, max_depth)
    req = _draw_requests(profiles, n_requests_per_category, tokens_per_request, max_depth, rng)
    cat_shift = np.exp(np.array([category_effects.get(c, 0.0) for c in req["categories_of"]]))
    copyability = (simulate_copyability(req["entropy"].shape, rng)
                   if block_depths is not None and block_depths.copy_coupling else None)
    shared = dict(entropy=req["entropy"], lengths=req["lengths"], categories_of=req["categories_of"],
                  request_ids=req["request_ids"], costs=costs, rng=rng, copyability=copyability)

    tokens_parts, rounds_parts, run_rows = [], [], []
    for drafter_id, spec in drafters.items():
        def accept_fn(h_block, depth_idx, active, spec=spec):
            rate = lam[depth_idx - 1] * spec["lambda_scale"] * cat_shift[active][:, None]
            return np.exp(-rate * (h_block + eps) ** spec["k"])

        tok, rnd = _simulate_run(run_id=spec["run_id"], accept_fn=accept_fn, depth=spec["depth"], nodes=spec["nodes"],
                                 block_size=spec["block_size"], depth_spec=spec.get("depth_spec"), **shared)
        tokens_parts.append(tok)
        rounds_parts.append(rnd)
        run_rows.append(dict(run_id=spec["run_id"], drafter_id=drafter_id, tree_policy=spec["tree_policy"],
                             model_id="simulated", status="complete", seed=seed, block_size=spec["block_size"]))
    if include_ar:
        tok, rnd = _simulate_run(run_id="sim-ar", accept_fn=None, depth=0, nodes=0, block_size=1, **shared)
        tokens_parts.append(tok)
        rounds_parts.append(rnd)
        run_rows.append(dict(run_id="sim-ar", drafter_id="ar", tree_policy="none", model_id="simulated",
                             status="complete", seed=seed, block_size=1))

    tokens = pd.concat(tokens_parts, ignore_index=True)
    rounds = pd.concat(rounds_parts, ignore_index=True)
    requests = _requests_table(rounds, req["request_ids"], req["categories_of"])
    _add_later_columns(tokens=tokens, rounds=rounds, requests=requests)
    truth = dict(
        k=k, lambda_d=lam, category_effects=category_effects, eps=eps, seed=seed,
        block_drafter_id="sim-block" if include_block else next(iter(drafters)),
        drafters={d: dict(lambda_scale=s["lambda_scale"], k=s["k"], depth=s["depth"], nodes=s["nodes"],
                          depth_spec=s.get("depth_spec")) for d, s in drafters.items()}, costs=costs)
    entropy_by_request = {rid: req["entropy"][i, : req["lengths"][i]] for i, rid in enumerate(req["request_ids"])}
    return SimulatedTraces(tokens=tokens, rounds=rounds, requests=requests, runs=pd.DataFrame(run_rows), truth=truth,
                           entropy=entropy_by_request)


def _checked_profiles(categories, category_effects, n_requests_per_category: int, block_size: int) -> tuple[dict, dict]:
    """``(profiles, category_effects)`` of ``simulate_traces``' arguments, checked."""
    if categories is None:
        categories = DEFAULT_CATEGORIES
    if isinstance(categories, Mapping):
        profiles = dict(categories)
    else:
        profiles = {name: DEFAULT_CATEGORIES.get(name, CategoryProfile()) for name in categories}
    if not profiles:
        raise ValueError("categories is empty: pass at least one category name")
    if n_requests_per_category < 1:
        raise ValueError("n_requests_per_category must be >= 1")
    if block_size < 2:
        raise ValueError("block_size must be >= 2 (one draft plus the target's token)")
    category_effects = dict(category_effects or {})
    unknown = set(category_effects) - set(profiles)
    if unknown:
        raise ValueError(f"category_effects names unknown categories {sorted(unknown)}; known: {sorted(profiles)}")
    return profiles, category_effects


def _drafter_specs(include_block: bool, tree: TreeSpec | None, block_size: int, k: float,
                   block_depths: DepthSpec | None) -> dict:
    """drafter id -> its run: depth, nodes, rate scale, exponent, tree policy, block size, run id."""
    drafters = {}
    if include_block:
        drafters["sim-block"] = dict(depth=block_size - 1, nodes=block_size - 1, lambda_scale=1.0, k=k,
                                     tree_policy="chain", block_size=block_size, run_id="sim-block",
                                     depth_spec=block_depths)
    if tree is not None:
        drafters[tree.drafter_id] = dict(depth=tree.depth, nodes=tree.nodes, lambda_scale=tree.lambda_scale,
                                         k=k if tree.k is None else tree.k, tree_policy="ddtree",
                                         block_size=tree.depth + 1, run_id="sim-tree")
    if not drafters:
        raise ValueError("nothing to simulate: include_block=False and tree=None")
    return drafters


def _depth_rates(lambda_d, k: float, max_depth: int) -> np.ndarray:
    """The law's rate at each depth 1..``max_depth`` (one rate repeated, or one per depth), checked."""
    lam = np.atleast_1d(np.asarray(lambda_d, dtype=float))
    if lam.size == 1:
        lam = np.full(max_depth, lam[0])
    if lam.size < max_depth:
        raise ValueError(f"lambda_d has {lam.size} values but drafters reach depth {max_depth}")
    if np.any(lam <= 0) or k <= 0:
        raise ValueError("lambda_d and k must be positive")
    return lam


def _draw_requests(profiles: dict, n: int, tokens_per_request: tuple[int, int], max_depth: int, rng) -> dict:
    """Per category, ``n`` requests' output lengths and entropy sequences (long enough for the deepest draft)."""
    lo, hi = tokens_per_request
    seqs, cats, req_ids, lengths = [], [], [], []
    for name in profiles:
        length = rng.integers(lo, hi + 1, size=n)
        seqs.append(simulate_entropy_sequences(profiles[name], n, hi + max_depth + 1, rng))
        cats += [name] * n
        req_ids += [f"{name}-{i:04d}" for i in range(n)]
        lengths.append(length)
    return dict(entropy=np.vstack(seqs), lengths=np.concatenate(lengths), categories_of=np.array(cats, dtype=object),
                request_ids=np.array(req_ids, dtype=object))


def _add_later_columns(**tables: pd.DataFrame) -> None:
    """Columns added to format v1 later (policy decisions, CPU clock) are not simulated: null, as in older runs."""
    for name, frame in tables.items():
        for column in added_columns(name):
            if column not in frame.columns:
                frame[column] = np.nan


def _requests_table(rounds: pd.DataFrame, request_ids: np.ndarray, categories_of: np.ndarray) -> pd.DataFrame:
    """The requests table: a request's decode time is the sum of its rounds' draft, verify and overhead times."""
    per_round = rounds.assign(round_ms=rounds["draft_ms"] + rounds["verify_ms"] + rounds["overhead_ms"]).groupby(
        ["run_id", "request_id"], sort=False).agg(
        new_tokens=("committed", "sum"), rounds=("round_index", "size"), decode_ms=("round_ms", "sum"))
    per_round = per_round.reset_index()
    index_of = {r: i for i, r in enumerate(request_ids)}
    rows = per_round["request_id"].map(index_of).to_numpy()
    return pd.DataFrame({
        "run_id": per_round["run_id"], "request_id": per_round["request_id"], "category": categories_of[rows],
        "dataset": "simulated", "question_id": per_round["request_id"], "prompt_tokens": np.int32(100),
        "image_tokens": np.int32(0), "new_tokens": per_round["new_tokens"].astype(np.int32),
        "rounds": per_round["rounds"].astype(np.int32), "stop_reason": "max_new_tokens",
        "prefill_ms": np.float32(50.0), "decode_ms": per_round["decode_ms"].astype(np.float32)})

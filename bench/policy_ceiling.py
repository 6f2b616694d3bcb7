"""How close to the replay oracle can a per-round policy get from what it knows before each round? Modelled by replay.

Issue #19 asks a law policy to reach within 10% of the replay oracle, which picks each round's budget knowing the
round's outcome. This bench asks how much of that distance any policy that reads the issue's inputs could close,
so that a shortfall can be told apart from a ceiling.

For every output position of each request of the open-ended AR recordings (``data/<workload>/ar``) it replays
what a round of each budget N in {0, 1, 2, 4, 8, 16} of the drafter's DDTree would do there
(``jobs.reference.workload_round_outcomes``: committed tokens, nodes verified, and the drafter's surrogate
expected accepted drafts of the tree: its confidence), and what the policy reads before drafting (the window
entropy, the context's copyability, the law's best chain rate). Every round is priced by one verify-cost curve
``c(nodes + 1)`` (+ the policy's draft cost when the drafter runs), the curve the policies decide by: the
modelled rate, as bench/policy.py's oracle line. Configurations, each walked over the table (the next round
starts where the chosen one ends) or replayed:

- fixed budgets (every round drafts, no gate);
- the **replay oracle** (``oracle_rounds``' rule: the best rate of the round itself in hindsight; issue #19's
  ceiling) and the **path oracle** (the walk with the highest rate over whole requests, in hindsight, by dynamic
  programming: the true ceiling of any per-round choice among these actions, at least the replay oracle);
- the shipped **law policy** (``--policy``; its in-request calibration included) and the **cost gate**, replayed
  by the decoder's own round (``workload_round_records``) and priced by the same curve;
- **table policies**: the best decision per cell of the inputs, chosen on the data with the renewal rule. Before
  drafting, a cell of (window entropy bin, copyability level) decides to draft or take a plain step; after
  drafting, a cell of (that, confidence bin) picks the budget (0: verify nothing). *In sample* (fitted on the
  requests it is scored on: an optimistic bound for a policy that reads those inputs at that resolution) and
  *cross-fitted* (each request scored by a table fitted on the other folds' requests: what such a policy could
  reach honestly from this much data).

If even the in-sample table stays more than 10% below the oracle, no policy deciding from those inputs at that
resolution meets the issue's goal on these prompts: the rest is what the inputs do not say about a round.

With ``--route OTHER.json`` (the other drafter's law policy; its DDTree16 arm of ``data/traces``) the bench also asks
what the hybrid goal can reach when each round goes to one drafter (the hybrid drafter's law policy routes so, its
merged trees are not modelled here): the second drafter's outcomes at the same round starts, its replay oracle and
replayed law policy, the **route oracle** (each round, in hindsight, the drafter and budget with the best rate of the
round, each drafter's own cost counted) and its path oracle, and a **route table** (before drafting a cell of window
entropy and copyability chooses a plain step or one drafter; after drafting that drafter's budget per cell of its own
confidence; in sample and cross-fitted). ``--workloads traces`` adds Spec-Bench (the reference AR run, where the hybrid
goal's 1.7x is read: the greedy outputs of its 400 reference requests, in ``data/traces/ngram``; the shipped law
policies were fitted on them, so their rows there are in sample) and ``--sample K
--seed S`` replays a seeded sample of K requests per category of each workload; the table then has an overall column
per workload.

    OMP_NUM_THREADS=1 python bench/policy_ceiling.py --policy BLOCK-POLICY.json --cache /tmp/ceiling \\
        | tee bench/results/policy_ceiling.txt
    OMP_NUM_THREADS=1 python bench/policy_ceiling.py --policy BLOCK-POLICY.json --route NGRAM-POLICY.json \\
        --workloads traces traces_open_context traces_open_timed --sample 12 --seed 11 --cache /tmp/route

Prints a table (modelled speedup over AR per category and overall, tokens per round, the distance to the oracle)
and ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKLOADS = ("traces_open_timed", "traces_open_budgets", "traces_open_policy", "traces_open_policy2",
             "traces_open_context")
ALL_WORKLOADS = (*WORKLOADS, "traces")
TASKS = {"traces": "spec_bench"}  # a workload whose run.json names no task file: the prompts it decoded
# the run of a workload replayed over (default its AR run): Spec-Bench's reference AR run holds 5 requests, its n-gram
# chain run all 400, and every arm's output is the target's greedy one (recorded with its entropies at every position)
RUN_OF = {"traces": "ngram"}
BUDGETS = (0, 1, 2, 4, 8, 16)
ORACLE = "replay oracle (best rate of the round, in hindsight)"
PATH = "path oracle (the best whole walk, in hindsight)"
ROUTE = "route oracle (either drafter and its budget, per round in hindsight)"
ROUTE_PATH = "route path oracle (the best whole walk over both drafters)"
LAW = "law policy (shipped, calibrated)"
MERGED = "merged-tree replay oracle (the hybrid drafter calling both drafters every round)"
ROUTE3 = "route oracle with the merged tree (either drafter or both merged, per round in hindsight)"
HYBRID_LAW = "hybrid drafter's law policy (routes each round by the two laws; merged tree when it calls the block)"


# --- the action table of one set of requests ------------------------------------------------------------------

class Actions:
    """Per round start: what each action commits and costs. Actions: a plain step (the drafter not called), then,
    the drafter called, each budget of the table (budget 0 there: verify nothing after drafting)."""

    def __init__(self, table: pd.DataFrame, budgets: list[int], curve, draft_cost: float):
        starts = table.loc[table["budget"] == budgets[0]].sort_values(["key", "start_position"])
        self.starts = starts.reset_index(drop=True)
        wide = {c: table.pivot_table(index=["key", "start_position"], columns="budget", values=c, observed=True)
                .reindex(columns=budgets).loc[list(zip(starts["key"], starts["start_position"]))].to_numpy()
                for c in ("committed", "tree_nodes", "expected_accepted")}
        plain = wide["committed"][:, :1]
        self.committed = np.hstack([plain, plain, wide["committed"][:, 1:]]).astype(float)
        nodes = np.hstack([np.zeros_like(plain), np.zeros_like(plain), wide["tree_nodes"][:, 1:]])
        self.cost = np.vectorize(lambda n: float(curve(int(n) + 1)))(nodes)
        self.cost[:, 1:] += draft_cost
        self.names = ["plain step", "draft, verify none"] + [f"N={b}" for b in budgets[1:]]
        self.confidence = wide["expected_accepted"][:, -1]  # the largest tree's surrogate: known after drafting
        # the walk: row of each (key, start), the next start of each action
        self.row_of = {(k, int(s)): i for i, (k, s) in enumerate(zip(starts["key"], starts["start_position"]))}
        self.keys = list(dict.fromkeys(starts["key"]))

    def walk(self, choice: np.ndarray, keys=None) -> tuple[np.ndarray, np.ndarray]:
        """The rows visited and their actions when each start takes ``choice[row]``."""
        rows, acts = [], []
        for key in self.keys if keys is None else keys:
            s = 1
            while (key, s) in self.row_of:
                i = self.row_of[(key, s)]
                rows.append(i)
                acts.append(int(choice[i]))
                s += int(self.committed[i, choice[i]])
        return np.array(rows, dtype=int), np.array(acts, dtype=int)

    def rate(self, choice: np.ndarray, keys=None) -> float:
        rows, acts = self.walk(choice, keys)
        return float(self.committed[rows, acts].sum() / self.cost[rows, acts].sum())


def either_drafter(parts: list[Actions], names: list[str]) -> Actions:
    """The actions of several drafters at the same round starts (a hybrid that routes each round to one of them): the
    plain step, then each drafter's drafting actions in turn (each priced with its own drafter's cost); ``groups``:
    the columns of each drafter's."""
    keys = [part.starts[["key", "start_position"]].reset_index(drop=True) for part in parts]
    if any(not keys[0].equals(other) for other in keys[1:]):
        raise ValueError("the drafters' outcome tables do not hold the same round starts")
    both = copy.copy(parts[0])
    both.committed = np.hstack([parts[0].committed[:, :1]] + [part.committed[:, 1:] for part in parts])
    both.cost = np.hstack([parts[0].cost[:, :1]] + [part.cost[:, 1:] for part in parts])
    both.names = ["plain step"] + [f"{name} {n}" for part, name in zip(parts, names) for n in part.names[1:]]
    both.groups, start = [], 1
    for part in parts:
        both.groups.append(list(range(start, start + part.committed.shape[1] - 1)))
        start += part.committed.shape[1] - 1
    return both


def path_oracle(actions: Actions, iterations: int = 30) -> np.ndarray:
    """The best walk in hindsight: per start, the action of the walk with the highest rate over all requests together
    (sum committed / sum cost). Dinkelbach's iteration: for a rate lambda, the walk with the most committed - lambda *
    cost is found exactly by dynamic programming backwards over each request's starts (the value of a start is its
    best action's committed - lambda * cost plus the value of the start that action leads to); lambda becomes that
    walk's rate, until it no longer rises. A ceiling for any per-round choice among these actions."""
    lam, order = 1.0, np.argsort(-actions.starts["start_position"].to_numpy(), kind="stable")
    keys = actions.starts["key"].to_numpy()
    for _ in range(iterations):
        value, choice = {}, np.zeros(len(actions.starts), dtype=int)
        for i in order:  # later starts first: a start's successors are already valued
            s, key = int(actions.starts["start_position"].iat[i]), keys[i]
            gains = [actions.committed[i, a] - lam * actions.cost[i, a]
                     + value.get((key, s + int(actions.committed[i, a])), 0.0) for a in range(actions.cost.shape[1])]
            choice[i] = int(np.argmax(gains))
            value[(key, s)] = gains[choice[i]]
        new = actions.rate(choice)
        if new <= lam + 1e-12:
            break
        lam = new
    return choice


def ratio_oracle(actions: Actions) -> np.ndarray:
    """``oracle_rounds``' rule: the action with the best rate of the round itself (the plain step when none beats
    it; drafting then verifying nothing is never chosen, as the oracle never pays for a draft it does not use)."""
    rates = actions.committed / actions.cost
    rates[:, [i for i, name in enumerate(actions.names) if name.endswith("verify none")]] = -np.inf
    return np.argmax(rates > rates.max(axis=1, keepdims=True) - 1e-12, axis=1)


# --- table policies ----------------------------------------------------------------------------------------------

def quantile_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """Edges of ``bins`` quantile bins of ``values``, each moved to the midpoint between the distinct values around it,
    so that tied values (a copyability level, a confidence of 1) never straddle an edge; fewer bins where ties merge
    them."""
    distinct = np.unique(values[np.isfinite(values)])
    edges = []
    for q in np.quantile(distinct if len(distinct) < 2 else values, np.linspace(0, 1, bins + 1)[1:-1]):
        above = min(np.searchsorted(distinct, q, side="right"), len(distinct) - 1)  # at the top: the edge below it
        if above > 0:
            edges.append((distinct[above - 1] + distinct[above]) / 2)
    return np.unique(edges)


def cells(actions: Actions, edges: dict, use: tuple[str, ...], drafters: list[Actions] | None = None
          ) -> tuple[np.ndarray, list[np.ndarray]]:
    """(before-drafting cell, after-drafting cells) of every start, from the inputs in ``use``: ``entropy`` (window
    entropy bin), ``copy`` (copyability level), ``confidence`` (the drafter's surrogate bin, after drafting). One
    array of after-drafting cells per drafter (``drafters``, default ``actions`` alone), each from its own confidence
    (``edges["confidence"]``: one list of edges per drafter)."""
    pre = np.zeros(len(actions.starts), dtype=np.int64)
    if "entropy" in use:
        pre = pre * 100 + np.searchsorted(edges["entropy"], actions.starts["window_entropy"].to_numpy())
    if "copy" in use:
        pre = pre * 100 + actions.starts["context_match"].to_numpy(dtype=np.int64)
    posts = [pre * 100 + (np.searchsorted(e, d.confidence) if "confidence" in use else 0)
             for d, e in zip(drafters or [actions], edges["confidence"])]
    return pre, posts


def fit_table(actions: Actions, rows: np.ndarray, pre: np.ndarray, posts: list[np.ndarray], groups: list[list[int]], *,
              iterations: int = 12, passes: int = 3):
    """The best action per cell for the requests of the starts ``rows``: before drafting, per ``pre`` cell, a plain
    step or which drafter to call (``groups``: one list of action columns per drafter); after it, that drafter's
    budget per cell of its own array of ``posts`` (a post cell belongs to the pre cell ``post // 100``). Started from
    the renewal rule over those starts (each weighed alike, lambda the walk's rate; the best table of the iterations
    kept), then improved cell by cell on the rate of the walk itself (coordinate ascent: each cell takes the choice
    whose walk over those requests commits most per cost, the others held; at most ``passes`` sweeps), since a walk
    visits only some starts, and which ones depends on the table. Returns a function from (pre cells, one array of
    post cells per drafter) to actions (an unseen cell: a plain step)."""
    keys = list(dict.fromkeys(actions.starts["key"].to_numpy()[rows]))
    pre_of_post = [pd.Series(p // 100, index=p).groupby(level=0).first() for p in posts]

    def choose(pre_cells, post_cells, route, best):
        taken = pd.Series(pre_cells).map(route).to_numpy()  # the drafter of each start's pre cell (NaN: plain)
        out = np.zeros(len(pre_cells), dtype=int)
        for g in range(len(groups)):
            here = taken == g
            out[here] = pd.Series(post_cells[g][here]).map(best[g]).fillna(0).to_numpy(dtype=int)
        return out

    def rate(route, best):
        return actions.rate(choose(pre, posts, route, best), keys)

    lam, found = 1.0, (-np.inf, {}, [{} for _ in groups])
    for _ in range(iterations):
        value = actions.committed[rows] - lam * actions.cost[rows]
        best, options = [], [value[:, 0]]
        for g, columns in enumerate(groups):
            frame = pd.DataFrame(value[:, columns], columns=columns).assign(post=posts[g][rows])
            chosen = frame.groupby("post").sum().idxmax(axis=1).astype(int)
            options.append(value[np.arange(len(rows)), chosen.loc[posts[g][rows]].to_numpy()])
            best.append(chosen.to_dict())
        sums = pd.DataFrame(np.column_stack(options)).groupby(pre[rows]).sum().to_numpy()
        cells_seen = np.unique(pre[rows])  # groupby sorts its keys
        # the drafter whose best budgets gain most in the cell, where that is strictly above a plain step
        pick = np.where((sums[:, 1:] > sums[:, :1]).any(axis=1), np.argmax(sums[:, 1:], axis=1) + 1, 0)
        route = {cell: int(k) - 1 for cell, k in zip(cells_seen, pick) if k > 0}
        new = rate(route, best)
        if new > found[0]:
            found = (new, route, best)
        if abs(new - lam) < 1e-9:
            break
        lam = new
    current, route, best = found
    for _ in range(passes):
        before = current
        for cell in sorted(set(pre[rows])):
            for option in [None, *range(len(groups))]:
                if option == route.get(cell):
                    continue
                trial = {k: v for k, v in route.items() if k != cell}
                if option is not None:
                    trial[cell] = option
                if (r := rate(trial, best)) > current + 1e-12:
                    current, route = r, trial
        for g, columns in enumerate(groups):
            for cell in sorted(set(posts[g][rows])):
                if route.get(pre_of_post[g][cell]) != g:
                    continue
                for action in columns:
                    if action != best[g].get(cell):
                        trial = [*best[:g], {**best[g], cell: action}, *best[g + 1:]]
                        if (r := rate(route, trial)) > current + 1e-12:
                            current, best = r, trial
        if current <= before + 1e-12:
            break
    return lambda pre_cells, post_cells: choose(pre_cells, post_cells, route, best)


def table_policy(actions: Actions, use: tuple[str, ...], *, bins: int, folds: int,
                 drafters: list[Actions] | None = None) -> dict[str, np.ndarray]:
    """Per start, the in-sample and the cross-fitted table policy's action. ``drafters``: for a route table over
    ``either_drafter``'s actions, the drafters' own actions (each drafter's budget is chosen per cell of its own
    confidence; before drafting, a cell chooses a plain step or one drafter)."""
    starts = actions.starts
    drafters = [actions] if drafters is None else drafters
    groups = getattr(actions, "groups", None) or [list(range(1, actions.committed.shape[1]))]

    def edges_of(rows):
        return {"entropy": quantile_edges(starts["window_entropy"].to_numpy()[rows], bins),
                "confidence": [quantile_edges(d.confidence[rows], bins) for d in drafters]}

    everything = np.arange(len(starts))
    pre, posts = cells(actions, edges_of(everything), use, drafters)
    in_sample = fit_table(actions, everything, pre, posts, groups)(pre, posts)
    fold_of = {key: i % folds for i, key in enumerate(actions.keys)}
    fold = starts["key"].map(fold_of).to_numpy()
    crossed = np.zeros(len(starts), dtype=int)
    for f in range(folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        pre, posts = cells(actions, edges_of(train), use, drafters)
        crossed[test] = fit_table(actions, train, pre, posts, groups)(pre[test], [p[test] for p in posts])
    return {"in sample": in_sample, "cross-fitted": crossed}


def replay_code_sha256() -> str:
    """SHA-256 of the code that replays and decides (``entropy_law/decoding/*.py``, ``entropy_law/jobs/reference.py``):
    kept in the cache's manifest, so that replays made by other code (a policy's rule, the curve's measurement) are
    refused, not reused."""
    root = Path(__file__).resolve().parents[1] / "entropy_law"
    digest = hashlib.sha256()
    for path in sorted((root / "decoding").glob("*.py")) + [root / "jobs" / "reference.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def open_cache(cache: Path, manifest: dict) -> None:
    """Use ``cache`` for the replays of what ``manifest`` names (the policy file's hash, the arm, the budgets, a
    given verify-cost curve and the replaying code's hash), writing the manifest into an empty or new folder; a
    folder that holds another configuration's replays is refused, never mixed in."""
    path = cache / "manifest.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored != manifest:
            differ = sorted(k for k in set(stored) | set(manifest) if stored.get(k) != manifest.get(k))
            raise SystemExit(f"--cache {cache} holds replays of another configuration ({', '.join(differ)} differ): "
                             "give another --cache folder, or empty this one")
        return
    if cache.is_dir() and any(cache.iterdir()):
        raise SystemExit(f"--cache {cache} is not empty and has no {path.name}: give an empty or new folder")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))


# --- the bench -----------------------------------------------------------------------------------------------------

def ddtree16_arm(data: Path, params: dict) -> Path:
    """The DDTree16 arm of the policy's drafter among the reference traces (``data/traces``)."""
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    for d in sorted((data / "traces").iterdir()):
        if (d / RUN_FILE).is_file():
            meta = read_run_json(d / RUN_FILE)
            if meta.get("drafter_id") == params.get("drafter_id") and meta.get("tree_budget") == 16:
                return d
    raise SystemExit(f"no DDTree16 arm of drafter {params.get('drafter_id')!r} under {data / 'traces'}: give --arm")


def sampled_requests(ar: Path, per_category: int | None, seed: int) -> list[str] | None:
    """A seeded sample of ``per_category`` requests of each category of a workload's AR run (the whole run, not its
    first requests); ``None``: all of them."""
    from entropy_law.traces.reader import load_traces

    if per_category is None:
        return None
    requests = load_traces(ar).requests[["request_id", "category"]].drop_duplicates()
    rng = np.random.default_rng(seed)
    chosen = []
    for _, part in requests.sort_values("request_id").groupby("category", observed=True):
        ids = part["request_id"].astype(str).to_numpy()
        chosen += list(rng.choice(ids, size=min(per_category, len(ids)), replace=False))
    return sorted(chosen)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, metavar="FITTED.json",
                   help="the drafter's law policy (entropy-law policy ... --context-match): its inputs, draft cost "
                        "and, replayed, its decisions")
    p.add_argument("--arm", default=None, metavar="RUN",
                   help="the drafting run whose drafter and tree are replayed (default: the policy drafter's "
                        "DDTree16 arm of data/traces)")
    p.add_argument("--route", default=None, metavar="OTHER.json",
                   help="a second drafter's law policy (its DDTree16 arm of data/traces): both drafters' outcomes at "
                        "the same round starts, each drafter's oracle and replayed law policy, and the route oracle "
                        "(each round the better drafter and budget in hindsight: the ceiling of a hybrid that routes)")
    p.add_argument("--merged", action="store_true",
                   help="with --route over the n-gram and block drafters: also the hybrid drafter's merged tree (both "
                        "drafters called every round, their candidates in one tree) as a third drafter of the route "
                        "oracle and table")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=ALL_WORKLOADS, metavar="NAME",
                   help=f"recordings under data/ whose AR runs are replayed over (default: {' '.join(WORKLOADS)}; "
                        "'traces': Spec-Bench's 400 reference requests (the greedy outputs of data/traces/ngram), on "
                        "which the shipped law policies were fitted)")
    p.add_argument("--sample", type=int, default=None, metavar="K",
                   help="K requests of each category of each workload, a seeded sample (default: every request)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--verify-cost", default=None, metavar="CURVE.json",
                   help="a verify-cost curve (VerifyCost.to_config) to decide and price by (default: measured now)")
    p.add_argument("--bins", type=int, default=6, help="quantile bins of the window entropy and the confidence")
    p.add_argument("--folds", type=int, default=2, help="folds of requests for the cross-fitted tables")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="keep each workload's outcome table and replayed rounds here, with the verify-cost curve "
                        "measured for them (all reused when present; a folder of another policy, arm, budgets, "
                        "sample, --verify-cost or decoding code is refused)")
    args = p.parse_args(argv)
    if args.bins < 1 or args.folds < 2:
        p.error("--bins must be >= 1 and --folds >= 2")
    if args.sample is not None and args.sample < 1:
        p.error("--sample must be >= 1 requests a category")
    if args.merged and not args.route:
        p.error("--merged goes with --route (the n-gram and the block drafter's law policies)")

    import torch

    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import VerifyCost, measure_verify_cost
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import with_gate, workload_round_outcomes, workload_round_records
    from entropy_law.law.policy import hybrid_policy, load_policy, policy_arm_meta
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.process_time()
    data = Path(__file__).resolve().parents[1] / "data"
    params = load_policy(args.policy)
    arm_dir = Path(args.arm) if args.arm else ddtree16_arm(data, params)
    arm_meta = read_run_json(arm_dir / RUN_FILE)
    other = load_policy(args.route) if args.route else None
    if other is not None and other.get("drafter_id") == params.get("drafter_id"):
        p.error("--route takes the OTHER drafter's law policy (it is the same drafter as --policy's)")
    other_dir = ddtree16_arm(data, other) if other is not None else None
    other_meta = read_run_json(other_dir / RUN_FILE) if other is not None else None
    target = load_target("smollm2-135m")
    cache = Path(args.cache) if args.cache else None
    if cache is not None:
        open_cache(cache, {"policy_sha256": hashlib.sha256(Path(args.policy).read_bytes()).hexdigest(),
                           "arm": str(arm_dir.resolve()), "budgets": list(BUDGETS),
                           "verify_cost": json.loads(Path(args.verify_cost).read_text()) if args.verify_cost else None,
                           "code_sha256": replay_code_sha256(),
                           **({"route_policy_sha256": hashlib.sha256(Path(args.route).read_bytes()).hexdigest(),
                               "route_arm": str(other_dir.resolve())} if other is not None else {}),
                           **({"sample": args.sample, "seed": args.seed} if args.sample is not None else {}),
                           **({"merged": True} if args.merged else {})})
    kept = cache / "verify_cost.json" if cache else None
    if args.verify_cost or (kept is not None and kept.is_file()):
        curve = VerifyCost.from_config(json.loads(Path(args.verify_cost or kept).read_text()))
    else:
        curve = measure_verify_cost(TargetAdapter(target.model))
        if kept is not None:  # the cached tables' replayed policies decided by it: keep it with them
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(curve.to_config()))
    draft_cost = float(params["draft_cost"])
    print(f"{arm_dir}: {arm_meta.get('drafter_id')} {arm_meta.get('tree_policy')}{arm_meta.get('tree_budget')}; "
          f"decided and priced by c(n): {curve.describe()}; draft cost {draft_cost:.3f} forwards", flush=True)
    replayed = {LAW: (policy_arm_meta(arm_meta, params, measured=curve.to_config())[0], "law", draft_cost),
                "cost gate (DDTree16)": (with_gate(arm_meta, {"gate": "cost", "verify_cost": curve.to_config()}),
                                         "cost", draft_cost)}
    drafters = [("", arm_meta, params)]
    if other is not None:
        name = other_meta.get("drafter_id")
        print(f"route: {other_dir}: {name} {other_meta.get('tree_policy')}{other_meta.get('tree_budget')}; draft cost "
              f"{float(other['draft_cost']):.3f} forwards", flush=True)
        drafters.append(("route.", other_meta, other))
        replayed[f"{name} {LAW}"] = (policy_arm_meta(other_meta, other, measured=curve.to_config())[0], "route.law",
                                     float(other["draft_cost"]))
        by_id = {arm_meta.get("drafter_id"): (arm_meta, params), name: (other_meta, other)}
        if args.merged and "ngram" not in by_id:
            p.error("--merged needs the n-gram drafter's law policy as --policy or --route")
        if "ngram" in by_id:  # the hybrid drafter's law policy: the two laws, each round the drafter of the higher rate
            (ngram_meta, ngram_law), (block_meta, block_law) = by_id.pop("ngram"), by_id.popitem()[1]
            hybrid_meta = {**block_meta, "drafter_id": "hybrid", "gate": "cost",
                           "drafter_config": {"ngram": ngram_meta.get("drafter_config") or {},
                                              "block": block_meta.get("drafter_config") or {}}}
            if args.merged:  # both drafters every round; the block law: only its inputs are read
                drafters.append(("merged.", {**hybrid_meta, "drafter_config": {
                    **hybrid_meta["drafter_config"], "skip_block_at": float("inf")}}, block_law))
                merged_cost = float(ngram_law["draft_cost"]) + float(block_law["draft_cost"])
            replayed[HYBRID_LAW] = (
                {**hybrid_meta, "verify_cost": curve.to_config(), "policy": hybrid_policy(ngram_law, block_law)},
                "hybrid.law", {"ngram": float(ngram_law["draft_cost"]), "block": float(block_law["draft_cost"])})
    tables, rounds = {tag: [] for tag, _, _ in drafters}, []
    for workload in args.workloads:
        ar = data / workload / RUN_OF.get(workload, "ar")
        requests = sampled_requests(ar, args.sample, args.seed)
        for tag, meta_of, params_of in drafters:
            stored = cache / f"{workload}.{tag}outcomes.parquet" if cache else None
            if stored is not None and stored.is_file():
                table = pd.read_parquet(stored)
            else:
                table = workload_round_outcomes(ar, meta_of, target, budgets=BUDGETS, policy=params_of,
                                                verify_cost=curve, requests=requests, tasks=TASKS.get(workload))
                if stored is not None:
                    stored.parent.mkdir(parents=True, exist_ok=True)
                    table.to_parquet(stored)
            tables[tag].append(table.assign(key=workload + ":" + table["request_id"].astype(str), workload=workload))
        for name, (meta, stem, _) in replayed.items():
            stored = cache / f"{workload}.{stem}.parquet" if cache else None
            if stored is not None and stored.is_file():
                part = pd.read_parquet(stored)
            else:
                part = workload_round_records(ar, meta, target, requests=requests, tasks=TASKS.get(workload))
                if stored is not None:
                    part.to_parquet(stored)
            rounds.append(part.assign(config=name, key=workload + ":" + part["request_id"].astype(str)))
        print(f"replayed over {ar} ({table['request_id'].nunique()} prompts)", flush=True)
    actions = Actions(pd.concat(tables[""], ignore_index=True), list(BUDGETS), curve, draft_cost)
    category = actions.starts.groupby("key")["category"].first()

    choices = {f"fixed N={b}": (actions, np.full(len(actions.starts), 2 + i, dtype=int))
               for i, b in enumerate(BUDGETS[1:])}
    choices[ORACLE] = (actions, ratio_oracle(actions))
    choices[PATH] = (actions, path_oracle(actions))
    inputs = {"entropy": ("entropy",), "entropy + copyability": ("entropy", "copy"),
              "confidence (after drafting)": ("confidence",),
              "entropy + copyability + confidence": ("entropy", "copy", "confidence")}
    for label, use in inputs.items():
        for how, choice in table_policy(actions, use, bins=args.bins, folds=args.folds).items():
            choices[f"table: {label}, {how}"] = (actions, choice)
    route = None
    if other is not None:
        name = other_meta.get("drafter_id")
        second = Actions(pd.concat(tables["route."], ignore_index=True), list(BUDGETS), curve,
                         float(other["draft_cost"]))
        choices[f"{name} replay oracle"] = (second, ratio_oracle(second))
        route = either_drafter([actions, second], [arm_meta.get("drafter_id"), name])
        choices[ROUTE] = (route, ratio_oracle(route))
        choices[ROUTE_PATH] = (route, path_oracle(route))
        use = inputs["entropy + copyability + confidence"]
        for how, choice in table_policy(route, use, bins=args.bins, folds=args.folds,
                                        drafters=[actions, second]).items():
            choices[f"route table: entropy + copyability + each drafter's confidence, {how}"] = (route, choice)
        if args.merged:
            merged = Actions(pd.concat(tables["merged."], ignore_index=True), list(BUDGETS), curve, merged_cost)
            choices[MERGED] = (merged, ratio_oracle(merged))
            three = either_drafter([actions, second, merged], [arm_meta.get("drafter_id"), name, "merged"])
            choices[ROUTE3] = (three, ratio_oracle(three))
            for how, choice in table_policy(three, use, bins=args.bins, folds=args.folds,
                                            drafters=[actions, second, merged]).items():
                choices[f"route table with the merged tree, {how}"] = (three, choice)

    rows, shares = [], {}
    for name, (acting, choice) in choices.items():
        visited, acts = acting.walk(choice)
        frame = pd.DataFrame({"key": acting.starts["key"].to_numpy()[visited],
                              "committed": acting.committed[visited, acts], "cost": acting.cost[visited, acts],
                              "drafted": acts > 0})
        rows.append((name, frame))
        if getattr(acting, "groups", None) is not None:  # the share of rounds each drafter drafted in
            shares[name] = [float(np.isin(acts, group).mean()) for group in acting.groups]
    costs = {name: cost for name, (_, _, cost) in replayed.items()}
    for name, part in pd.concat(rounds).groupby("config", sort=False):
        part = part.loc[part["round_index"] > 0]
        called = part["policy_drafted"].fillna(True).astype(bool) if LAW in name or name == HYBRID_LAW else \
            pd.Series(True, index=part.index)
        if name == HYBRID_LAW:  # prompt lookup runs every round (the policy looks at it first); the block forward
            # where the round was routed to it
            spent = costs[name]["ngram"] + costs[name]["block"] * (called & (part["policy_route"] == "block"))
        else:
            spent = costs[name] * called
        cost = np.array([curve(int(n) + 1) for n in part["tree_nodes"]]) + spent.to_numpy(dtype=float)
        rows.append((name, pd.DataFrame({"key": part["key"].to_numpy(), "committed": part["committed"].to_numpy(),
                                         "cost": cost, "drafted": called.to_numpy()})))
    summary = []
    for name, frame in rows:
        frame = frame.assign(category=frame["key"].map(category))
        by = frame.groupby("category")[["committed", "cost"]].sum()
        sets = frame.groupby(frame["key"].str.split(":").str[0])[["committed", "cost"]].sum()
        summary.append({"config": name, **(by["committed"] / by["cost"]).round(3).to_dict(),
                        **({f"all {w}": round(float(sets.loc[w, "committed"] / sets.loc[w, "cost"]), 3)
                            for w in args.workloads} if len(args.workloads) > 1 else {}),
                        "all": round(float(frame["committed"].sum() / frame["cost"].sum()), 4),
                        "tokens_per_round": round(float(frame["committed"].mean()), 2),
                        "drafter_called": round(float(frame["drafted"].mean()), 2)})
    out = pd.DataFrame(summary).set_index("config")
    oracle = float(out.loc[ORACLE, "all"])
    out["below_oracle"] = (1 - out["all"] / oracle).round(3)
    with pd.option_context("display.width", 240, "display.max_columns", 30):
        print(f"\nmodelled speedup over AR ({len(actions.keys)} prompt runs; every round priced by the curve above)")
        print(out.to_string())
    if "traces" in args.workloads:
        print("NOTE: the law policies' rows on Spec-Bench ('traces') are in sample when the policies were fitted on "
              "data/traces (as entropy-law policy data/traces fits them): it holds these requests; the oracles and "
              "fixed budgets fit nothing")
    law = float(out.loc[LAW, "all"])
    best_in = out.loc[[c for c in out.index if c.startswith("table:") and c.endswith("in sample")], "all"]
    best_cross = out.loc[[c for c in out.index if c.startswith("table:") and c.endswith("cross-fitted")], "all"]
    print(f"\nthe replay oracle {oracle:.3f}x (the path oracle {out.loc[PATH, 'all']:.3f}x); the shipped law "
          "policy "
          f"{law:.3f}x ({1 - law / oracle:.1%} below the oracle); the best table policy in sample: {best_in.idxmax()} "
          f"{best_in.max():.3f}x ({1 - best_in.max() / oracle:.1%} below), cross-fitted: {best_cross.idxmax()} "
          f"{best_cross.max():.3f}x ({1 - best_cross.max() / oracle:.1%} below)")
    routed = {}
    if route is not None:
        names = (arm_meta.get("drafter_id"), other_meta.get("drafter_id"))
        second_oracle = float(out.loc[f"{names[1]} replay oracle", "all"])
        routed = {"route_oracle": float(out.loc[ROUTE, "all"]), "route_path_oracle": float(out.loc[ROUTE_PATH, "all"]),
                  "second_oracle": second_oracle, "second_drafter": names[1],
                  "second_law_policy": float(out.loc[f"{names[1]} {LAW}", "all"]),
                  **({"hybrid_law_policy": float(out.loc[HYBRID_LAW, "all"])} if HYBRID_LAW in out.index else {}),
                  "route_oracle_shares": dict(zip(names, shares[ROUTE])),
                  "route_table": {how: float(out.loc[c, "all"]) for c in out.index if c.startswith("route table:")
                                  for how in ("in sample", "cross-fitted") if c.endswith(how)},
                  "per_workload": {c: {k: float(v) for k, v in out[c].items()} for c in out.columns
                                   if c.startswith("all ")}}
        share = shares[ROUTE]
        print(f"the route oracle {routed['route_oracle']:.3f}x (path {routed['route_path_oracle']:.3f}x): "
              f"{routed['route_oracle'] / max(oracle, second_oracle) - 1:+.1%} over the better drafter's own oracle "
              f"({names[0]} {oracle:.3f}x, {names[1]} {second_oracle:.3f}x); it drafts with {names[0]} in "
              f"{share[0]:.0%} of its rounds, with {names[1]} in {share[1]:.0%}, and takes a plain step "
              f"in {1 - sum(share):.0%}. The better law policy reaches "
              f"{max(law, routed['second_law_policy']) / routed['route_oracle']:.1%} of the route oracle, a route "
              f"table on the inputs {routed['route_table']['cross-fitted'] / routed['route_oracle']:.1%} cross-fitted, "
              f"{routed['route_table']['in sample'] / routed['route_oracle']:.1%} in sample"
              + (f", the hybrid drafter's law policy {routed['hybrid_law_policy'] / routed['route_oracle']:.1%}"
                 if "hybrid_law_policy" in routed else ""))
    if args.merged:
        three = {c: float(out.loc[c, "all"]) for c in out.index
                 if c in (MERGED, ROUTE3) or c.startswith("route table with")}
        routed["merged"] = {**three, "route3_oracle_shares": dict(zip([*names, "merged"], shares[ROUTE3]))}
        print(f"with the merged tree as a third drafter: its own oracle {three[MERGED]:.3f}x, the route oracle "
              f"{three[ROUTE3]:.3f}x, a route table "
              + ", ".join(f"{v:.3f}x {k.rsplit(', ', 1)[1]}" for k, v in three.items() if k.startswith("route table")))
    result = {"bench": "policy_ceiling", "policy": str(args.policy), "arm": str(arm_dir), "workloads": args.workloads,
              "route_policy": args.route, "sample": args.sample, "seed": args.seed,
              "prompt_runs": len(actions.keys), "verify_cost_curve": curve.to_config(), "draft_cost": draft_cost,
              "bins": args.bins, "folds": args.folds, "cpu_s": round(time.process_time() - t0, 1),
              "overall": {c: float(v) for c, v in out["all"].items()}, "oracle": oracle,
              "path_oracle": float(out.loc[PATH, "all"]), "law_policy_below_oracle": 1 - law / oracle,
              "best_table_in_sample": best_in.idxmax(), "best_table_in_sample_below_oracle": 1 - best_in.max() / oracle,
              "best_table_cross_fitted": best_cross.idxmax(),
              "best_table_cross_fitted_below_oracle": 1 - best_cross.max() / oracle, **routed}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

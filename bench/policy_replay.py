"""Which drafting policy pays most on prompts it was never fitted on? Modelled by replay, not timed.

Every configuration's rounds are replayed over the AR runs of the timed open-ended recordings (``data/traces_open_*``:
seeds 7, 11, 13 and 17, 3 prompts per category each, and 19, 4 per category; the same prompt may appear in several) and priced by the cost
model of ``data/traces_timed``'s n-gram arm of that tree (``entropy-law predict --replay-rounds`` / ``--budgets`` /
``--policy``; on the timed open-ended checks these predictions landed within 2.2-3.1% of the measured speedups on
average per category, ``bench/results/predict_policy.txt`` and ``predict_budgets.txt``). Configurations:

- the fixed arms: n-gram chain, DDTree16 and DDTree4 under their ratio gate;
- the cost gate (DDTree16: every round drafts, the best-value prefix by the drafter's own probabilities under the
  same verify-cost curve the policies decide by), as ``bench/policy.py`` times it; not a fixed arm;
- the law policy (``--policy``: fitted on ``data/traces``, Spec-Bench), on DDTree16, with ``confidence_weight`` 0
  (the law alone), 0.5 (the default blend) and 1 (the drafter's own confidence alone: no law), each with the
  in-request calibration on (the default) and off;
- the replay oracle (``jobs.reference.workload_oracle_rounds``): the drafter's DDTree with, each round in hindsight,
  the budget N in {0, 1, 2, 4, 8, 16} that commits the most tokens per unit of the verify-cost curve (+ the policy's
  draft cost when it drafts); a ceiling for any per-round policy, not a decoder, priced as the others are. Issue
  #19's "distance to the oracle" is the best law policy's shortfall against it.

The verify-cost curve the policies and the oracle decide by (``--curve``): by default the verify line of the cost
model that prices every configuration (``cost.verify_curve`` of the tree arm of ``--from``), so that each decision
is judged by the cost it was made with. ``--curve measured`` decides by this machine's curve measured now, as an
online run here would; it is priced by the recording machine's timings all the same, so where the two machines
differ the comparison mixes two cost models (2026-12-05: this machine c(2) = 1.01, c(4) = 1.50; the recording
machine's measured curve had c(2) = 1.65, c(4) = 2.02; the priced line c(2) = 1.08, c(4) = 1.25: the law policy's
verdict against the best fixed arm moved from -0.7% to +3.3% with the curve alone). The priced line is fitted on the
timed rounds of the tree arm (mostly large trees: the run printed their range), so the small trees a policy verifies
are priced by extrapolation; the timed bench (``bench/policy.py``) is the measurement.

``--drafter block``: the block drafter's DDTree16 and DDTree4 and its law policy at the three weights (its replay needs
one teacher-forced pass per request: give fewer ``--workloads``). Prints per configuration the modelled speedup over
AR per category (pooled over the recordings) and overall, and ends with ONE JSON line.

    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --fit-policy ngram --out /tmp/ngram-policy.json
    OMP_NUM_THREADS=1 python bench/policy_replay.py --policy /tmp/ngram-policy.json \
        | tee bench/results/policy_replay.txt
    OMP_NUM_THREADS=1 python bench/policy_replay.py --drafter block --policy /tmp/block-policy.json \
        --workloads traces_open_policy2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKLOADS = ("traces_open_timed", "traces_open_budgets", "traces_open_policy", "traces_open_policy2",
             "traces_open_context")
WEIGHTS = (0.0, 0.5, 1.0)
ORACLE = "replay oracle (DDTree, best N per round in hindsight)"
ORACLE_BUDGETS = (0, 1, 2, 4, 8, 16)
COST_GATE = "ddtree16 (cost gate)"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, nargs="+", metavar="FITTED.json",
                   help="the drafter's law policy parameters; several files: each at the three weights, labelled by "
                        "its file name, all under the same measured verify-cost curve")
    p.add_argument("--from", dest="arm_traces", default="data/traces_timed", help="the timed arms whose costs price")
    p.add_argument("--drafter", choices=("ngram", "block"), default="ngram",
                   help="ngram (default): chain, DDTree16, DDTree4 and six law policies; block: DDTree16, DDTree4 and "
                        "the law policy at weights 0, 0.5, 1 (its replay needs a teacher-forced pass per request)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS, metavar="NAME",
                   help=f"recordings under data/ whose AR runs are replayed over (default: {' '.join(WORKLOADS)})")
    p.add_argument("--curve", choices=CURVES, default="priced",
                   help="the verify-cost curve the law policies and the oracle decide by: 'priced' (default), the verify "
                        "line of the cost model that prices every configuration (decisions judged by the cost they "
                        "were made with); 'measured', this machine's curve measured now (what an online run here "
                        "would decide by, priced by the recording machine's timings)")
    args = p.parse_args(argv)

    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import VerifyCost, measure_verify_cost
    from entropy_law.law.cost import verify_curve
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import with_gate, workload_oracle_rounds, workload_rounds
    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.policy import load_policy, policy_arm_meta
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.reader import load_traces

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.process_time()
    data = Path(__file__).resolve().parents[1] / "data"
    source = TraceAnalysis(load_traces(args.arm_traces), n_boot=0)
    path_of = dict(zip(source.runs["arm"], source.runs["path"]))
    meta = {arm: read_run_json(Path(path_of[arm]) / RUN_FILE) for arm in source.arms}
    tree_arm = next(a for a in source.arms if a.startswith(args.drafter) and a.endswith("ddtree16"))
    policies = {Path(path).stem: load_policy(path) for path in args.policy}
    for name, policy in policies.items():
        if policy.get("drafter_id") != meta[tree_arm].get("drafter_id"):
            raise SystemExit(f"--policy {name} is for drafter {policy.get('drafter_id')!r}, --drafter {args.drafter} "
                             f"is {meta[tree_arm].get('drafter_id')!r}")
    if len(policies) != len(args.policy):
        raise SystemExit("--policy: give files of distinct names (they label the configurations)")
    target = load_target("smollm2-135m")
    measured = measure_verify_cost(TargetAdapter(target.model))
    priced = {**verify_curve(source.cost_model(tree_arm)), "clock": measured.clock}
    curve = priced if args.curve == "priced" else measured.to_config()
    print(f"this machine's measured verify cost c(n): {measured.describe()}\n"
          f"{tree_arm}'s priced verify line c(n):      {VerifyCost.from_config(priced).describe()}\n"
          f"the policies and the oracle decide by the {args.curve} curve", flush=True)
    sizes = _timed_tree_sizes(source, tree_arm)
    print(f"the priced line is fitted on {tree_arm}'s timed rounds, which verified {sizes}: smaller trees are priced "
          "by extrapolation", flush=True)
    tree = meta[tree_arm]
    configs = {}
    if args.drafter == "ngram":
        configs["chain (ratio gate)"] = (meta["ngram chain"], "ngram chain")
    configs["ddtree16 (ratio gate)"] = (tree, tree_arm)
    configs["ddtree4 (ratio gate)"] = ({**tree, "tree_budget": 4}, tree_arm)
    # the cost gate as bench/policy.py times it: DDTree16, every round drafted, the best-value prefix of the tree by
    # the drafter's own probabilities under the same curve the policies decide by
    configs[COST_GATE] = (with_gate(tree, {"gate": "cost", "verify_cost": curve}), tree_arm)
    for label, policy in policies.items():
        for weight in WEIGHTS:
            for calibrated in (True, False) if args.drafter == "ngram" else (True,):
                params = {**policy, "confidence_weight": weight,
                          **({} if calibrated else {"calibration_prior": None})}
                name = ("law policy" + (f" {label}" if len(policies) > 1 else "") + f", weight {weight:g}"
                        + ("" if calibrated else ", no calibration"))
                configs[name] = (policy_arm_meta(tree, params, measured=curve, arm=tree_arm)[0], tree_arm)
    frames = []
    for workload in args.workloads:
        ar = data / workload / "ar"
        runs = load_traces(ar)
        for name, (arm_meta, priced_by) in configs.items():
            rounds = workload_rounds(ar, arm_meta, target)
            frames.append(rounds.assign(config=name, priced_by=priced_by, workload=workload))
        oracle = workload_oracle_rounds(ar, tree, target, verify_cost=VerifyCost.from_config(curve),
                                        draft_cost=float(next(iter(policies.values()))["draft_cost"]),
                                        budgets=ORACLE_BUDGETS)
        frames.append(oracle.assign(config=ORACLE, priced_by=tree_arm, workload=workload))
        print(f"replayed over {ar} ({runs.requests['request_id'].nunique()} prompts)", flush=True)
    table = pd.concat(frames, ignore_index=True)
    # pooled over the recordings: each (config, category) priced once by its arm's cost model
    ar_runs = [load_traces(data / w / "ar") for w in args.workloads]  # one workload: request ids made unique
    entropies = pd.concat([t.tokens.assign(request_id=w + ":" + t.tokens["request_id"].astype(str))
                           for w, t in zip(args.workloads, ar_runs)], ignore_index=True)
    workload = _Workload(entropies, pd.concat([t.runs for t in ar_runs], ignore_index=True).drop_duplicates("run_id"))
    rows = []
    for name, part in table.groupby("config", sort=False):
        work = part.assign(request_id=part["workload"] + ":" + part["request_id"].astype(str))
        summary = source.predict(part["priced_by"].iloc[0], workload, rounds=work, transfer_error=0.0).summary
        rows.append({"config": name, **summary["predicted_speedup"].round(3).to_dict(),
                     "tokens_per_round": round(float(summary.loc["all", "predicted_tokens_per_round"]), 3),
                     "nodes_per_verify": round(float(part["nodes"].sum() / max(part["drafting_rounds"].sum(), 1)), 2)})
    out = pd.DataFrame(rows).set_index("config")
    with pd.option_context("display.width", 220, "display.max_columns", 20):
        print("\nmodelled speedup over AR (replayed rounds priced by data/traces_timed's cost models; not timed), "
              f"{len(set(table['workload'] + table['request_id'].astype(str)))} prompt runs")
        print(out.to_string())
    fixed = out.loc[[c for c in out.index if "ratio gate" in c], "all"]
    best_fixed = float(fixed.max())
    laws = out.loc[[c for c in out.index if c.startswith("law policy")], "all"]
    ceiling = float(out.loc[ORACLE, "all"])
    gate = float(out.loc[COST_GATE, "all"])
    result = {"bench": "policy_replay", "drafter": args.drafter, "from": args.arm_traces,
              "workloads": list(args.workloads),
              "cpu_s": round(time.process_time() - t0, 1), "curve": args.curve, "verify_cost_curve": curve,
              "measured_curve": measured.to_config(),
              "overall": {c: float(v) for c, v in out["all"].items()}, "best_fixed": fixed.idxmax(),
              "best_law_policy": laws.idxmax(),
              "best_law_policy_over_best_fixed": float(laws.max() / best_fixed - 1),
              "oracle": ceiling, "best_law_policy_below_oracle": float(1 - laws.max() / ceiling),
              "best_fixed_below_oracle": float(1 - best_fixed / ceiling),
              "cost_gate": gate, "best_law_policy_over_cost_gate": float(laws.max() / gate - 1)}
    alone = ", ".join(f"{out.loc[c, 'all']:.3f}x" for c in out.index
                      if c.startswith("law policy") and c.endswith("weight 0"))
    print(f"\nbest fixed: {fixed.idxmax()} {best_fixed:.3f}x; best law policy: {laws.idxmax()} {laws.max():.3f}x "
          f"({laws.max() / best_fixed - 1:+.1%}); the law alone (weight 0): "
          f"{alone}; the replay oracle (a ceiling: it knows each round's outcome) {ceiling:.3f}x: the best law policy {1 - laws.max() / ceiling:.1%} below it, the best fixed arm "
          f"{1 - best_fixed / ceiling:.1%}; the cost gate (DDTree16) {gate:.3f}x: the best law policy "
          f"{laws.max() / gate - 1:+.1%} against it")
    print(json.dumps(result, default=lambda v: float(v) if isinstance(v, np.floating) else str(v)))
    return result


CURVES = ("priced", "measured")


def _timed_tree_sizes(source, arm: str) -> str:
    """The draft nodes of the arm's timed drafting rounds: the range its cost model's verify line is fitted on."""
    view = source.arm_view(arm)
    nodes = view.rounds.loc[view.rounds["tree_nodes"] > 0, "tree_nodes"]
    share = (nodes <= 2).mean()
    return (f"{int(nodes.min())}-{int(nodes.max())} draft nodes (median {int(nodes.median())}; {share:.1%} of them "
            "<= 2 nodes)")


class _Workload:
    """The pooled AR runs as ``TraceAnalysis.predict`` reads a workload: ``tokens`` and ``runs``."""

    def __init__(self, tokens, runs):
        self.tokens, self.runs = tokens, runs


if __name__ == "__main__":
    main()

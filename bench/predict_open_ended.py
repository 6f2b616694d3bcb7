"""Will drafting pay on categories never seen? Predicted from an AR run alone, then measured on the same prompts.

Two steps (``--record`` first, once; then the check, as often as wanted):

- ``--record OUT``: decode ``--per-category`` seeded open-ended prompts per category (``data/open_ended``: writing,
  role-play, opinion, brainstorming, coding, explanations; none of them in the Spec-Bench traces the costs come from)
  with AR, the n-gram chain, n-gram DDTree16 and block DDTree16 through the one recording loop
  (``jobs.record.record_arms``: warm-up, arms interleaved per prompt in rotating order, CPU and wall clock), one run
  per arm under ``OUT``, per-call timings in ``OUT/timings.csv``. Set ``OMP_NUM_THREADS=1`` and record on an idle
  machine.
- the check (``TRACES``, default ``data/traces_open_timed``): for every drafting arm of ``--from`` (default
  ``data/traces_timed``: its costs measured on other prompts, another day), the rounds of the arm as it was measured in
  ``TRACES`` (its own run.json: drafter checkpoint, tree, budget and gate; ``replay_meta`` checks that ``--from``'s arm
  can price it) replayed over the AR run of ``TRACES`` (``jobs.reference.workload_rounds``; loads the default target)
  and priced by ``--from``'s arm's cost model
  (``TraceAnalysis.predict(rounds=)``, as ``entropy-law predict --replay-rounds``), per category and overall; next
  to it the speedup the same arm measured on the same prompts in ``TRACES`` (paired with AR, decode time on the CPU
  clock, ``TraceAnalysis.speedup``; overall: the same estimator and interval over all its requests), and its
  tokens per round. A verdict is judged right or wrong only where the measured interval excludes 1. An arm of
  ``TRACES`` that ``--from`` lacks but that is a DDTree of the same drafter at another budget (``--arms
  ar,ngram-ddtree4,ngram-ddtree8``) is replayed at its budget and priced by ``--from``'s DDTree arm, widened by
  ``TraceAnalysis.variant_error``: the check of ``entropy-law predict --budgets``. An arm of ``TRACES`` recorded with
  a law policy (``--record ... --policy ngram=FITTED.json``: its parameters in its run.json) is replayed with those
  parameters over the AR run, with the verify-cost curve measured here (as the online run measured its own), and
  priced by the cost model of ``--from``'s arm of the same drafter, tree and budget
  (``law.policy.policy_arm_meta``), as ``entropy-law predict --policy`` prices it: the check of a policy priced before
  it ever ran (its skipped rounds without the drafter's time).

Prints a table and ends with ONE JSON line.

    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --record data/traces_open_timed --per-category 3 --seed 7
    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --record data/traces_probe --tasks data/probe/probe.jsonl
    OMP_NUM_THREADS=1 python bench/predict_open_ended.py data/traces_probe --law-from data/traces --law-tasks spec_bench
    OMP_NUM_THREADS=1 python bench/predict_open_ended.py | tee bench/results/predict_open_ended.txt
    python bench/predict_open_ended.py --fit-policy ngram --out /tmp/ngram-policy.json   # from data/traces
    python bench/predict_open_ended.py --fit-policy block --context-match --out /tmp/block-context.json
    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --record data/traces_open_policy --per-category 3 \
        --seed 13 --arms ar,ngram-ddtree16,block-ddtree16 --policy ngram=/tmp/ngram-policy.json \
        --policy block=/tmp/block-policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECORD_ARMS = ("ar", "ngram", "ngram-ddtree16", "block-ddtree16")


def fit_reference_policy(drafter: str, out: Path, arm_traces: Path, context_match: bool = False) -> None:
    """Law policy parameters for ``drafter`` ("ngram" or "block") from its runs in ``data/traces`` (Spec-Bench, none
    of the open-ended prompts), its draft cost (one-token forwards per round) from ``arm_traces``' timed DDTree16 arm
    of the drafter: ``entropy_law.law.policy.fit_policy`` with its defaults; ``context_match``: with the copyability
    input (``jobs.reference.context_matches`` of each run, the prompts rebuilt from Spec-Bench)."""
    import warnings

    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.policy import fit_policy, save_policy
    from entropy_law.traces.reader import load_traces

    warnings.simplefilter("ignore")
    timed = TraceAnalysis(load_traces(arm_traces), n_boot=0)
    arm = next(a for a in timed.arms if a.startswith(drafter) and a.endswith("ddtree16"))
    cost = timed.cost_model(arm)
    draft_cost = cost.draft_ms / cost.ar_ms_per_token
    traces = load_traces(Path(__file__).resolve().parents[1] / "data" / "traces")
    runs = traces.runs
    ids = list(runs.loc[runs["drafter_id"].astype(str).str.startswith(drafter) & (runs["tree_policy"] == "ddtree"),
                        "run_id"])
    lengths = None
    if context_match:
        from entropy_law.decoding.loading import load_target
        from entropy_law.jobs.reference import context_matches

        lengths = context_matches(list(runs.loc[runs["run_id"].isin(ids), "path"]), load_target("smollm2-135m"),
                                  tasks="spec_bench")
    params = fit_policy(traces.filter(run_id=ids), draft_cost=draft_cost, context_match=lengths)
    params["notes"].append(f"draft_cost {draft_cost:.4f}: {arm}'s draft_ms / t_AR in {arm_traces} ({cost.clock} clock)")
    save_policy(params, out)
    print(f"{drafter} policy from {len(ids)} run(s) of data/traces ({params['fitted_on']['requests']} requests), "
          f"draft cost {draft_cost:.4f} forwards: {out}")


def record(out: Path, per_category: int, seed: int, max_new_tokens: int, arms=RECORD_ARMS,
           policies: dict | None = None, tasks_name: str = "open_ended", gate: str | None = None) -> None:
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.record import record_timed
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    tasks = sample_per_category(load_tasks(tasks_name), per_category, seed=seed)
    print(f"{per_category} per category, seed {seed}", flush=True)
    policy = None
    if policies:
        from entropy_law.law.policy import load_policy
        loaded = {drafter: load_policy(path) for drafter, path in policies.items()}

        def policy(spec):  # the drafter's law policy, None for AR
            return loaded.get(spec.drafter)
    record_timed(tasks, arms, out, load_target("smollm2-135m"), max_new_tokens=max_new_tokens,
                 log=lambda m: print(m, flush=True), metadata={"seed": seed, "tasks": tasks_name}, policy=policy,
                 gate=gate)


def law_check(arm_traces: Path, ar_path: Path, source, table, law_from: str, law_tasks: str | None, tasks: str | None,
              n_boot: int, seed: int, law_borrow: bool = False) -> dict:
    """The law's answer (``entropy-law predict --replay --law-from LAW_FROM``: the drafter's proposals replayed, the
    acceptance from a law fitted on ``law_from``) against the measured speedups of ``table``: with the law in the
    drafter's confidence alone (``REPLAYED_FAMILY``) and with the one the command now picks (``replayed_family``: +
    the context's copyability and the target's top-1 probability), each without and with the law's residual b on
    ``law_from``'s categories (``law.transfer.calibrated_transfer``; the command applies it)."""
    from types import SimpleNamespace

    import pandas as pd

    from entropy_law.commands.predict import replayed_laws
    from entropy_law.law.workload import REPLAYED_FAMILY, verdict_right
    from entropy_law.traces.reader import load_traces

    args = SimpleNamespace(workload=str(ar_path), arm_traces=str(arm_traces), law_from=law_from, law_tasks=law_tasks,
                           tasks=tasks, model=None, checkpoint=None, transfer_error=None, n_boot=n_boot, seed=seed,
                           law_borrow=law_borrow)
    arms = [a for a in source.arms if a in set(table["arm"])]
    rows, families = [], {}
    for forced in (REPLAYED_FAMILY, None):
        laws, workload = replayed_laws(args, source, arms, load_traces(ar_path), family=forced)
        for arm, (law, error, proposals, notes, calibration) in laws.items():
            families[forced or "picked"] = law.family.name
            for calibrated in (False, True):  # without and with the law's residual b (predict --replay: with)
                bias = calibration["bias"] if calibrated else 0.0
                band = error if calibrated else calibration["uncalibrated_error"]
                pred = source.predict(arm, workload, law=law, transfer_error=band, proposals=proposals,
                                      bias=bias).summary
                name = law.family.name + (" + b" if calibrated else "")
                for category, p in pred.iterrows():
                    m = table.loc[(table["arm"] == arm) & (table["category"] == category)]
                    if m.empty:
                        continue
                    m = m.iloc[0]
                    rows.append(dict(law=name, arm=arm, category=category, b=bias,
                                     predicted=float(p["predicted_speedup"]), low=float(p["low"]),
                                     high=float(p["high"]), verdict=p["verdict"], measured=float(m["measured"]),
                                     measured_lo=float(m["measured_lo"]), measured_hi=float(m["measured_hi"]),
                                     transfer_error=band,
                                     predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                                     measured_tokens_per_round=float(m["measured_tokens_per_round"])))
    law_table = pd.DataFrame(rows)
    law_table["relative_error"] = law_table["predicted"] / law_table["measured"] - 1
    law_table["tokens_per_round_error"] = (law_table["predicted_tokens_per_round"]
                                           / law_table["measured_tokens_per_round"] - 1)
    law_table["measured_inside_predicted"] = (law_table["measured"] >= law_table["low"]) & (
        law_table["measured"] <= law_table["high"])
    law_table["right"] = [verdict_right(v, lo, hi) for v, lo, hi in
                          zip(law_table["verdict"], law_table["measured_lo"], law_table["measured_hi"])]
    print(f"\nthe law's answer (entropy-law predict --replay --law-from {law_from}"
          + (f" --law-tasks {law_tasks}" if law_tasks else "") + "), against the same measured speedups:")
    with pd.option_context("display.width", 240, "display.max_columns", 30):
        print(law_table.drop(columns=["measured_lo", "measured_hi"]).round(3).to_string(index=False))
    out = {}
    for family, part in law_table.groupby("law", sort=False):
        cats = part.loc[part["category"] != "all"]
        out[family] = {"mean_abs_error": float(cats["relative_error"].abs().mean()),
                       "max_abs_error": float(cats["relative_error"].abs().max()),
                       "mean_signed_error": float(cats["relative_error"].mean()),
                       "tokens_per_round_mean_abs_error": float(cats["tokens_per_round_error"].abs().mean()),
                       "measured_inside_predicted": int(part["measured_inside_predicted"].sum()), "cells": len(part),
                       "right": int((part["right"] == True).sum()),  # noqa: E712
                       "wrong": int((part["right"] == False).sum())}  # noqa: E712
        o = out[family]
        print(f"{family}: per category speedup |error| mean {o['mean_abs_error']:.1%} (max {o['max_abs_error']:.1%}, "
              f"signed mean {o['mean_signed_error']:+.1%}), tokens per round |error| mean "
              f"{o['tokens_per_round_mean_abs_error']:.1%}; measured inside the widened interval in "
              f"{o['measured_inside_predicted']} of {o['cells']} cells (categories and overall); verdicts judged right "
              f"{o['right']}, wrong {o['wrong']}")
    return {"families": families, **out}


def replay_meta(mine: dict, source_meta: dict, measured, arm: str, arm_traces: Path, priced_by: str) -> dict:
    """The run.json whose rounds are replayed for the measured ``arm``: its own (``mine``: the drafter checkpoint,
    tree, budget and gate it was timed with), once it is checked that ``priced_by``'s cost model (``source_meta``:
    its run.json in ``arm_traces``) can price it: the same drafter configured alike but for its checkpoint (one
    checkpoint costs what another of the same shape does, the verify cost depends on the nodes verified; another
    shape costs otherwise), one checkpoint in the measured arm's runs, and a gate the replay can play (a cost gate
    with its stored curve: ``jobs.reference.arm_round_options``). Says where the checkpoint or the gate differ from
    ``priced_by``'s. Replaying ``priced_by``'s run.json instead would price rounds that were never timed."""
    from entropy_law.jobs.reference import arm_round_options
    from entropy_law.law.arms import run_checkpoints

    if mine.get("drafter_id") != source_meta.get("drafter_id"):
        raise SystemExit(f"{arm} ran drafter {mine.get('drafter_id')!r}, {priced_by} of {arm_traces} "
                         f"{source_meta.get('drafter_id')!r}: that arm's cost model does not price it")
    theirs = run_checkpoints(measured.runs.loc[measured.runs["arm"] == arm])
    if len(theirs) > 1:
        raise SystemExit(f"{arm} ran several drafter checkpoints ({theirs}): replay one run at a time")
    config, base = mine.get("drafter_config") or {}, source_meta.get("drafter_config") or {}
    differ = sorted(k for k in set(config) | set(base)
                    if k not in ("checkpoint", "checkpoint_sha256") and config.get(k) != base.get(k))
    if differ:
        raise SystemExit(f"{arm}: its drafter is configured otherwise than {priced_by} of {arm_traces} ({differ}), "
                         "not only another checkpoint: that arm's cost model does not price it; time it with AR")
    try:
        arm_round_options(mine)
    except ValueError as e:
        raise SystemExit(f"{arm}: {e}") from None
    if config.get("checkpoint_sha256") != base.get("checkpoint_sha256"):
        print(f"  {arm}: measured with the drafter checkpoint sha256:{str(config.get('checkpoint_sha256'))[:8]}, "
              f"{priced_by} of {arm_traces} ran sha256:{str(base.get('checkpoint_sha256'))[:8]}: the measured "
              f"checkpoint's rounds are replayed, priced by {priced_by}'s cost model (the same drafter shape)")

    def gate(meta):  # what the replay decides by, as arm_round_options reads it from the run.json
        options = arm_round_options(meta)[0]
        return ("the cost gate" if "verify_cost" in options
                else f"the ratio gate at {options['min_expected_accepted']} expected accepted drafts")

    if not mine.get("policy") and gate(mine) != gate(source_meta):
        print(f"  {arm}: ran {gate(mine)}, {priced_by} {gate(source_meta)}: replayed with its own")
    return mine


def check(path: Path, arm_traces: Path, n_boot: int, seed: int, law_from: str | None = None,
          law_tasks: str | None = None, tasks: str | None = None, law_borrow: bool = False) -> dict:
    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.law.analysis import SPEEDUP_BOOT, TraceAnalysis
    from entropy_law.law.cost import paired_speedup, paired_speedup_interval
    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import measure_verify_cost
    from entropy_law.law.policy import policy_arm_meta
    from entropy_law.law.workload import verdict_right
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.reader import load_traces

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # SmallSampleWarning: 3 prompts per category; the table says it
    t0 = time.process_time()
    traces = load_traces(path)
    measured = TraceAnalysis(traces, n_boot=n_boot, seed=seed)
    source = TraceAnalysis(load_traces(arm_traces), n_boot=n_boot, seed=seed)
    ar_runs = measured.runs.loc[measured.runs["is_ar"], "path"]
    if len(ar_runs) != 1:
        raise SystemExit(f"{path} needs exactly one AR run (the workload the prediction reads)")
    ar_path = Path(ar_runs.iloc[0])
    workload = load_traces(ar_path)
    target = load_target("smollm2-135m")
    print(f"workload: the AR run {ar_path} ({workload.requests['request_id'].nunique()} prompts, categories "
          f"{sorted(set(workload.requests['category']))}); arms and costs from {arm_traces}")
    rows = []
    meta_of = {a: read_run_json(Path(source.runs.loc[source.runs["arm"] == a, "path"].iloc[0]) / RUN_FILE)
               for a in source.arms}
    plans = []  # (arm measured in TRACES, the source arm whose cost model prices it, its run.json for the replay)
    measured_curve = None  # this machine's verify-cost curve, for a law policy's replay
    for arm in measured.arms:
        mine = read_run_json(Path(measured.runs.loc[measured.runs["arm"] == arm, "path"].iloc[0]) / RUN_FILE)
        if mine.get("policy"):  # a law policy: priced by --from's arm of its drafter, tree and budget
            same = [a for a, m in meta_of.items() if not m.get("policy") and all(
                m.get(k) == mine.get(k) for k in ("drafter_id", "tree_policy", "tree_budget"))]
            if not same:
                print(f"  {arm}: no arm of its drafter, tree and budget in {arm_traces} to price its policy, skipped")
                continue
            replay_meta(mine, meta_of[same[0]], measured, arm, arm_traces, same[0])
            params = {k: v for k, v in mine["policy"].items() if k != "verify_cost"}  # what the user had before
            if measured_curve is None:  # once, as the online run measured its own when it started
                measured_curve = measure_verify_cost(TargetAdapter(target.model)).to_config()
            # its drafter, tree and budget with the policy as a user had it before the run (its parameters, the
            # curve measured now), not the run's own stored curve: the check is of a prediction made beforehand
            base = {k: v for k, v in mine.items() if k != "policy"}
            variant, whence = policy_arm_meta(base, params, measured=measured_curve,
                                              cost=source.cost_model(same[0]), arm=arm)
            print(f"  {arm}: its law policy replayed over the AR run in place of {same[0]}'s gate, priced by "
                  f"{same[0]}'s cost model; the policy's curve: {whence}")
            plans.append((arm, same[0], variant))
            continue
        if arm in source.arms:
            plans.append((arm, arm, replay_meta(mine, meta_of[arm], measured, arm, arm_traces, arm)))
            continue
        # another budget of a DDTree arm of --from (entropy-law predict --budgets): replayed at the budget it ran
        same = [a for a, m in meta_of.items() if m.get("drafter_id") == mine.get("drafter_id")
                and m.get("tree_policy") == "ddtree" == mine.get("tree_policy")]
        if same:
            plans.append((arm, same[0], replay_meta(mine, meta_of[same[0]], measured, arm, arm_traces, same[0])))
        else:
            print(f"  {arm}: no arm of its drafter and tree in {arm_traces} to price it, skipped")
    for arm in source.arms:
        if arm not in measured.arms:
            print(f"  {arm}: not decoded in {path}, skipped")
    for arm, priced_by, meta in plans:
        rounds = workload_rounds(ar_path, meta, target)
        error = None if priced_by == arm and not meta.get("policy") else source.variant_error(priced_by)[0]
        pred = source.predict(priced_by, workload, rounds=rounds, transfer_error=error).summary
        got = measured.speedup(arm).set_index("category")
        paired = measured.paired_requests(arm)  # all its requests: the per-category cells' estimator, pooled
        times = (paired["ar_ms"].to_numpy(float), paired["ar_decoded"].to_numpy(float), paired["ms"].to_numpy(float),
                 paired["decoded"].to_numpy(float))
        lo, hi = paired_speedup_interval(*times, rng=np.random.default_rng(seed), n_boot=SPEEDUP_BOOT)
        overall = dict(speedup=float(paired_speedup(*times)), lo=float(lo), hi=float(hi), requests=len(paired),
                       tokens_per_round=float(paired["decoded"].sum() / paired["rounds"].sum()))
        for category, p in pred.iterrows():
            if category == "all":
                m = overall
            elif category in got.index:
                m = got.loc[category]
            else:
                continue
            rows.append(dict(arm=arm, priced_by=priced_by, category=category, requests=int(m["requests"]),
                             predicted=float(p["predicted_speedup"]), low=float(p["low"]), high=float(p["high"]),
                             verdict=p["verdict"], measured=float(m["speedup"]), measured_lo=float(m["lo"]),
                             measured_hi=float(m["hi"]),
                             predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                             measured_tokens_per_round=float(m["tokens_per_round"])))
    table = pd.DataFrame(rows)
    table["relative_error"] = table["predicted"] / table["measured"] - 1
    table["predicted_inside_measured"] = (table["predicted"] >= table["measured_lo"]) & (
        table["predicted"] <= table["measured_hi"])
    table["measured_inside_predicted"] = (table["measured"] >= table["low"]) & (table["measured"] <= table["high"])
    table["right"] = [verdict_right(v, lo, hi)
                      for v, lo, hi in zip(table["verdict"], table["measured_lo"], table["measured_hi"])]
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    cats = table.loc[table["category"] != "all"]
    overall = table.loc[table["category"] == "all"]
    out = {"bench": "predict_open_ended", "traces": str(path), "from": str(arm_traces), "n_boot": n_boot, "seed": seed,
           "cpu_s": round(time.process_time() - t0, 1), "cells": len(cats),
           "mean_abs_error": float(cats["relative_error"].abs().mean()),
           "max_abs_error": float(cats["relative_error"].abs().max()),
           "predicted_inside_measured": int(cats["predicted_inside_measured"].sum()),
           "measured_inside_predicted": int(cats["measured_inside_predicted"].sum()),
           "tokens_per_round_max_abs_error": float((cats["predicted_tokens_per_round"]
                                                    / cats["measured_tokens_per_round"] - 1).abs().max()),
           "overall": {r["arm"]: {k: r[k] for k in ("predicted", "low", "high", "verdict", "measured", "measured_lo",
                                                     "measured_hi", "right")} for r in overall.to_dict("records")},
           "right": int((table["right"] == True).sum()), "wrong": int((table["right"] == False).sum())}  # noqa: E712
    print(f"\nper category: speedup |error| mean {out['mean_abs_error']:.1%} (max {out['max_abs_error']:.1%}); "
          f"predicted inside the measured interval in {out['predicted_inside_measured']} of {len(cats)}, measured "
          f"inside the predicted one in {out['measured_inside_predicted']} of {len(cats)}; tokens per round off by at "
          "most "
          f"{out['tokens_per_round_max_abs_error']:.1%}; verdicts judged right {out['right']}, wrong {out['wrong']} "
          "(per category and overall, where the measured interval excludes 1)")
    if law_from:
        out["law"] = law_check(arm_traces, ar_path, source, table, law_from, law_tasks, tasks, n_boot, seed,
                               law_borrow)
    print(json.dumps(out, default=lambda v: None if v is None else bool(v) if isinstance(v, np.bool_) else float(v)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="?", default="data/traces_open_timed", help="the timed open-ended recording")
    p.add_argument("--from", dest="arm_traces", default="data/traces_timed",
                   help="the arms whose costs price the prediction (timed with AR on this machine)")
    p.add_argument("--record", metavar="OUT", default=None, help="record the open-ended set into OUT first")
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--tasks", default="open_ended",
                   help="--record: the prompts, 'open_ended' (default) or a JSONL file of other categories (e.g. "
                        "data/probe/probe.jsonl)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--n-boot", type=int, default=100)
    p.add_argument("--arms", default=",".join(RECORD_ARMS),
                   help="--record: the arms to record (default %(default)s); an n-gram DDTree arm at another budget "
                        "(ngram-ddtree4, ngram-ddtree8) is then priced by --from's DDTree arm of that drafter, as "
                        "entropy-law predict --budgets prices it")
    p.add_argument("--policy", action="append", default=[], metavar="DRAFTER=FITTED.json",
                   help="--record: run the drafter's arms (ngram, block) with this law policy in place of the gate")
    p.add_argument("--law-from", default=None, metavar="TRACES",
                   help="the check: also the law's answer (entropy-law predict --replay --law-from TRACES), with "
                        "the law in the drafter's confidence alone and with the one the command picks (+ the "
                        "copyability), each without and with the law's residual b")
    p.add_argument("--law-tasks", default=None, help="with --law-from: the prompts its runs decoded (spec_bench for "
                                                      "data/traces, whose run.json names none)")
    p.add_argument("--law-borrow", action="store_true",
                   help="with --law-from: apply its law to arms of another drafter checkpoint (entropy-law predict "
                        "--law-borrow; the open-ended sets' block arms ran the sixth checkpoint, data/traces' the "
                        "default since 2026-12-05)")
    p.add_argument("--gate", choices=("ratio", "cost"), default=None,
                   help="--record: the drafting arms' gate (cost: this machine's verify-cost curve, measured at the "
                        "start); default ratio, cost with a --policy (which needs the curve)")
    p.add_argument("--fit-policy", choices=("ngram", "block"), default=None,
                   help="write the drafter's law policy, fitted on data/traces, to --out and stop")
    p.add_argument("--out", default=None, help="--fit-policy: the parameters' file")
    p.add_argument("--context-match", action="store_true",
                   help="--fit-policy: with the copyability input (the law per level of the context's suffix match)")
    args = p.parse_args(argv)
    if args.fit_policy:
        if not args.out:
            raise SystemExit("--fit-policy needs --out FITTED.json")
        fit_reference_policy(args.fit_policy, Path(args.out), Path(args.arm_traces), args.context_match)
        return 0
    policies = {}
    for item in args.policy:
        drafter, _, path = item.partition("=")
        if drafter not in ("ngram", "block") or not path:
            raise SystemExit(f"--policy takes ngram=FITTED.json or block=FITTED.json, got {item!r}")
        policies[drafter] = path
    if args.record:
        record(Path(args.record), args.per_category, args.seed, args.max_new_tokens, tuple(args.arms.split(",")),
               policies, args.tasks, args.gate)
        return 0
    check(Path(args.traces), Path(args.arm_traces), args.n_boot, args.seed, args.law_from, args.law_tasks,
          None if args.tasks == "open_ended" else args.tasks, args.law_borrow)
    return 0


if __name__ == "__main__":
    sys.exit(main())

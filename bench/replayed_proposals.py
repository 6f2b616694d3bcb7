"""Replay each drafter's proposal at every output position of the reference traces (issue #18, leak-free depths).

A law predicts a held-out request's tokens per round by a DP over rounds that could start at any output position
(``law.transfer``). Which depth the drafter drafts there, and how confident it is, is a function of the context
alone for the n-gram drafter (prompt + greedy output) and for the block drafter (the target's teacher-forced
hidden states): ``decoding.replay.replay_proposals`` rebuilds it offline, without any round's outcome. This script
does so for every run of a trace set (prompts re-encoded with the default target's chat template and checked
against the recorded prompt length; the drafter configuration and tree of the run's ``run.json``) and, with
``--write``, stores them as ``<run>/proposals.parquet`` (``traces.proposals``), which ``bench/law_categories.py``
reads for its "replayed" depth mode.

The run's ratio gate is applied (``decoding.replay.run_gate_threshold``: a start where the run would have declined
to draft proposes nothing; ``verify_cost_ratio`` 1 in ``data/traces``, so nothing is declined there; the default 2
in ``data/traces_timed``); a cost gate or law policy is not reproduced (every proposal kept).

It reports, at the starts of the recorded rounds, how often the replayed depth equals the recorded drafted depth
and how close the replayed ``top1_prob`` is to the recorded ``draft_top1_prob``: the n-gram drafter is consulted at
every position here (its self-calibration then rests on more evidence than online), so they need not be equal.

    OMP_NUM_THREADS=1 python bench/replayed_proposals.py --write [--drafters ngram,block] \
        | tee bench/results/replayed_proposals.txt
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def agreement(run: Path, frame: pd.DataFrame) -> dict:
    """Replayed against recorded, at the recorded rounds' starts: depth equal, top-1 probability difference."""
    from entropy_law.traces.reader import load_traces

    traces = load_traces(run)
    columns = ["request_id", "round_index", "start_position", "tree_depth"]
    rounds = traces.rounds.loc[traces.rounds["round_index"] > 0, columns].astype({"request_id": str})
    firsts = frame.drop_duplicates(["request_id", "start_position"])[["request_id", "start_position", "proposal_depth"]]
    both = rounds.merge(firsts, on=["request_id", "start_position"], how="left")
    out = {"recorded_rounds": len(both), "replayed_at_start": float(both["proposal_depth"].notna().mean()),
           "depth_equal": float((both["tree_depth"] == both["proposal_depth"]).mean())}
    tokens = traces.tokens
    if "draft_top1_prob" in tokens:
        rec = tokens.loc[tokens["draft_top1_prob"].notna(), ["request_id", "round_index", "depth", "draft_top1_prob"]]
        rec = rec.astype({"request_id": str}).merge(rounds[["request_id", "round_index", "start_position"]],
                                                    on=["request_id", "round_index"])
        rec = rec.merge(frame[["request_id", "start_position", "depth", "top1_prob"]],
                        on=["request_id", "start_position", "depth"], how="inner")
        diff = rec["top1_prob"].astype(float) - rec["draft_top1_prob"].astype(float)
        out.update(top1_rows=len(rec), top1_mean_diff=float(diff.mean()), top1_mean_abs_diff=float(diff.abs().mean()),
                   top1_corr=float(np.corrcoef(rec["top1_prob"], rec["draft_top1_prob"])[0, 1]) if len(rec) > 2
                   else float("nan"))
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--write", action="store_true", help="write <run>/proposals.parquet for every run replayed")
    parser.add_argument("--drafters", default="ngram,block", help="ngram, block or ngram,block (block: a "
                        "teacher-forced target pass per request, shared by the block runs)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    clock = time.process_time()

    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.decoding.replay import replay_proposals, run_gate_threshold
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.jobs.arms import arm_spec, make_drafter
    from entropy_law.jobs.reference import recorded_prompts, replay_drafter
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.proposals import write_proposals
    from entropy_law.traces.reader import load_traces

    root = Path(args.traces)
    kinds = args.drafters.split(",")
    metas = {p.parent: json.loads(p.read_text()) for p in sorted(root.glob("*/run.json"))}
    runs = [r for r, m in metas.items() if m.get("drafter_id") not in (None, "none")
            and ((m["drafter_id"] == "ngram" and "ngram" in kinds) or (m["drafter_id"].startswith("block")
                                                                      and "block" in kinds))]
    if not runs:
        raise SystemExit(f"{root}: no run of {kinds}")
    target = load_target("smollm2-135m")
    plain = SpeculativeDecoder(target)
    eos, max_context = plain.config["eos_token_ids"], plain.adapter.max_context
    tasks = {t.request_id: t for t in load_tasks("spec_bench")}
    outputs, prompts = {}, {}
    for run in runs:
        prompts.update(recorded_prompts(run, lambda task: plain.encode_prompt(task.messages()), tasks))
        tokens = load_traces(run).tokens.sort_values(["request_id", "position"])
        for rid, part in tokens.groupby("request_id", observed=True, sort=False):
            outputs[(run, str(rid))] = part["token_id"].astype(int).tolist()

    frames = {run: [] for run in runs}
    block_runs = [r for r in runs if metas[r]["drafter_id"] != "ngram"]
    block_drafter = make_drafter(arm_spec(metas[block_runs[0]]["arm"]), target) if block_runs else None
    for run in block_runs:
        if metas[run]["drafter_id"] != block_drafter.drafter_id:
            raise SystemExit(f"{run}: recorded with {metas[run]['drafter_id']}, the shipped checkpoint is "
                             f"{block_drafter.drafter_id}")
    done = 0
    for rid in sorted(prompts):
        cache = {}  # one teacher-forced pass per (prompt, output), shared by the block runs
        for run in runs:
            if (run, rid) not in outputs:
                continue
            meta, output = metas[run], outputs[(run, rid)]
            if meta["drafter_id"] == "ngram":
                drafter = NgramDrafter(**meta["drafter_config"])
            else:
                key = tuple(output)
                if key not in cache:
                    cache[key] = replay_drafter(block_drafter, target, prompts[rid], output)
                drafter = cache[key]
            threshold = run_gate_threshold(meta)  # the run's ratio gate (None: cost gate / policy, not replayed)
            frame = replay_proposals(prompts[rid], output, drafter, meta["tree_policy"], meta.get("tree_budget"),
                                     eos_token_ids=eos, max_new_tokens=meta["max_new_tokens"], max_context=max_context,
                                     min_expected_accepted=threshold if threshold is not None else 0.0)
            frames[run].append(frame.assign(run_id=meta["run_id"], request_id=rid))
        done += 1
        if done % 50 == 0:
            print(f"  {done} / {len(prompts)} prompts, CPU {time.process_time() - clock:.0f} s", flush=True)

    report = {}
    for run in runs:
        frame = pd.concat(frames[run], ignore_index=True)
        agree = agreement(run, frame)
        report[run.name] = {"rows": len(frame), "starts": int(frame.drop_duplicates(["request_id", "start_position"])
                                                               .shape[0]), **agree}
        print(f"{run.name}: {report[run.name]['starts']} start positions, {len(frame)} rows; at the "
              f"{agree['recorded_rounds']} recorded rounds' starts the replayed depth equals the recorded one in "
              f"{agree['depth_equal']:.1%}"
              + (f"; top1_prob replayed - recorded: mean {agree['top1_mean_diff']:+.4f}, mean |.| "
                 f"{agree['top1_mean_abs_diff']:.4f}, correlation {agree['top1_corr']:.3f} ({agree['top1_rows']} rows)"
                 if "top1_rows" in agree else ""), flush=True)
        if args.write:
            threshold = run_gate_threshold(metas[run])
            how = {"by": "bench/replayed_proposals.py", "gate_threshold": threshold,
                   "how": "decoding.replay.replay_proposals on the recorded greedy outputs, with the run's ratio gate" + ("" if metas[run]["drafter_id"] == "ngram" else
                                       " through PrecomputedBlockDrafter on a teacher-forced target pass"),
                   "drafter_id": metas[run]["drafter_id"], "tree_policy": metas[run]["tree_policy"],
                   "tree_budget": metas[run].get("tree_budget"), **agree,
                   "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
            print(f"  wrote {write_proposals(run, frame, how)}", flush=True)
    print(f"CPU time {time.process_time() - clock:.0f} s, OMP_NUM_THREADS=1")
    print(json.dumps({"bench": "replayed_proposals", "traces": str(root), "runs": report}))
    return report


if __name__ == "__main__":
    main()

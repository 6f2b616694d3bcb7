"""Does the drafter's confidence in its own proposal explain the category gap? (issue #18, n-gram arms)

The n-gram drafter is context-only, so its proposals are a function of the prompt, the greedy output and the round
boundaries; ``decoding.replay.replay_rounds`` rebuilds every round of a recorded n-gram run without the target. This
script replays each n-gram arm of a trace set (prompts re-encoded with the default target's chat template, the
drafter configuration and gate of the run's ``run.json``) and checks that every replayed round equals the recorded
one (start, nodes, depth, accepted, committed). Only then does it take, per committed token at depth d <= the
verified depth, ``draft_top1_prob``: the drafter's probability of its own most probable candidate at depth d (the
trace column the decoder now logs, ``traces.stats.draft_stats``), known before verification. With ``--write`` it
adds that column to the run's shards (each tokens.parquet rewritten through a temporary file and renamed; the
recorded columns are compared before the rename; run.json says what was backfilled and how).

Then per arm, on the at-risk trials (CV log-loss per trial, random request folds and leave-one-category-out):
``law_exp`` and the primary law ``law_exp_obs_ceil``, each with and without ``log(1 - draft_top1_prob + 1e-3)``
(``law_exp_drafttop``, ``law_exp_obs_ceil_drafttop``), and the share of the CV gain over depth only that category
terms add (``compare.category_share_of_gain``; the goal is <= 5%). The families with the drafter's confidence need
it at every trial, so they score trials but cannot run the DP over whole outputs (no tokens-per-round LOCO).

    OMP_NUM_THREADS=1 python bench/draft_confidence.py [--traces data/traces] [--write] \
        | tee bench/results/draft_confidence.txt
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
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FAMILIES = ("law_exp", "law_exp_drafttop", "law_exp_obs_ceil", "law_exp_obs_ceil_drafttop")


def replay_top1(run: Path, plain, target, tasks) -> tuple[pd.DataFrame, int, int]:
    """(rows run_id, request_id, round_index, depth, draft_top1_prob; requests replayed; rounds checked) of one
    n-gram or block-drafter run. Raises if any replayed round differs from the recorded one, or (block drafter) if
    the replayed drafter entropy differs from the recorded ``draft_entropy_nats``."""
    from entropy_law.decoding.replay import replay_rounds
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.jobs.arms import arm_spec, make_drafter
    from entropy_law.jobs.reference import recorded_prompts, replay_drafter
    from entropy_law.traces.reader import load_traces
    from entropy_law.traces.stats import draft_stats

    meta = json.loads((run / "run.json").read_text())
    traces = load_traces(run)
    tokens = traces.tokens.sort_values(["request_id", "position"])
    rounds = traces.rounds.sort_values(["request_id", "round_index"])
    prompts = recorded_prompts(run, lambda task: plain.encode_prompt(task.messages()), tasks)
    eos, max_context = plain.config["eos_token_ids"], plain.adapter.max_context
    fields = ["round_index", "start_position", "tree_nodes", "tree_depth", "accepted", "committed"]
    block = meta["drafter_id"] != "ngram"
    block_drafter = make_drafter(arm_spec(meta["arm"]), target) if block else None
    if block and block_drafter.drafter_id != meta["drafter_id"]:
        raise ValueError(f"{run}: recorded with {meta['drafter_id']}, the shipped checkpoint is "
                         f"{block_drafter.drafter_id}")
    rows, checked = [], 0
    for rid, part in tokens.groupby("request_id", observed=True, sort=False):
        rid = str(rid)
        prompt, output = prompts[rid], part["token_id"].astype(int).tolist()
        drafter = replay_drafter(block_drafter if block else NgramDrafter(**meta["drafter_config"]), target, prompt,
                                 output)
        result = replay_rounds(prompt, output, drafter,
                               meta["tree_policy"], meta.get("tree_budget"), eos_token_ids=eos,
                               max_new_tokens=meta["max_new_tokens"], max_context=max_context,
                               verify_cost_ratio=meta.get("verify_cost_ratio", 1.0))
        mine = [tuple(int(getattr(r, f)) for f in fields) for r in result.rounds]
        theirs = [tuple(int(v) for v in row) for row in rounds.loc[rounds["request_id"] == rid, fields].itertuples(
            index=False, name=None)]
        if mine != theirs:
            first = next(i for i, (a, b) in enumerate(zip(mine + [None], theirs + [None])) if a != b)
            raise ValueError(f"{run}: request {rid}: replayed round {first} differs from the recorded one "
                             f"({mine[first] if first < len(mine) else None} vs "
                             f"{theirs[first] if first < len(theirs) else None}; fields {fields})")
        checked += len(mine)
        for record, proposal in zip(result.rounds, result.proposals):
            if proposal is None or proposal.depth == 0:
                continue
            depth = min(proposal.depth, record.committed)  # what the recorder scores (decoding.observers)
            committed = list(record.committed_ids)
            if proposal.logits is not None:
                stats = draft_stats(proposal.logits[:depth].float().numpy(), committed)
            else:
                stats = draft_stats(committed_ids=committed, candidates=proposal.tokens[:depth],
                                    candidate_logprobs=proposal.logprobs[:depth])
            rows += [(rid, record.round_index, d + 1, float(stats["top1_prob"][d]), float(stats["entropy_nats"][d]))
                     for d in range(depth)]
    keys = ["request_id", "round_index", "depth"]
    frame = pd.DataFrame(rows, columns=[*keys, "draft_top1_prob", "replayed_entropy"])
    worst_entropy = 0.0
    if block:  # the replayed drafter's entropies against the recorded ones, on the same rows
        recorded = tokens[[*keys, "draft_entropy_nats"]].astype({"request_id": str})
        both = frame.merge(recorded, on=keys, how="left", validate="one_to_one")
        worst_entropy = float((both["replayed_entropy"] - both["draft_entropy_nats"].astype(float)).abs().max())
    if not worst_entropy <= 1e-3:  # NaN (a recorded entropy missing) fails too
        raise ValueError(f"{run}: the replayed drafter entropy differs from the recorded one by up to "
                         f"{worst_entropy:.2e} nats: not the drafter that recorded the run")
    if block:
        print(f"  {run.name}: replayed drafter entropy within {worst_entropy:.1e} nats of the recorded", flush=True)
    return frame.drop(columns="replayed_entropy").assign(run_id=meta["run_id"]), tokens["request_id"].nunique(), checked


def write_column(run: Path, top1: pd.DataFrame, checked: int, drafter: str) -> int:
    """Add ``draft_top1_prob`` to every tokens.parquet of ``run`` (rows without a value: null); returns rows filled."""
    from entropy_law.traces.layout import write_json_atomic, write_parquet_atomic
    from entropy_law.traces.schema import TOKENS_SCHEMA

    look = top1.set_index(["request_id", "round_index", "depth"])["draft_top1_prob"]
    filled = 0
    for path in sorted((run / "shards").glob("*/tokens.parquet")):
        table = pq.read_table(path)
        frame = table.select(["request_id", "round_index", "depth"]).to_pandas()
        keys = pd.MultiIndex.from_arrays([frame["request_id"].astype(str), frame["round_index"].astype(int),
                                          frame["depth"].astype(int)])
        values = look.reindex(keys).to_numpy(dtype=float)
        column = pa.array(values.astype(np.float32), mask=np.isnan(values), type=pa.float32())
        if "draft_top1_prob" in table.column_names:
            table = table.drop(["draft_top1_prob"])
        new = table.append_column(TOKENS_SCHEMA.field("draft_top1_prob"), column).select(TOKENS_SCHEMA.names)
        new = new.cast(TOKENS_SCHEMA)
        strings = [f.name for f in TOKENS_SCHEMA if pa.types.is_string(f.type)]
        recorded = [name for name in TOKENS_SCHEMA.names if name != "draft_top1_prob"]

        def unchanged(tmp, table=table, path=path):  # the recorded columns read back equal: else nothing replaced
            back = pq.read_table(tmp).select(recorded)
            if not back.equals(table.select(recorded).cast(back.schema)):
                raise RuntimeError(f"{path}: the rewritten recorded columns differ; nothing replaced")

        # as the recorder writes shards: zstd, dictionary strings
        write_parquet_atomic(path, new, check=unchanged, compression="zstd", use_dictionary=strings)
        filled += int((~np.isnan(values)).sum())
    meta_path = run / "run.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("backfilled", []).append({
        "column": "tokens.draft_top1_prob", "how": f"offline replay of {drafter} (decoding.replay.replay_rounds"
        f"{'' if drafter == 'ngram' else ' through PrecomputedBlockDrafter on a teacher-forced target pass'}) on the "
        "recorded greedy outputs; every replayed round equalled the recorded one"
        + ("" if drafter == "ngram" else ", and every drafter entropy the recorded draft_entropy_nats within 1e-3"),
        "rounds_checked": checked, "rows_filled": filled, "by": "bench/draft_confidence.py",
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    write_json_atomic(meta_path, meta)
    return filled


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--write", action="store_true", help="add draft_top1_prob to the replayed runs' shards")
    parser.add_argument("--no-fit", action="store_true", help="replay (and write) only")
    parser.add_argument("--no-replay", action="store_true",
                        help="fit only, on runs whose shards already hold draft_top1_prob (written by --write)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drafters", default="ngram", help="ngram, block or ngram,block (block: a teacher-forced "
                        "target pass per request, about 2 s each)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # few-request warnings etc.: the fits here only score
    pd.set_option("display.width", 200)
    clock = time.process_time()

    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.law import atrisk
    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.compare import category_share_of_gain, compare_laws
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.reader import load_traces

    root = Path(args.traces)
    kinds = args.drafters.split(",")
    runs = [p.parent for p in sorted(root.glob("*/run.json"))
            if (json.loads(p.read_text()).get("drafter_id") == "ngram" and "ngram" in kinds)
            or (json.loads(p.read_text()).get("drafter_id", "").startswith("block") and "block" in kinds)]
    if not runs:
        raise SystemExit(f"{root}: no run of {kinds}")
    top1 = []
    if not args.no_replay:
        target = load_target("smollm2-135m")
        plain = SpeculativeDecoder(target)
        tasks = {t.request_id: t for t in load_tasks("spec_bench")}
        for run in runs:
            frame, n_req, checked = replay_top1(run, plain, target, tasks)
            top1.append(frame)
            print(f"{run.name}: replayed {n_req} requests, {checked} rounds, every one equal to the recorded; "
                  f"{len(frame)} drafted token rows", flush=True)
            if args.write:
                drafter = json.loads((run / "run.json").read_text())["drafter_id"]
                print(f"  wrote draft_top1_prob into {write_column(run, frame, checked, drafter)} rows of {run}")
    if args.no_fit:
        return {}
    run_ids = {json.loads((run / "run.json").read_text())["run_id"] for run in runs}
    replayed = (pd.concat(top1, ignore_index=True) if top1 else
                pd.DataFrame(columns=["run_id", "request_id", "round_index", "depth", "draft_top1_prob"]))
    an = TraceAnalysis(load_traces(root))
    out = {}
    for arm in an.arms:
        view = an.arm_view(arm)
        rows = atrisk.at_risk_table(view, drafters=[arm])
        if not set(rows["run_id"].astype(str)) <= run_ids:
            continue  # not an arm of the drafters asked for
        if args.no_replay and ("draft_top1_prob" not in rows or rows["draft_top1_prob"].isna().any()):
            print(f"\n{arm}: skipped, its shards do not hold draft_top1_prob at every trial (backfill with --write)")
            continue
        if "draft_top1_prob" not in rows or rows["draft_top1_prob"].isna().any():  # not written: merge the replay
            keys = ["run_id", "request_id", "round_index", "depth"]
            merged = rows[keys].astype({"run_id": str, "request_id": str}).merge(
                replayed, on=keys, how="left", validate="many_to_one")
            rows["draft_top1_prob"] = merged["draft_top1_prob"].to_numpy(float)
            atrisk.add_log_covariates(rows)
        if rows["draft_top1_prob"].isna().any():
            raise ValueError(f"{arm}: {int(rows['draft_top1_prob'].isna().sum())} at-risk trials without a replayed "
                             "draft_top1_prob")
        result = {}
        for folds in ("requests", "category"):
            comp = compare_laws(rows, ("depth_only", *FAMILIES), folds=folds, seed=args.seed)
            result[folds] = comp.summary["cv_log_loss"].to_dict()
        shares = {fam: category_share_of_gain(rows, fam, seed=args.seed) for fam in
                  ("law_exp_obs_ceil", "law_exp_obs_ceil_drafttop")}
        by_cat = rows.groupby("category", observed=True).agg(trials=("accepted", "size"),
                                                             acceptance=("accepted", "mean"),
                                                             mean_H=("target_entropy_nats", "mean"),
                                                             mean_top1=("draft_top1_prob", "mean"))
        print(f"\n== {arm}: {len(rows)} at-risk trials ==")
        print(by_cat.round(3).to_string())
        table = pd.DataFrame({"cv_log_loss (request folds)": result["requests"],
                              "cv_log_loss (leave one category out)": result["category"]})
        print(table.round(4).to_string())
        for fam, share in shares.items():
            print(f"category share of CV gain ({fam}): {share['cv_category_share']:.3f} (law over depth only "
                  f"{share['cv_gain_law_vs_depth_only']:.4f}, category terms {share['cv_gain_cat_vs_law']:.4f} "
                  "nats/trial; goal <= 0.05)")
        out[arm] = dict(trials=len(rows), cv_requests=result["requests"], cv_loco=result["category"],
                        category_share={f: s["cv_category_share"] for f, s in shares.items()})
    print(f"[CPU {time.process_time() - clock:.0f} s]")
    print(json.dumps({"bench": "draft_confidence", "traces": str(root), "arms": out}))
    return out


if __name__ == "__main__":
    main()

"""``entropy-law predict WORKLOAD --from TRACES``: will drafting pay on a workload no drafter has decoded yet?
The modes (default, ``--replay``, ``--replay-rounds``) are explained in ``docs/cli.md``."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "predict", help="will drafting pay on a workload? predicted from its entropies and an arm's law and costs",
        description="Price a workload's requests with each drafting arm's law and cost model (or replay its drafter or "
                    "rounds over them) and say per category whether drafting pays. Details: docs/cli.md.")
    p.add_argument("workload", help="trace runs of the workload (any arm: AR is enough), a run or a folder of runs")
    p.add_argument("--from", dest="arm_traces", required=True, metavar="TRACES",
                   help="trace runs of the drafting arm(s) and an AR run, timed together on this target and machine "
                        "(e.g. data/traces_timed)")
    p.add_argument("--drafter", action="append", metavar="ARM", help="only this arm (repeatable; default: all)")
    p.add_argument("--transfer-error", type=float, default=None, metavar="X",
                   help="the law's (with --replay-rounds: the cost model's) relative error on a new category, "
                        "e.g. 0.2 (default: measured; docs/cli.md)")
    p.add_argument("--replay", action="store_true",
                   help="replay each arm's drafter over the workload (one run) and price with the law in its confidence")
    p.add_argument("--law-from", metavar="TRACES", help="--replay: runs with proposals, for the law (default: --from)")
    p.add_argument("--replay-rounds", action="store_true", help="replay each arm's rounds, priced by its cost model")
    p.add_argument("--budgets", metavar="N,N,...",
                   help="--replay-rounds: also replay every DDTree arm at these budgets, priced by its cost model")
    p.add_argument("--policy", metavar="FITTED.json",
                   help="--replay-rounds: also replay the policy's drafter's arms with it in place of the gate")
    p.add_argument("--context-match", action="store_true",
                   help="depths by the copyability too: recorded, else rebuilt (--model, --tasks; docs/cli.md)")
    p.add_argument("--model", help="--replay / --replay-rounds / --context-match: the target (default: the workload's)")
    p.add_argument("--tasks", help="--replay / --replay-rounds / --context-match: the workload's prompts")
    p.add_argument("--law-tasks", help="--replay: the prompts of the --law-from runs where run.json names none")
    p.add_argument("--law-borrow", action="store_true",
                   help="--replay: use --law-from's law of a same-named arm that ran another checkpoint (noted)")
    p.add_argument("--checkpoint", help="--replay / --replay-rounds: the arm's checkpoint (default: by SHA-256)")
    p.add_argument("--n-boot", type=int, default=100, help="replicates for the intervals (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the intervals' bootstrap (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import replace

    # lazy: `entropy-law --help` imports every command module; the law layer loads only here
    from entropy_law.traces.reader import load_traces

    if args.n_boot < 0:
        raise ValueError(f"--n-boot must be >= 0, got {args.n_boot}")
    if args.transfer_error is not None and not args.transfer_error >= 0:
        raise ValueError(f"--transfer-error must be >= 0 (a relative error such as 0.2), got {args.transfer_error}")
    budgets = _replay_options(args)  # before anything loads: options that cannot go together fail fast
    workload, arm_traces = load_traces(args.workload), load_traces(args.arm_traces)
    if args.context_match:
        from entropy_law.commands.law import with_context_match

        workload = with_context_match(workload, args.model, args.tasks, what=f"the workload {args.workload}")
        arm_traces = with_context_match(arm_traces, args.model, what=f"--from {args.arm_traces}")
    analysis = _analysis(args, workload, arm_traces)
    arms = _arms(args, analysis)
    policy = _policy(args, analysis, arms) if args.policy else None
    replayed = {}
    if args.replay:
        replayed, workload = replayed_laws(args, analysis, arms, workload)
    replayed_rounds = _replayed_rounds(args, analysis, arms, budgets, policy) if args.replay_rounds else {}
    results = {}
    not_default = checkpoint_notes(analysis, analysis.arms)
    for arm in [*arms, *(name for name in replayed_rounds if name not in arms)]:
        if arm in replayed_rounds:
            rounds, notes, priced_by, error = replayed_rounds[arm]
            result = analysis.predict(priced_by, workload, rounds=rounds,
                                      transfer_error=args.transfer_error if error is None else error)
            label = arm if priced_by == arm else f"{arm} (never timed: priced by the cost model of {priced_by})"
            result = replace(result, drafter_id=label, notes=notes + result.notes)
        elif arm in replayed:
            law, transfer_error, proposals, notes, calibration = replayed[arm]
            result = analysis.predict(arm, workload, law=law, transfer_error=transfer_error, proposals=proposals,
                                      bias=calibration["bias"])
            result = replace(result, notes=notes + result.notes)
        else:
            result = analysis.predict(arm, workload, transfer_error=args.transfer_error)
        own = arm if arm in analysis.arms else priced_by  # a budget or policy variant: the arm that priced it
        result = replace(result, notes=result.notes + not_default.get(own, []))
        results[arm] = result
        print(result.title)
        print(result.answer())
        for note in result.notes:
            print(f"  note: {note}")
        print()
    if len(results) > 1:
        _print_choice(results)
    return 0


def _analysis(args, workload, arm_traces):
    """The analysis of the ``--from`` runs, in the law that can price the workload's own sequences (a workload
    without the target's top-1 probability is priced by the primary law of such traces, said)."""
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.fit import PRIMARY_FAMILY, fallback_note, primary_family

    family = primary_family(workload.tokens)
    analysis = TraceAnalysis(arm_traces, n_boot=args.n_boot, seed=args.seed,
                             **({} if family == PRIMARY_FAMILY else {"family": family}))
    if family != PRIMARY_FAMILY:
        print(fallback_note(family, f"the workload {args.workload}"))
    return analysis


def _arms(args, analysis) -> list:
    """The drafting arms asked for (default: every one of ``--from``), each checked to be there."""
    arms = args.drafter or analysis.arms
    if not arms:
        raise ValueError(f"{args.arm_traces} holds no drafting arm: --from needs trace runs of a drafter (and AR)")
    unknown = [a for a in arms if a not in analysis.arms]
    if unknown:
        raise ValueError(f"no drafting arm {', '.join(map(repr, unknown))} in {args.arm_traces}; arms: "
                         f"{', '.join(analysis.arms)}")
    return arms


def _replay_options(args) -> list:
    """``--budgets``, after refusing options that need a replay mode not asked for (or both modes)."""
    if args.law_tasks and not args.replay:
        raise ValueError("--law-tasks names the prompts of --replay's law traces: add --replay")
    if args.law_borrow and not args.replay:
        raise ValueError("--law-borrow borrows --replay's law from another checkpoint: add --replay")
    if args.law_from and not args.replay:
        raise ValueError("--law-from is for --replay (the law in the drafter's confidence); drop it, or add --replay")
    budgets = _budgets(args.budgets) if args.budgets else []
    if budgets and not args.replay_rounds:
        raise ValueError("--budgets replays DDTree arms at other budgets: it needs --replay-rounds")
    if args.policy and not args.replay_rounds:
        raise ValueError("--policy replays the arms' rounds under a law policy: it needs --replay-rounds")
    if args.replay and args.replay_rounds:
        raise ValueError("--replay prices replayed proposals with a law, --replay-rounds replayed rounds without one: "
                         "choose one")
    if args.replay or args.replay_rounds:
        _one_run(args.workload, "--replay" if args.replay else "--replay-rounds")
    return budgets


def _policy(args, analysis, arms) -> dict:
    """``--policy`` loaded (before the target loads: a bad file fails fast), for a drafter one of ``arms`` ran."""
    from entropy_law.payoff.policy import load_policy

    policy = load_policy(args.policy)
    drafters = sorted({str(d) for d in analysis.runs.loc[analysis.runs["arm"].isin(arms), "recorded_drafter_id"]})
    if policy.get("drafter_id") not in drafters:
        raise ValueError(f"--policy {args.policy}: the policy is for drafter {policy.get('drafter_id')!r}, and "
                         f"{args.arm_traces} has no timed arm of it among {', '.join(arms)} (drafters: "
                         f"{', '.join(drafters)}): its rounds need that drafter's cost model")
    return policy


def _print_choice(results: dict) -> None:
    """What to run per category: the paying arm with the highest predicted speedup, else AR."""
    from entropy_law.payoff.workload import choose_arms

    print("what to run, per category (the paying arm with the highest predicted speedup, else AR):")
    for r in choose_arms(results).to_dict("records"):
        band = f" [{r['low']:.2f}, {r['high']:.2f}]" if r["choice"] != "AR" else ""
        print(f"{r['category']:<16} {r['choice']:<36} {r['predicted_speedup']:.2f}x{band}: {r['why']}")


def checkpoint_notes(analysis, arms) -> dict[str, list[str]]:
    """Per arm of ``arms`` recorded with a block drafter checkpoint other than today's default
    (``jobs.arms.block_drafter_checkpoint``): ``[a note]`` naming both; other arms are absent."""
    recorded = {arm: shas for arm in arms if (shas := _checkpoints(analysis, arm))}
    if not recorded:
        return {}
    from entropy_law.jobs.arms import block_drafter_checkpoint, find_block_checkpoint
    from entropy_law.traces.layout import file_sha256

    default = block_drafter_checkpoint()
    if default is None or not default.is_file():
        return {}
    sha = file_sha256(default)
    others = {s: find_block_checkpoint(s) for shas in recorded.values() for s in shas if s != sha}
    return {arm: [f"{arm} was recorded with the checkpoint "
                  + ", ".join(others[s].name if others.get(s) else f"sha256:{s[:8]} (not found here)" for s in shas)
                  + f", not {default.name}, which `entropy-law record --drafter block` loads when no --checkpoint is "
                  "named: this answer is for the recorded one; for the default, time it beside AR on this machine "
                  "(bench/predict.py speed-validation --record) and pass those runs as --from"]
            for arm, shas in recorded.items() if shas != [sha]}


def _with_copyability(traces, target, tasks=None):
    """(``traces`` with ``context_match`` at every position, None) (``ensure_context_matches`` with the loaded
    ``target``), else (``traces``, why not)."""
    from entropy_law.jobs.reference import ensure_context_matches

    try:
        return ensure_context_matches(traces, tasks=tasks, target=target)[0], None
    except (OSError, ValueError) as err:
        return traces, str(err)


def replayed_laws(args, analysis, arms, workload, family: str | None = None) -> tuple[dict, object]:
    """``--replay``: per arm (its law, transfer error, replayed proposals, notes, ``{"bias": b,
    "uncalibrated_error": ...}``), and the workload with the context's copyability where it could be attached.
    ``args``: the command's options; ``family``: the law (default ``payoff.workload.replayed_family``)."""
    from entropy_law.jobs.reference import workload_proposals
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.fit import get_family
    from entropy_law.payoff.workload import REPLAYED_FAMILY, replayed_family
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.proposals import read_proposals
    from entropy_law.traces.reader import load_traces

    _one_run(args.workload, "--replay")
    law_from = args.law_from or args.arm_traces
    proposals = read_proposals(law_from)
    if proposals is None:
        raise ValueError(f"--replay needs the arms' replayed proposals in {law_from} (proposals.parquet beside run.json: "
                         f"bench/law.py proposals --traces {law_from} --write), or --law-from traces that have them")
    law_traces = load_traces(law_from)
    arms_of = TraceAnalysis(law_traces, family=REPLAYED_FAMILY, proposals=proposals, n_boot=0)  # checks, no fit
    missing = [a for a in arms if a not in arms_of.arms]
    if missing:
        raise ValueError(f"--law-from {law_from} has no arm {', '.join(map(repr, missing))}; arms: "
                         f"{', '.join(arms_of.arms)}")
    borrowed = {}
    for arm in arms:  # the law in the drafter's confidence must be of the target whose costs and workload it prices
        if arms_of.model_of(arm) != analysis.model_of(arm):
            raise ValueError(f"--law-from {law_from} holds arm {arm!r} decoded by {arms_of.model_of(arm)}, --from by "
                             f"{analysis.model_of(arm)}: a law of one target predicts nothing for another; give "
                             "--law-from runs of the same target")
        theirs, ours = _checkpoints(arms_of, arm), _checkpoints(analysis, arm)
        if theirs != ours:  # and of the drafter: one checkpoint's confidence is not another's
            what = (f"--law-from {law_from} ran arm {arm!r} with the drafter checkpoint {_shas(theirs)}, --from "
                    f"{args.arm_traces} with {_shas(ours)}")
            if not args.law_borrow:
                raise ValueError(f"{what}: the law in one checkpoint's confidence is not another's; give --law-from "
                                 "runs of the same checkpoint, or --law-borrow to apply it knowingly")
            borrowed[arm] = f"law borrowed (--law-borrow): {what}"
    target = _workload_target(args, "--replay")
    # the context's copyability, for the law that reads it: from the workload's and the law's runs and prompts
    workload, why_not = _with_copyability(workload, target, args.tasks)
    if why_not is None:
        law_traces, why_not = _with_copyability(law_traces, target, args.law_tasks)
    if family is None:
        family = REPLAYED_FAMILY if why_not else replayed_family(workload.tokens, law_traces.tokens)
    if why_not:
        copy_note = (f"law {family}: without the context's copyability ({why_not}); pass the prompts (--tasks for the "
                     "workload's, --law-tasks for --law-from's) for the law that reads it")
    elif "context_match" in get_family(family).position_columns:
        copy_note = (f"law {family}: the drafter's confidence, the target's top-1 probability where the traces hold it "
                     "and the context's copyability at every position (the longest suffix of prompt and output that "
                     "occurred earlier, rebuilt from the prompts where the runs did not record it)")
    else:
        copy_note = f"law {family}, as asked (the traces hold the context's copyability; it does not read it)"
    reference = TraceAnalysis(law_traces, family=family, proposals=proposals, n_boot=args.n_boot, seed=args.seed)
    out = {}
    for arm in arms:
        law = reference.law(arm)
        error, calibration, notes = _law_error(args, analysis, reference, arm, law_from, family)
        path = analysis.runs.loc[analysis.runs["arm"] == arm, "path"].iloc[0]
        replay = workload_proposals(args.workload, read_run_json(Path(path) / RUN_FILE), target, tasks=args.tasks,
                                    checkpoint=args.checkpoint)
        notes.append(f"drafted depths and the drafter's confidence: its proposals replayed at every output position of "
                     f"the workload ({replay['request_id'].nunique()} requests), with {replay.attrs['gate']}; law "
                     f"{family} fitted on {law_from}")
        notes.append(copy_note)
        if arm in borrowed:
            notes.append(borrowed[arm])
        out[arm] = (law, error, replay, notes, calibration)
    return out, workload


def _checkpoints(analysis, arm: str) -> list[str]:
    """The drafter checkpoints (SHA-256) ``arm``'s runs in ``analysis`` recorded; ``[]`` for a drafter without one."""
    from entropy_law.law.arms import run_checkpoints

    return run_checkpoints(analysis.runs.loc[analysis.runs["arm"] == arm])


def _shas(shas: list[str]) -> str:
    return ", ".join(f"sha256:{s[:8]}" for s in shas) or "none"


def _law_error(args, analysis, reference, arm: str, law_from: str, family: str) -> tuple[float, dict, list]:
    """(the widening of the verdict, ``{"bias": b, "uncalibrated_error": ...}``, notes) for ``arm``'s law fitted on
    ``reference``: ``--transfer-error``, else the law's calibrated transfer error compounded with the cost model's."""
    from entropy_law.law.transfer import calibrated_transfer

    if args.transfer_error is not None:
        return args.transfer_error, {"bias": 0.0, "uncalibrated_error": args.transfer_error}, [
            f"transfer error {args.transfer_error:.1%} (--transfer-error); the law's residual b not applied (it comes "
            "from the leave-one-category-out run that --transfer-error skips)"]
    loco = reference.loco(arm, "replayed")
    raw = loco.accuracy.loc["tokens_per_round"]
    bias, law_error, table = calibrated_transfer(loco)
    calibration = {"bias": bias, "uncalibrated_error": float(raw["max_abs_relative_error"])}
    notes = [f"transfer error of the law: the largest leave-one-category-out |relative error| of tokens per round on "
             f"the {int(raw['categories'])} categories of {law_from}, each scaled by the residual b of the others "
             "(nested: from laws fitted without it), "
             f"{law_error:.1%} (mean {table['relative_error'].abs().mean():.1%}; without b "
             f"{float(raw['max_abs_relative_error']):.1%}, mean {float(raw['mean_abs_relative_error']):.1%}; {family}, "
             "replayed depths)"]
    # a right tokens per round can still be priced wrong: compound the cost model's own error
    cost_error, cost_note = analysis.cost_model_error(arm)
    error = (1 + law_error) * (1 + cost_error) - 1
    notes.append(f"widened by both: (1 + {law_error:.1%}) x (1 + {cost_error:.1%}) - 1 = {error:.1%}, the second "
                 f"for {arm}'s cost model; {cost_note}")
    return error, calibration, notes


def _one_run(workload, flag: str) -> None:
    from entropy_law.traces.layout import RUN_FILE

    if not (Path(workload) / RUN_FILE).is_file():
        raise ValueError(f"{flag} replays the drafter over one run: {workload} is not a run (no {RUN_FILE})")


def _workload_target(args, flag: str):
    """The workload's target, loaded (``--model`` or the name its run.json records)."""
    from entropy_law.decoding.loading import load_target
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    model = args.model or read_run_json(Path(args.workload) / RUN_FILE).get("model_id")
    try:
        return load_target(model)
    except FileNotFoundError as err:  # a folder-loaded target's run.json keeps a short name, not the folder
        raise ValueError(f"{flag} loads the workload's target, {model!r}: {err}; pass --model FOLDER") from err


def _budgets(text: str) -> list[int]:
    try:
        budgets = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        raise ValueError(f"--budgets takes tree budgets separated by commas, e.g. 4,8,32; got {text!r}") from None
    if not budgets or budgets[0] < 1:
        raise ValueError(f"--budgets: each budget must be a whole number of draft nodes >= 1; got {text!r}")
    return budgets


def _replayed_rounds(args, analysis, arms, budgets=(), policy=None) -> dict:
    """name -> (rounds replayed over the workload, notes, the arm whose cost model prices them, its error or None):
    every arm, its law policy variant, and each DDTree arm at each other budget of ``budgets``."""
    import re

    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    target = _workload_target(args, "--replay-rounds")
    measured = None
    if policy is not None and policy.get("verify_cost") is None:  # once, as an online run measures it at start
        from entropy_law.decoding.adapter import TargetAdapter
        from entropy_law.decoding.gate import measure_verify_cost
        from entropy_law.decoding.loading import model_of
        measured = measure_verify_cost(TargetAdapter(model_of(target))).to_config()
    out = {}
    for arm in arms:
        path = analysis.runs.loc[analysis.runs["arm"] == arm, "path"].iloc[0]
        meta = read_run_json(Path(path) / RUN_FILE)
        rounds = workload_rounds(args.workload, meta, target, tasks=args.tasks, checkpoint=args.checkpoint)
        notes = [f"the arm's rounds replayed over the workload ({len(rounds)} requests) with {rounds.attrs['gate']}: "
                 "the rounds it decodes there, priced by its cost model (no law)"]
        if args.transfer_error is not None:
            notes.append(f"the cost model's error taken as {args.transfer_error:.1%} (--transfer-error)")
        out[arm] = (rounds, notes, arm, None)
        if policy is not None and meta.get("drafter_id") == policy.get("drafter_id") and not meta.get("policy"):
            out[f"{arm} law policy"] = _policy_variant(args, analysis, arm, meta, policy, target, measured)
        if meta.get("tree_policy") != "ddtree" or not budgets:
            continue
        error, error_notes = _variant_error(args, analysis, arm)
        most = int(analysis.cost_view(arm).rounds["tree_nodes"].max())
        for budget in budgets:
            name = re.sub(r"ddtree\d*$", f"ddtree{budget}", arm)
            if budget == meta.get("tree_budget") or name in out or name in analysis.arms:
                continue  # recorded (and timed) already: priced as itself
            variant = workload_rounds(args.workload, {**meta, "tree_budget": budget}, target, tasks=args.tasks,
                                      checkpoint=args.checkpoint)
            notes = [f"{arm} with tree budget {budget}: its rounds replayed over the workload ({len(variant)} "
                     f"requests) with {variant.attrs['gate']}, priced by {arm}'s cost model (no law)", *error_notes]
            if budget > most:
                notes.append(f"an extrapolation: budget {budget} verifies more nodes than any round {arm}'s cost model "
                             f"was timed on (at most {most})")
            out[name] = (variant, notes, arm, error)
    return out


def _policy_variant(args, analysis, arm, meta, policy, target, measured) -> tuple:
    """``arm`` with the law policy ``policy`` in place of its gate, replayed over the workload and priced by the
    arm's cost model (``_replayed_rounds``' tuple); ``measured``: this machine's verify-cost curve (config)."""
    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.payoff.policy import policy_arm_meta

    variant, whence = policy_arm_meta(meta, policy, measured=measured, cost=analysis.cost_model(arm), arm=arm)
    rounds = workload_rounds(args.workload, variant, target, tasks=args.tasks, checkpoint=args.checkpoint)
    skipped = int(rounds["skipped_rounds"].sum())
    notes = [f"{arm} with the law policy of {args.policy} in place of its gate: its rounds replayed over the workload "
             f"({len(rounds)} requests; in {skipped} of {int(rounds['rounds'].sum())} rounds the policy did not call "
             f"the drafter), priced by {arm}'s cost model (no law); the policy priced trees with {whence}"]
    models = policy.get("model_id")
    if isinstance(models, list) and meta.get("model_id") is not None and str(meta["model_id"]) not in models:
        notes.append(f"the policy was fitted on traces of {', '.join(models)}, the arm ran {meta['model_id']}: its "
                     "law describes another target")
    error, error_notes = _variant_error(args, analysis, arm)
    return rounds, notes + error_notes, arm, error


def _variant_error(args, analysis, arm) -> tuple[float | None, list[str]]:
    """(error or None, notes): how a variant of ``arm`` that never ran (a budget, a law policy) is widened."""
    if args.transfer_error is not None:
        return None, [f"the cost model's error taken as {args.transfer_error:.1%} (--transfer-error)"]
    return analysis.variant_error(arm)

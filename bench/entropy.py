"""The target's entropy: its speed and cost as an input to the law.

Subcommands (each prints a table and ends with one JSON line):

    python bench/entropy.py speed [ARGS]
    python bench/entropy.py topk [ARGS]
    python bench/entropy.py import-speed [ARGS]

``python bench/entropy.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, measured_line, run_subcommand  # noqa: E402


# --- speed -----------------------------------------------------------------------------------------------------------

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "traces" / "ngram"


def engine_lines(traces, tokenizer, request_ids, num_spec_tokens: int) -> list[dict]:
    """vLLM ``detailed`` responses for these requests of the reference run (a round cut at EOS or the token
    budget reports the drafts it kept, as an engine that trims does)."""
    from entropy_law.prompts.text import load_tasks

    tasks = {t.request_id: t for t in load_tasks("spec_bench")}
    tokens, rounds = traces.tokens, traces.rounds
    lines = []
    for request_id in request_ids:
        task = tasks[request_id]
        text = tokenizer.apply_chat_template(task.messages(), add_generation_prompt=True, tokenize=False)
        prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        rows = tokens.loc[tokens["request_id"] == request_id].sort_values("position")
        steps = rounds.loc[(rounds["request_id"] == request_id) & (rounds["round_index"] > 0)]
        steps = steps.sort_values("round_index")
        accepted = [int(min(a, c - 1)) for a, c in zip(steps["accepted"], steps["committed"])]
        drafted = [int(d) for d in steps["tree_depth"]]
        histogram = [0] * (num_spec_tokens + 1)
        for a in accepted:
            histogram[a] += 1
        output = [int(t) for t in rows["token_id"]]
        lines.append({
            "id": request_id, "object": "chat.completion", "model": "smollm2-135m",
            "choices": [{"index": 0, "finish_reason": "length", "token_ids": output}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output)},
            "prompt_token_ids": prompt, "category": task.category,
            "metrics": {"speculative_decoding": {
                "num_spec_tokens": num_spec_tokens, "per_step_accepted": accepted, "per_step_drafted": drafted,
                "acceptance_histogram": histogram, "num_spec_steps": len(accepted),
                "num_accepted_draft_tokens": sum(accepted), "num_draft_tokens": sum(drafted)}},
        })
    return lines


def gemm_gflops(hidden: int, inner: int, seconds: float = 1.0, dtype=torch.float32) -> tuple[float, float]:
    """GEMM rate now on the shape of the model's MLP ([512, hidden] x [hidden, inner]) in ``dtype``: GFLOP per
    wall second, and GFLOP per CPU second of the process (what one busy core does, whatever the load)."""
    a, b = torch.randn(512, hidden).to(dtype), torch.randn(hidden, inner).to(dtype)
    for _ in range(3):
        a @ b
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    flop = 2 * 512 * hidden * inner * n / 1e9
    return flop / (time.perf_counter() - start), flop / max(time.process_time() - cpu, 1e-9)


def speed_arguments(parser) -> None:
    """The arguments of ``speed``."""
    parser.add_argument("--requests", type=int, default=8, help="requests of the reference run (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved repeats of every arm (default: %(default)s)")
    parser.add_argument("--batch-tokens", type=int, default=4096,
                        help="the batched arm's budget (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--bf16", action="store_true", help="also the per-request arm in bfloat16")
    parser.add_argument("--sdpa", action="store_true", help="also the per-request arm on torch's sdpa attention")
    parser.add_argument("--seed", type=int, default=0, help="which requests (default: %(default)s)")


def run_speed(args, parser) -> int:
    """Throughput of ``entropy-law entropy`` (output tokens per second) on this machine, per batching arm.

    The engine run is real: requests of the n-gram reference traces (``data/traces/ngram``: Spec-Bench prompts
    through the default target's chat template, its greedy outputs, the rounds it verified) written as vLLM
    ``detailed`` responses (prompt ids, output ids, per-step accepted / drafted counts) and imported with
    ``entropy-law import``. Each arm computes the target statistics of that import into its own run through
    the one job (``entropy_law.jobs.entropy.compute_target_stats``), so every arm goes through the same loading,
    timing (the job's own clock: forward passes and statistics, not the import or the writing) and counting
    (output tokens scored). Arms: one forward per request (``batch_tokens=0``) and left-padded batches of
    ``--batch-tokens``; with ``--sdpa`` also the per-request arm on torch's fused attention (the target is
    loaded with transformers' eager attention by default), with ``--bf16`` also the per-request arm in bfloat16 (weights and activations; the statistics stay fp32: its entropy error against the fp32 arm is printed). One warm-up request first, then
    the arms run interleaved ``--repeats`` times in a rotating order (load drifts on a shared machine hit all
    alike); the table shows the median and the range.

    Checks printed beside the speed: that the entropies equal the decoder's recorded ones (the reference
    traces' ``target_entropy_nats``, recorded online with a KV cache; teacher forcing must agree to fp32
    round-off), that the target's argmax is the output token everywhere (greedy outputs), and the physical
    bound: FLOPs per output token (2 x body parameters x (prompt + output) / output + 2 x LM-head parameters)
    against the fp32 GEMM rate this machine reaches now.

        python bench/entropy.py speed                        # 8 requests, 3 repeats, torch's threads
        python bench/entropy.py speed --requests 24 --threads 1 --bf16
    Ends with ONE JSON line.
    """
    if not (REFERENCE / "run.json").is_file():
        print(f"no reference traces at {REFERENCE}; this bench needs them", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    from entropy_law.decoding.loading import load_target
    from entropy_law.importers import import_jsonl
    from entropy_law.jobs.entropy import compute_target_stats
    from entropy_law.traces.reader import load_traces

    reference = load_traces(REFERENCE)
    block = int(reference.runs["drafter_config"][0]["block_size"])
    target = load_target()
    requests = reference.requests
    rng = np.random.default_rng(args.seed)
    chosen = sorted(rng.choice(requests["request_id"].astype(str).to_numpy(), size=args.requests + 1, replace=False))
    warmup, chosen = chosen[:1], chosen[1:]
    arms = {"per request": (target, 0), f"batched {args.batch_tokens}": (target, args.batch_tokens)}
    if args.sdpa:
        arms["per request, sdpa"] = (load_target(attn_implementation="sdpa"), 0)
    if args.bf16:
        arms["per request, bf16"] = (load_target(dtype=torch.bfloat16), 0)

    with tempfile.TemporaryDirectory(prefix="entropy-speed-") as tmp:
        tmp = Path(tmp)
        lines = engine_lines(reference, target.tokenizer, warmup + chosen, block - 1)
        for name, part in (("warmup", lines[:1]), ("bench", lines[1:])):
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in part))
            import_jsonl(tmp / f"{name}.jsonl", "vllm", tmp / name)
        for arm, (model, batch) in arms.items():  # the same warm-up for every arm
            compute_target_stats(tmp / "warmup", model, out=tmp / f"warmup-{len(arm)}-{batch}", batch_tokens=batch)
        runs: dict[str, list] = {arm: [] for arm in arms}
        names = list(arms)
        for repeat in range(args.repeats):
            for i in range(len(names)):
                arm = names[(i + repeat) % len(names)]
                model, batch = arms[arm]
                out = tmp / f"run-{repeat}-{names.index(arm)}"
                summary = compute_target_stats(tmp / "bench", model, out=out, batch_tokens=batch)
                runs[arm].append((summary, out))
        # the statistics against the decoder's recorded entropies, and the arms against each other
        recorded = reference.tokens.set_index(["request_id", "position"])["target_entropy_nats"]
        errors, versus_fp32, entropies = {}, {}, {}
        for arm in arms:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ours = load_traces(runs[arm][0][1]).tokens
            ours = ours.assign(request_id=ours["request_id"].astype(str)).set_index(["request_id", "position"])
            entropies[arm] = ours["target_entropy_nats"].astype(float)
            diff = (entropies[arm] - recorded.reindex(ours.index).astype(float)).abs()
            errors[arm] = float(diff.max())
        for arm in arms:  # every arm against the fp32 per-request arm, token by token
            d = (entropies[arm] - entropies[names[0]].reindex(entropies[arm].index)).abs()
            versus_fp32[arm] = {"max_abs_nats": float(d.max()), "mean_abs_nats": float(d.mean()),
                                "max_rel": float((d / entropies[names[0]].reindex(d.index).clip(lower=1e-3)).max())}
    tokens = runs[names[0]][0][0].tokens_now
    prompt_tokens = int(requests.set_index("request_id").loc[chosen, "prompt_tokens"].sum())
    config = target.model.config
    body = sum(p.numel() for p in target.model.model.layers.parameters())
    head = config.vocab_size * config.hidden_size
    flops = 2 * body * (prompt_tokens + tokens) / tokens + 2 * head
    gflops, gflops_cpu = gemm_gflops(config.hidden_size, config.intermediate_size)
    bf16_gflops, bf16_gflops_cpu = gemm_gflops(config.hidden_size, config.intermediate_size, dtype=torch.bfloat16)

    load = os.getloadavg()

    print(f"entropy-law entropy on {len(chosen)} Spec-Bench requests of the n-gram reference run: {prompt_tokens} "
          f"prompt + {tokens} output tokens; torch threads {torch.get_num_threads()}; shared machine (load average "
          f"{load[0]:.1f} on {os.cpu_count()} cores at the end): wall rates move with its load, rates per CPU second "
          "much less")
    print(f"{'arm':<24}{'tokens/s (median)':>19}{'range':>18}{'tokens/CPU-s':>14}{'argmax = token':>16}"
          f"{'max |dH| vs decoder':>21}{'vs fp32 arm: max |dH|, mean':>30}")
    result = {}
    for arm in arms:
        rates = [s.tokens_per_s for s, _ in runs[arm]]
        per_cpu = statistics.median(s.tokens_now / s.cpu_seconds for s, _ in runs[arm])
        agree = runs[arm][0][0].argmax_agree / tokens
        v = versus_fp32[arm]
        versus = f"{v['max_abs_nats']:.2e}, {v['mean_abs_nats']:.2e}"
        result[arm] = {"tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                       "tokens_per_cpu_s": per_cpu, "argmax_agree": agree, "max_abs_entropy_error_nats": errors[arm],
                       "entropy_vs_fp32_arm": v}
        print(f"{arm:<24}{statistics.median(rates):>19,.0f}{f'{min(rates):,.0f} - {max(rates):,.0f}':>18}"
              f"{per_cpu:>14,.0f}{agree:>16.2%}{errors[arm]:>21.2e}"
              f"{versus:>30}")
    bound = gflops * 1e9 / flops
    cores = os.cpu_count() or 1
    idle_fp32, idle_bf16 = cores * gflops_cpu * 1e9 / flops, cores * bf16_gflops_cpu * 1e9 / flops
    print(f"physical bound: {flops / 1e9:.2f} GFLOP per output token (prompt:output = {prompt_tokens / tokens:.2f}); "
          f"GEMM now: fp32 {gflops:.0f} GFLOP/s wall ({gflops_cpu:.0f} per CPU second), bf16 {bf16_gflops:.0f} "
          f"({bf16_gflops_cpu:.0f} per CPU second); so at most ~{bound:,.0f} output tokens/s in fp32 at this load, and "
          f"on {cores} idle cores at the full GEMM rate with nothing else costing anything ~{idle_fp32:,.0f} (fp32) "
          f"/ ~{idle_bf16:,.0f} (bf16) tokens/s; 1,000 tokens/s needs {flops * 1000 / 1e9:.0f} GFLOP/s")
    best = max(result, key=lambda a: result[a]["tokens_per_s"])
    print(json.dumps({"bench": "entropy_speed", "requests": len(chosen), "prompt_tokens": prompt_tokens,
                      "output_tokens": tokens, "threads": torch.get_num_threads(), "arms": result, "best_arm": best,
                      "gemm_gflops": gflops, "gemm_gflops_per_cpu_s": gflops_cpu, "bf16_gemm_gflops": bf16_gflops,
                      "bf16_gemm_gflops_per_cpu_s": bf16_gflops_cpu, "gflop_per_output_token": flops / 1e9,
                      "bound_tokens_per_s": bound, "idle_bound_fp32_tokens_per_s": idle_fp32,
                      "idle_bound_bf16_tokens_per_s": idle_bf16, "load_average": load, "goal_tokens_per_s": 1000}))
    return 0


# --- topk ------------------------------------------------------------------------------------------------------------

TOPK_KS = (1, 5, 10, 20)
TOPK_TRACES = {"smollm2-135m": REFERENCE, "gemma3-270m": REFERENCE.parents[1] / "traces_gemma" / "ngram"}
TOPK_RESULTS = Path(__file__).resolve().parent / "results" / "entropy-topk.txt"
BOUND_WIDTH_NATS = 0.05  # "bounds within": upper - lower at most this
LOCO_GOAL = 0.02  # LOCO tokens per round on the estimate within this of the exact fit's (relative)


def topk_arguments(parser) -> None:
    """The arguments of ``topk``."""
    parser.add_argument("--targets", default=",".join(TOPK_TRACES),
                        help="targets whose recordings to use, comma-separated (default: %(default)s)")
    parser.add_argument("--per-category", type=int, default=10,
                        help="requests per category drawn from each recording (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="which requests (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--out", default=str(TOPK_RESULTS), help="table file (default: %(default)s)")


class _WithTokens:
    """``traces`` with another tokens table (what the law reads as the entropy)."""

    def __init__(self, traces, tokens):
        self._traces, self.tokens = traces, tokens

    def __getattr__(self, name):
        return getattr(self._traces, name)


def _sampled(traces, per_category: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    requests = traces.requests.assign(request_id=traces.requests["request_id"].astype(str))
    chosen = []
    for _, group in sorted(requests.groupby("category", observed=True), key=lambda kv: str(kv[0])):
        ids = sorted(group["request_id"])
        chosen += sorted(rng.choice(ids, size=min(per_category, len(ids)), replace=False).tolist())
    return chosen


def _teacher_forced_topk(traces, name: str, chosen: list[str], kmax: int) -> tuple[pd.DataFrame, int, float]:
    """Per output position of ``chosen``: the exact entropy and the top ``kmax`` log-probabilities of the target's
    distribution, recomputed teacher-forced (the traces store no logits); also V and the forward seconds."""
    from entropy_law.decoding.loading import load_target
    from entropy_law.decoding.replay import target_stats, teacher_forced_logits
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.topk import topk_logprobs_from_logits

    target = load_target(name)
    tokenizer = target.tokenizer
    chat = bool(traces.runs["chat_template"].iloc[0]) if "chat_template" in traces.runs else True
    tasks = {t.request_id: t for t in load_tasks("spec_bench")}
    tokens = traces.tokens.assign(request_id=traces.tokens["request_id"].astype(str))
    prompt_tokens = traces.requests.assign(request_id=traces.requests["request_id"].astype(str)) \
        .set_index("request_id")["prompt_tokens"]
    frames, seconds = [], 0.0
    for request_id in chosen:
        task = tasks[request_id]
        if chat:
            text = tokenizer.apply_chat_template(task.messages(), add_generation_prompt=True, tokenize=False)
            prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            prompt = list(tokenizer(task.prompt)["input_ids"])
        if len(prompt) != int(prompt_tokens[request_id]):
            raise RuntimeError(f"{request_id}: the prompt encodes to {len(prompt)} tokens, the recording has "
                               f"{int(prompt_tokens[request_id])}: not the prompt that was decoded")
        rows = tokens.loc[tokens["request_id"] == request_id].sort_values("position")
        start = time.process_time()
        with torch.no_grad():
            logits = teacher_forced_logits(target, prompt, rows["token_id"].tolist())
        exact = target_stats(logits)["target_entropy_nats"].numpy()
        top = topk_logprobs_from_logits(logits.numpy(), kmax)
        seconds += time.process_time() - start
        frames.append(pd.DataFrame({"request_id": request_id, "position": rows["position"].to_numpy(),
                                    "exact_tf": exact.astype(np.float64), "top": list(top)}))
    return pd.concat(frames, ignore_index=True), int(logits.shape[1]), seconds


def _topk_one(name: str, path: Path, args) -> dict:
    """The estimator's errors and the law's fits on the estimate against the exact entropy, per k, on one target."""
    from entropy_law.law.fit import fit_law, primary_family
    from entropy_law.law.transfer import loco_transfer
    from entropy_law.traces.reader import load_traces
    from entropy_law.traces.topk import topk_entropy

    everything = load_traces(path)
    chosen = _sampled(everything, args.per_category, args.seed)
    positions, vocab, cpu_s = _teacher_forced_topk(everything, name, chosen, max(TOPK_KS))
    tokens = everything.tokens.assign(request_id=everything.tokens["request_id"].astype(str))
    tokens = tokens.loc[tokens["request_id"].isin(chosen)].reset_index(drop=True)
    tokens = tokens.merge(positions, on=["request_id", "position"], how="left", validate="one_to_one")
    if tokens["exact_tf"].isna().any():
        raise RuntimeError(f"{name}: {int(tokens['exact_tf'].isna().sum())} token rows got no recomputed distribution")
    exact = tokens["target_entropy_nats"].to_numpy(np.float64)
    recompute_gap = float(np.abs(tokens["exact_tf"].to_numpy() - exact).max())
    top = np.stack(tokens["top"].to_numpy())
    traces = _WithTokens(everything, tokens.drop(columns=["exact_tf", "top"]))
    family = primary_family(traces.tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = fit_law(traces, family)
        base_loco = loco_transfer(traces, family).summary["predicted_tokens_per_round"]
    ci = base.coefficients[["estimate", "ci_low", "ci_high", "std_err"]]
    per_k = {}
    for k in TOPK_KS:
        est = topk_entropy(top[:, :k], vocab)
        err = np.abs(est.estimate_nats - tokens["exact_tf"].to_numpy())
        width = est.upper_nats - est.lower_nats
        outside = int(((tokens["exact_tf"] < est.lower_nats - 1e-4) | (tokens["exact_tf"] > est.upper_nats + 1e-4)).sum())
        moved = _WithTokens(everything, traces.tokens.assign(target_entropy_nats=est.estimate_nats.astype(np.float32)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = fit_law(moved, family).coefficients["estimate"].reindex(ci.index)
            loco = loco_transfer(moved, family).summary["predicted_tokens_per_round"].reindex(base_loco.index)
        inside = (fit >= ci["ci_low"]) & (fit <= ci["ci_high"])
        loco_rel = loco / base_loco - 1
        per_k[k] = {"mean_abs_error_nats": float(err.mean()), "p95_abs_error_nats": float(np.quantile(err, 0.95)),
                    "max_abs_error_nats": float(err.max()),
                    "share_bounds_within": float((width <= BOUND_WIDTH_NATS).mean()), "exact_outside_bounds": outside,
                    "coefficients_inside_exact_ci": int(inside.sum()), "coefficients": len(inside),
                    "max_shift_in_se": float(((fit - ci["estimate"]).abs() / ci["std_err"]).max()),
                    "coefficients_estimate_fit": fit.to_dict(),
                    "loco_max_abs_relative_difference": float(loco_rel.abs().max()),
                    "loco_relative_difference": loco_rel.to_dict()}
    return {"target": name, "traces": str(path.relative_to(REFERENCE.parents[2])), "requests": len(chosen),
            "positions": len(tokens), "vocab_size": vocab, "family": family, "recompute_cpu_s": cpu_s,
            "recompute_max_abs_vs_recorded_nats": recompute_gap, "exact_fit": ci.to_dict(orient="index"),
            "exact_loco_tokens_per_round": base_loco.to_dict(), "per_k": per_k}


def _topk_lines(result: dict) -> list[str]:
    out = [f"{result['target']}: {result['requests']} requests ({result['positions']} positions) of {result['traces']}, "
           f"V = {result['vocab_size']}; law {result['family']}; top-k from teacher-forced logits ({result['recompute_cpu_s']:.0f} "
           f"CPU-s; exact entropy recomputed there within {result['recompute_max_abs_vs_recorded_nats']:.1e} nats of the "
           "recorded one)",
           f"{'k':>3}{'mean |est-H|':>14}{'p95 |est-H|':>13}{'max |est-H|':>13}{'bounds <= 0.05':>16}{'H outside':>11}"
           f"{'coefs in exact CI':>19}{'max shift/SE':>14}{'LOCO max |rel diff|':>21}"]
    for k, r in result["per_k"].items():
        out.append(f"{k:>3}{r['mean_abs_error_nats']:>14.4f}{r['p95_abs_error_nats']:>13.4f}{r['max_abs_error_nats']:>13.3f}"
                   f"{r['share_bounds_within']:>16.1%}{r['exact_outside_bounds']:>11}"
                   f"{str(r['coefficients_inside_exact_ci']) + ' / ' + str(r['coefficients']):>19}"
                   f"{r['max_shift_in_se']:>14.2f}{r['loco_max_abs_relative_difference']:>21.2%}")
    k = max(TOPK_KS)
    out.append(f"coefficients at k = {k} (estimate fit) against the exact fit's 95% interval:")
    for term, row in result["exact_fit"].items():
        value = result["per_k"][k]["coefficients_estimate_fit"][term]
        inside = row["ci_low"] <= value <= row["ci_high"]
        out.append(f"  {term:<34} exact {row['estimate']:>9.4f} [{row['ci_low']:>8.4f}, {row['ci_high']:>8.4f}]  "
                   f"estimate {value:>9.4f}  {'inside' if inside else 'OUTSIDE'}")
    loco = result["per_k"][k]["loco_relative_difference"]
    out.append(f"LOCO tokens per round at k = {k}, estimate vs exact fit: " + ", ".join(
        f"{cat} {result['exact_loco_tokens_per_round'][cat]:.3f} ({rel:+.2%})" for cat, rel in loco.items()))
    return out


def run_topk(args, parser) -> int:
    """How good the top-k entropy estimate is: per k, its error and the law fitted on it against the exact entropy.

    On our own recordings (``data/traces/ngram``, the default target; ``data/traces_gemma/ngram``, the second), for a
    seeded sample of ``--per-category`` requests per category: the target's distribution at every output position is
    recomputed teacher-forced (the traces store no logits; the exact entropy recomputed there is checked against the
    recorded one), and its top k log-probabilities, k = 1, 5, 10, 20, give the entropy's bounds and point estimate
    (``traces.topk.topk_entropy``). Per k: mean, 95th percentile and largest |estimate - exact| (nats); the share of
    positions whose bounds lie within 0.05 nats of each other; positions whose exact entropy falls outside the bounds
    (must be 0); the primary law (``law.fit.primary_family``) fitted on the estimate in place of the exact entropy,
    each coefficient against the exact fit's 95% interval (cluster-robust by request), and the largest move in the
    exact fit's standard errors; the LOCO tokens-per-round predictions (``law.transfer.loco_transfer``, training
    depth model) of the estimate's laws against the exact fit's, largest relative difference over the held-out
    categories (goal: within 2% at k = 20). Only the entropy moves: the top-1 probability the primary law also reads
    is exact from any top-k. The table goes to ``--out`` with date, commit and machine.

        python bench/entropy.py topk                       # both targets, 10 requests per category, seed 0
    Ends with ONE JSON line.
    """

    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOPK_TRACES]
    if unknown:
        parser.error(f"unknown target(s) {unknown}; known: {sorted(TOPK_TRACES)}")
    start = time.perf_counter()
    results = [_topk_one(name, TOPK_TRACES[name], args) for name in names]
    wall = time.perf_counter() - start
    k = max(TOPK_KS)
    goals = {r["target"]: {"coefficients_inside": r["per_k"][k]["coefficients_inside_exact_ci"] == r["per_k"][k]["coefficients"],
                           "loco_within_2pct": r["per_k"][k]["loco_max_abs_relative_difference"] <= LOCO_GOAL}
             for r in results}
    lines = [f"# entropy-topk.txt: python bench/entropy.py topk --targets {args.targets} --per-category "
             f"{args.per_category} --seed {args.seed} --threads {args.threads}",
             f"{measured_line()}; {wall:.0f} s wall", ""]
    for result in results:
        lines += _topk_lines(result) + [""]
    lines.append("goals at k = 20 (coefficients inside the exact fit's 95% intervals; LOCO within 2%): " + "; ".join(
        f"{t}: coefficients {'hold' if g['coefficients_inside'] else 'FAIL'}, LOCO {'holds' if g['loco_within_2pct'] else 'FAILS'}"
        for t, g in goals.items()))
    payload = json.dumps({"bench": "entropy_topk", "per_category": args.per_category, "seed": args.seed,
                          "wall_s": wall, "goals_k20": goals, "targets": results}, default=float)
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n" + payload + "\n")
    print(payload)
    return 0


# --- import-speed ----------------------------------------------------------------------------------------------------

IMPORT_SPEED_RESULTS = Path(__file__).resolve().parent / "results" / "entropy-import-speed.txt"
IMPORT_SPEED_GOAL = 500  # import tokens per CPU second over recompute tokens per CPU second, at least


def import_speed_arguments(parser) -> None:
    """The arguments of ``import-speed``."""
    parser.add_argument("--tokens", type=float, default=1e6, help="output tokens of the generated log (default: 1e6)")
    parser.add_argument("--recompute-tokens", type=float, default=1e4,
                        help="output tokens the target recomputes (default: 1e4)")
    parser.add_argument("--k", type=int, default=20, help="top_logprobs per output token (default: %(default)s)")
    parser.add_argument("--num-spec-tokens", type=int, default=4, help="K of the logged engine (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the generated log and the requests recomputed "
                                                            "(default: %(default)s)")
    parser.add_argument("--log", default=None,
                        help="the generated log's path: reused when it is there (default: a temporary file)")
    parser.add_argument("--out", default=str(IMPORT_SPEED_RESULTS), help="table file (default: %(default)s)")


def _zipf_top(n: int, k: int, vocab: int, rng) -> np.ndarray:
    """``[n, k]`` top-k log-probabilities (best first) of ``n`` next-token distributions over ``vocab`` tokens:
    a Zipf law ``p_i ~ i^-a`` over the whole vocabulary, its exponent drawn per position (``a - 1`` exponential
    with mean 3, so confident positions and flat ones both occur), ranks 2..k jittered (lognormal, sigma 0.25, their mass kept) and
    re-sorted; the normaliser is exact, so the tail beyond k is one a real distribution has."""
    grid = np.geomspace(1.0, 16.0, 256)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    log_z = np.array([np.log(np.sum(ranks ** -a)) for a in grid])
    which = np.minimum(np.searchsorted(grid, 1.0 + rng.exponential(3.0, n)), grid.size - 1)
    lp = -grid[which, None] * np.log(ranks[:k])[None, :] - log_z[which, None]
    mass = np.exp(lp[:, 1:]).sum(axis=1, keepdims=True)
    jittered = lp[:, 1:] + rng.normal(0.0, 0.25, (n, k - 1))
    jittered += np.log(mass) - np.log(np.exp(jittered).sum(axis=1, keepdims=True))  # ranks 2..k keep their mass
    lp[:, 1:] = np.minimum(jittered, lp[:, :1])  # and none rises above the top one
    return -np.sort(-lp, axis=1)


def vllm_topk_log(path: Path, tokens: int, k: int, num_spec_tokens: int, seed: int, tokenizer) -> dict:
    """Write a seeded vLLM chat-completions log (``return_token_ids``, ``logprobs`` with ``top_logprobs = k``,
    ``--per-request-spec-decode-metrics detailed``) of ``tokens`` output tokens, in vLLM's compact JSON: each
    output token's entry carries its ``token`` string (the tokenizer's text of the id), ``logprob`` and UTF-8
    ``bytes``, and its ``top_logprobs`` list of k such entries; the output token is the top one (greedy). Lengths
    200-999 tokens, per-step accepted counts uniform over 0..K. Returns what was written."""
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    pieces = tokenizer.batch_decode([[i] for i in range(vocab)])
    head = [f'{{"token":{json.dumps(s)},"logprob":' for s in pieces]
    tail = [',"bytes":' + json.dumps(list(s.encode("utf-8", "replace")), separators=(",", ":")) + "}"
            for s in pieces]
    written, requests = 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < tokens:
            n = int(min(rng.integers(200, 1000), tokens - written))
            ids = rng.integers(0, vocab, (n, k))
            lp = _zipf_top(n, k, vocab, rng)
            accepted, total = [], 1
            while total < n:
                a = int(min(rng.integers(0, num_spec_tokens + 1), n - total - 1))
                accepted.append(a)
                total += a + 1
            content = ",".join(
                head[row[0]] + repr(vals[0]) + tail[row[0]][:-1] + ',"top_logprobs":['
                + ",".join(head[t] + repr(v) + tail[t] for t, v in zip(row, vals)) + "]}"
                for row, vals in zip(ids.tolist(), lp.tolist()))
            prompt = rng.integers(0, vocab, int(rng.integers(50, 500))).tolist()
            output = ids[:, 0].tolist()
            obj = {"id": f"chatcmpl-{seed}-{requests:07d}", "object": "chat.completion", "created": 1790000000 + requests,
                   "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces[t] for t in output),
                                                        "tool_calls": []},
                                "logprobs": {"content": "@CONTENT@"}, "finish_reason": "length", "stop_reason": None,
                                "token_ids": output}],
                   "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n},
                   "prompt_token_ids": prompt,
                   "metrics": {"speculative_decoding": {
                       "num_spec_tokens": num_spec_tokens, "num_spec_steps": len(accepted),
                       "num_draft_tokens": num_spec_tokens * len(accepted), "num_accepted_draft_tokens": sum(accepted),
                       "acceptance_histogram": np.bincount(accepted, minlength=num_spec_tokens + 1).tolist(),
                       "per_step_accepted": accepted, "per_step_drafted": [num_spec_tokens] * len(accepted)}}}
            fh.write(json.dumps(obj, separators=(",", ":")).replace('"@CONTENT@"', f"[{content}]") + "\n")
            written += n
            requests += 1
    return {"tokens": written, "requests": requests, "vocab_size": vocab, "bytes": path.stat().st_size}


def _recompute_rate(tokens: int, seed: int) -> dict:
    """``entropy-law entropy``'s job (``compute_target_stats``: the default target, fp32, its default batching) on
    requests of the n-gram reference run, drawn in a seeded order until ``tokens`` output tokens, on one torch
    thread; one request first as a warm-up. Tokens per CPU second by the job's own clock (forward passes and
    statistics: the import of these requests, the model's loading and the writing are not in it)."""
    from entropy_law.decoding.loading import load_target
    from entropy_law.importers import import_jsonl
    from entropy_law.jobs.entropy import compute_target_stats
    from entropy_law.traces.reader import load_traces

    torch.set_num_threads(1)
    reference = load_traces(REFERENCE)
    block = int(reference.runs["drafter_config"][0]["block_size"])
    target = load_target()
    counts = reference.tokens.assign(request_id=reference.tokens["request_id"].astype(str)) \
        .groupby("request_id").size()
    order = np.random.default_rng(seed).permutation(sorted(counts.index))
    chosen = list(order[:1 + int(np.searchsorted(np.cumsum(counts[order[1:]].to_numpy()), tokens)) + 1])
    with tempfile.TemporaryDirectory(prefix="entropy-recompute-") as tmp:
        tmp = Path(tmp)
        lines = engine_lines(reference, target.tokenizer, chosen, block - 1)
        for name, part in (("warmup", lines[:1]), ("bench", lines[1:])):
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in part))
            import_jsonl(tmp / f"{name}.jsonl", "vllm", tmp / name)
        compute_target_stats(tmp / "warmup", target, out=tmp / "warmup-out")
        summary = compute_target_stats(tmp / "bench", target, out=tmp / "bench-out")
        ours = load_traces(tmp / "bench-out").tokens
    recorded = reference.tokens.assign(request_id=reference.tokens["request_id"].astype(str)) \
        .set_index(["request_id", "position"])["target_entropy_nats"]
    ours = ours.assign(request_id=ours["request_id"].astype(str)).set_index(["request_id", "position"])
    gap = float((ours["target_entropy_nats"] - recorded.reindex(ours.index)).abs().max())
    prompt = int(reference.requests.assign(request_id=reference.requests["request_id"].astype(str))
                 .set_index("request_id").loc[chosen[1:], "prompt_tokens"].sum())
    return {"requests": len(chosen) - 1, "tokens": summary.tokens_now, "prompt_tokens": prompt,
            "cpu_s": summary.cpu_seconds, "seconds": summary.seconds,
            "tokens_per_cpu_s": summary.tokens_now / summary.cpu_seconds, "max_abs_entropy_vs_recorded": gap}


def _timed_import(log: Path, out: Path, vocab: int) -> dict:
    """``entropy-law import vllm LOG --vocab-size V`` in a child process pinned to one core (one thread for
    OpenMP and Arrow): its CPU seconds (user + system, interpreter start and imports included) and wall."""
    import resource
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARROW_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "entropy_law", "import", "vllm", str(log), "--out", str(out),
                           "--vocab-size", str(vocab)], env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"the import failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "seconds": wall, "peak_rss_gb": after.ru_maxrss / 2 ** 20, "printed": done.stdout}


def run_import_speed(args, parser) -> int:
    """Output tokens turned into entropies per CPU second: importing a vLLM log with top-k log-probabilities
    against recomputing them with the target.

    The import side: a seeded vLLM chat-completions log of ``--tokens`` output tokens with ``top_logprobs =
    --k`` (``vllm_topk_log``) imported end to end by ``entropy-law import vllm --vocab-size V`` in one child
    process on one core: JSON parsing, the checks, the estimator (bounds and point estimate per token), the
    Parquet shards and ``engine_import.jsonl``; its CPU clock. The recompute side: ``entropy-law entropy``'s
    job on ``--recompute-tokens`` output tokens of the n-gram reference run (the default target, fp32, one
    thread; ``_recompute_rate``). Both in this one run; the ratio of the two rates per CPU second is the goal's
    number (at least ``IMPORT_SPEED_GOAL``). Two reference lines say what a parse alone costs: the stdlib
    ``json.loads`` of every line (the generic reader's parser; the importer reads these chat lines with a typed
    msgspec decoder, ``importers.vllm.fast_decode``), and pyarrow's C++ JSON reader with a schema of the top-k
    values only (a parser the importer does not use). ``--log`` reuses a log written before. The table goes
    to ``--out``; ends with ONE JSON line.

        python bench/entropy.py import-speed
        python bench/entropy.py import-speed --tokens 1e5 --recompute-tokens 1e3 --out /tmp/t.txt
    """

    from entropy_law.decoding.loading import load_target
    from entropy_law.traces.reader import load_traces

    tokenizer = load_target().tokenizer
    with tempfile.TemporaryDirectory(prefix="entropy-import-speed-") as tmp:
        tmp = Path(tmp)
        log = Path(args.log) if args.log else tmp / "vllm.jsonl"
        start = time.perf_counter()
        made = {"reused": log.is_file()} if log.is_file() else \
            vllm_topk_log(log, int(args.tokens), args.k, args.num_spec_tokens, args.seed, tokenizer)
        made["seconds"] = time.perf_counter() - start
        cpu, requests, count = time.process_time(), 0, 0  # the stdlib JSON parse alone, as the importer reads lines
        with open(log, "rb") as fh:
            for line in fh:
                count += len(json.loads(line)["choices"][0]["token_ids"])
                requests += 1
        parse_cpu = time.process_time() - cpu
        import pyarrow as pa
        import pyarrow.json as pj

        top = pa.list_(pa.struct([("top_logprobs", pa.list_(pa.struct([("logprob", pa.float64())])))]))
        schema = pa.schema([("choices", pa.list_(pa.struct([("logprobs", pa.struct([("content", top)]))])))])
        cpu = time.process_time()
        pj.read_json(log, read_options=pj.ReadOptions(use_threads=False, block_size=1 << 26),
                     parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
        arrow_cpu = time.process_time() - cpu
        made.update(tokens=count, requests=requests, vocab_size=len(tokenizer), bytes=log.stat().st_size)
        imported = _timed_import(log, tmp / "run", made["vocab_size"])
        tokens = load_traces(tmp / "run").tokens
        rows, estimated = len(tokens), int(tokens["target_entropy_estimate_nats"].notna().sum())
    if rows != made["tokens"] or estimated != rows:
        print(f"the import wrote {rows} token rows ({estimated} with an estimate) of {made['tokens']} output tokens",
              file=sys.stderr)
        return 1
    print(f"import: {made['tokens']:,} tokens in {imported['cpu_s']:.1f} CPU s ({imported['seconds']:.1f} s wall)",
          flush=True)
    recompute = _recompute_rate(int(args.recompute_tokens), args.seed)
    import_rate = made["tokens"] / imported["cpu_s"]
    ratio = import_rate / recompute["tokens_per_cpu_s"]
    lines = [
        f"# entropy-import-speed.txt: python bench/entropy.py import-speed --tokens {args.tokens:g} --recompute-tokens "
        f"{args.recompute_tokens:g} --k {args.k} --seed {args.seed}",
        measured_line(),
        "",
        f"import: a generated vLLM chat-completions log, {made['requests']:,} requests, {made['tokens']:,} output "
        f"tokens with top-{args.k} log-probabilities ({made['bytes'] / 1e9:.2f} GB of JSON, V = {made['vocab_size']:,})",
        f"recompute: {recompute['requests']} requests of the n-gram reference run, {recompute['prompt_tokens']:,} "
        f"prompt + {recompute['tokens']:,} output tokens through the default target (fp32, 1 thread); max |H - "
        f"recorded| {recompute['max_abs_entropy_vs_recorded']:.1e} nats",
        f"{'side':<44}{'tokens':>12}{'CPU s':>10}{'wall s':>10}{'tokens/CPU-s':>15}",
        f"{'import (end to end, 1 core, own process)':<44}{made['tokens']:>12,}{imported['cpu_s']:>10.1f}"
        f"{imported['seconds']:>10.1f}{import_rate:>15,.0f}",
        f"{'json.loads of each line alone (this process)':<44}{made['tokens']:>12,}{parse_cpu:>10.1f}{'':>10}"
        f"{made['tokens'] / parse_cpu:>15,.0f}",
        f"{'pyarrow.json, top-k values only (reference)':<44}{made['tokens']:>12,}{arrow_cpu:>10.1f}{'':>10}"
        f"{made['tokens'] / arrow_cpu:>15,.0f}",
        f"{'recompute (the job clock, 1 thread)':<44}{recompute['tokens']:>12,}{recompute['cpu_s']:>10.1f}"
        f"{recompute['seconds']:>10.1f}{recompute['tokens_per_cpu_s']:>15,.1f}",
        f"ratio (per CPU second): {ratio:,.0f} (goal: at least {IMPORT_SPEED_GOAL}): "
        + ("met" if ratio >= IMPORT_SPEED_GOAL else "NOT met") + f"; the import's peak RSS "
        f"{imported['peak_rss_gb']:.2f} GB",
    ]
    print("\n".join(lines))
    payload = json.dumps({"bench": "entropy_import_speed", "k": args.k, "log": made, "import": {
        k: imported[k] for k in ("cpu_s", "seconds", "peak_rss_gb")}, "import_tokens_per_cpu_s": import_rate,
        "json_parse_cpu_s": parse_cpu, "pyarrow_topk_parse_cpu_s": arrow_cpu,
        "recompute": recompute, "ratio": ratio, "goal": IMPORT_SPEED_GOAL, "goal_met": ratio >= IMPORT_SPEED_GOAL,
        "load_average": os.getloadavg()})
    Path(args.out).write_text("\n".join(lines) + "\n" + payload + "\n")
    print(payload)
    return 0


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "speed": (speed_arguments, run_speed),
    "topk": (topk_arguments, run_topk),
    "import-speed": (import_speed_arguments, run_import_speed),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))

"""Decoding speed: our decoders timed against our AR, the noise floor of a measured speedup, the demo repeated.

Subcommands (each prints a table and ends with one JSON line):

    python bench/speed.py decode [ARGS]
    python bench/speed.py aa-noise [ARGS]
    python bench/speed.py demo-repeat [ARGS]

``python bench/speed.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, run_subcommand  # noqa: E402

from entropy_law.decoding.adapter import TargetAdapter  # noqa: E402
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder  # noqa: E402
from entropy_law.decoding.gate import CostGate, RatioGate, measure_verify_cost  # noqa: E402
from entropy_law.decoding.loading import load_target  # noqa: E402
from entropy_law.decoding.observers import RecorderObserver  # noqa: E402
from entropy_law.drafters.block import BlockDrafter, default_drafter_path  # noqa: E402
from entropy_law.drafters.ngram import NgramDrafter  # noqa: E402
from entropy_law.jobs.speed import ALL, format_speedup, paired_speedups, print_progress, time_arms  # noqa: E402
from entropy_law.prompts.text import load_tasks, sample_per_category  # noqa: E402
from entropy_law.traces.recorder import TraceRecorder  # noqa: E402


# --- decode ----------------------------------------------------------------------------------------------------------

AR_ARM = "ours AR"
GROUNDED = ("summarization", "rag")  # the categories of the speed goals


class TimedObserver:
    """Wraps an observer and adds up the time spent in it (the direct recording cost)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def _timed(self, method, *args):
        t0 = time.perf_counter()
        getattr(self.inner, method)(*args)
        self.seconds += time.perf_counter() - t0

    def on_request_start(self, request_id, info):
        self._timed("on_request_start", request_id, info)

    def on_round(self, record):
        self._timed("on_round", record)

    def on_request_end(self, request_id, info):
        self._timed("on_request_end", request_id, info)


@contextmanager
def model_attention(model, implementation: str | None):
    """Run ``model`` with another attention implementation for the duration (None: as loaded)."""
    if implementation is None:
        yield
        return
    loaded = model.config._attn_implementation
    model.config._attn_implementation = implementation
    try:
        yield
    finally:
        model.config._attn_implementation = loaded


def make_arms(target, args, recorder_observer, verify_cost):
    model = target.model
    eos = model.generation_config.eos_token_id

    def hf(extra, attention=None):
        @torch.inference_mode()
        def run(prompt_ids, max_new_tokens, category, request_id):
            ids = torch.tensor([prompt_ids])
            with model_attention(model, attention):
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=eos, pad_token_id=eos, **extra)
            return out[0, len(prompt_ids):].tolist(), None

        return run

    def ours(decoder):
        def run(prompt_ids, max_new_tokens, category, request_id):
            result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, category=category,
                                      request_id=request_id)
            return result.token_ids, result

        return run

    def ngram(**kwargs):
        return NgramDrafter(block_size=args.block_size)

    def ratio_gate():  # a fresh policy object per decoder
        return {"policy": RatioGate(args.verify_cost_ratio)}

    def gate():
        return ratio_gate() if verify_cost is None else {"policy": CostGate(verify_cost)}
    # name -> builder: only the arms that run are built (decoders, drafter loads)
    arms = {
        "HF greedy": lambda: hf({}),
        "HF prompt lookup": lambda: hf({"prompt_lookup_num_tokens": 10}),
        AR_ARM: lambda: ours(ARDecoder(target)),
        "ours ngram chain": lambda: ours(SpeculativeDecoder(target, ngram(), tree="chain", **gate())),
        "ours ngram ddtree": lambda: ours(SpeculativeDecoder(target, ngram(), tree="ddtree", budget=args.budget,
                                                             **gate())),
        "ours ngram chain + recorder": lambda: ours(SpeculativeDecoder(target, ngram(), tree="chain", **gate(),
                                                                       observers=[recorder_observer])),
    }
    if args.kernel_arms:  # where our AR's edge over HF greedy comes from: the adapter's attention kernel
        arms["ours AR, HF eager kernel"] = lambda: ours(ARDecoder(TargetAdapter(model, lean_attention=False),
                                                                  tokenizer=target.tokenizer))
        arms["HF greedy, sdpa"] = lambda: hf({}, attention="sdpa")
    if args.compare_gates and verify_cost is not None:
        arms["ours ngram chain, ratio gate"] = lambda: ours(SpeculativeDecoder(target, ngram(), tree="chain",
                                                                               **ratio_gate()))
        arms["ours ngram ddtree, ratio gate"] = lambda: ours(SpeculativeDecoder(target, ngram(), tree="ddtree",
                                                                                budget=args.budget, **ratio_gate()))
    if args.block_arms:  # the learned one-pass block drafter (one instance per decoder: it keeps its own cache)
        path = args.drafter or default_drafter_path()
        arms["ours block chain"] = lambda: ours(SpeculativeDecoder(target, BlockDrafter.load(path, target),
                                                                   tree="chain", **gate()))
        arms["ours block ddtree"] = lambda: ours(SpeculativeDecoder(target, BlockDrafter.load(path, target),
                                                                    tree="ddtree", budget=args.budget, **gate()))
    if args.arms:
        unknown = sorted(set(args.arms) - set(arms))
        if unknown:
            raise SystemExit(f"unknown arm(s) {unknown}; arms: {sorted(arms)} (block arms need --block-arms)")
        arms = {name: build for name, build in arms.items() if name in args.arms or name == AR_ARM}
    return {name: build() for name, build in arms.items()}


def decode_arguments(parser) -> None:
    """The arguments of ``decode``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=5, help="prompts per category (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="which prompts: a seeded sample per category (default 0)")
    parser.add_argument("--categories", nargs="*", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=11, help="n-gram drafter block size")
    parser.add_argument("--budget", type=int, default=16, help="DDTree node budget")
    parser.add_argument("--gate", choices=("cost", "ratio"), default="cost",
                        help="drafting gate of our n-gram arms: 'cost' measures this machine's verify-cost curve "
                             "once and verifies the best prefix of each tree (default); 'ratio' drafts iff the "
                             "expected accepted drafts >= verify-cost-ratio - 1")
    parser.add_argument("--verify-cost-ratio", type=float, default=2.0)
    parser.add_argument("--compare-gates", action="store_true",
                        help="with --gate cost, also run the n-gram arms with the ratio gate")
    parser.add_argument("--kernel-arms", action="store_true",
                        help="also run our AR with transformers' eager attention kernel and HF greedy with sdpa "
                             "(attributes our AR's edge over HF greedy to the adapter's attention kernel)")
    parser.add_argument("--block-arms", action="store_true",
                        help="also run our decoder with the block drafter (chain and DDTree, same gate)")
    parser.add_argument("--drafter", default=None,
                        help="block drafter checkpoint for --block-arms (default: the shipped one)")
    parser.add_argument("--arms", nargs="+", default=None, metavar="NAME",
                        help="run only these arms (our AR always runs: it is the reference)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                        help="time each call by this process's CPU time (default; the honest clock on a shared "
                             "machine, with --threads 1: with several threads CPU time also counts their "
                             "spinning) or by wall clock")


def run_decode(args, parser) -> dict:
    """Decoding speed on Spec-Bench: HF greedy, HF prompt lookup, our AR, ours + n-gram (chain, DDTree), ours + block drafter.

    Every arm maps prompt token ids to new token ids and goes through the same timing code (wall time of
    the whole call, prefill included; or this process's CPU time with ``--clock cpu``, the honest clock on a
    machine shared with other work, used with ``--threads 1``) and the same token counting (new tokens
    returned). Arms run through the one speed routine (``entropy_law.jobs.speed``): interleaved per prompt, in a
    rotating order, after the same warm-up, so machine load drifts hit all arms alike; speedups over our AR are
    paired per request with a request-bootstrap 95% interval, checked against the physical bound (tokens per
    round over the measured verify cost of the trees verified) and called "not measured reliably" when the
    interval is wider than +-15%. Prompts: ``--limit`` questions of each Spec-Bench category drawn with
    ``--seed`` from the whole set (not the first ones), chat template, ``--max-new-tokens`` new tokens (greedy,
    EOS stops).

    Our arms run the adapter's lean grouped-query attention kernel (``entropy_law.decoding.attention``: the
    same logits as transformers' eager attention, without copying the KV cache per query head); the HF arms run
    the model as loaded (eager). ``--kernel-arms`` adds our AR on transformers' kernel and HF greedy on sdpa.
    ``--block-arms`` adds the block drafter (the shipped checkpoint, or ``--drafter PATH``) with chain and DDTree
    trees and the same drafting gate as the n-gram arms; ``--arms NAME ...`` keeps only the named arms (and our
    AR, the reference), to time a few arms on more prompts.

    Reports per category and overall: the paired speedup over our AR with its interval and verdict, tokens per
    second; mean committed tokens
    per verify round of the n-gram arms; the recording overhead (the n-gram chain decoder with and without
    a ``RecorderObserver`` writing a real trace; also the observer's own time as a share of decode time);
    and whether every arm produced the same token ids as our AR. Ends with ONE JSON line.

        python bench/speed.py decode --limit 5 --max-new-tokens 256 --seed 1 # the goals' setting
        nice python bench/speed.py decode --limit 2 --max-new-tokens 128     # quicker
        python bench/speed.py decode --limit 2 --compare-gates               # cost gate vs ratio gate
        nice -n -15 python bench/speed.py decode --threads 1 --clock cpu     # on a shared machine
        python bench/speed.py decode --limit 2 --kernel-arms                 # + our AR on HF's eager kernel, HF sdpa
        python bench/speed.py decode --block-arms --arms "ours block chain" "ours block ddtree" "ours ngram ddtree"
    """
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_target(args.model)
    tasks = sample_per_category(load_tasks("spec_bench", categories=args.categories), args.limit, seed=args.seed)
    prompt_of = {task.request_id: ARDecoder(target).encode_prompt(task.messages()) for task in tasks}

    with tempfile.TemporaryDirectory() as tmp, TraceRecorder(Path(tmp) / "run", model_id=target.model_id,
                                                            drafter_id="ngram", tree_policy="chain") as recorder:
        timed_observer = TimedObserver(RecorderObserver(recorder))
        verify_cost = None
        if args.gate == "cost":
            verify_cost = measure_verify_cost(TargetAdapter(target.model))
            print(f"verify cost c(n) (one-token forward = 1): {verify_cost.describe()}", flush=True)
        built = make_arms(target, args, timed_observer, verify_cost)
        decode_s = {name: 0.0 for name in built}  # our arms' decode time (observers included), for the share

        calls = itertools.count()  # unique request ids for the recording arm's trace run

        def timed_arm(name):
            def run(prompt_ids, max_new_tokens):
                new_ids, result = built[name](prompt_ids, max_new_tokens, "qa", f"call-{next(calls)}")
                if result is None:
                    return new_ids, None
                decode_s[name] += result.decode_ms / 1000.0
                return new_ids, result.rounds
            return run

        names = list(built)
        timings = time_arms(tasks, {name: timed_arm(name) for name in names}, lambda task: prompt_of[task.request_id],
                            max_new_tokens=args.max_new_tokens, reference=AR_ARM, warm_up_tokens=16,
                            verify_cost=verify_cost, progress=print_progress)
        recorded = "ours ngram chain + recorder"
        observer_share = (timed_observer.seconds / decode_s[recorded] if decode_s.get(recorded)
                          else float("nan"))
    speed = paired_speedups(timings, reference=AR_ARM, clock=args.clock, seed=args.seed)
    categories = list(dict.fromkeys(task.category for task in tasks))
    clock_s = f"{args.clock}_s"
    other_s = "wall_s" if args.clock == "cpu" else "cpu_s"

    def rate(name, category=None, column=clock_s):
        rows = timings.loc[(timings["arm"] == name) & ((timings["category"] == category) if category else True)]
        return rows["new_tokens"].sum() / rows[column].sum()

    def cell(name, category):
        row = speed.loc[(speed["arm"] == name) & (speed["category"] == category)]
        return None if row.empty else row.iloc[0]

    print(f"\nSpeedup over {AR_ARM} by {'CPU' if args.clock == 'cpu' else 'wall'} time, paired per request, 95% "
          f"request-bootstrap interval; {args.limit} prompts/category (seed {args.seed}), {args.max_new_tokens} new "
          f"tokens, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    for name in names:
        if name == AR_ARM:
            continue
        print(f"{name}")
        for category in [*categories, ALL]:
            row = cell(name, category)
            if row is not None:
                print(f"    {category:<16} {format_speedup(row)}   tokens/round {row['tokens_per_round']:.2f}, "
                      f"bound {row['bound']:.2f}x")
    print(f"\nTokens per {'CPU ' if args.clock == 'cpu' else ''}second")
    print(f"{'arm':<30}" + "".join(f"{c[:12]:>14}" for c in categories) + f"{'all':>14}")
    for name in names:
        print(f"{name:<30}" + "".join(f"{rate(name, c):>14.1f}" for c in categories) + f"{rate(name):>14.1f}")
    mismatches = {name: int((~timings.loc[timings["arm"] == name, "matches_reference"]).sum()) for name in names}
    recording = {"ours ngram chain", recorded} <= set(names)
    overhead = float(rate("ours ngram chain") / rate(recorded) - 1.0) if recording else None
    if recording:
        print(f"\nRecording overhead: {100 * overhead:+.2f}% (with vs without recorder; noisy), "
              f"observer time = {100 * observer_share:.2f}% of decode time")
    print("Outputs different from our AR: " + ", ".join(f"{n}: {m}" for n, m in mismatches.items()))

    def speedup(name, category):
        row = cell(name, category)
        return None if row is None else row

    goals = {}  # only those whose arms (and, for the grounded goals, both grounded categories) ran, judged on
    grounded_ran = set(GROUNDED) <= set(categories)  # the interval's lower end (a goal must hold beyond noise)
    if "HF greedy" in names:
        goals["ar_at_least_hf_greedy"] = rate(AR_ARM) >= rate("HF greedy")
    if recording:
        goals["recording_overhead_le_2pct"] = observer_share <= 0.02
    for name in ("ours ngram chain", "ours ngram ddtree"):
        if name not in names:
            continue
        if "HF prompt lookup" in names:
            goals[f"{name}: faster than HF prompt lookup on every category"] = all(
                rate(name, c) > rate("HF prompt lookup", c) for c in categories)
        if grounded_ran:
            goals[f"{name}: >= 1.2x AR on summarization and rag (interval's lower end)"] = all(
                speedup(name, c)["lo"] >= 1.2 for c in GROUNDED)
        goals[f"{name}: never > 5% slower than AR (interval's upper end)"] = all(
            speedup(name, c)["hi"] >= 0.95 for c in categories)
    for name in ("ours block chain", "ours block ddtree"):  # the block drafter's speed goal
        if name in names and grounded_ran:
            goals[f"{name}: faster than AR on summarization and rag (interval's lower end)"] = all(
                speedup(name, c)["lo"] > 1.0 for c in GROUNDED)
    print("Goals: " + ("; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in goals.items()) if goals
                       else "none judged by these arms and categories"))
    summary = {
        "bench": "decode_speed", "model": target.model_id, "prompts_per_category": args.limit, "seed": args.seed,
        "question_ids": sorted(task.question_id for task in tasks),
        "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
        "block_size": args.block_size, "ddtree_budget": args.budget, "verify_cost_ratio": args.verify_cost_ratio,
        "clock": args.clock, "load_average_end": os.getloadavg()[0],
        "gate": args.gate, "verify_cost": None if verify_cost is None else verify_cost.to_config(),
        "tokens_per_second": {name: {**{c: float(rate(name, c)) for c in categories}, "all": float(rate(name))}
                              for name in names},
        "tokens_per_second_other_clock": {name: float(rate(name, column=other_s)) for name in names},
        "speedup_vs_ar": {name: {row["category"]: {k: (None if row[k] != row[k] else round(float(row[k]), 4))
                                                   for k in ("speedup", "lo", "hi", "tokens_per_round", "bound")}
                                 | {"verdict": row["verdict"], "requests": int(row["requests"])}
                                 for _, row in speed.loc[speed["arm"] == name].iterrows()}
                          for name in names if name != AR_ARM},
        "recording_overhead": overhead, "recording_observer_share": observer_share if recording else None,
        "mismatches_vs_ar": mismatches, "goals": {name: bool(value) for name, value in goals.items()},
    }
    print(json.dumps(summary))
    return summary


# --- aa-noise --------------------------------------------------------------------------------------------------------

AR, AGAIN = "AR", "AR again"
HALF_WIDTH_N = (2, 5, 10, 20)
THRESHOLDS = (1.00, 0.97, 0.95)


def log_ratios(timings, column: str) -> np.ndarray:
    """Per request: log(AR's time per token / AR again's time per token) on ``column`` (cpu_s or wall_s)."""
    ref = timings.loc[timings["arm"] == AR].set_index("request_id")
    other = timings.loc[timings["arm"] == AGAIN].set_index("request_id").loc[ref.index]
    mine = (ref[column] / ref["new_tokens"]).to_numpy(float)
    again = (other[column] / other["new_tokens"]).to_numpy(float)
    return np.log(mine / again)


def half_width(sd: float, n: int) -> float:
    """Relative half-width of a 95% t interval of a mean of ``n`` per-request log ratios of spread ``sd``."""
    return float(np.expm1(stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)))


def aa_noise_arguments(parser) -> None:
    """The arguments of ``aa-noise``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=3, help="prompts per category (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])


def run_aa_noise(args, parser) -> dict:
    """The noise floor of a measured speedup: our AR timed against itself (an A/A test).

    Two arms that do identical work, ``AR`` and ``AR again`` (two ``ARDecoder`` instances of one target), go
    through the one speed routine every speed bench uses (``jobs.speed.time_arms``: a warm-up, arms interleaved per
    prompt in rotating order, the CPU clock of this process; ``jobs.speed.paired_speedups``: the paired ratio per
    category with its request-bootstrap interval widened to Student t). Their true speedup is exactly 1, so what
    the routine reports is noise alone:

    - per category and overall: the A/A "speedup" and its interval (does it cover 1? is the point below 1.00?);
    - the spread of the per-request log ratios (CPU clock, and wall clock for comparison), and from it the
      half-width of a 95% interval for a category of n requests, n in {2, 5, 10, 20} (t quantile x SD / sqrt(n));
    - how often a point estimate of an arm no faster than AR falls below 1.00 / 0.97 / 0.95 in a category.

    What it is for: a goal such as "at least 1.00x our AR in every category" (a "never loses" goal), read on point
    estimates of a few requests per category, fails by chance alone for a policy that does exactly what AR does
    (drafts nothing): about half of its categories fall below 1.00. Such a goal can only be checked against this
    floor: a category is a loss only when its interval lies below 1.

    Prompts: ``--limit`` per category of each set in ``--sets`` (a seeded sample of the whole set, not the first
    ones). Prints a table and ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/speed.py aa-noise --limit 3 --max-new-tokens 128
    """
    if args.limit < 2:
        raise SystemExit("--limit must be >= 2 (a spread needs two requests per category)")

    import torch

    from entropy_law.decoding.decoder import ARDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.speed import ALL, decoder_arm, paired_speedups, print_progress, time_arms
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    started = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    target = load_target(args.model)
    tasks = [t for name in args.sets for t in sample_per_category(load_tasks(name), args.limit, seed=args.seed)]
    encoder = ARDecoder(target)
    prompt_of = {t.request_id: encoder.encode_prompt(t.messages()) for t in tasks}

    t0 = time.perf_counter()
    arms = {AR: decoder_arm(ARDecoder(target)), AGAIN: decoder_arm(ARDecoder(target))}
    timings = time_arms(tasks, arms, lambda task: prompt_of[task.request_id], max_new_tokens=args.max_new_tokens,
                        reference=AR, warm_up_tokens=16, progress=print_progress)
    elapsed = time.perf_counter() - t0
    speed = paired_speedups(timings, reference=AR, clock="cpu", seed=args.seed)
    mismatches = int((~timings.loc[timings["arm"] == AGAIN, "matches_reference"]).sum())

    print(f"# python bench/speed.py aa-noise --limit {args.limit} --max-new-tokens {args.max_new_tokens} --seed {args.seed} "
          f"--sets {' '.join(args.sets)}   (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; {started}; "
          f"{elapsed / 60:.0f} min; load average at the end {os.getloadavg()[0]:.1f})")
    print(f"A/A: '{AGAIN}' against '{AR}', identical work (true speedup 1), {len(tasks)} prompts, one torch thread, "
          "CPU clock, the speed routine of every bench (jobs.speed)")
    categories = [c for c in dict.fromkeys(t.category for t in tasks)]
    print(f"\n{'category':<16}{'requests':>9}  {'A/A speedup [95%]':<24}{'covers 1':>9}  verdict")
    rows = []
    for category in [*categories, ALL]:
        r = speed.loc[(speed["arm"] == AGAIN) & (speed["category"] == category)].iloc[0]
        covers = bool(r["lo"] <= 1.0 <= r["hi"]) if np.isfinite(r["lo"]) else None
        rows.append(dict(category=category, requests=int(r["requests"]), speedup=float(r["speedup"]),
                         lo=float(r["lo"]), hi=float(r["hi"]), covers_1=covers, verdict=str(r["verdict"])))
        interval = f"{r['speedup']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"
        print(f"{category:<16}{int(r['requests']):>9}  {interval:<24}{str(covers):>9}  {r['verdict']}")

    spread = {}
    print("\nper-request log ratio (AR / AR again, time per token):")
    for clock in ("cpu_s", "wall_s"):
        x = log_ratios(timings, clock)
        sd = float(np.std(x, ddof=1))
        spread[clock] = {"sd": sd, "mean": float(np.mean(x)), "min": float(np.min(x)), "max": float(np.max(x)),
                         "half_width": {n: half_width(sd, n) for n in HALF_WIDTH_N}}
        print(f"  {clock[:-2]:<5} SD {sd:.4f} (mean {np.mean(x):+.4f}, range {np.min(x):+.3f} to {np.max(x):+.3f}); "
              "95% half-width of a category mean: "
              + ", ".join(f"n={n}: ±{spread[clock]['half_width'][n]:.1%}" for n in HALF_WIDTH_N))

    per_category = [r for r in rows if r["category"] != ALL]
    below = {f"{t:.2f}": sum(r["speedup"] < t for r in per_category) for t in THRESHOLDS}
    print("\ncategories whose A/A point estimate falls below: "
          + ", ".join(f"{t}: {n} of {len(per_category)}" for t, n in below.items()))
    k = len(per_category)
    print(f"so a goal 'at least 1.00x in every one of {k} categories' on point estimates fails for an arm identical "
          f"to AR with probability about 1 - 0.5^{k} = {1 - 0.5 ** k:.4g}; a category is a loss only where its "
          "interval lies below 1")
    print(f"outputs different between the two AR arms: {mismatches}")
    result = {"bench": "aa_noise", "model": args.model, "prompts_per_category": args.limit, "seed": args.seed,
              "max_new_tokens": args.max_new_tokens, "sets": args.sets, "torch_threads": 1, "clock": "cpu",
              "minutes": elapsed / 60, "load_average_end": os.getloadavg()[0], "categories": rows,
              "log_ratio": spread, "below": below, "mismatches": mismatches}
    print(json.dumps(result))
    return result


# --- demo-repeat -----------------------------------------------------------------------------------------------------

def measure(tasks, specs, target, out: Path, max_new_tokens: int, seed: int):
    from entropy_law.jobs.plan import Limits, Output, RecordPlan
    from entropy_law.jobs.record import record_arms
    from entropy_law.jobs.speed import paired_speedups

    plan = RecordPlan(tasks, specs, target, Output(out), Limits(max_new_tokens, warm_up_tokens=16),
                      run_metadata=lambda spec: {"seed": seed, "replayed": False, "arm": spec.name})
    recorded = record_arms(plan, progress=False)
    ar = next(spec.name for spec in specs if not spec.drafts)
    timings = recorded.timings(ar)
    return paired_speedups(timings, reference=ar, clock="cpu", seed=seed), timings


def demo_repeat_arguments(parser) -> None:
    """The arguments of ``demo-repeat``."""
    from entropy_law.jobs.demo import DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS

    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="prompts per category (the demo's default)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timings-out", help="CSV of every run's per-request timings (to re-derive intervals later)")


def run_demo_repeat(args, parser) -> int:
    """Do two demo runs on one machine agree? The demo's decode and speed measurement, twice, compared.

    Runs the demo's measurement twice on the same prompts (its defaults: ``--limit`` prompts per category drawn with
    ``--seed`` from the whole Spec-Bench set, 128 new tokens, arms AR, n-gram chain, block DDTree16), each through
    the one recording loop (``jobs.record.record_arms``: warm-up, arms interleaved per prompt in rotating order) and
    the one speed routine (``jobs.speed.paired_speedups``: CPU clock, paired per request, 95% interval from the
    request bootstrap widened to Student t with few requests, physical bound, verdict), then per arm x category (and
    all prompts together):

    - the two speedups and intervals, whether the intervals overlap and whether each run's estimate lies inside the
      other run's interval;
    - whether either run prints a speedup above its physical bound as a result (it must not).

    Prints a table and ends with ONE JSON line. The report and the law fit of the demo are left out (they do not
    change a measured speedup). Set ``OMP_NUM_THREADS=1`` on a shared machine.

        OMP_NUM_THREADS=1 python bench/speed.py demo-repeat     # ~8 min
    """
    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.arms import available_arms
    from entropy_law.jobs.demo import DEFAULT_ARMS
    from entropy_law.jobs.speed import format_speedup
    from entropy_law.prompts.text import load_tasks, sample_per_category

    if args.repeats < 2:
        raise ValueError("--repeats must be at least 2 to compare runs")
    torch.set_num_threads(1)
    tasks = sample_per_category(load_tasks("spec_bench"), args.limit, seed=args.seed)
    specs, messages = available_arms(DEFAULT_ARMS)
    for m in messages:
        print(m)
    target = load_target("smollm2-135m")
    print(f"{len(tasks)} prompts ({args.limit} per category, seed {args.seed}), arms {[s.name for s in specs]}, "
          f"{args.max_new_tokens} new tokens, {args.repeats} runs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"load average {os.getloadavg()}", flush=True)
    runs, timings = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            t0 = time.perf_counter()
            speed, timed = measure(tasks, specs, target, Path(tmp) / f"run{i}", args.max_new_tokens, args.seed)
            runs.append(speed.assign(run=i))
            timings.append(timed.assign(run=i))
            print(f"run {i}: {time.perf_counter() - t0:.0f} s wall, load average {os.getloadavg()}", flush=True)
    table = pd.concat(runs, ignore_index=True)
    if args.timings_out:
        pd.concat(timings, ignore_index=True).to_csv(args.timings_out, index=False)
    rows = []
    for (arm, category), part in table.groupby(["arm", "category"], sort=False):
        part = part.sort_values("run")
        a, b = part.iloc[0], part.iloc[1]
        overlap = bool(max(a["lo"], b["lo"]) <= min(a["hi"], b["hi"])) if np.isfinite([a["lo"], b["lo"]]).all() else None
        cross = (bool(a["lo"] <= b["speedup"] <= a["hi"] and b["lo"] <= a["speedup"] <= b["hi"])
                 if np.isfinite([a["lo"], b["lo"]]).all() else None)
        printed_above = bool(((part["verdict"] == "measured") & (part["speedup"] > part["bound"] * 1.05)).any())
        rows.append(dict(arm=arm, category=category, requests=int(a["requests"]), run0=format_speedup(a.to_dict()),
                         run1=format_speedup(b.to_dict()), speedup0=float(a["speedup"]), speedup1=float(b["speedup"]),
                         intervals_overlap=overlap, each_inside_other=cross,
                         above_bound_verdicts=int((part["verdict"] == "above the physical bound").sum()),
                         above_bound_printed_as_result=printed_above))
    out = pd.DataFrame(rows)
    with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_colwidth", 60):
        print(out.drop(columns=["speedup0", "speedup1"]).to_string(index=False))
    rated = out.loc[out["intervals_overlap"].notna()]
    print(f"\nintervals overlap in {int(rated['intervals_overlap'].sum())} of {len(rated)} arm x category cells; each "
          f"estimate inside the other run's interval in {int(rated['each_inside_other'].sum())} of {len(rated)}; "
          f"speedups above the physical bound printed as a result: {int(out['above_bound_printed_as_result'].sum())}")
    print(json.dumps({"bench": "demo_repeat", "prompts": len(tasks), "limit": args.limit, "seed": args.seed,
                      "max_new_tokens": args.max_new_tokens, "cells": len(rated),
                      "intervals_overlap": int(rated["intervals_overlap"].sum()),
                      "each_inside_other": int(rated["each_inside_other"].sum()),
                      "above_bound_printed": int(out["above_bound_printed_as_result"].sum()),
                      "rows": out.to_dict("records"), "load_average": os.getloadavg()}, default=str))
    return 0


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "decode": (decode_arguments, run_decode),
    "aa-noise": (aa_noise_arguments, run_aa_noise),
    "demo-repeat": (demo_repeat_arguments, run_demo_repeat),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))

"""Measured decoding speed, the one routine: warm-up, arms interleaved per prompt, paired ratios, intervals.

Every arm is a callable ``(prompt ids, max_new_tokens) -> (new token ids, rounds or None)``, timed by the CPU and
wall clocks in an order rotating with the prompt. A speedup is a result only by ``payoff.cost.speed_verdict``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from entropy_law.payoff.cost import (ABOVE_BOUND, MEASURED, paired_speedup, paired_speedup_interval,
                                     pooled_log_speedup_sd, speed_verdict)

ALL = "all"


@dataclass(frozen=True)
class Timing:
    arm: str
    request_id: str
    category: str
    new_tokens: int
    cpu_s: float
    wall_s: float
    rounds: int  # verify rounds after the prefill (0: unknown)
    verify_cost: float  # sum over those rounds of c(verified tokens) in one-token forwards (0: unknown)
    matches_reference: bool
    draft_calls: int = 0  # those rounds in which the drafter ran (a policy's declined rounds not; 0: none, unknown)


def round_cost(rounds, cost_of: Callable[[int], float] | None = None) -> tuple[int, float]:
    """(verify rounds after the prefill, their summed verify cost ``c(tree nodes + 1)`` in one-token forwards;
    ``cost_of`` default ``c(n) = 1``) of a decoder's round records; (0, 0.0) without them."""
    cost_of = cost_of or (lambda n: 1.0)
    decode = [r for r in rounds or () if r.round_index > 0]
    return len(decode), float(sum(cost_of(r.tree_nodes + 1) for r in decode))


def draft_calls(rounds) -> int:
    """Verify rounds after the prefill in which the drafter ran (not those a law policy declined)."""
    return sum(1 for r in rounds or () if r.round_index > 0
               and (getattr(r, "policy", None) is None or bool(r.policy.get("draft"))))


def decoder_arm(decoder) -> Callable:
    """A ``time_arms`` arm for one of our decoders: its token ids and round records."""
    def run(prompt_ids, max_new_tokens):
        result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens)
        return result.token_ids, result.rounds
    return run


def print_progress(tasks: Sequence):
    """A ``time_arms`` progress for benches: one line per prompt on stderr (``[i/n] category question``)."""
    for index, task in enumerate(tasks):
        print(f"[{index + 1}/{len(tasks)}] {task.category:<16} {task.question_id:>6}", file=sys.stderr, flush=True)
        yield task


def time_arms(tasks: Sequence, arms: Mapping[str, Callable], encode: Callable, *, max_new_tokens: int,
              reference: str, warm_up_tokens: int = 8, verify_cost: Callable[[int], float] | None = None,
              progress: Callable | None = None) -> pd.DataFrame:
    """Decode every task with every arm (interleaved, rotating order, after a warm-up): one ``Timing`` row per (arm,
    request). ``reference``: the AR arm; ``verify_cost``: the curve ``c(n)`` for the bound (default 1)."""
    if reference not in arms:
        raise ValueError(f"the reference arm {reference!r} is not among the arms {list(arms)}")
    if not tasks:
        raise ValueError("no prompts to time")
    names = list(arms)
    warm = list(encode(tasks[0]))
    for name in names:
        arms[name](warm, min(warm_up_tokens, max_new_tokens))
    rows = []
    for index, task in enumerate(progress(tasks) if progress else tasks):
        prompt = list(encode(task))
        order = names[index % len(names):] + names[: index % len(names)]
        outputs, timed = {}, {}
        for name in order:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            tokens, rounds = arms[name](prompt, max_new_tokens)
            timed[name] = (time.process_time() - cpu0, time.perf_counter() - wall0, rounds)
            outputs[name] = list(tokens)
        for name in names:
            cpu_s, wall_s, rounds = timed[name]
            n_rounds, cost = round_cost(rounds, verify_cost)
            rows.append(Timing(arm=name, request_id=task.request_id, category=task.category,
                               new_tokens=len(outputs[name]), cpu_s=cpu_s, wall_s=wall_s, rounds=n_rounds,
                               verify_cost=cost, matches_reference=outputs[name] == outputs[reference],
                               draft_calls=0 if name == reference else draft_calls(rounds)))
    return pd.DataFrame([row.__dict__ for row in rows])


def paired_speedups(timings: pd.DataFrame, *, reference: str, clock: str = "cpu", n_boot: int = 2000,
                    seed: int = 0) -> pd.DataFrame:
    """Per arm and category (and ``"all"``): the paired speedup over ``reference`` with its 95% interval, tokens per
    round, the physical ``bound``, ``within_bound``, ``reliable``, ``mismatches`` (kept and counted), ``verdict``."""
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")
    column = f"{clock}_s"
    ref = timings.loc[timings["arm"] == reference].set_index("request_id")
    rng = np.random.default_rng(seed)
    rows = []
    for arm, part in timings.loc[timings["arm"] != reference].groupby("arm", sort=False):
        part = part.set_index("request_id")
        both = [r for r in part.index if r in ref.index]
        pooled = pooled_log_speedup_sd(ref.loc[both, column], ref.loc[both, "new_tokens"], part.loc[both, column],
                                       part.loc[both, "new_tokens"], part.loc[both, "category"])
        for category in [*sorted(part["category"].unique()), ALL]:
            mine = part if category == ALL else part.loc[part["category"] == category]
            ids = [r for r in mine.index if r in ref.index]
            if not ids:
                continue
            a_t, a_n = mine.loc[ids, column].to_numpy(float), mine.loc[ids, "new_tokens"].to_numpy(float)
            r_t, r_n = ref.loc[ids, column].to_numpy(float), ref.loc[ids, "new_tokens"].to_numpy(float)
            speedup = paired_speedup(r_t, r_n, a_t, a_n)
            lo, hi = paired_speedup_interval(r_t, r_n, a_t, a_n, rng=rng, n_boot=n_boot,  # NaN for one request
                                             pooled=pooled)
            rounds = mine.loc[ids, "rounds"].sum()
            tokens_per_round = (a_n - 1).sum() / rounds if rounds else math.nan  # the prefill's token excluded
            cost = mine.loc[ids, "verify_cost"].sum()
            bound = tokens_per_round * rounds / cost if rounds and cost else tokens_per_round
            verdict = speed_verdict(speedup, lo, hi, bound, len(ids))
            rows.append(dict(arm=arm, category=category, requests=len(ids), speedup=float(speedup), lo=float(lo),
                             hi=float(hi), tokens_per_round=tokens_per_round, bound=bound,
                             within_bound=verdict != ABOVE_BOUND, reliable=verdict == MEASURED,
                             mismatches=int((~mine.loc[ids, "matches_reference"]).sum()), verdict=verdict))
    return pd.DataFrame(rows)


def format_speedup(row) -> str:
    """The speedup as it may be printed: a number with its interval only when it is a result."""
    if row["verdict"] == ABOVE_BOUND:
        return f"above the physical bound ({row['speedup']:.2f}x > {row['bound']:.2f}x): not a result"
    if row["verdict"] != MEASURED:
        interval = "" if row["lo"] != row["lo"] else f" [{row['lo']:.2f}, {row['hi']:.2f}]"
        return f"not measured reliably ({row['speedup']:.2f}x{interval}, {row['requests']} requests)"
    return f"{row['speedup']:.2f}x [{row['lo']:.2f}, {row['hi']:.2f}] ({row['requests']} requests)"

"""Are the per-request 90% intervals of a category the law never saw calibrated? Simulated, with the truth known.

``law.predict.loco_predictions`` gives each held-out request a 90% interval on its tokens per round whose width has
a between-category part: how far an unseen category's mean lands from the law. It is estimated from the training
categories' residuals, either in sample (``overdispersion="in-sample"``: under the law fitted on all of them) or
out of sample (``"nested"``, the default: each training category predicted by a law fitted without it). This bench
draws ``--sets`` trace sets from ``law_exp`` (``law.simulate.simulate_traces``, 5 categories x ``--requests``) in
which every category's rejection rate is shifted by exp(u), u ~ N(0, SD) drawn per set, for each SD of ``--sds``
(0: no category effect; the category-free law cannot know u), and reports for each estimator the pooled coverage of
the held-out requests over all five LOCO folds: mean over the sets (nominal 0.90), its SD across sets, the 5% and
95% quantiles, and the share of sets whose coverage lies in the 85-95% band of issue #18.

Estimators: ``nested`` (the package's: out-of-sample residual means, their sum of squares about the bias over k, times
(k - 1) / k since 2026-12-06: each was predicted by a fit on k - 1 categories; before it, without the factor),
``nested, divisor k-1`` (the same residuals with the in-sample divisor: the estimator of 2026-12-04 19:05, which counts
the fit's error twice) and ``in-sample``.

What it says about real traces: the across-set SD is the spread a calibrated interval's pooled coverage has on five
categories (requests of one category share its mean's error), so a coverage on ``data/traces`` outside 85-95% is not
by itself a miscalibration; and where the law is misspecified across categories beyond a rate shift (as on real
traces), in-sample residual means understate it, which the simulation, drawn from the law, cannot show.

Prints a table and ends with ONE JSON line.

    OMP_NUM_THREADS=1 python bench/interval_calibration.py [--sets 40] [--sds 0 0.4] | tee bench/results/interval_calibration.txt
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import entropy_law.law.predict as predict  # noqa: E402
from entropy_law.law.simulate import simulate_traces  # noqa: E402

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
ESTIMATORS = ("nested", "nested, divisor k-1", "in-sample")
BAND = (0.85, 0.95)


@contextlib.contextmanager
def in_sample_divisor():
    """``Overdispersion.estimate`` with the in-sample divisor k - 1 whatever residuals it is given."""
    original = predict.Overdispersion.estimate.__func__
    predict.Overdispersion.estimate = classmethod(lambda cls, residual, out_of_sample=False: original(cls, residual))
    try:
        yield
    finally:
        predict.Overdispersion.estimate = classmethod(original)


def coverage(traces, estimator: str, draws: int) -> float:
    mode = "in-sample" if estimator == "in-sample" else "nested"
    with in_sample_divisor() if estimator == "nested, divisor k-1" else contextlib.nullcontext():
        return float(predict.loco_predictions(traces, "law_exp", n_draws=draws, seed=0, overdispersion=mode).coverage)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=40, help="simulated trace sets per SD")
    parser.add_argument("--sds", type=float, nargs="+", default=[0.0, 0.4],
                        help="SD of the per-category log-rate shift (default 0 and 0.4)")
    parser.add_argument("--requests", type=int, default=16, help="requests per category")
    parser.add_argument("--draws", type=int, default=0, help="coefficient draws per held-out category")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.sets < 2:
        raise SystemExit("--sets must be at least 2")
    warnings.simplefilter("ignore")  # few requests per category: SmallSampleWarning (the simulation's own choice)
    t0 = time.process_time()
    rows = []
    for sd in args.sds:
        for i in range(args.sets):
            seed = args.seed + i
            rng = np.random.default_rng([seed, int(round(sd * 1000))])
            effects = {c: float(rng.normal(0.0, sd)) for c in CATEGORIES}
            traces = simulate_traces(seed=seed, n_requests_per_category=args.requests, tokens_per_request=(60, 100),
                                     categories=list(CATEGORIES), category_effects=effects)
            for estimator in ESTIMATORS:
                rows.append(dict(sd=sd, set=i, estimator=estimator, coverage=coverage(traces, estimator, args.draws)))
        print(f"[SD {sd:g}: {args.sets} sets, cumulative CPU {time.process_time() - t0:.0f} s]", flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby(["sd", "estimator"], sort=False)["coverage"].agg(
        mean="mean", sd="std", q05=lambda c: c.quantile(0.05), q95=lambda c: c.quantile(0.95),
        in_band=lambda c: float(((c >= BAND[0]) & (c <= BAND[1])).mean()))
    pd.set_option("display.width", 200)
    print(f"\npooled coverage of the held-out requests' 90% intervals, LOCO over 5 simulated categories x "
          f"{args.requests} requests, {args.sets} sets per SD (law_exp, {args.draws} coefficient draws; nominal 0.90; "
          f"in_band: share of sets in [{BAND[0]:.2f}, {BAND[1]:.2f}])")
    print(summary.round(3).to_string())
    cpu = round(time.process_time() - t0, 1)
    print(f"CPU time {cpu} s")
    out = {"bench": "interval_calibration", "sets": args.sets, "requests_per_category": args.requests,
           "categories": len(CATEGORIES), "draws": args.draws, "cpu_s": cpu,
           "coverage": {f"sd={sd:g}": {est: {k: round(float(v), 4) for k, v in summary.loc[(sd, est)].items()}
                                       for est in ESTIMATORS} for sd in args.sds}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

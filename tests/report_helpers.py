"""A small simulated trace set written through TraceRecorder (5 categories x 5 requests, three runs)."""

from __future__ import annotations

from entropy_law.analysis.sample_traces import write_simulated_traces

FAST = dict(n_boot=3, compare_families=("law_logit", "law_exp"), n_folds=3)


def small_traces(path, seed: int = 3):
    return write_simulated_traces(path, seed=seed, n_requests_per_category=5, tokens_per_request=(40, 60))

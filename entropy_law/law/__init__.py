"""The entropy law itself: at-risk tables, law families, fits, comparison, transfer and tests.

Known here, one module each: ``arms`` (which runs are one arm: model, drafter and checkpoint, tree
policy, budget, gate; their labels; the machine a run was timed on), ``atrisk`` (the at-risk layout and
its aggregate, refusing rows that pool arms), ``fit`` (law families, ``fit_law``, ``FittedLaw`` and, with
``by=``, a ``LawSet`` of them), ``blocks`` (block-level arithmetic: E[tau], exact rounds by dynamic
programming), ``compare`` (grouped CV, AIC/BIC, calibration), ``transfer`` (block prediction,
leave-one-category-out), ``hypotheses`` (pre-registered tests, Holm), ``bootstrap`` (request bootstrap),
``stats`` (small shared statistics: exact Spearman permutation p, Wilson interval, and the rule for intervals
on fewer than ``FEW_REQUESTS`` requests: a ``SmallSampleWarning``), ``results`` (the result base class).
Definitions and departures from the research notes: ``docs/law.md``.

Not known here, each in its own room that builds on this one: when drafting pays (the cost model, workload
prediction, break-even, policy fitting: ``entropy_law.payoff``), the out-of-core path (``entropy_law.outofcore``),
GLANCE's round-level law (``entropy_law.glance``; ``fit_law`` refuses its names and points to ``fit_glance``),
the simulator and ``TraceAnalysis`` (``entropy_law.analysis``). Never imported from here: those rooms, torch,
decoding, drafters, jobs, plotting. Depends on numpy, scipy, pandas and statsmodels (matplotlib only when a
result is plotted).
"""

from entropy_law.law.arms import run_arms
from entropy_law.law.atrisk import aggregate_at_risk, at_risk_table
from entropy_law.law.bootstrap import bootstrap_law
from entropy_law.law.compare import compare_laws
from entropy_law.law.fit import LAW_FAMILIES, FittedLaw, LawSet, fit_law
from entropy_law.law.hypotheses import (category_ranking_test, drafter_entropy_test, preregistered_tests,
                                        universality_test)
from entropy_law.law.stats import FEW_REQUESTS, SmallSampleWarning, exact_spearman_p, wilson_interval
from entropy_law.law.transfer import block_prediction, loco_transfer

__all__ = [
    "FEW_REQUESTS",
    "LAW_FAMILIES",
    "FittedLaw",
    "LawSet",
    "SmallSampleWarning",
    "aggregate_at_risk",
    "at_risk_table",
    "block_prediction",
    "bootstrap_law",
    "category_ranking_test",
    "compare_laws",
    "drafter_entropy_test",
    "exact_spearman_p",
    "fit_law",
    "loco_transfer",
    "preregistered_tests",
    "run_arms",
    "universality_test",
    "wilson_interval",
]

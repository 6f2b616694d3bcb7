"""The entropy law (analysis layer): at-risk tables, law families, tests, predictions, cost model.

Known here, one module each: ``arms`` (which runs are one arm: model, drafter and checkpoint, tree
policy, budget, gate; their labels; the machine a run was timed on), ``atrisk`` (the at-risk layout and
its aggregate, refusing rows that pool arms), ``fit`` (law families,
``fit_law``, ``FittedLaw``), ``glance`` (GLANCE's round-level "draftability law": fit, diagnostics,
round logs; ``fit_law(family="glance")``), ``blocks`` (block-level arithmetic: E[tau], exact rounds by dynamic
programming), ``compare`` (grouped CV, AIC/BIC, calibration), ``transfer`` (block prediction,
leave-one-category-out), ``outofcore`` (the aggregate as one SQL query, run by DuckDB over the Parquet
shards of runs larger than memory, and ``fit_law_out_of_core``), ``hypotheses`` (pre-registered tests,
Holm), ``bootstrap`` (request bootstrap), ``cost`` (when drafting pays, at constant entropy), ``workload`` (when
drafting pays on a workload: each request priced on its own entropy sequence), ``simulate`` (traces from a known
law), ``stats`` (small
shared statistics: exact Spearman permutation p, Wilson interval, and the rule for intervals on fewer
than ``FEW_REQUESTS`` requests: a ``SmallSampleWarning``), ``results`` (the result base
class), ``analysis`` (``TraceAnalysis``: one trace set analysed once, for figures, report, notebooks)
and ``sample_traces`` (where traces are found: the reference traces, else simulated ones).
Definitions and departures from the research notes: ``docs/law.md``.

Not known here: torch, decoding, drafters, jobs, plotting (``entropy_law.plots``). Depends on numpy,
scipy, pandas and statsmodels (matplotlib only when a result is plotted, DuckDB only when an out-of-core
query runs).
"""

from entropy_law.law.analysis import TraceAnalysis
from entropy_law.law.arms import run_arms
from entropy_law.law.atrisk import aggregate_at_risk, at_risk_table
from entropy_law.law.bootstrap import bootstrap_law
from entropy_law.law.compare import compare_laws
from entropy_law.law.cost import fit_cost_model, when_drafting_pays
from entropy_law.law.fit import LAW_FAMILIES, FittedLaw, fit_law
from entropy_law.law.glance import GlanceLaw, fit_glance, glance_rounds, read_glance_rounds, write_glance_rounds
from entropy_law.law.hypotheses import (category_ranking_test, drafter_entropy_test, preregistered_tests,
                                        universality_test)
from entropy_law.law.outofcore import aggregate_at_risk_sql, at_risk_sql, fit_law_out_of_core
from entropy_law.law.simulate import simulate_traces
from entropy_law.law.stats import FEW_REQUESTS, SmallSampleWarning, exact_spearman_p, wilson_interval
from entropy_law.law.transfer import block_prediction, loco_transfer
from entropy_law.law.workload import workload_breakeven

__all__ = [
    "FEW_REQUESTS",
    "LAW_FAMILIES",
    "FittedLaw",
    "GlanceLaw",
    "SmallSampleWarning",
    "TraceAnalysis",
    "aggregate_at_risk",
    "aggregate_at_risk_sql",
    "at_risk_sql",
    "at_risk_table",
    "block_prediction",
    "bootstrap_law",
    "category_ranking_test",
    "compare_laws",
    "drafter_entropy_test",
    "exact_spearman_p",
    "fit_cost_model",
    "fit_glance",
    "fit_law",
    "fit_law_out_of_core",
    "glance_rounds",
    "loco_transfer",
    "preregistered_tests",
    "read_glance_rounds",
    "run_arms",
    "simulate_traces",
    "universality_test",
    "when_drafting_pays",
    "wilson_interval",
    "workload_breakeven",
    "write_glance_rounds",
]

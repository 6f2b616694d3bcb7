"""The entropy law itself: at-risk tables, law families, fits, comparison, transfer and tests.

Definitions: ``docs/law.md``. The rooms that build on it (``payoff``, ``outofcore``, ``glance``, ``analysis``),
torch and plotting are never imported from here.
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

__all__ = ["FEW_REQUESTS", "LAW_FAMILIES", "FittedLaw", "LawSet", "SmallSampleWarning", "aggregate_at_risk",
           "at_risk_table", "block_prediction", "bootstrap_law", "category_ranking_test", "compare_laws",
           "drafter_entropy_test", "exact_spearman_p", "fit_law", "loco_transfer", "preregistered_tests", "run_arms",
           "universality_test", "wilson_interval"]

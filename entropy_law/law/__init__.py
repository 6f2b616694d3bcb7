"""The entropy law (analysis layer): at-risk tables, law families, tests, predictions, cost model.

numpy / scipy / pandas / statsmodels only; never imports torch. Modules: ``atrisk`` (the at-risk
layout and its aggregate), ``fit`` (law families, ``fit_law``, ``FittedLaw``), ``blocks`` (block-level
arithmetic: E[tau], exact rounds by dynamic programming), ``compare`` (grouped CV, AIC/BIC,
calibration), ``transfer`` (block prediction, leave-one-category-out), ``hypotheses`` (pre-registered
tests, Holm), ``bootstrap`` (request bootstrap), ``cost`` (when drafting pays), ``simulate`` (traces
from a known law). Definitions and departures from the research notes: ``docs/law.md``.
"""

"""GLANCE's law: its own room, apart from the law families of ``entropy_law.law``.

Known here, one module each: ``law`` (GLANCE's round-level "draftability law", logit p = b0 - b1 H at the round
root, in its two forms: ``fit_glance``, ``GlanceLaw`` with its diagnostics and ``holds()``), ``rounds`` (the
per-round table a fit reads, GLANCE's JSONL round logs: ``read_glance_rounds``, ``glance_rounds`` for our traces,
``write_glance_rounds``) and ``compare`` (GLANCE's law against ours round by round: ``law_round_expectations``,
``loco_glance``, ``round_scores``). GLANCE's law is fitted by ``fit_glance`` only: ``entropy_law.law.fit_law``
refuses the names "glance" / "glance_readme" and says to call it.

Not known here: the GLM law families and their fits (``entropy_law.law``, which never imports this room), the
figure and report section (``entropy_law.plots.glance``), importing a round log as a trace run
(``entropy_law.importers.glance``). No torch; numpy, scipy and pandas.
"""

from entropy_law.glance.compare import category_frame, law_round_expectations, loco_glance, round_scores
from entropy_law.glance.law import CAP, GLANCE_FAMILIES, GlanceLaw, decile_curve, fit_glance, glance_expected_accepted
from entropy_law.glance.rounds import (ROUND_LOG_FIELDS, glance_rounds, read_glance_rounds, round_table,
                                      write_glance_rounds)

__all__ = [
    "CAP",
    "GLANCE_FAMILIES",
    "GlanceLaw",
    "ROUND_LOG_FIELDS",
    "category_frame",
    "decile_curve",
    "fit_glance",
    "glance_expected_accepted",
    "glance_rounds",
    "law_round_expectations",
    "loco_glance",
    "read_glance_rounds",
    "round_scores",
    "round_table",
    "write_glance_rounds",
]

"""GLANCE's law: its own room, apart from the law families of ``entropy_law.law``.

``law`` (GLANCE's round-level law, logit p = b0 - b1 H at the round root: ``fit_glance``, ``GlanceLaw``), ``rounds``
(the per-round table; GLANCE's JSONL round logs read and written) and ``compare`` (GLANCE's law against ours round by
round); ``matched`` (both given the same drafted depth). ``fit_law`` refuses "glance" and says to call ``fit_glance``.
Not known here: the GLM families (``entropy_law.law`` never imports this room), the figure (``plots.glance``), importing
a round log as a run (``importers.glance``). No torch.
"""

from entropy_law.glance.compare import category_frame, law_round_expectations, loco_glance, round_scores
from entropy_law.glance.law import CAP, GLANCE_FAMILIES, GlanceLaw, decile_curve, fit_glance, glance_expected_accepted
from entropy_law.glance.rounds import (ROUND_LOG_FIELDS, glance_rounds, read_glance_rounds, round_table,
                                      write_glance_rounds)

__all__ = ["CAP", "GLANCE_FAMILIES", "GlanceLaw", "ROUND_LOG_FIELDS", "category_frame", "decile_curve", "fit_glance",
           "glance_expected_accepted", "glance_rounds", "law_round_expectations", "loco_glance", "read_glance_rounds",
           "round_scores", "round_table", "write_glance_rounds"]

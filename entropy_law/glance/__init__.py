"""GLANCE's law: its own room, apart from the law families of ``entropy_law.law``.

``law`` (logit p = b0 - b1 H at the round root: ``fit_glance``, ``GlanceLaw``), ``rounds`` (GLANCE's JSONL round
logs), ``compare`` and ``matched`` (GLANCE's law against ours round by round). ``entropy_law.law`` never imports it.
"""

from entropy_law.glance.compare import category_frame, law_round_expectations, loco_glance, round_scores
from entropy_law.glance.law import CAP, GLANCE_FAMILIES, GlanceLaw, decile_curve, fit_glance, glance_expected_accepted
from entropy_law.glance.rounds import (ROUND_LOG_FIELDS, glance_rounds, read_glance_rounds, round_table,
                                      write_glance_rounds)

__all__ = ["CAP", "GLANCE_FAMILIES", "GlanceLaw", "ROUND_LOG_FIELDS", "category_frame", "decile_curve", "fit_glance",
           "glance_expected_accepted", "glance_rounds", "law_round_expectations", "loco_glance", "read_glance_rounds",
           "round_scores", "round_table", "write_glance_rounds"]

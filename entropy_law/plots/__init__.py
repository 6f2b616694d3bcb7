"""Figures of the entropy law: ``figures`` (one plot function per figure: data first, keyword-only options,
``ax=None`` -> ``ax``; ``*_table`` helpers return the numbers behind a figure), ``gallery`` (the figure set of a
``TraceAnalysis``; ``cli`` runs the scripts in ``figures/``) and ``style`` (rc settings, palettes, saving).
"""

from entropy_law.plots.figures import (acceptance_vs_entropy, accepted_length_vs_entropy, calibration,
                                       entropy_distributions, example_response, law_comparison,
                                       loco_predicted_vs_observed, speedup_vs_entropy, survival_by_depth)
from entropy_law.plots.gallery import FIGURES, build_figure, make_figures

__all__ = ["FIGURES", "acceptance_vs_entropy", "accepted_length_vs_entropy", "build_figure", "calibration",
           "entropy_distributions", "example_response", "law_comparison", "loco_predicted_vs_observed", "make_figures",
           "speedup_vs_entropy", "survival_by_depth"]

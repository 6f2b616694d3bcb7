"""Figures of the entropy law: plot functions, the figure set of a trace set, and one style.

Known here, one module each: ``figures`` (one plot function per figure: data first, keyword-only
options, ``ax=None`` -> ``ax``; the ``*_table`` helpers return the numbers behind a figure),
``gallery`` (the nine paper figures built from a ``TraceAnalysis``, ``make_figures`` writes them
all; ``cli`` is the command line of the scripts in ``figures/``) and ``style`` (rc settings,
palettes, deterministic saving). Not known here: fitting (``entropy_law.law``), torch, decoding.
"""

from entropy_law.plots.figures import (acceptance_vs_entropy, accepted_length_vs_entropy, calibration,
                                       entropy_distributions, example_response, law_comparison,
                                       loco_predicted_vs_observed, speedup_vs_entropy, survival_by_depth)
from entropy_law.plots.gallery import FIGURES, build_figure, make_figures

__all__ = [
    "FIGURES",
    "acceptance_vs_entropy",
    "accepted_length_vs_entropy",
    "build_figure",
    "calibration",
    "entropy_distributions",
    "example_response",
    "law_comparison",
    "loco_predicted_vs_observed",
    "make_figures",
    "speedup_vs_entropy",
    "survival_by_depth",
]

"""Acceptance by depth: survival S(k) = P(accepted length >= k) per category and drafter.

    python figures/fig3_survival_by_depth.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig3_survival_by_depth"]`` (plot function in ``entropy_law.plots.figures``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig3_survival_by_depth"], description=__doc__.splitlines()[0]))

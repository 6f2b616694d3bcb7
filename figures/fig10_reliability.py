"""Reliability per category: predicted vs observed acceptance of each held-out category's trials.

    python figures/fig10_reliability.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig10_reliability"]`` (plot function in ``entropy_law.plots.reliability``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig10_reliability"], description=__doc__.splitlines()[0]))

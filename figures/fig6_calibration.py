"""Calibration (reliability diagram) of the fitted law.

    python figures/fig6_calibration.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig6_calibration"]`` (plot function in ``entropy_law.plots.figures``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig6_calibration"], description=__doc__.splitlines()[0]))

"""Predicted vs measured speedup per arm and category, and where measured speedups cross 1.

    python figures/fig12_speed_validation.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig12_speed_validation"]`` (plot function in ``entropy_law.plots.speed``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig12_speed_validation"], description=__doc__.splitlines()[0]))

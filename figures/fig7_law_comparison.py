"""Law comparison: cross-validated log-loss per at-risk trial.

    python figures/fig7_law_comparison.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig7_law_comparison"]`` (plot function in ``entropy_law.plots.figures``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig7_law_comparison"], description=__doc__.splitlines()[0]))
